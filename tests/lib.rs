//! End-to-end tests of `outbox` live in `tests/` of this package; this library is
//! empty. Later tests against the real PostgreSQL, RabbitMQ and Redis join them here.

/// The README's Rust examples, compiled (and run where they need no server) as
/// doctests of this package, which depends on every crate they use.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
