//! A consumer's running totals, shared by its worker, its retention and its
//! metrics.

use std::sync::atomic::AtomicU64;

/// Totals of a consumer, for metrics and the demo.
#[derive(Debug, Default)]
pub struct ConsumerCounters {
    /// Deliveries handled successfully (first attempt or retry).
    pub consumed: AtomicU64,
    /// Handler attempts that failed.
    pub consume_failures: AtomicU64,
    /// Redeliveries recognised by the inbox and skipped.
    pub duplicates: AtomicU64,
    /// Deliveries that went dead.
    pub dead: AtomicU64,
    /// Deliveries that could not be decoded, kept as dead letters.
    pub dead_letters: AtomicU64,
    /// Consumed inbox rows deleted by retention.
    pub retention_deleted: AtomicU64,
    /// Deliveries recorded to wait behind an earlier unfinished delivery of their
    /// ordering key (with [`crate::ConsumerConfig::ordered_by_key`]); the consume sweep
    /// handles them in order.
    pub held_behind_key: AtomicU64,
}
