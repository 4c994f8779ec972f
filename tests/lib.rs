//! End-to-end tests of `outbox` live in `tests/` of this package; this library is
//! empty. Later tests against the real PostgreSQL, RabbitMQ and Redis join them here.

/// The README's Rust examples, compiled (and run where they need no server) as
/// doctests of this package, which depends on every crate they use.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of `docs/`, compiled (and run where they need no server) like
/// the README's: one struct per file that holds any.
#[cfg(doctest)]
#[doc = include_str!("../docs/relay.md")]
pub struct RelayDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/consumers.md")]
pub struct ConsumersDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/delayed.md")]
pub struct DelayedDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/adapters.md")]
pub struct AdaptersDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/tls.md")]
pub struct TlsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/admin.md")]
pub struct AdminDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/typed-messages.md")]
pub struct TypedMessagesDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/cluster.md")]
pub struct ClusterDoctests;
