//! Typed enqueue on every [`OutboxStore`], for callers without a transaction of
//! their own: [`EnqueueEvents`].
//!
//! The port's own [`OutboxStore::enqueue`] takes complete [`Message`]s (id and
//! creation time chosen by the caller) and is object safe; a typed enqueue is
//! generic over the event type, so it is an extension trait with a blanket impl
//! (`Arc<dyn OutboxStore>` and every store get it). It lives here, not in the
//! ports, because this is where message ids come from ([`crate::new_message_id`]:
//! UUIDv7 with the process's random source), and the ports stay free of both.
//! Inside a transaction of your own, use the adapter's enqueue instead
//! (PostgreSQL: `PgOutbox::enqueue(&mut tx, &event)`).

use std::future::Future;

use outbox_core::{Event, IntoNewMessage, Message, MessageId, Timestamp};
use outbox_ports::{OutboxStore, PortError};

/// Enqueues typed events (or anything [`IntoNewMessage`]) on any [`OutboxStore`]:
/// each encoded as JSON with its type, version header, exchange, routing key,
/// ordering key and delay, checked against the store's payload limit
/// ([`OutboxStore::max_payload_bytes`]), and given a fresh UUIDv7 id, before
/// anything is written. A value that cannot become a message fails the call with
/// [`PortError::InvalidEvent`] and nothing is stored.
///
/// ```
/// use std::sync::Arc;
///
/// use outbox_core::Event;
/// use outbox_ports::{OutboxStore, SystemClock};
/// use outbox_runtime::EnqueueEvents;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// impl Event for OrderCreated {
///     const TYPE: &'static str = "order.created";
///     const EXCHANGE: &'static str = "shop.orders";
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store: Arc<dyn OutboxStore> = Arc::new(
///     outbox_adapters_memory::MemoryOutboxStore::new(Arc::new(SystemClock)),
/// );
/// let id = store.enqueue_event(&OrderCreated { order_id: 1 }).await?;
/// let ids = store
///     .enqueue_events(&[OrderCreated { order_id: 2 }, OrderCreated { order_id: 3 }])
///     .await?;
/// assert_eq!(ids.len(), 2);
/// assert!(!ids.contains(&id));
/// # Ok(())
/// # }
/// ```
pub trait EnqueueEvents: OutboxStore {
    /// Enqueues one message and returns its id: an event by reference
    /// (`&event`), `event.caused_by(&incoming)`, or a
    /// [`NewMessage`](outbox_core::NewMessage).
    ///
    /// # Errors
    /// [`PortError::InvalidEvent`] when an event cannot be encoded or breaks a
    /// limit, [`PortError::InvalidMessage`] when a `NewMessage` breaks one
    /// (nothing is stored either way); the store's errors otherwise.
    fn enqueue_event<M: IntoNewMessage>(
        &self,
        message: M,
    ) -> impl Future<Output = Result<MessageId, PortError>> + Send;

    /// Enqueues events of one type, all or none, in order, and returns their ids
    /// in the same order.
    ///
    /// # Errors
    /// As [`enqueue_event`](Self::enqueue_event); one event that cannot become a
    /// message fails them all, before anything is stored.
    fn enqueue_events<E: Event>(
        &self,
        events: &[E],
    ) -> impl Future<Output = Result<Vec<MessageId>, PortError>> + Send;
}

impl<T: OutboxStore + ?Sized> EnqueueEvents for T {
    fn enqueue_event<M: IntoNewMessage>(
        &self,
        message: M,
    ) -> impl Future<Output = Result<MessageId, PortError>> + Send {
        // Made before the future, so that it holds only messages and the store.
        let made = make(self.max_payload_bytes(), [message]);
        async move {
            let made = made?;
            let id = made.first().map(|m| m.id);
            self.enqueue(made).await?;
            id.ok_or_else(|| PortError::fatal("enqueue", "no message was made"))
        }
    }

    fn enqueue_events<E: Event>(
        &self,
        events: &[E],
    ) -> impl Future<Output = Result<Vec<MessageId>, PortError>> + Send {
        let made = make(self.max_payload_bytes(), events);
        async move {
            let made = made?;
            let ids = made.iter().map(|m| m.id).collect();
            if !made.is_empty() {
                self.enqueue(made).await?;
            }
            Ok(ids)
        }
    }
}

/// The messages for `values`, each with a new id and one creation time; the
/// first that cannot become a message fails all.
fn make<M: IntoNewMessage>(
    max_payload_bytes: usize,
    values: impl IntoIterator<Item = M>,
) -> Result<Vec<Message>, PortError> {
    let now = Timestamp::now_utc();
    values
        .into_iter()
        .map(|value| {
            let message = value.into_new_message(max_payload_bytes)?;
            Ok(message.into_message(crate::new_message_id(now), now))
        })
        .collect()
}
