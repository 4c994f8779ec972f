//! Adds what an instance completed to the shared per-minute totals every few
//! seconds ([`ThroughputLog`]), so charts cost a few rows however many messages
//! went through, and cover every instance: a running total's growth
//! ([`ThroughputRecorder`], all exchanges or one consumer) or what was tallied per
//! name since the last add ([`NamedTally`] and [`TallyRecorder`], per exchange).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_ports::{MAX_NAMES_PER_ADD, ThroughputKind, ThroughputLog};
use tokio_util::sync::CancellationToken;

use crate::sleep_or_cancel;

/// How often an instance adds its counts.
pub const THROUGHPUT_INTERVAL: Duration = Duration::from_secs(5);

/// Adds the growth of one counter to the log, every [`THROUGHPUT_INTERVAL`] and
/// once more when cancelled.
pub struct ThroughputRecorder {
    log: Arc<dyn ThroughputLog>,
    kind: ThroughputKind,
    counter: Arc<dyn Fn() -> u64 + Send + Sync>,
    interval: Duration,
    /// Added under this name (a consumer's) instead of to the totals of all.
    name: Option<String>,
    /// The counter when this recorder was made: what was counted before is not
    /// this recorder's to add (another recorder of the same process, or nobody,
    /// had it), what comes after is, even before its task first runs.
    baseline: u64,
}

impl ThroughputRecorder {
    /// Records the growth of `counter` (a running total, e.g.
    /// `RelayCounters::published`) as `kind`.
    pub fn new(
        log: Arc<dyn ThroughputLog>,
        kind: ThroughputKind,
        counter: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        let baseline = counter();
        Self {
            log,
            kind,
            counter,
            interval: THROUGHPUT_INTERVAL,
            name: None,
            baseline,
        }
    }

    /// Records the growth of an atomic total.
    pub fn of_total<T: Send + Sync + 'static>(
        log: Arc<dyn ThroughputLog>,
        kind: ThroughputKind,
        owner: Arc<T>,
        total: fn(&T) -> &AtomicU64,
    ) -> Self {
        Self::new(
            log,
            kind,
            Arc::new(move || total(&owner).load(Ordering::Relaxed)),
        )
    }

    /// Adds every `interval` instead.
    #[must_use]
    pub const fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Adds under `name` (e.g. a consumer's, for its own chart) instead of to the
    /// totals of all (the overview's).
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Runs until `cancel` fires, then adds what is left.
    pub async fn run(self, cancel: CancellationToken) {
        let mut recorded = self.baseline;
        loop {
            let go_on = sleep_or_cancel(self.interval, &cancel).await;
            let total = (self.counter)();
            let growth = total.saturating_sub(recorded);
            let added = match &self.name {
                Some(name) if growth > 0 => {
                    self.log
                        .add_named(self.kind, &[(name.clone(), growth)])
                        .await
                }
                Some(_) => Ok(()),
                None => self.log.add(self.kind, growth).await,
            };
            match added {
                Ok(()) => recorded = total,
                // Kept for the next add: a chart may lag, it does not lose counts
                // (what a store refuses for good, a name it cannot keep, never
                // reaches it: see `chartable`).
                Err(e) => {
                    tracing::warn!(kind = self.kind.as_str(), error = %e, "per-minute totals not recorded; trying again later");
                }
            }
            if !go_on {
                break;
            }
        }
    }
}

/// Counts per name (an exchange's publishes and failed attempts) since a recorder
/// last took them: the relay adds a batch's at once, a [`TallyRecorder`] takes them
/// every few seconds. At most [`MAX_NAMES_PER_ADD`] names are held; what a further
/// name counts before the next take is left out of its chart (said once in the log),
/// never out of the totals of all.
#[derive(Debug, Default)]
pub struct NamedTally {
    /// Set once a recorder takes from it: until then nothing is held (a relay
    /// without a throughput log keeps no per-exchange counts).
    recording: AtomicBool,
    counts: Mutex<HashMap<String, (u64, u64)>>,
    /// Whether a name was left out already (said once a process).
    overflowed: AtomicBool,
}

/// Whether `name` can have a chart: at most 255 bytes (AMQP's limit for an
/// exchange), no NUL.
fn chartable(name: &str) -> bool {
    name.len() <= 255 && !name.contains('\0')
}

/// A name with what it completed and its failed attempts.
pub type NamedCounts = (String, u64, u64);

impl NamedTally {
    /// Holds what is added from now on (a [`TallyRecorder`] over it calls this).
    pub fn start_recording(&self) {
        self.recording.store(true, Ordering::Relaxed);
    }

    /// Adds each `(name, completed, failed)`, once recording.
    pub fn add_all<'a>(&self, counts: impl IntoIterator<Item = (&'a str, u64, u64)>) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        let mut held = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (name, done, failed) in counts {
            // No exchange or consumer has such a name (a message AMQP cannot carry
            // names it: it is dead at once); the store could not keep it either.
            if (done == 0 && failed == 0) || !chartable(name) {
                continue;
            }
            if let Some(c) = held.get_mut(name) {
                c.0 = c.0.saturating_add(done);
                c.1 = c.1.saturating_add(failed);
            } else if held.len() < MAX_NAMES_PER_ADD {
                held.insert(name.to_owned(), (done, failed));
            } else if !self.overflowed.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    name,
                    max = MAX_NAMES_PER_ADD,
                    "more names within a few seconds than the per-name charts take; \
                     those beyond are left out of their charts (the totals keep them)"
                );
            }
        }
    }

    /// What was counted since the last take, by name.
    #[must_use]
    pub fn take(&self) -> Vec<NamedCounts> {
        let mut held = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut taken: Vec<NamedCounts> = held
            .drain()
            .map(|(name, (done, failed))| (name, done, failed))
            .collect();
        taken.sort_unstable();
        taken
    }
}

/// Adds what a [`NamedTally`] counted to the log per name, every
/// [`THROUGHPUT_INTERVAL`] and once more when cancelled; what the log refused is
/// put back and added the next time.
pub struct TallyRecorder {
    log: Arc<dyn ThroughputLog>,
    tally: Arc<NamedTally>,
    completed: ThroughputKind,
    failed: ThroughputKind,
    interval: Duration,
}

impl TallyRecorder {
    /// Records `tally`'s completed counts as `completed` and its failed attempts as
    /// `failed`.
    pub fn new(
        log: Arc<dyn ThroughputLog>,
        tally: Arc<NamedTally>,
        completed: ThroughputKind,
        failed: ThroughputKind,
    ) -> Self {
        tally.start_recording();
        Self {
            log,
            tally,
            completed,
            failed,
            interval: THROUGHPUT_INTERVAL,
        }
    }

    /// Adds every `interval` instead.
    #[must_use]
    pub const fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Runs until `cancel` fires, then adds what is left.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            let go_on = sleep_or_cancel(self.interval, &cancel).await;
            let taken = self.tally.take();
            if !taken.is_empty() {
                self.add(taken).await;
            }
            if !go_on {
                break;
            }
        }
    }

    async fn add(&self, taken: Vec<NamedCounts>) {
        let pick = |f: fn(&NamedCounts) -> u64| -> Vec<(String, u64)> {
            taken
                .iter()
                .filter(|c| f(c) > 0)
                .map(|c| (c.0.clone(), f(c)))
                .collect()
        };
        let (completed, failed) = (pick(|c| c.1), pick(|c| c.2));
        let mut kept = Vec::new();
        for (kind, counts) in [(self.completed, &completed), (self.failed, &failed)] {
            if counts.is_empty() {
                continue;
            }
            if let Err(e) = self.log.add_named(kind, counts).await {
                // Kept for the next add: a chart may lag, it does not lose counts.
                // (At most `MAX_NAMES_PER_ADD` names, each one a store can keep.)
                tracing::warn!(kind = kind.as_str(), error = %e, "per-name totals not recorded; trying again later");
                let is_completed = kind == self.completed;
                kept.extend(counts.iter().map(|(name, n)| {
                    if is_completed {
                        (name.as_str(), *n, 0)
                    } else {
                        (name.as_str(), 0, *n)
                    }
                }));
            }
        }
        self.tally.add_all(kept);
    }
}
