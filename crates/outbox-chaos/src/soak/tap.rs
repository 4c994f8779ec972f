//! Duplicates at the broker, counted live: a tap queue bound to the shop's exchange
//! like the chaos suite's, consumed for the whole run, each copy's message id looked
//! up in the ids seen lately. A tap queue left to fill for an hour would hold every
//! message in the broker's memory; this one stays near empty.
//!
//! Ids are remembered for at least [`HORIZON_S`] (two generations of sets, the older
//! dropped when the newer is that old), which is far longer than any copy comes
//! late: a relay publishes a message again within a claim lease and a confirm
//! timeout (seconds) of the first copy.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;

use crate::world::World;

/// How long an id is remembered at least.
pub(crate) const HORIZON_S: f64 = 300.0;

/// Copies and distinct ids seen, with the ids of the last [`HORIZON_S`] or more.
#[derive(Debug, Default)]
pub(crate) struct DupCounter {
    current: HashSet<u128>,
    previous: HashSet<u128>,
    generation_started_s: f64,
    pub(crate) copies: u64,
    pub(crate) unique: u64,
}

impl DupCounter {
    /// A delivery of message `id` at `now_s`. `redelivered`: the broker hands the
    /// same copy again (the tap's connection dropped before its ack), which is not
    /// another copy if its id was seen.
    pub(crate) fn see(&mut self, id: &str, redelivered: bool, now_s: f64) {
        if now_s - self.generation_started_s >= HORIZON_S {
            self.previous = std::mem::take(&mut self.current);
            self.generation_started_s = now_s;
        }
        let key = key(id);
        let seen = self.current.contains(&key) || self.previous.contains(&key);
        if seen && redelivered {
            return;
        }
        self.copies += 1;
        if !seen {
            self.unique += 1;
            self.current.insert(key);
        }
    }

    /// Copies beyond the first.
    pub(crate) fn duplicates(&self) -> u64 {
        self.copies - self.unique
    }

    /// Ids held now (for the memory bound).
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

fn key(id: &str) -> u128 {
    uuid::Uuid::parse_str(id).map_or_else(
        |_| {
            use std::hash::{Hash as _, Hasher as _};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            id.hash(&mut h);
            u128::from(h.finish())
        },
        |u| u.as_u128(),
    )
}

/// A stop flag that can be awaited.
#[derive(Clone)]
struct Stop(Arc<tokio::sync::watch::Sender<bool>>);

impl Stop {
    fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }
    fn stop(&self) {
        self.0.send_replace(true);
    }
    async fn stopped(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The live tap: a task consuming the world's tap queue into a [`DupCounter`].
pub(crate) struct Tap {
    pub(crate) counter: Arc<Mutex<DupCounter>>,
    stop: Stop,
    task: tokio::task::JoinHandle<()>,
}

impl Tap {
    pub(crate) fn start(w: &Arc<World>, t0: Instant) -> Self {
        let counter = Arc::new(Mutex::new(DupCounter::default()));
        let stop = Stop::new();
        let task = tokio::spawn(consume(
            Arc::clone(w),
            Arc::clone(&counter),
            stop.clone(),
            t0,
        ));
        Self {
            counter,
            stop,
            task,
        }
    }

    /// Stops consuming; (duplicate copies, distinct ids).
    pub(crate) async fn finish(mut self) -> (u64, u64) {
        self.stop.stop();
        let _ = (&mut self.task).await;
        self.counter
            .lock()
            .map(|c| (c.duplicates(), c.unique))
            .unwrap_or_default()
    }
}

impl Drop for Tap {
    /// An interrupted run: the task goes with its handle on the world.
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn consume(w: Arc<World>, counter: Arc<Mutex<DupCounter>>, stop: Stop, t0: Instant) {
    loop {
        let run = async {
            let ch = w.channel().await?;
            w.bind_tap().await?;
            ch.basic_qos(1000, BasicQosOptions::default()).await?;
            let mut deliveries = ch
                .basic_consume(
                    w.tap.as_str().into(),
                    "soak-tap".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            while let Some(d) = deliveries.next().await {
                let d = d?;
                let id = d
                    .properties
                    .message_id()
                    .as_ref()
                    .map_or_else(String::new, |s| s.as_str().to_owned());
                if let Ok(mut c) = counter.lock() {
                    c.see(&id, d.redelivered, t0.elapsed().as_secs_f64());
                }
                d.ack(BasicAckOptions::default()).await?;
            }
            anyhow::Ok(())
        };
        tokio::select! {
            () = stop.stopped() => return,
            r = run => {
                if let Err(e) = r {
                    eprintln!("soak: tap: {e:#}; consuming again in 1 s");
                }
            }
        }
        tokio::select! {
            () = stop.stopped() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0190a5c2-0000-7000-8000-000000000001";
    const B: &str = "0190a5c2-0000-7000-8000-000000000002";

    #[test]
    fn copies_beyond_the_first_are_duplicates_and_a_redelivered_copy_is_not_another() {
        let mut c = DupCounter::default();
        c.see(A, false, 0.0);
        c.see(B, false, 1.0);
        c.see(A, false, 2.0); // published again
        c.see(A, true, 3.0); // the same copy handed to the tap again
        c.see("not-a-uuid", false, 4.0);
        c.see("not-a-uuid", false, 5.0);
        assert_eq!((c.copies, c.unique, c.duplicates()), (5, 3, 2));
    }

    #[test]
    fn ids_are_remembered_for_the_horizon_and_then_forgotten() {
        let mut c = DupCounter::default();
        c.see(A, false, 0.0);
        c.see(A, false, HORIZON_S + 1.0); // in the previous generation: still seen
        assert_eq!(c.duplicates(), 1);
        for i in 0..1000u32 {
            c.see(&format!("id-{i}"), false, 2.0 * HORIZON_S + 2.0);
        }
        // A is two generations old: forgotten, the memory stays bounded.
        assert_eq!(c.remembered(), 1000);
        c.see(A, false, 2.0 * HORIZON_S + 3.0);
        assert_eq!(c.duplicates(), 1);
    }
}
