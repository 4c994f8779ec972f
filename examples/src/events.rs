//! The shop's messages: Rust structs, JSON on the wire.

use outbox::Event;
use serde::{Deserialize, Serialize};

/// An order was placed: what the order service publishes and billing consumes.
/// Its body is `{"order_id": <integer>, "total_cents": <integer>}`; a producer in
/// another language writes that with `message_type = 'order.created'`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Event)]
#[event(type = "order.created", exchange = "shop.orders")]
pub struct OrderCreated {
    /// The order's id.
    pub order_id: i64,
    /// What it costs, in cents.
    pub total_cents: i64,
}
