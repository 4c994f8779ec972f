//! `AdminService`: the operator's actions over the ports, shared by the HTTP API
//! and the CLI. Every write is recorded in the audit log; every payload and header
//! view goes through the redaction lists.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{InboxStatus, Lifecycle, Message, MessageId, OutboxStatus, Side, SideState};
use outbox_ports::{
    AuditEntry, AuditLog, BulkOutcome, Clock, DeliveryFilter, DistributedLock, InboxOperator,
    InboxRecord, MessageFilter, MessageSummary, MinuteCount, OutboxOperator, OutboxStore,
    PREVIEW_BYTES, Page, PageCursor, Pause, PauseKind, PauseStore, PortError, StoredDeadLetter,
    SweepStateStore, SystemClock, ThroughputKind, ThroughputLog, deletable_statuses,
    reconsumable_statuses, requeueable_statuses,
};

use crate::AdminError;
use crate::model::{
    AuditItem, AuditPage, BlockedKeyItem, BlockedKeyPage, BulkProgress, BulkResponse, ConsumeSide,
    ConsumerItem, DeadLetterPage, DeadLetterView, ExchangeItem, FailedAttemptItem,
    FailureGroupItem, FailureGroups, LockItem, MessageDetail, MessageItem, MessagePage, MinuteItem,
    OutboxCounts, PauseItem, PauseKindItem, PauseList, PauseState, QueueItem, StatsPrecision,
    StatsResponse, SweepItem,
};
use crate::params::{encode_cursor, format_time};
use crate::redact::{Redaction, is_textual};

/// Entries a bulk action changes per batch unless [`AdminService::with_bulk_batch`]
/// says otherwise (each batch is one statement of the store).
pub const DEFAULT_BULK_BATCH: u64 = 1_000;

mod replay;
mod throughput;

/// A bulk action's progress callback.
pub type OnBatch<'a> = &'a mut (dyn FnMut(BulkProgress) + Send);

/// What a bulk action does to each entry it picks, on its side `S`: how it
/// counts, which statuses it changes, one batch of it, and its audit name. It is
/// moved into the task that changes the entries and audits them (`run_bulk`).
#[async_trait]
trait BulkAction<S: Lifecycle>: Send + Sync + 'static {
    /// The audit log's action, and its target from the filter as written.
    fn audited(&self, target: String) -> (&'static str, String);
    /// The statuses it changes, each in its own batches.
    fn statuses(&self, filter: &MessageFilter<S>) -> Vec<S>;
    /// Entries matching `filter`, counted up to `max`.
    async fn count(
        &self,
        ports: &AdminPorts,
        filter: &MessageFilter<S>,
        max: u64,
    ) -> Result<u64, PortError>;
    /// One batch: changes up to `max` entries matching `filter`.
    async fn apply(
        &self,
        ports: &AdminPorts,
        filter: &MessageFilter<S>,
        max: u64,
    ) -> Result<BulkOutcome, PortError>;
}

/// Outbox messages back to pending.
struct Requeue;

/// Outbox messages removed (`force`: also those not yet sent).
struct Delete {
    force: bool,
}

/// One consumer's deliveries run through their handler again.
struct Reconsume {
    consumer: String,
}

#[async_trait]
impl BulkAction<OutboxStatus> for Requeue {
    fn audited(&self, target: String) -> (&'static str, String) {
        ("requeue_matching", target)
    }

    fn statuses(&self, _: &MessageFilter) -> Vec<OutboxStatus> {
        requeueable_statuses()
    }

    async fn count(
        &self,
        ports: &AdminPorts,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<u64, PortError> {
        ports.outbox.count_messages(filter, max).await
    }

    async fn apply(
        &self,
        ports: &AdminPorts,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        ports.outbox.requeue_matching(filter, max).await
    }
}

#[async_trait]
impl BulkAction<OutboxStatus> for Delete {
    fn audited(&self, target: String) -> (&'static str, String) {
        if self.force {
            ("delete_matching_forced", target)
        } else {
            ("delete_matching", target)
        }
    }

    fn statuses(&self, _: &MessageFilter) -> Vec<OutboxStatus> {
        deletable_statuses(self.force)
    }

    async fn count(
        &self,
        ports: &AdminPorts,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<u64, PortError> {
        ports.outbox.count_messages(filter, max).await
    }

    async fn apply(
        &self,
        ports: &AdminPorts,
        filter: &MessageFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        ports.outbox.delete_matching(filter, max, self.force).await
    }
}

#[async_trait]
impl BulkAction<InboxStatus> for Reconsume {
    fn audited(&self, target: String) -> (&'static str, String) {
        ("reconsume_matching", format!("{} {target}", self.consumer))
    }

    fn statuses(&self, filter: &DeliveryFilter) -> Vec<InboxStatus> {
        reconsumable_statuses(filter)
    }

    async fn count(
        &self,
        ports: &AdminPorts,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<u64, PortError> {
        ports
            .inbox
            .count_deliveries(&self.consumer, filter, max)
            .await
    }

    async fn apply(
        &self,
        ports: &AdminPorts,
        filter: &DeliveryFilter,
        max: u64,
    ) -> Result<BulkOutcome, PortError> {
        ports
            .inbox
            .reconsume_matching(&self.consumer, filter, max)
            .await
    }
}

/// Which entries a bulk action picks, and how the caller wrote it (for the audit
/// log).
struct Bulk<'a, S: Lifecycle> {
    filter: &'a MessageFilter<S>,
    target: String,
    dry_run: bool,
    max: u64,
}

impl<'a, S: Lifecycle> Bulk<'a, S> {
    fn new(filter: &'a MessageFilter<S>, target: String, dry_run: bool, max: u64) -> Self {
        Self {
            filter,
            target,
            dry_run,
            max,
        }
    }
}

/// How far back the per-minute counts of `stats` go.
const CHART_WINDOW: Duration = Duration::from_secs(3600);

/// The ports the admin service works through.
#[derive(Clone)]
pub struct AdminPorts {
    /// Listing and acting on outbox messages.
    pub outbox: Arc<dyn OutboxOperator>,
    /// Listing and acting on deliveries and dead letters.
    pub inbox: Arc<dyn InboxOperator>,
    /// Where writes are recorded.
    pub audit: Arc<dyn AuditLog>,
    /// The outbox's cheap counts (`stats`).
    pub outbox_store: Arc<dyn OutboxStore>,
    /// The pauses operators set; the stores' claims and consumers read the same.
    pub pauses: Arc<dyn PauseStore>,
}

/// How many of one message's or delivery's recorded actions its page shows.
pub(crate) const ACTIONS_SHOWN: u32 = 20;

/// The operator's actions.
#[derive(Clone)]
pub struct AdminService {
    ports: AdminPorts,
    redaction: Redaction,
    sweeps: Option<(Arc<dyn SweepStateStore>, Vec<String>)>,
    throughput: Option<Arc<dyn ThroughputLog>>,
    locks: Option<(Arc<dyn DistributedLock>, Vec<String>)>,
    queues: Option<Arc<dyn outbox_ports::QueueDepths>>,
    clock: Arc<dyn Clock>,
    bulk_batch: u64,
    edit: bool,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService")
            .field("redaction", &self.redaction)
            .field("sweep_keys", &self.sweeps.as_ref().map(|(_, keys)| keys))
            .finish_non_exhaustive()
    }
}

fn to_response(outcome: BulkOutcome) -> BulkResponse {
    BulkResponse {
        matched: outcome.matched,
        changed: outcome.changed,
    }
}

fn minutes(counts: Vec<MinuteCount>) -> Vec<MinuteItem> {
    counts
        .into_iter()
        .map(|m| MinuteItem {
            minute: format_time(m.minute),
            count: m.count,
        })
        .collect()
}

fn consume_side(record: &InboxRecord) -> ConsumeSide {
    ConsumeSide {
        consumer: record.consumer.clone(),
        status: record.status.as_str().to_owned(),
        attempts: record.consume.attempts,
        last_attempt_at: record.consume.last_attempt_at.map(format_time),
        next_attempt_at: record.consume.next_attempt_at.map(format_time),
        last_error: record.consume.last_error.clone(),
        failed_attempts: failed_attempts(&record.consume),
        consumed_at: record.consume.completed_at.map(format_time),
    }
}

fn failed_attempts(state: &SideState) -> Vec<FailedAttemptItem> {
    state
        .failed_attempts
        .iter()
        .map(|a| FailedAttemptItem {
            attempt: a.attempt,
            at: format_time(a.at),
            error: a.error.clone(),
        })
        .collect()
}

impl AdminService {
    /// Over these ports, with nothing redacted and no sweep reports.
    #[must_use]
    pub fn new(ports: AdminPorts) -> Self {
        Self {
            ports,
            redaction: Redaction::default(),
            sweeps: None,
            throughput: None,
            locks: None,
            queues: None,
            clock: Arc::new(SystemClock),
            bulk_batch: DEFAULT_BULK_BATCH,
            edit: false,
        }
    }

    /// Hides these headers and JSON keys in every payload and header view.
    #[must_use]
    pub fn with_redaction(mut self, redaction: Redaction) -> Self {
        self.redaction = redaction;
        self
    }

    /// Shows the last report stored under each of `keys` in `stats`.
    #[must_use]
    pub fn with_sweep_reports(
        mut self,
        state: Arc<dyn SweepStateStore>,
        keys: Vec<String>,
    ) -> Self {
        self.sweeps = Some((state, keys));
        self
    }

    /// Shows in `stats` whether each of the sweep lock `keys` is held now.
    #[must_use]
    pub fn with_locks(mut self, lock: Arc<dyn DistributedLock>, keys: Vec<String>) -> Self {
        self.locks = Some((lock, keys));
        self
    }

    /// Shows in `stats` the depth of the consumers' queues as the broker reports
    /// them (what left the outbox and waits to be consumed).
    #[must_use]
    pub fn with_queue_depths(mut self, queues: Arc<dyn outbox_ports::QueueDepths>) -> Self {
        self.queues = Some(queues);
        self
    }

    /// Reads the per-minute charts from the totals every relay and consumer add to
    /// `log` (a few rows), instead of counting the tables' rows of the last hour
    /// (as many rows as went through in that hour).
    #[must_use]
    pub fn with_throughput(mut self, log: Arc<dyn ThroughputLog>) -> Self {
        self.throughput = Some(log);
        self
    }

    /// Bulk actions change at most `batch` entries per batch (at least 1;
    /// [`DEFAULT_BULK_BATCH`] unless set), telling their progress after each.
    #[must_use]
    pub fn with_bulk_batch(mut self, batch: u64) -> Self {
        self.bulk_batch = batch.max(1);
        self
    }

    /// Reads "now" (for the oldest unsent age) from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: String,
        count: u64,
    ) -> Result<(), AdminError> {
        let entry = AuditEntry {
            actor: actor.to_owned(),
            action: action.to_owned(),
            target,
            count,
            at: None,
        };
        self.ports
            .audit
            .record(entry)
            .await
            .map_err(AdminError::AuditFailed)
    }

    fn item<S: Lifecycle>(&self, summary: MessageSummary<S>) -> MessageItem {
        let truncated = summary.payload_size > summary.payload_preview.len() as u64;
        let preview = self
            .redaction
            .bytes(&summary.payload_preview, truncated, true);
        MessageItem {
            id: summary.id.to_string(),
            status: summary.status.as_str().to_owned(),
            exchange: summary.exchange,
            routing_key: summary.routing_key,
            message_type: summary.message_type,
            correlation_id: summary.correlation_id,
            created_at: format_time(summary.created_at),
            received_at: summary.received_at.map(format_time),
            attempts: summary.attempts,
            last_error: summary.last_error,
            next_attempt_at: summary.next_attempt_at.map(format_time),
            due_at: summary.due_at.map(format_time),
            completed_at: summary.completed_at.map(format_time),
            payload_preview: preview.text,
            payload_preview_base64: preview.base64,
            payload_redacted: preview.redacted,
            payload_size: summary.payload_size,
        }
    }

    fn page<S: Lifecycle>(&self, page: Page<MessageSummary<S>>) -> MessagePage {
        MessagePage {
            items: page.items.into_iter().map(|s| self.item(s)).collect(),
            next_cursor: page.next.map(encode_cursor),
        }
    }

    fn detail<S: Lifecycle>(
        &self,
        message: &Message,
        status: S,
        state: &SideState,
        deliveries: Vec<ConsumeSide>,
    ) -> MessageDetail {
        let payload =
            self.redaction
                .bytes(&message.payload, false, is_textual(&message.content_type));
        MessageDetail {
            id: message.id.to_string(),
            status: status.as_str().to_owned(),
            exchange: message.exchange.clone(),
            routing_key: message.routing_key.clone(),
            ordering_key: message.ordering_key.clone(),
            waits_behind: None,
            waiting_behind: None,
            message_type: message.message_type.clone(),
            headers: self.redaction.headers(&message.headers),
            content_type: message.content_type.clone(),
            source: message.source.clone(),
            correlation_id: message.correlation_id.clone(),
            created_at: format_time(message.created_at),
            payload: payload.text,
            payload_base64: payload.base64,
            payload_redacted: payload.redacted,
            payload_size: message.payload.len() as u64,
            attempts: state.attempts,
            last_attempt_at: state.last_attempt_at.map(format_time),
            next_attempt_at: state.next_attempt_at.map(format_time),
            due_at: match S::SIDE {
                Side::Outbox => message.not_before.map(format_time),
                Side::Inbox => None,
            },
            last_error: state.last_error.clone(),
            failed_attempts: failed_attempts(state),
            completed_at: state.completed_at.map(format_time),
            deliveries,
            replayed_from: None,
            replayed_as: None,
        }
    }

    fn dead_letter(&self, letter: StoredDeadLetter, whole: bool) -> DeadLetterView {
        let body_size = letter.body_size;
        // A list page's letters hold only the start of their body already.
        let shown_len = if whole {
            letter.body.len()
        } else {
            letter.body.len().min(PREVIEW_BYTES)
        };
        let truncated = (shown_len as u64) < body_size;
        let shown = self
            .redaction
            .bytes(&letter.body[..shown_len], truncated, true);
        DeadLetterView {
            id: letter.id,
            consumer: letter.consumer,
            message_id: letter.message_id,
            routing_key: letter.routing_key,
            reason: letter.reason,
            received_at: format_time(letter.received_at),
            headers: self.redaction.headers(&letter.headers),
            body: shown.text,
            body_base64: shown.base64,
            body_redacted: shown.redacted,
            body_size,
        }
    }

    /// Counts, per-minute throughput and the last sweep reports.
    ///
    /// # Errors
    /// What the stores say.
    pub async fn stats(&self) -> Result<StatsResponse, AdminError> {
        let counts = self.ports.outbox_store.stats().await?;
        let consumers = self.consumers().await?;
        let per_minute_of = async |kind| match &self.throughput {
            Some(log) => log.per_minute(kind, CHART_WINDOW).await,
            None => Ok(Vec::new()),
        };
        let (published, consumed, per_minute) = match &self.throughput {
            Some(_) => (
                per_minute_of(ThroughputKind::Published).await?,
                per_minute_of(ThroughputKind::Consumed).await?,
                "recorded",
            ),
            None => (
                self.ports.outbox.published_per_minute(CHART_WINDOW).await?,
                self.ports.inbox.consumed_per_minute(CHART_WINDOW).await?,
                "exact",
            ),
        };
        // Failed attempts are only in the per-minute totals: a row keeps its last
        // few, not a count per minute that an index could serve.
        let publish_failed = per_minute_of(ThroughputKind::PublishFailed).await?;
        let consume_failed = per_minute_of(ThroughputKind::ConsumeFailed).await?;
        let failures_per_minute = if self.throughput.is_some() {
            "recorded"
        } else {
            "not_recorded"
        };
        let now = self.clock.now();
        let mut sweeps = Vec::new();
        if let Some((state, keys)) = &self.sweeps {
            for key in keys {
                // A sweep state that cannot be read makes that report unknown, not
                // the whole dashboard unavailable.
                let report = state.get(key).await;
                let available = report.is_ok();
                let report = report.ok().flatten();
                sweeps.push(SweepItem {
                    key: key.clone(),
                    available,
                    started_at: report.as_ref().map(|r| format_time(r.started_at)),
                    completed_at: report.as_ref().map(|r| format_time(r.completed_at)),
                    publish_retried: report.as_ref().map(|r| r.publish_retried),
                    publish_failed: report.as_ref().map(|r| r.publish_failed),
                    consume_retried: report.as_ref().map(|r| r.consume_retried),
                    consume_failed: report.as_ref().map(|r| r.consume_failed),
                });
            }
        }
        let mut locks = Vec::new();
        if let Some((lock, keys)) = &self.locks {
            for key in keys {
                // A lock service that does not answer makes that flag unknown, not
                // the whole dashboard unavailable.
                locks.push(LockItem {
                    key: key.clone(),
                    held: lock.is_locked(key).await.ok(),
                });
            }
        }
        let pauses = self.pause_items().await?;
        let exchanges = self.exchange_items(&pauses, now).await?;
        // A broker that does not answer makes the depths unknown, not the whole
        // dashboard unavailable.
        let (queues, queues_precision) = match &self.queues {
            None => (Vec::new(), "not_configured".to_owned()),
            Some(q) => match q.queue_depths().await {
                Ok(depths) => (
                    depths
                        .into_iter()
                        .map(|d| QueueItem {
                            name: d.queue,
                            messages: d.messages,
                            consumers: d.consumers,
                        })
                        .collect(),
                    "broker".to_owned(),
                ),
                Err(e) => (Vec::new(), format!("unavailable: {e}")),
            },
        };
        Ok(StatsResponse {
            outbox: OutboxCounts {
                pending: counts.pending,
                scheduled: counts.scheduled,
                publish_failed: counts.publish_failed,
                dead: counts.dead,
                blocked_keys: counts.blocked_keys,
                sent: None,
                oldest_unsent_at: counts.oldest_unsent_at.map(format_time),
                oldest_unsent_age_seconds: counts
                    .oldest_unsent_at
                    .map(|at| outbox_core::saturating_elapsed(at, now).as_secs()),
            },
            exchanges,
            queues,
            consumers,
            published_per_minute: minutes(published),
            consumed_per_minute: minutes(consumed),
            publish_failed_per_minute: minutes(publish_failed),
            consume_failed_per_minute: minutes(consume_failed),
            sweeps,
            locks,
            pauses,
            precision: StatsPrecision {
                outbox: "exact".into(),
                outbox_sent: "not_counted".into(),
                consumers: "exact; consumed null where not counted".into(),
                per_minute: per_minute.into(),
                failures_per_minute: failures_per_minute.into(),
                queues: queues_precision,
            },
        })
    }

    /// Each exchange with an unsent or dead message, and each paused one, by
    /// name: its counts and its oldest unsent message's age at `now`.
    async fn exchange_items(
        &self,
        pauses: &[PauseItem],
        now: outbox_core::Timestamp,
    ) -> Result<Vec<ExchangeItem>, AdminError> {
        let paused: std::collections::BTreeSet<&str> = pauses
            .iter()
            .filter(|p| p.kind == PauseKindItem::Exchange)
            .map(|p| p.name.as_str())
            .collect();
        let mut items: std::collections::BTreeMap<String, ExchangeItem> = self
            .ports
            .outbox
            .exchange_counts()
            .await?
            .into_iter()
            .map(|c| {
                let item = ExchangeItem {
                    paused: paused.contains(c.exchange.as_str()),
                    name: c.exchange.clone(),
                    pending: c.pending,
                    publish_failed: c.publish_failed,
                    dead: c.dead,
                    oldest_unsent_age_s: c
                        .oldest_unsent_at
                        .map(|at| outbox_core::saturating_elapsed(at, now).as_secs()),
                };
                (c.exchange, item)
            })
            .collect();
        for name in paused {
            items
                .entry(name.to_owned())
                .or_insert_with(|| ExchangeItem {
                    name: name.to_owned(),
                    pending: 0,
                    publish_failed: 0,
                    dead: 0,
                    oldest_unsent_age_s: None,
                    paused: true,
                });
        }
        Ok(items.into_values().collect())
    }

    /// A page of outbox messages.
    ///
    /// # Errors
    /// What the store says.
    pub async fn list_messages(
        &self,
        filter: &MessageFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<MessagePage, AdminError> {
        let page = self
            .ports
            .outbox
            .list_messages(filter, after, limit)
            .await?;
        Ok(self.page(page))
    }

    /// A page of the blocked ordering keys, in key order, after key `after`. The
    /// head's last error is shown as every message view shows it (errors are not
    /// redacted: the redaction lists apply to headers and payloads).
    ///
    /// # Errors
    /// What the store says.
    pub async fn blocked_keys(
        &self,
        after: Option<String>,
        limit: u32,
    ) -> Result<BlockedKeyPage, AdminError> {
        let keys = self.ports.outbox.blocked_keys(after, limit).await?;
        // Against the limit the store applied (clamped), so a caller asking for
        // more than a page still gets a cursor when the page is full.
        let full = keys.len() >= outbox_ports::page_limit(limit) as usize;
        let next_after = keys.last().filter(|_| full).map(|k| k.key.clone());
        Ok(BlockedKeyPage {
            items: keys
                .into_iter()
                .map(|k| BlockedKeyItem {
                    key: k.key,
                    head_id: k.head.to_string(),
                    head_status: k.status.as_str().to_owned(),
                    head_attempts: k.attempts,
                    head_last_error: k.last_error,
                    head_next_attempt_at: k.next_attempt_at.map(format_time),
                    waiting: k.waiting,
                    waiting_capped: k.waiting_capped,
                })
                .collect(),
            next_after,
        })
    }

    /// One message with its publish side and every consumer's side.
    ///
    /// # Errors
    /// `NotFound`, or what the stores say.
    pub async fn get_message(&self, id: MessageId) -> Result<MessageDetail, AdminError> {
        let record = self
            .ports
            .outbox
            .get_message(id)
            .await?
            .ok_or_else(|| not_found("message", id))?;
        let deliveries = self.ports.inbox.deliveries_of(id).await?;
        let sides = deliveries.iter().map(consume_side).collect();
        let mut detail = self.detail(&record.message, record.status, &record.publish, sides);
        detail.replayed_from = record.replayed_from.map(|r| r.to_string());
        detail.replayed_as = record.replayed_as.map(|r| r.to_string());
        // A keyed message that waits: the head it waits behind; the head: what waits
        // behind it (what deleting or requeueing it releases).
        let unsent = matches!(
            record.status,
            OutboxStatus::Pending | OutboxStatus::PublishFailed | OutboxStatus::Dead
        );
        if let (Some(key), true) = (record.message.ordering_key.as_deref(), unsent)
            && let Some(head) = self.ports.outbox.head_of_key(key).await?
        {
            if head.head == id {
                detail.waiting_behind = Some(head.waiting);
            } else if record.status == OutboxStatus::Pending {
                detail.waits_behind = Some(head.head.to_string());
            }
        }
        Ok(detail)
    }

    /// Requeues one message.
    ///
    /// # Errors
    /// `NotFound`, `IllegalTransition`, or what the stores say.
    pub async fn requeue_message(&self, actor: &str, id: MessageId) -> Result<(), AdminError> {
        self.ports.outbox.requeue_message(id).await?;
        self.audit(actor, "requeue", id.to_string(), 1).await
    }

    /// A delayed message due now (audited as `publish_now`).
    ///
    /// # Errors
    /// `NotFound`, `IllegalTransition` when it is not pending, or what the stores
    /// say.
    pub async fn publish_now(&self, actor: &str, id: MessageId) -> Result<(), AdminError> {
        self.ports.outbox.publish_now(id).await?;
        self.audit(actor, "publish_now", id.to_string(), 1).await
    }

    /// Deletes one message.
    ///
    /// # Errors
    /// `NotFound`, `NotDeletable`, or what the stores say.
    pub async fn delete_message(
        &self,
        actor: &str,
        id: MessageId,
        force: bool,
    ) -> Result<(), AdminError> {
        self.ports.outbox.delete_message(id, force).await?;
        let action = if force { "delete_forced" } else { "delete" };
        self.audit(actor, action, id.to_string(), 1).await
    }

    /// Requeues up to `max` messages matching `filter` (`dry_run`: counts only).
    /// `target` is the filter as the caller wrote it, for the audit log.
    ///
    /// # Errors
    /// What the stores say.
    pub async fn requeue_matching(
        &self,
        actor: &str,
        filter: &MessageFilter,
        target: String,
        dry_run: bool,
        max: u64,
    ) -> Result<BulkResponse, AdminError> {
        let bulk = Bulk::new(filter, target, dry_run, max);
        self.run_bulk(actor, Requeue, bulk, &mut |_| {}).await
    }

    /// [`Self::requeue_matching`], calling `on_batch` after each batch with the
    /// count matched and the count changed so far (not on a dry run).
    ///
    /// # Errors
    /// What the stores say; what was changed before an error stays changed and
    /// is recorded in the audit log.
    pub async fn requeue_matching_with_progress(
        &self,
        actor: &str,
        filter: &MessageFilter,
        target: String,
        dry_run: bool,
        max: u64,
        on_batch: OnBatch<'_>,
    ) -> Result<BulkResponse, AdminError> {
        let bulk = Bulk::new(filter, target, dry_run, max);
        self.run_bulk(actor, Requeue, bulk, on_batch).await
    }

    /// Deletes up to `max` messages matching `filter` (`dry_run`: counts only).
    ///
    /// # Errors
    /// What the stores say.
    pub async fn delete_matching(
        &self,
        actor: &str,
        filter: &MessageFilter,
        target: String,
        dry_run: bool,
        max: u64,
        force: bool,
    ) -> Result<BulkResponse, AdminError> {
        let bulk = Bulk::new(filter, target, dry_run, max);
        self.run_bulk(actor, Delete { force }, bulk, &mut |_| {})
            .await
    }

    /// [`Self::delete_matching`], calling `on_batch` after each batch (see
    /// [`Self::requeue_matching_with_progress`]).
    ///
    /// # Errors
    /// What the stores say; what was deleted before an error stays deleted and is
    /// recorded in the audit log.
    #[allow(clippy::too_many_arguments)] // The existing action's, plus the callback.
    pub async fn delete_matching_with_progress(
        &self,
        actor: &str,
        filter: &MessageFilter,
        target: String,
        dry_run: bool,
        max: u64,
        force: bool,
        on_batch: OnBatch<'_>,
    ) -> Result<BulkResponse, AdminError> {
        let bulk = Bulk::new(filter, target, dry_run, max);
        self.run_bulk(actor, Delete { force }, bulk, on_batch).await
    }

    /// Reconsumes up to `max` of a consumer's deliveries matching `filter`.
    ///
    /// # Errors
    /// What the stores say.
    pub async fn reconsume_matching(
        &self,
        actor: &str,
        consumer: &str,
        filter: &DeliveryFilter,
        target: String,
        dry_run: bool,
        max: u64,
    ) -> Result<BulkResponse, AdminError> {
        let bulk = Bulk::new(filter, target, dry_run, max);
        let consumer = consumer.to_owned();
        self.run_bulk(actor, Reconsume { consumer }, bulk, &mut |_| {})
            .await
    }

    /// [`Self::reconsume_matching`], calling `on_batch` after each batch (see
    /// [`Self::requeue_matching_with_progress`]).
    ///
    /// # Errors
    /// What the stores say; what was changed before an error stays changed and
    /// is recorded in the audit log.
    #[allow(clippy::too_many_arguments)] // The existing action's, plus the callback.
    pub async fn reconsume_matching_with_progress(
        &self,
        actor: &str,
        consumer: &str,
        filter: &DeliveryFilter,
        target: String,
        dry_run: bool,
        max: u64,
        on_batch: OnBatch<'_>,
    ) -> Result<BulkResponse, AdminError> {
        let bulk = Bulk::new(filter, target, dry_run, max);
        let consumer = consumer.to_owned();
        self.run_bulk(actor, Reconsume { consumer }, bulk, on_batch)
            .await
    }

    /// The one path of every bulk action: counts the matching entries, exactly
    /// (all a dry run does), changes them in batches telling `on_batch` after
    /// each, and records what was changed in the audit log (also when an error
    /// stopped it).
    ///
    /// The changes and their audit run in a task of their own: a caller that goes
    /// away mid-way (an HTTP client that disconnects, a proxy's timeout: the
    /// request's future is dropped) does not cut the loop between the batches
    /// and the audit row that counts them; the action runs to its end and is
    /// audited as if the caller had waited.
    async fn run_bulk<S: Lifecycle + Send + Sync + 'static>(
        &self,
        actor: &str,
        action: impl BulkAction<S>,
        bulk: Bulk<'_, S>,
        on_batch: OnBatch<'_>,
    ) -> Result<BulkResponse, AdminError> {
        let Bulk {
            filter,
            target,
            dry_run,
            max,
        } = bulk;
        let matched = if filter.error_group.is_some() && filter.status.is_none() {
            // A failure group's filter names no status, and a sent message or a
            // consumed delivery keeps its last error: count only the statuses the
            // action changes (each served by its own index), not every row that
            // once failed so.
            let mut matched = 0;
            for status in action.statuses(filter) {
                let narrowed = MessageFilter {
                    status: Some(status),
                    ..filter.clone()
                };
                matched += action.count(&self.ports, &narrowed, u64::MAX).await?;
            }
            matched
        } else {
            // Exact, whatever `max` (which bounds only what is changed): an
            // operator deciding on a dry run reads the true number.
            action.count(&self.ports, filter, u64::MAX).await?
        };
        if dry_run {
            return Ok(BulkResponse {
                matched,
                changed: 0,
            });
        }
        let (told, mut progress) = tokio::sync::mpsc::unbounded_channel();
        let service = self.clone();
        let filter = filter.clone();
        let actor = actor.to_owned();
        let job = tokio::spawn(async move {
            let statuses = action.statuses(&filter);
            let mut tell = |p: BulkProgress| {
                // The caller may be gone: its progress is then nobody's.
                let _ = told.send(p);
            };
            let applied = service
                .in_batches(
                    &action,
                    &filter,
                    &statuses,
                    matched.min(max),
                    max,
                    &mut tell,
                )
                .await;
            let (audited, target) = action.audited(target);
            service
                .finish_bulk(&actor, audited, target, matched, applied)
                .await
        });
        // Ends when the task does (it drops the sender).
        while let Some(p) = progress.recv().await {
            on_batch(p);
        }
        job.await.unwrap_or_else(|e| {
            Err(AdminError::Port(PortError::transient(
                "bulk action",
                format!("the action stopped: {e}"),
            )))
        })
    }

    /// Applies a bulk action in batches of at most `self.bulk_batch`, up to `max`
    /// changes in all. Each batch narrows `filter` to one status the action
    /// changes, so what a batch changed leaves the filter and the next batch picks
    /// the next entries, without a cursor; a batch that changes nothing (what it
    /// picked is held or moved on meanwhile) ends that status. Returns the count
    /// changed, and the error that stopped it if one did.
    async fn in_batches<S: Lifecycle>(
        &self,
        action: &impl BulkAction<S>,
        filter: &MessageFilter<S>,
        statuses: &[S],
        matched: u64,
        max: u64,
        on_batch: OnBatch<'_>,
    ) -> (u64, Option<PortError>) {
        let mut progress = BulkProgress {
            matched,
            changed: 0,
            batches: 0,
        };
        for &status in statuses {
            if filter.status.is_some_and(|s| s != status) {
                continue;
            }
            let narrowed = MessageFilter {
                status: Some(status),
                ..filter.clone()
            };
            while progress.changed < max {
                let batch = self.bulk_batch.min(max - progress.changed);
                let outcome = match action.apply(&self.ports, &narrowed, batch).await {
                    Ok(outcome) => outcome,
                    Err(e) => return (progress.changed, Some(e)),
                };
                if outcome.matched == 0 {
                    break; // Nothing (left) in this status: no batch to tell of.
                }
                progress.changed += outcome.changed;
                progress.batches += 1;
                on_batch(progress);
                if outcome.matched < batch || outcome.changed == 0 {
                    break;
                }
            }
        }
        (progress.changed, None)
    }

    /// Records what a bulk action changed (also when it stopped on an error) and
    /// answers its counts or the error.
    async fn finish_bulk(
        &self,
        actor: &str,
        action: &str,
        target: String,
        matched: u64,
        (changed, error): (u64, Option<PortError>),
    ) -> Result<BulkResponse, AdminError> {
        if error.is_none() || changed > 0 {
            self.audit(actor, action, target, changed).await?;
        }
        match error {
            Some(e) => Err(e.into()),
            None => Ok(to_response(BulkOutcome { matched, changed })),
        }
    }

    /// Failing and dead messages and deliveries, grouped by their error with what
    /// varies taken out: the outbox's per exchange, then the inbox's per consumer,
    /// each the largest first. Every group, each counted exactly (the stores keep
    /// each row's group).
    ///
    /// # Errors
    /// What the stores say.
    pub async fn failure_groups(&self) -> Result<FailureGroups, AdminError> {
        let publish = self.ports.outbox.failure_groups().await?;
        let consume = self.ports.inbox.failure_groups().await?;
        let item = |g: outbox_ports::FailureGroup, outbox: bool| FailureGroupItem {
            error: g.error,
            example: g.example,
            count: g.count,
            exchange: outbox.then(|| g.place.clone()),
            consumer: (!outbox).then_some(g.place),
            oldest: g.oldest.map(format_time),
            newest: g.newest.map(format_time),
        };
        let groups = publish
            .into_iter()
            .map(|g| item(g, true))
            .chain(consume.into_iter().map(|g| item(g, false)))
            .collect();
        Ok(FailureGroups { groups })
    }

    /// `error` as a failure group's name: a group's text is its own group, and an
    /// error text as stored gives the group it is in.
    #[must_use]
    pub fn error_group(error: &str) -> String {
        outbox_core::failure_group::failure_group(error)
    }

    /// `place`'s failure group of `error` (outbox side: an exchange; inbox: a
    /// consumer), when it has failing or dead members.
    async fn group_of(&self, outbox: bool, place: &str, error: &str) -> Result<String, AdminError> {
        let group = Self::error_group(error);
        let groups = if outbox {
            self.ports.outbox.failure_groups().await?
        } else {
            self.ports.inbox.failure_groups().await?
        };
        if groups.iter().any(|g| g.place == place && g.error == group) {
            return Ok(group);
        }
        Err(PortError::NotFound {
            what: "failure group",
            id: format!(
                "{error:?} of {} {place}",
                if outbox { "exchange" } else { "consumer" }
            ),
        }
        .into())
    }

    /// The filter of `exchange`'s failure group `error` (its stored texts), and
    /// the group as the audit log records an action on it.
    async fn exchange_group(
        &self,
        exchange: &str,
        error: &str,
    ) -> Result<(MessageFilter, String), AdminError> {
        let filter = MessageFilter {
            exchange: Some(exchange.to_owned()),
            error_group: Some(self.group_of(true, exchange, error).await?),
            ..MessageFilter::default()
        };
        Ok((filter, group_target("exchange", exchange, error)))
    }

    /// Requeues the head of every blocked ordering key (its failing or dead first
    /// message, which holds the key's later ones back), up to `max`, each as the
    /// single requeue does (never one a relay holds, never one that moved on);
    /// audited as one `requeue_blocked_heads` with the count changed. `matched`
    /// is the number of blocked keys, exactly (`dry_run`: counts only).
    ///
    /// # Errors
    /// What the stores say; what was requeued before an error is audited.
    pub async fn requeue_blocked_heads(
        &self,
        actor: &str,
        dry_run: bool,
        max: u64,
    ) -> Result<BulkResponse, AdminError> {
        let mut heads = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .ports
                .outbox
                .blocked_keys(after.take(), outbox_ports::MAX_PAGE_LIMIT)
                .await?;
            let full = page.len() >= outbox_ports::MAX_PAGE_LIMIT as usize;
            after = page.last().map(|k| k.key.clone());
            heads.extend(page.into_iter().map(|k| k.head));
            if !full || after.is_none() {
                break;
            }
        }
        let matched = heads.len() as u64;
        if dry_run {
            return Ok(BulkResponse {
                matched,
                changed: 0,
            });
        }
        let mut changed = 0;
        let mut stopped = None;
        for head in heads
            .into_iter()
            .take(usize::try_from(max).unwrap_or(usize::MAX))
        {
            match self.ports.outbox.requeue_message(head).await {
                Ok(()) => changed += 1,
                // Held by a relay right now, or moved on (sent, requeued by
                // someone else): that key is not blocked by it any more or will
                // not be for long; the others go on.
                Err(
                    PortError::Busy { .. }
                    | PortError::IllegalTransition(_)
                    | PortError::NotFound { .. },
                ) => {}
                Err(e) => {
                    stopped = Some(e);
                    break;
                }
            }
        }
        self.finish_bulk(
            actor,
            "requeue_blocked_heads",
            "blocked ordering keys".to_owned(),
            matched,
            (changed, stopped),
        )
        .await
    }

    /// Requeues the failing and dead messages of `exchange`'s failure group
    /// `error` (as [`failure_groups`](Self::failure_groups) names it), up to `max`
    /// (`dry_run`: counts only); audited as `requeue_matching` with the group.
    ///
    /// # Errors
    /// `NotFound` when no failing or dead message of `exchange` is in that group,
    /// or what the stores say.
    pub async fn requeue_failure_group(
        &self,
        actor: &str,
        exchange: &str,
        error: &str,
        dry_run: bool,
        max: u64,
    ) -> Result<BulkResponse, AdminError> {
        let (filter, target) = self.exchange_group(exchange, error).await?;
        self.requeue_matching(actor, &filter, target, dry_run, max)
            .await
    }

    /// Deletes the dead messages of `exchange`'s failure group `error` (its
    /// failing ones stay), up to `max` (`dry_run`: counts only); audited as
    /// `delete_matching` with the group.
    ///
    /// # Errors
    /// `NotFound` when no failing or dead message of `exchange` is in that group,
    /// or what the stores say.
    pub async fn delete_failure_group(
        &self,
        actor: &str,
        exchange: &str,
        error: &str,
        dry_run: bool,
        max: u64,
    ) -> Result<BulkResponse, AdminError> {
        let (filter, target) = self.exchange_group(exchange, error).await?;
        self.delete_matching(actor, &filter, target, dry_run, max, false)
            .await
    }

    /// Reconsumes the failing and dead deliveries of `consumer`'s failure group
    /// `error`, up to `max` (`dry_run`: counts only); audited as
    /// `reconsume_matching` with the group.
    ///
    /// # Errors
    /// `NotFound` when no failing or dead delivery of `consumer` is in that
    /// group, or what the stores say.
    pub async fn reconsume_failure_group(
        &self,
        actor: &str,
        consumer: &str,
        error: &str,
        dry_run: bool,
        max: u64,
    ) -> Result<BulkResponse, AdminError> {
        let filter = DeliveryFilter {
            error_group: Some(self.group_of(false, consumer, error).await?),
            ..DeliveryFilter::default()
        };
        let target = group_target("consumer", consumer, error);
        self.reconsume_matching(actor, consumer, &filter, target, dry_run, max)
            .await
    }

    /// How many of each status one list holds, for its status tabs: the outbox's
    /// (`consumer` `None`) or one consumer's deliveries. `None` where the count is
    /// not kept (sent messages; consumed deliveries where not counted), as cheap
    /// as `/stats`: never a read of every row.
    ///
    /// # Errors
    /// What the stores say.
    pub async fn status_counts(
        &self,
        consumer: Option<&str>,
    ) -> Result<Vec<(&'static str, Option<u64>)>, AdminError> {
        Ok(match consumer {
            None => {
                let c = self.ports.outbox_store.stats().await?;
                vec![
                    (OutboxStatus::Pending.as_str(), Some(c.pending)),
                    (OutboxStatus::PublishFailed.as_str(), Some(c.publish_failed)),
                    (OutboxStatus::Sent.as_str(), None),
                    (OutboxStatus::Dead.as_str(), Some(c.dead)),
                ]
            }
            Some(name) => {
                let summary = self
                    .ports
                    .inbox
                    .consumers()
                    .await?
                    .into_iter()
                    .find(|c| c.name == name);
                // A consumer with nothing recorded has none of each.
                let stats = summary.as_ref().map(|c| c.stats).unwrap_or_default();
                let consumed = match &summary {
                    Some(c) if c.consumed_counted => Some(stats.consumed),
                    Some(_) => None,
                    None => Some(0),
                };
                vec![
                    (InboxStatus::Received.as_str(), Some(stats.received)),
                    (
                        InboxStatus::ConsumeFailed.as_str(),
                        Some(stats.consume_failed),
                    ),
                    (InboxStatus::Consumed.as_str(), consumed),
                    (InboxStatus::Dead.as_str(), Some(stats.dead)),
                ]
            }
        })
    }

    /// Dead messages, and dead deliveries of every consumer: what the dashboard's
    /// navigation shows beside Messages and Consumers.
    ///
    /// # Errors
    /// What the stores say.
    pub async fn dead_counts(&self) -> Result<(u64, u64), AdminError> {
        let messages = self.ports.outbox_store.stats().await?.dead;
        let deliveries = self
            .ports
            .inbox
            .consumers()
            .await?
            .iter()
            .map(|c| c.stats.dead)
            .sum();
        Ok((messages, deliveries))
    }

    /// Every consumer with its counts.
    ///
    /// # Errors
    /// What the store says.
    pub async fn consumers(&self) -> Result<Vec<ConsumerItem>, AdminError> {
        let mut consumers = self.ports.inbox.consumers().await?;
        consumers.sort_by(|a, b| a.name.cmp(&b.name));
        let paused: std::collections::HashSet<String> = self
            .ports
            .pauses
            .pauses()
            .await?
            .into_iter()
            .filter(|p| p.kind == PauseKind::Consumer)
            .map(|p| p.name)
            .collect();
        Ok(consumers
            .into_iter()
            .map(|c| ConsumerItem {
                paused: paused.contains(&c.name),
                name: c.name,
                received: c.stats.received,
                consumed: c.consumed_counted.then_some(c.stats.consumed),
                consume_failed: c.stats.consume_failed,
                dead: c.stats.dead,
                dead_letters: c.stats.dead_letters,
            })
            .collect())
    }

    /// Pauses `name` (audited as `pause`, with the target `exchange NAME` or
    /// `consumer NAME` and a count of 1 when it was not paused before, else 0).
    /// Every relay or consumer of the store obeys at its next claim or pause check.
    /// An exchange's answer counts its unsent messages, with a warning when none
    /// carries that name (a typo, a shard's name): the pause holds all the same.
    ///
    /// # Errors
    /// `BadRequest` for a name that cannot be paused (empty, over 255 characters, a
    /// control character), or what the stores say.
    pub async fn pause(
        &self,
        actor: &str,
        kind: PauseKind,
        name: &str,
    ) -> Result<PauseState, AdminError> {
        place_name(kind, name)?;
        let changed = self.ports.pauses.pause(kind, name, actor).await?;
        self.audit(actor, "pause", format!("{kind} {name}"), u64::from(changed))
            .await?;
        let unsent = self.unsent_of(kind, name).await;
        Ok(PauseState {
            kind: kind.into(),
            name: name.to_owned(),
            paused: true,
            changed,
            unsent,
            warning: (unsent == Some(0)).then(|| no_unsent_warning(name)),
        })
    }

    /// How many unsent messages (pending, delayed or failing) exchange `name`
    /// holds now; `None` for a consumer, or when they cannot be counted (the
    /// pause or resume is done either way: logged, not failed).
    async fn unsent_of(&self, kind: PauseKind, name: &str) -> Option<u64> {
        if kind != PauseKind::Exchange {
            return None;
        }
        let mut unsent = 0;
        for status in [OutboxStatus::Pending, OutboxStatus::PublishFailed] {
            let filter = MessageFilter {
                status: Some(status),
                exchange: Some(name.to_owned()),
                ..MessageFilter::default()
            };
            match self.ports.outbox.count_messages(&filter, u64::MAX).await {
                Ok(n) => unsent += n,
                Err(e) => {
                    tracing::warn!(error = %e, exchange = name, "counting a paused exchange's unsent messages failed");
                    return None;
                }
            }
        }
        Some(unsent)
    }

    /// Lifts the pause of `name` (audited as `resume`, counting 1 when it was
    /// paused, else 0).
    ///
    /// # Errors
    /// `BadRequest` for a name that cannot be paused, or what the stores say.
    pub async fn resume(
        &self,
        actor: &str,
        kind: PauseKind,
        name: &str,
    ) -> Result<PauseState, AdminError> {
        place_name(kind, name)?;
        let changed = self.ports.pauses.resume(kind, name).await?;
        self.audit(
            actor,
            "resume",
            format!("{kind} {name}"),
            u64::from(changed),
        )
        .await?;
        Ok(PauseState {
            kind: kind.into(),
            name: name.to_owned(),
            paused: false,
            changed,
            unsent: self.unsent_of(kind, name).await,
            warning: None,
        })
    }

    /// Every pause in force.
    ///
    /// # Errors
    /// What the store says.
    pub async fn pauses(&self) -> Result<PauseList, AdminError> {
        Ok(PauseList {
            items: self.pause_items().await?,
        })
    }

    /// How many pauses are in force: what the dashboard's navigation shows
    /// beside Pauses.
    ///
    /// # Errors
    /// What the pause store says.
    pub async fn pauses_in_force(&self) -> Result<u64, AdminError> {
        Ok(self.ports.pauses.pauses().await?.len() as u64)
    }

    /// The pauses in force, exchanges first, each kind by name.
    async fn pause_items(&self) -> Result<Vec<PauseItem>, AdminError> {
        let mut pauses: Vec<Pause> = self.ports.pauses.pauses().await?;
        pauses.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        Ok(pauses
            .into_iter()
            .map(|p| PauseItem {
                kind: p.kind.into(),
                name: p.name,
                since: p.since.map(format_time),
                by: p.by,
            })
            .collect())
    }

    /// A page of one consumer's deliveries.
    ///
    /// # Errors
    /// What the store says.
    pub async fn list_deliveries(
        &self,
        consumer: &str,
        filter: &DeliveryFilter,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<MessagePage, AdminError> {
        let page = self
            .ports
            .inbox
            .list_deliveries(consumer, filter, after, limit)
            .await?;
        Ok(self.page(page))
    }

    /// One delivery of one consumer, with the message as received.
    ///
    /// # Errors
    /// `NotFound`, or what the store says.
    pub async fn get_delivery(
        &self,
        consumer: &str,
        id: MessageId,
    ) -> Result<MessageDetail, AdminError> {
        let record = self
            .ports
            .inbox
            .get_delivery(consumer, id)
            .await?
            .ok_or_else(|| not_found("delivery", format!("{consumer}/{id}")))?;
        let side = vec![consume_side(&record)];
        let mut detail = self.detail(&record.message, record.status, &record.consume, side);
        detail.replayed_from = record.replayed_from.map(|r| r.to_string());
        detail.replayed_as = record.replayed_as.map(|r| r.to_string());
        Ok(detail)
    }

    /// Runs one delivery's handler again (through the consume sweep).
    ///
    /// # Errors
    /// `NotFound`, `IllegalTransition`, or what the stores say.
    pub async fn reconsume(
        &self,
        actor: &str,
        consumer: &str,
        id: MessageId,
        again: bool,
    ) -> Result<(), AdminError> {
        self.ports
            .inbox
            .reconsume_delivery(consumer, id, again)
            .await?;
        let target = if again {
            format!("{consumer}/{id} (again)")
        } else {
            format!("{consumer}/{id}")
        };
        self.audit(actor, "reconsume", target, 1).await
    }

    /// A page of dead letters (bodies cut to a preview).
    ///
    /// # Errors
    /// What the store says.
    pub async fn list_dead_letters(
        &self,
        consumer: Option<String>,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<DeadLetterPage, AdminError> {
        let page = self
            .ports
            .inbox
            .list_dead_letters(consumer, after, limit)
            .await?;
        Ok(DeadLetterPage {
            items: page
                .items
                .into_iter()
                .map(|l| self.dead_letter(l, false))
                .collect(),
            next_cursor: page.next.map(encode_cursor),
        })
    }

    /// One dead letter with its whole body.
    ///
    /// # Errors
    /// `NotFound`, or what the store says.
    pub async fn get_dead_letter(&self, id: u64) -> Result<DeadLetterView, AdminError> {
        let letter = self
            .ports
            .inbox
            .get_dead_letter(id)
            .await?
            .ok_or_else(|| not_found("dead letter", id))?;
        Ok(self.dead_letter(letter, true))
    }

    /// Removes one dead letter.
    ///
    /// # Errors
    /// `NotFound`, or what the stores say.
    pub async fn delete_dead_letter(&self, actor: &str, id: u64) -> Result<(), AdminError> {
        self.ports.inbox.delete_dead_letter(id).await?;
        self.audit(actor, "delete_dead_letter", id.to_string(), 1)
            .await
    }

    /// What operators did to one message (`consumer` `None`) or one delivery,
    /// one by one, as the audit log recorded it: (action, actor, when), newest
    /// first per target, at most [`ACTIONS_SHOWN`] each (a bulk action is
    /// recorded by its filter, not per message).
    ///
    /// # Errors
    /// What the audit log says.
    pub async fn actions_on(
        &self,
        consumer: Option<&str>,
        id: MessageId,
    ) -> Result<Vec<(String, String, Option<String>)>, AdminError> {
        // As the single actions name their target: a message by its id, a
        // delivery as `consumer/id` (` (again)` when reconsumed once consumed).
        let targets = match consumer {
            None => vec![id.to_string()],
            Some(c) => vec![format!("{c}/{id}"), format!("{c}/{id} (again)")],
        };
        let mut actions = Vec::new();
        for target in targets {
            for e in self.ports.audit.of_target(&target, ACTIONS_SHOWN).await? {
                actions.push((e.action, e.actor, e.at.map(format_time)));
            }
        }
        Ok(actions)
    }

    /// A page of the audit log, newest first.
    ///
    /// # Errors
    /// What the store says.
    pub async fn audit_log(
        &self,
        after: Option<PageCursor>,
        limit: u32,
    ) -> Result<AuditPage, AdminError> {
        let page = self.ports.audit.list(after, limit).await?;
        Ok(AuditPage {
            items: page
                .items
                .into_iter()
                .map(|e| AuditItem {
                    actor: e.actor,
                    action: e.action,
                    target: e.target,
                    count: e.count,
                    at: e.at.map(format_time),
                })
                .collect(),
            next_cursor: page.next.map(encode_cursor),
        })
    }
}

fn not_found(what: &'static str, id: impl ToString) -> AdminError {
    AdminError::Port(outbox_ports::PortError::NotFound {
        what,
        id: id.to_string(),
    })
}

/// What a pause of exchange `name` says when no unsent message carries that name:
/// it holds only messages written to it from now on, and a shard's name (the
/// relay publishes a sharded exchange's messages to `NAME.shard-N`, but they
/// carry `NAME`) or a typo holds nothing.
fn no_unsent_warning(name: &str) -> String {
    let shard_of = name
        .rsplit_once(".shard-")
        .filter(|(base, n)| {
            !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        })
        .map(|(base, _)| base);
    let hint = match shard_of {
        Some(base) => format!(
            "{name:?} looks like a shard of the sharded exchange {base:?}, whose messages \
             carry {base:?}: pause {base:?} to hold them"
        ),
        None => "check the name for a typo; a sharded exchange is paused by its own name \
                 (the one its messages carry), not by a shard's such as NAME.shard-0"
            .to_owned(),
    };
    format!(
        "no unsent message carries the exchange name {name:?}; the pause holds only \
         messages written to it from now on. {hint}"
    )
}

/// An exchange or consumer name as pauses and charts take it (1 to 255
/// characters, no control character), or a `BadRequest` saying why not.
pub(crate) fn place_name(kind: PauseKind, name: &str) -> Result<(), AdminError> {
    match outbox_ports::invalid_pause_name(name) {
        Some(why) => Err(AdminError::bad(
            "bad_name",
            format!("the {kind} name {why}"),
        )),
        None => Ok(()),
    }
}

/// A failure group as the audit log records a bulk action on it.
fn group_target(place: &str, name: &str, error: &str) -> String {
    serde_json::json!({ place: name, "error": error }).to_string()
}
