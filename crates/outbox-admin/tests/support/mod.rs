//! A router over the memory adapters, seeded messages, and a request helper.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use outbox_adapters_memory::{
    MemoryAuditLog, MemoryInboxStore, MemoryOutboxStore, MemorySweepState,
};
use outbox_admin::{AdminAuth, AdminPorts, AdminService, AdminToken, Redaction, Role, Secret};
use outbox_core::{Decision, Message, MessageId, NewMessage};
use outbox_ports::prelude::*;
use outbox_ports::{Arrival, DeadLetter, Lease, OutboxStore, PublishFailure, SystemClock};
use serde_json::Value;
use tower::ServiceExt;

pub const READ: &str = "read-secret-0123456789";
pub const WRITE: &str = "write-secret-0123456789";

pub struct Harness {
    pub outbox: Arc<MemoryOutboxStore>,
    pub inbox: Arc<MemoryInboxStore>,
    pub audit: Arc<MemoryAuditLog>,
    pub state: Arc<MemorySweepState>,
    pub app: Router,
}

pub fn tokens() -> Vec<AdminToken> {
    vec![
        AdminToken {
            name: "viewer".into(),
            secret: Secret::new(READ),
            role: Role::Read,
        },
        AdminToken {
            name: "ops".into(),
            secret: Secret::new(WRITE),
            role: Role::Write,
        },
    ]
}

pub fn harness_with(tokens: Vec<AdminToken>, redaction: Redaction) -> Harness {
    harness_configured(tokens, |service| service.with_redaction(redaction))
}

/// A harness whose service `configure` sets up further (charts, locks, ...).
pub fn harness_configured(
    tokens: Vec<AdminToken>,
    configure: impl FnOnce(AdminService) -> AdminService,
) -> Harness {
    let clock = Arc::new(SystemClock);
    let outbox = Arc::new(MemoryOutboxStore::new(clock.clone()));
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()).with_pauses(&outbox.pauses()));
    let audit = Arc::new(MemoryAuditLog::new(clock.clone()));
    let state = Arc::new(MemorySweepState::new(clock));
    let service = AdminService::new(AdminPorts {
        outbox: outbox.clone(),
        inbox: inbox.clone(),
        audit: audit.clone(),
        outbox_store: outbox.clone(),
        pauses: Arc::new(outbox.pauses()),
    })
    .with_sweep_reports(state.clone(), vec!["relay-sweep".into()]);
    let app = outbox_admin::router(configure(service), AdminAuth::new(tokens));
    Harness {
        outbox,
        inbox,
        audit,
        state,
        app,
    }
}

pub fn harness() -> Harness {
    harness_with(tokens(), Redaction::default())
}

pub fn message(exchange: &str, routing_key: &str, payload: &[u8]) -> Message {
    let now = time::OffsetDateTime::now_utc();
    NewMessage::new(exchange, routing_key, payload.to_vec())
        .with_type("order.created")
        .into_message(MessageId::v7(now, rand_bytes()), now)
}

fn rand_bytes() -> [u8; 10] {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let c = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut out = [0u8; 10];
    out[..8].copy_from_slice(&c.to_be_bytes());
    out[8..].copy_from_slice(&(n as u16).to_be_bytes());
    out
}

impl Harness {
    pub async fn pending(&self, m: Message) -> MessageId {
        let id = m.id;
        self.outbox.enqueue(vec![m]).await.expect("enqueue");
        id
    }

    /// Enqueued, claimed and failed for good (with every other pending message:
    /// tests make dead messages first).
    pub async fn dead(&self, m: Message) -> MessageId {
        let id = self.pending(m).await;
        let lease = Lease::new(format!("t-{id}"), Duration::from_secs(30));
        let claimed = self
            .outbox
            .claim_pending(&lease, 1000)
            .await
            .expect("claim");
        let failures: Vec<PublishFailure> = claimed
            .iter()
            .map(|c| PublishFailure {
                id: c.message.id,
                error: "broker said no".into(),
                decision: Decision::Dead,
            })
            .collect();
        self.outbox
            .mark_publish_failed(&lease, &failures)
            .await
            .expect("mark");
        id
    }

    /// Received by `consumer`; consumed when `consumed`, else dead.
    pub async fn delivered(&self, consumer: &str, m: &Message, consumed: bool) {
        let lease = Lease::new(format!("c-{}", m.id), Duration::from_secs(30));
        let arrival = self
            .inbox
            .record_arrival(consumer, m, &lease)
            .await
            .expect("arrival");
        assert_eq!(arrival, Arrival::New);
        if consumed {
            self.inbox
                .mark_consumed(consumer, m.id, &lease)
                .await
                .expect("consumed");
        } else {
            self.inbox
                .mark_consume_failed(consumer, m.id, &lease, "handler failed", Decision::Dead)
                .await
                .expect("failed");
        }
    }

    pub async fn dead_letter(&self, consumer: &str, body: &[u8]) {
        self.inbox
            .record_dead_letter(
                consumer,
                DeadLetter {
                    message_id: None,
                    routing_key: "orders.created".into(),
                    headers: [("x-token".to_owned(), "abc".to_owned())].into(),
                    body: body.to_vec(),
                    reason: "no message id".into(),
                },
            )
            .await
            .expect("dead letter");
    }

    pub async fn call(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Body::from(body.unwrap_or_default().to_owned()))
            .expect("request");
        let response = self.app.clone().oneshot(request).await.expect("response");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
            .await
            .expect("body");
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    pub async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.call("GET", uri, Some(READ), None).await
    }

    pub async fn write(&self, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
        self.call(method, uri, Some(WRITE), body).await
    }

    pub async fn audit_entries(&self) -> Vec<Value> {
        let (status, page) = self.get("/audit").await;
        assert_eq!(status, StatusCode::OK);
        page["items"].as_array().cloned().unwrap_or_default()
    }
}

pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}
