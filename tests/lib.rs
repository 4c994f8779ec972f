//! End-to-end tests of `outbox` live in `tests/` of this package; this library is
//! empty. Later tests against the real PostgreSQL, RabbitMQ and Redis join them here.
