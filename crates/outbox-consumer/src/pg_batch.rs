//! Group commit for the PostgreSQL inbox: the deliveries in hand that wait while
//! the consumer's inbox transactions are busy are gathered, and the next free
//! transaction records and handles them together
//! ([`PgInboxStore::consume_batch_in_transaction`]), so one COMMIT covers many.
//!
//! No task of its own: each delivery's task queues its delivery, then either runs a
//! batch itself (when a transaction is free, taking what waits, its own among them
//! or before it) or waits for the batch that took it. A delivery is acknowledged
//! by its own task, after the result of its batch is known, so after the COMMIT.
//! Should a task running a batch be dropped, the batch's transaction is rolled
//! back and each of its deliveries is told "unrecorded" (returned to the broker).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use outbox_adapters_postgres::{
    BatchDelivery, ConsumeOutcome, PgConnection, PgInboxStore, TxHandler,
};
use outbox_core::{Decision, HandlerFailure, Message, MessageId};
use outbox_ports::{Lease, PortError};
use tokio::sync::{Semaphore, oneshot};
use tracing::Instrument as _;

/// The most deliveries in one transaction. Each delivery's savepoint that writes is
/// a subtransaction; PostgreSQL keeps 64 of a transaction's in shared memory, and
/// past that every snapshot taken anywhere on the server gets slower while the
/// transaction runs (a handler's own savepoints count too).
pub(crate) const MAX_BATCH: usize = 32;

/// A delivery waiting for its batch.
struct Waiting {
    message: Message,
    lease: Lease,
    /// The delivery's span: its handler runs under it in whichever task runs the
    /// batch, so what the handler traces is its own delivery's.
    span: tracing::Span,
    done: oneshot::Sender<Result<ConsumeOutcome, PortError>>,
}

/// The deliveries waiting for a transaction, and the transactions free.
pub(crate) struct GroupCommit {
    waiting: Mutex<VecDeque<Waiting>>,
    transactions: Semaphore,
    max_batch: usize,
}

impl GroupCommit {
    /// Up to `transactions` inbox transactions at once, each of up to `max_batch`
    /// deliveries.
    pub(crate) fn new(transactions: usize, max_batch: usize) -> Self {
        Self {
            waiting: Mutex::default(),
            transactions: Semaphore::new(transactions.max(1)),
            max_batch: max_batch.clamp(1, MAX_BATCH),
        }
    }

    fn take(&self) -> Vec<Waiting> {
        let mut waiting = self
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = waiting.len().min(self.max_batch);
        waiting.drain(..n).collect()
    }

    /// Records and handles `message` in a batch; the outcome is its own.
    pub(crate) async fn consume(
        &self,
        inbox: &PgInboxStore,
        consumer: &str,
        message: Message,
        lease: Lease,
        decide: &(dyn Fn(&Message, u32, &HandlerFailure) -> Decision + Send + Sync),
        handler_for: &(dyn Fn(&Message) -> TxHandler<'static> + Send + Sync),
    ) -> Result<ConsumeOutcome, PortError> {
        let (done, mut outcome) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(Waiting {
                message,
                lease,
                span: tracing::Span::current(),
                done,
            });
        loop {
            let permit = tokio::select! {
                biased;
                o = &mut outcome => return received(o),
                p = self.transactions.acquire() => p,
            };
            let Ok(permit) = permit else {
                return received(outcome.await);
            };
            let batch = self.take();
            if batch.is_empty() {
                // Ours was taken by a batch that is running.
                drop(permit);
                return received(outcome.await);
            }
            let deliveries: Vec<BatchDelivery<'_>> = batch
                .iter()
                .map(|w| BatchDelivery {
                    message: &w.message,
                    lease: &w.lease,
                })
                .collect();
            let spans: HashMap<MessageId, tracing::Span> = batch
                .iter()
                .map(|w| (w.message.id, w.span.clone()))
                .collect();
            let in_its_span = |m: &Message| -> TxHandler<'static> {
                let handler = handler_for(m);
                let span = spans
                    .get(&m.id)
                    .cloned()
                    .unwrap_or_else(tracing::Span::none);
                Box::new(move |conn: &mut PgConnection| Box::pin(handler(conn).instrument(span)))
            };
            let outcomes = inbox
                .consume_batch_in_transaction(consumer, &deliveries, decide, &in_its_span)
                .await;
            drop(deliveries);
            for (w, o) in batch.into_iter().zip(outcomes) {
                // The delivery's task is gone only when the worker was dropped.
                let _ = w.done.send(o);
            }
            drop(permit);
        }
    }
}

fn received(
    o: Result<Result<ConsumeOutcome, PortError>, oneshot::error::RecvError>,
) -> Result<ConsumeOutcome, PortError> {
    o.unwrap_or_else(|_| {
        Err(PortError::transient(
            "consume batch",
            "the task running this delivery's batch stopped before its outcome was known",
        ))
    })
}
