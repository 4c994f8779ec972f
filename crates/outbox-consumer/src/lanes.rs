//! Per-key lanes of a consumer that keeps order by key.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The lanes of a consumer that keeps order by key: each delivery with a key waits
/// for the one before it with the same key to finish. A chain of one-shot signals
/// per key, in the order deliveries are taken from the stream (which is the order
/// the broker delivers them), so no scheduling of tasks can reorder a key.
/// Per key: the signal its last delivery fires when it finishes, and that
/// delivery's number.
type LastOfKey = HashMap<String, (u64, tokio::sync::watch::Receiver<bool>)>;

#[derive(Default, Clone)]
pub(crate) struct Lanes {
    /// Per key: the signal the key's last delivery fires when it finishes, and that
    /// delivery's number (so a finished last delivery removes its own entry only).
    last: Arc<std::sync::Mutex<LastOfKey>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

/// A delivery's place in its key's lane: [`Turn::wait`] returns when every earlier
/// delivery of the key finished; dropping it (after handling, or when the task is
/// cancelled) lets the next one go.
pub(crate) struct Turn {
    lanes: Lanes,
    key: String,
    number: u64,
    before: Option<tokio::sync::watch::Receiver<bool>>,
    done: tokio::sync::watch::Sender<bool>,
}

impl Lanes {
    pub(crate) fn join(&self, key: &str) -> Turn {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (done, finished) = tokio::sync::watch::channel(false);
        let before = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.to_owned(), (number, finished))
            .map(|(_, rx)| rx);
        Turn {
            lanes: self.clone(),
            key: key.to_owned(),
            number,
            before,
            done,
        }
    }
}

impl Turn {
    pub(crate) async fn wait(&mut self) {
        if let Some(rx) = &mut self.before {
            // Fires `true` when the earlier one finished; an error means its sender
            // is gone, which also means it finished (or was dropped on shutdown).
            let _ = rx.wait_for(|done| *done).await;
        }
        self.before = None;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let _ = self.done.send(true);
        let mut last = self
            .lanes
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.get(&self.key).is_some_and(|(n, _)| *n == self.number) {
            last.remove(&self.key);
        }
    }
}
