//! Per-key lanes of a consumer that keeps order by key: each delivery with a key
//! waits until every earlier one of the same key has left. Who goes next is
//! [`KeyLanes`]'s decision (outbox-core, tested there); this only wakes the one
//! whose turn it is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::lanes::{KeyLanes, Ticket};
use tokio::sync::oneshot;

/// The lanes and, per waiting delivery, the signal that its turn came: under
/// one lock, so a turn given is never given before its waiter is there.
#[derive(Default)]
struct Shared {
    lanes: KeyLanes,
    waiting: HashMap<Ticket, oneshot::Sender<()>>,
}

/// The lanes of one consumer, in the order deliveries are taken from the stream
/// (the order the broker delivers them), so no scheduling of tasks can reorder
/// a key.
#[derive(Default, Clone)]
pub(crate) struct Lanes {
    shared: Arc<Mutex<Shared>>,
}

/// A delivery's place in its key's lane: [`Turn::wait`] returns when every earlier
/// delivery of the key has left; dropping it (after handling, or when the task is
/// cancelled, waiting or not) lets the next one go if it was its turn.
pub(crate) struct Turn {
    lanes: Lanes,
    key: String,
    ticket: Ticket,
    /// Fires when the turn comes; `None` once it has.
    turn: Option<oneshot::Receiver<()>>,
}

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn join(&self, key: &str) -> Turn {
        let mut shared = self.lock();
        let (ticket, now) = shared.lanes.join(key);
        let turn = if now {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            shared.waiting.insert(ticket, tx);
            Some(rx)
        };
        Turn {
            lanes: self.clone(),
            key: key.to_owned(),
            ticket,
            turn,
        }
    }
}

impl Turn {
    /// Returns when the turn came. Cancel-safe: a wait cut short (a timeout,
    /// a `select!`) leaves the turn to be waited for again.
    pub(crate) async fn wait(&mut self) {
        if let Some(rx) = &mut self.turn {
            // An error means the sender is gone without a turn given: only when
            // the lanes are dropped, at shutdown.
            let _ = rx.await;
            self.turn = None;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let next = {
            let mut shared = self.lanes.lock();
            shared.waiting.remove(&self.ticket);
            shared
                .lanes
                .leave(&self.key, self.ticket)
                .and_then(|next| shared.waiting.remove(&next))
        };
        // Sent outside the lock (waking a task under it would hold up every other
        // delivery's join). Should the next one be dropped meanwhile, it is the
        // first of its lane by now, so its own drop passes the turn on.
        if let Some(tx) = next {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn goes_within(turn: &mut Turn, within: Duration) -> bool {
        tokio::time::timeout(within, turn.wait()).await.is_ok()
    }

    #[tokio::test]
    async fn the_next_of_a_key_goes_when_the_one_before_leaves() {
        let lanes = Lanes::default();
        let mut a1 = lanes.join("a");
        let mut a2 = lanes.join("a");
        let mut b1 = lanes.join("b");
        assert!(goes_within(&mut a1, Duration::from_millis(10)).await);
        assert!(goes_within(&mut b1, Duration::from_millis(10)).await);
        assert!(!goes_within(&mut a2, Duration::from_millis(20)).await);
        drop(a1);
        assert!(goes_within(&mut a2, Duration::from_millis(100)).await);
    }

    #[tokio::test]
    async fn one_dropped_while_waiting_does_not_let_the_next_past_the_running_one() {
        let lanes = Lanes::default();
        let mut a1 = lanes.join("a");
        let a2 = lanes.join("a");
        let mut a3 = lanes.join("a");
        assert!(goes_within(&mut a1, Duration::from_millis(10)).await);
        drop(a2);
        assert!(
            !goes_within(&mut a3, Duration::from_millis(20)).await,
            "a1 still runs"
        );
        drop(a1);
        assert!(goes_within(&mut a3, Duration::from_millis(100)).await);
    }
}
