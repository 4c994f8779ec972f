//! Mocks of the wide stores, whose capabilities are split over supertraits (which
//! `automock` cannot follow): `MockOutboxStore` and `MockInboxStore` implement the
//! store and each of its small traits, so tests keep one mock per store.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Decision, Message, MessageId};

use crate::{
    Arrival, ClaimedDelivery, ClaimedMessage, DeadLetter, InboxConsumerPath, InboxStats,
    InboxStore, Lease, OutboxRelayPath, OutboxRetention, OutboxStats, OutboxStore, PortError,
    PublishFailure,
};

mockall::mock! {
    /// A mock [`OutboxStore`] (with its relay path and retention).
    pub OutboxStore {}

    #[async_trait]
    impl OutboxRelayPath for OutboxStore {
        async fn claim_pending(&self, lease: &Lease, limit: u32) -> Result<Vec<ClaimedMessage>, PortError>;
        async fn claim_due_retries(&self, lease: &Lease, limit: u32) -> Result<Vec<ClaimedMessage>, PortError>;
        async fn mark_sent(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError>;
        async fn mark_publish_failed(&self, lease: &Lease, failures: &[PublishFailure]) -> Result<u64, PortError>;
        async fn release(&self, lease: &Lease, ids: &[MessageId]) -> Result<u64, PortError>;
        async fn recover_expired_leases(&self) -> Result<u64, PortError>;
        async fn next_due_in(&self) -> Result<Option<std::time::Duration>, PortError>;
    }

    #[async_trait]
    impl OutboxRetention for OutboxStore {
        async fn delete_sent_batch(&self, age: Duration, limit: u32) -> Result<u64, PortError>;
    }

    #[async_trait]
    impl OutboxStore for OutboxStore {
        async fn enqueue(&self, messages: Vec<Message>) -> Result<(), PortError>;
        async fn stats(&self) -> Result<OutboxStats, PortError>;
    }
}

mockall::mock! {
    /// A mock [`InboxStore`] (with its consumer path).
    pub InboxStore {}

    #[async_trait]
    impl InboxConsumerPath for InboxStore {
        async fn record_arrival(&self, consumer: &str, message: &Message, lease: &Lease) -> Result<Arrival, PortError>;
        async fn hold_behind_key(&self, consumer: &str, message: &Message) -> Result<bool, PortError>;
        async fn mark_consumed(&self, consumer: &str, id: MessageId, lease: &Lease) -> Result<bool, PortError>;
        async fn mark_consume_failed(&self, consumer: &str, id: MessageId, lease: &Lease, error: &str, decision: Decision) -> Result<bool, PortError>;
        async fn claim_due(&self, consumer: &str, lease: &Lease, limit: u32) -> Result<Vec<ClaimedDelivery>, PortError>;
        async fn record_given_up(&self, consumer: &str, message: &Message, reason: &str) -> Result<bool, PortError>;
        async fn record_dead_letter(&self, consumer: &str, letter: DeadLetter) -> Result<(), PortError>;
    }

    #[async_trait]
    impl InboxStore for InboxStore {
        async fn stats(&self, consumer: &str) -> Result<InboxStats, PortError>;
    }
}
