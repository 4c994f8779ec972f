//! A bulk action whose request goes away mid-way (the client disconnects, a
//! proxy times out: axum drops the handler's future) still runs to its end and
//! leaves the audit row that counts what it changed (issue 47).
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::Request;
use outbox_admin::{AdminAuth, AdminPorts, AdminService};
use outbox_core::{MessageId, OutboxStatus};
use outbox_ports::{
    BlockedKey, BulkOutcome, FailureGroup, KeyHead, MessageFilter, MessageSummary, MinuteCount,
    OutboxOperator, OutboxRecord, Page, PageCursor, PortError,
};
use support::{WRITE, harness, message, tokens};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// The memory store, with every bulk batch after the first waiting for `gate`.
struct Gated {
    inner: Arc<dyn OutboxOperator>,
    batches: AtomicU32,
    gate: Arc<Semaphore>,
}

impl Gated {
    async fn wait_after_the_first(&self) {
        if self.batches.fetch_add(1, Ordering::SeqCst) > 0 {
            self.gate.acquire().await.unwrap().forget();
        }
    }
}

#[async_trait]
impl OutboxOperator for Gated {
    async fn list_messages(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<Page<MessageSummary>, PortError> {
        self.inner.list_messages(filter, after, limit).await
    }
    async fn get_message(&self, id: MessageId) -> Result<Option<OutboxRecord>, PortError> {
        self.inner.get_message(id).await
    }
    async fn oldest_messages(
        &self,
        status: OutboxStatus,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, PortError> {
        self.inner.oldest_messages(status, limit).await
    }
    async fn requeue_message(&self, id: MessageId) -> Result<(), PortError> {
        self.inner.requeue_message(id).await
    }
    async fn replay_message(
        &self,
        original: MessageId,
        replay: outbox_core::Message,
    ) -> Result<(), PortError> {
        self.inner.replay_message(original, replay).await
    }
    async fn publish_now(&self, id: MessageId) -> Result<(), PortError> {
        self.inner.publish_now(id).await
    }
    async fn delete_message(&self, id: MessageId, force: bool) -> Result<(), PortError> {
        self.inner.delete_message(id, force).await
    }
    async fn count_messages(&self, filter: &MessageFilter, max: u64) -> Result<u64, PortError> {
        self.inner.count_messages(filter, max).await
    }
    async fn requeue_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        self.wait_after_the_first().await;
        self.inner.requeue_matching(filter, max).await
    }
    async fn delete_matching(
        &self,
        filter: &MessageFilter,
        max: u64,
        force: bool,
    ) -> Result<BulkOutcome, PortError> {
        self.wait_after_the_first().await;
        self.inner.delete_matching(filter, max, force).await
    }
    async fn published_per_minute(&self, window: Duration) -> Result<Vec<MinuteCount>, PortError> {
        self.inner.published_per_minute(window).await
    }
    async fn blocked_keys(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<BlockedKey>, PortError> {
        self.inner.blocked_keys(after, limit).await
    }
    async fn head_of_key(&self, key: &str) -> Result<Option<KeyHead>, PortError> {
        self.inner.head_of_key(key).await
    }
    async fn exchange_counts(&self) -> Result<Vec<outbox_ports::ExchangeCounts>, PortError> {
        self.inner.exchange_counts().await
    }

    async fn failure_groups(&self) -> Result<Vec<FailureGroup>, PortError> {
        self.inner.failure_groups().await
    }
}

#[tokio::test]
async fn a_bulk_requeue_whose_request_is_dropped_mid_way_is_still_audited_with_its_count() {
    let h = harness();
    for i in 0..10 {
        h.dead(message("orders", &format!("k{i}"), b"{}")).await;
    }
    let gate = Arc::new(Semaphore::new(0));
    let gated = Arc::new(Gated {
        inner: h.outbox.clone(),
        batches: AtomicU32::new(0),
        gate: Arc::clone(&gate),
    });
    let service = AdminService::new(AdminPorts {
        outbox: gated.clone(),
        inbox: h.inbox.clone(),
        audit: h.audit.clone(),
        outbox_store: h.outbox.clone(),
        pauses: Arc::new(h.outbox.pauses()),
    })
    .with_bulk_batch(3);
    let app = outbox_admin::router(service, AdminAuth::new(tokens()));
    let request = Request::builder()
        .method("POST")
        .uri("/messages/requeue")
        .header("authorization", format!("Bearer {WRITE}"))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"filter":{"status":"dead"}}"#))
        .unwrap();
    // The client gives up while the second batch waits: its future is dropped.
    let answer = tokio::time::timeout(Duration::from_millis(300), app.oneshot(request)).await;
    assert!(answer.is_err(), "the request was cut before it answered");
    assert!(
        gated.batches.load(Ordering::SeqCst) >= 2,
        "cut between batches"
    );
    gate.add_permits(1_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let entries = loop {
        let entries = h.audit_entries().await;
        if !entries.is_empty() || tokio::time::Instant::now() > deadline {
            break entries;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(entries.len(), 1, "one audit row: {entries:?}");
    assert_eq!(entries[0]["action"], "requeue_matching");
    assert_eq!(entries[0]["actor"], "token:ops");
    let (_, dead) = h.get("/messages?status=dead").await;
    let left = dead["items"].as_array().unwrap().len() as u64;
    assert_eq!(
        entries[0]["count"],
        10 - left,
        "the row counts what changed ({left} left dead)"
    );
    assert_eq!(left, 0, "the action ran to its end");
}
