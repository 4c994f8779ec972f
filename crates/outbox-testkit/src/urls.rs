//! The services' URLs and the reachability probe: what both `services` (the
//! local servers and the environment) and `containers` (Docker) need, kept apart
//! so neither imports the other back.

use std::net::TcpStream;
use std::time::Duration;

/// Connection URLs of the services under test.
#[derive(Debug, Clone)]
pub struct TestUrls {
    /// `OUTBOX_TEST_DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`.
    pub pg: String,
    /// `OUTBOX_TEST_AMQP_URL`, else `amqp://guest:guest@127.0.0.1:5672/%2f`.
    pub amqp: String,
    /// `OUTBOX_TEST_REDIS_URL`, else `redis://127.0.0.1:6379/`.
    pub redis: String,
}

/// Whether something accepts TCP connections at `addr`.
#[must_use]
pub fn answering(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).ok())
        .is_some()
}
