//! The derive through `#[event(crate = outbox_core)]`, for a crate that depends on
//! `outbox-core` rather than the facade.

use outbox_core::Event;
use outbox_core::event::{self, VERSION_HEADER};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize, outbox_macros::Event)]
#[event(crate = outbox_core, type = "order.created", exchange = "shop.orders", version = 2)]
struct OrderCreated {
    order_id: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, outbox_macros::Event)]
#[event(
    crate = "outbox_core",
    type = "order.paid",
    exchange = "",
    routing_key = "billing"
)]
enum OrderPaid {
    Card { order_id: u64 },
    Invoice { order_id: u64, due_days: u32 },
}

#[test]
fn the_derive_names_the_trait_through_the_given_crate() {
    assert_eq!(OrderCreated::TYPE, "order.created");
    assert_eq!(OrderCreated::EXCHANGE, "shop.orders");
    assert_eq!(OrderCreated::VERSION, 2);
    let order = OrderCreated { order_id: 7 };
    assert_eq!(order.routing_key(), "order.created");
    assert_eq!((order.ordering_key(), order.delay()), (None, None));

    let message = event::to_new_message(&order).expect("valid");
    assert_eq!(
        message.headers.get(VERSION_HEADER).map(String::as_str),
        Some("2")
    );
    let received = message.into_message(
        outbox_core::MessageId::v7(outbox_core::Timestamp::UNIX_EPOCH, [1; 10]),
        outbox_core::Timestamp::UNIX_EPOCH,
    );
    assert_eq!(
        event::decode::<OrderCreated>(&received).expect("decodes"),
        order
    );
}

#[test]
fn a_fixed_routing_key_and_the_default_version() {
    assert_eq!(OrderPaid::VERSION, 1);
    assert_eq!(OrderPaid::EXCHANGE, "");
    let paid = OrderPaid::Invoice {
        order_id: 1,
        due_days: 30,
    };
    assert_eq!(paid.routing_key(), "billing");
    let message = event::to_new_message(&paid).expect("valid");
    assert_eq!(message.routing_key, "billing");
    assert_eq!(message.message_type.as_deref(), Some("order.paid"));
    assert!(matches!(
        OrderPaid::Card { order_id: 1 },
        OrderPaid::Card { .. }
    ));
}
