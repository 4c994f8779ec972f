//! `#[derive(outbox::Event)]` through the facade, as an application writes it.

#![cfg(feature = "derive")]

use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox::Event)]
#[event(type = "order.created", exchange = "shop.orders")]
struct OrderCreated {
    order_id: u64,
    total_cents: u64,
}

/// The derive through the prelude's `Event` (trait and derive under one name).
#[derive(Debug, PartialEq, Serialize, Deserialize, Event)]
#[event(
    type = "order.shipped",
    exchange = "shop.shipping",
    version = 2,
    routing_key = "shipping.any"
)]
struct OrderShipped {
    order_id: u64,
    carrier: String,
}

#[test]
fn the_derive_sets_the_constants_and_keeps_the_defaults() {
    assert_eq!(OrderCreated::TYPE, "order.created");
    assert_eq!(OrderCreated::EXCHANGE, "shop.orders");
    assert_eq!(OrderCreated::VERSION, 1);
    let order = OrderCreated {
        order_id: 42,
        total_cents: 1999,
    };
    assert_eq!(order.routing_key(), "order.created");
    assert_eq!((order.ordering_key(), order.delay()), (None, None));

    assert_eq!(OrderShipped::TYPE, "order.shipped");
    assert_eq!(OrderShipped::EXCHANGE, "shop.shipping");
    assert_eq!(OrderShipped::VERSION, 2);
    let shipped = OrderShipped {
        order_id: 42,
        carrier: "post".into(),
    };
    assert_eq!(shipped.routing_key(), "shipping.any");
}

#[test]
fn a_derived_event_goes_through_a_message_and_back() {
    let shipped = OrderShipped {
        order_id: 42,
        carrier: "post".into(),
    };
    let message = outbox::event::to_new_message(&shipped).expect("valid");
    assert_eq!(message.exchange, "shop.shipping");
    assert_eq!(message.routing_key, "shipping.any");
    assert_eq!(message.message_type.as_deref(), Some("order.shipped"));
    assert_eq!(
        message
            .headers
            .get(outbox::event::VERSION_HEADER)
            .map(String::as_str),
        Some("2")
    );
    let now = outbox::Timestamp::now_utc();
    let received = message.into_message(new_message_id(now), now);
    assert_eq!(
        outbox::event::decode::<OrderShipped>(&received).expect("decodes"),
        shipped
    );
    // The same message is not an OrderCreated, and says so.
    let err = outbox::event::decode::<OrderCreated>(&received).expect_err("another type");
    assert!(err.is_permanent());
    assert!(err.to_string().contains("derive::OrderCreated"), "{err}");
}
