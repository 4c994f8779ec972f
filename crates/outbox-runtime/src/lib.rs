//! The tokio-side machinery the relay and the consumers both run on.
//!
//! - [`RetrySweeper`]: the seed's retry background service over the ports, driven
//!   by `outbox-core`'s scheduling decisions; it runs a [`SweepTask`] (the relay's
//!   publish retries, a consumer's consume retries).
//! - [`LeaseFactory`]: the leases an instance claims rows under.
//! - [`stall`]: the progress watchdog behind `/readyz` ([`RelayProgress`]).
//! - [`supervision`]: a service task that stops on its own is a failure
//!   ([`ServiceHealth`]).
//! - [`ThroughputRecorder`]: per-minute totals shared by every instance.
//! - [`vacuum`]: vacuuming after retention rounds, for both sides' retention.
//! - [`EnqueueEvents`]: typed enqueue on every outbox store, with ids from
//!   [`new_message_id`].
//!
//! Every task stops cleanly when its [`CancellationToken`] is cancelled.

pub mod enqueue;
pub mod lease;
pub mod retention;
pub mod stall;
pub mod supervision;
pub mod sweeper;
pub mod throughput;
pub mod vacuum;

pub use enqueue::EnqueueEvents;
pub use lease::LeaseFactory;
pub use stall::{DEFAULT_STALL_AFTER, RelayProgress};
pub use supervision::ServiceHealth;
pub use sweeper::{RetrySweeper, SweepTask};
pub use throughput::{NamedTally, TallyRecorder, ThroughputRecorder};
pub use tokio_util::sync::CancellationToken;
pub use vacuum::VacuumMode;

/// A source of uniform random numbers in `[0, 1)` for retry jitter. A plain function
/// pointer, so tests can pin it.
pub type Random = fn() -> f64;

/// The default jitter source.
#[must_use]
pub fn default_random() -> f64 {
    fastrand::f64()
}

/// A new message id for a message created at `at`: UUIDv7 (time ordered, as the
/// stores' claim order expects) with ten random bytes from the process's generator.
/// `outbox-core` takes both as arguments; this is where they come from.
#[must_use]
pub fn new_message_id(at: outbox_core::Timestamp) -> outbox_core::MessageId {
    let mut random = [0_u8; 10];
    fastrand::fill(&mut random);
    outbox_core::MessageId::v7(at, random)
}

/// Sleeps for `d`, or less if `cancel` fires first. Returns `false` when cancelled.
pub async fn sleep_or_cancel(d: std::time::Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn new_message_ids_are_version_7_distinct_and_ordered_by_time() {
        let early = outbox_core::Timestamp::from_unix_timestamp(1_700_000_000).expect("a time");
        let late = outbox_core::Timestamp::from_unix_timestamp(1_700_000_001).expect("a time");
        let a = super::new_message_id(early);
        let b = super::new_message_id(early);
        assert_ne!(a, b, "two ids made in the same millisecond must differ");
        assert_eq!(a.as_uuid().get_version_num(), 7);
        assert!(a < super::new_message_id(late) && b < super::new_message_id(late));
    }
}
