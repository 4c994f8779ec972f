//! The dispatcher's decisions as a state machine without I/O: what to do next
//! (claim, publish, finish a mark, give a batch back, wait, stop) given what the
//! last step did. `outbox_relay::Dispatcher::run` only executes the steps; time
//! comes in as an argument, so every interleaving of claims, publishes, outages
//! and stops is tested here without a runtime (see the property tests below).
//!
//! The loop it drives publishes one batch while the next is claimed ("claimed
//! ahead") and the previous one is marked, so the broker is not left idle while a
//! claim or a mark runs. The rules:
//! - At most one mark is in flight; the previous one is finished before the next
//!   batch's mark starts (a failing store slows the loop instead of piling up).
//! - A batch claimed ahead that waited through half of its lease's publish budget
//!   is given back untouched and a fresh one claimed: published with a sliver of
//!   time left, its confirms could be cut short (attempts spent, duplicates).
//! - How many rows a claim asks for, and whether it may overlap the batch in
//!   flight, is [`ClaimOverlap`]'s choice (keyed traffic).
//! - An empty claim finishes the mark in flight; an overlapped one is tried once
//!   more (the mark may release the next messages of ordering keys), one with
//!   nothing in flight waits for work ([`idle_wait`]).
//! - A batch that came back unsent because the broker cannot be reached gives
//!   back the batch claimed ahead and pauses, doubling up to
//!   [`MAX_OUTAGE_PAUSE`]; nothing is claimed ahead during an outage. One that
//!   came back unsent only because its publish budget ran out is claimed again at
//!   once (the broker is not at fault), its batch ahead given back too.
//! - A stop is taken between batches: the batch claimed ahead is given back, the
//!   mark in flight finished, and nothing is claimed again. A batch already in
//!   hand is published and marked first.

use std::time::{Duration, Instant};

use crate::lease::publish_budget;

mod overlap;
pub use overlap::{ClaimOverlap, MAX_SPLIT, PROBE_AFTER};

/// The longest pause between tries of a dispatcher that finds the broker
/// unreachable.
pub const MAX_OUTAGE_PAUSE: Duration = Duration::from_secs(30);

/// The shortest idle wait for a delayed message that is due already.
pub const MIN_DUE_WAIT: Duration = Duration::from_millis(20);

/// Added to the time left before claiming (the round trip that measured it, and
/// timer granularity).
const DUE_MARGIN: Duration = Duration::from_millis(5);

/// How long an idle dispatcher waits before claiming again: `idle_poll`, or less
/// when a delayed message falls due sooner (`next_due`, measured by the store's
/// clock; `None` when nothing is delayed or it is unknown). A due time already
/// past waits [`MIN_DUE_WAIT`]: the row is about to be claimed by someone, and a
/// zero wait would spin.
#[must_use]
pub fn idle_wait(next_due: Option<Duration>, idle_poll: Duration) -> Duration {
    match next_due {
        // A little after the due time, so the first claim finds the row due.
        Some(until) => idle_poll.min((until + DUE_MARGIN).max(MIN_DUE_WAIT)),
        None => idle_poll,
    }
}

/// What the dispatcher does next. Exhaustive on purpose: a step added here must
/// fail to compile in every executor until it carries the step out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchStep {
    /// Claim up to `limit` pending rows under a fresh lease; `overlapped` when a
    /// mark is in flight meanwhile. Answer with [`DispatchMachine::claimed`] or
    /// [`DispatchMachine::claim_failed`].
    Claim {
        /// The most rows to claim.
        limit: u32,
        /// Whether an earlier batch's mark is in flight during the claim.
        overlapped: bool,
    },
    /// Publish the batch in hand within `budget`, then start its mark once the
    /// mark in flight (if any) is finished; meanwhile, with `claim_ahead`, claim
    /// that many rows for the next batch (after the previous mark, and not if a
    /// stop comes first). Answer with [`DispatchMachine::published`].
    Publish {
        /// What is left of the batch's lease for publishing it.
        budget: Duration,
        /// Rows to claim ahead while the batch is published.
        claim_ahead: Option<u32>,
    },
    /// Wait for the mark in flight to finish. Answer with
    /// [`DispatchMachine::mark_finished`].
    FinishMark,
    /// Give the batch claimed ahead back untouched (no attempt spent). Answer
    /// with [`DispatchMachine::gave_back`].
    GiveBack,
    /// Nothing to publish: wait for work ([`idle_wait`], or a wake-up). Answer
    /// with [`DispatchMachine::waited`] (or [`DispatchMachine::stop`]).
    Idle,
    /// Wait this long (a store error, or the broker out of reach). Answer with
    /// [`DispatchMachine::waited`] (or [`DispatchMachine::stop`]).
    Pause(Duration),
    /// Stopped: nothing is held, nothing in flight.
    Done,
}

/// How a published batch came out, as far as the next step cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishedBatch {
    /// Messages given back unsent (no attempt spent).
    pub unsent: u64,
    /// Whether any came back unsent because the broker could not be reached
    /// (rather than only because the publish budget ran out).
    pub broker_unavailable: bool,
}

/// A claim's answer: how many rows it took, and when it was sent (its lease ends
/// no earlier than this plus the ttl).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTaken {
    /// Rows claimed.
    pub rows: usize,
    /// Before the claim was sent.
    pub claimed_at: Instant,
}

/// A batch claimed and not yet published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Batch {
    taken: ClaimTaken,
    /// Claimed while an earlier batch was in flight.
    overlapped: bool,
}

/// Where the machine stands between two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between batches: publish or give back the batch ahead, or claim.
    Next,
    /// A batch with rows is in hand: publish it.
    InHand(Batch),
    /// A claim came back empty: finish the mark in flight, then claim again
    /// (overlapped) or wait for work.
    Empty {
        overlapped: bool,
    },
    /// Give back the batch ahead (if any), then pause this long (if any), then
    /// go on.
    Retreat(Option<Duration>),
    Done,
}

/// The step handed out whose answer is awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    Claim { overlapped: bool },
    Publish,
    FinishMark,
    GiveBack,
    Wait,
}

/// The dispatcher's decisions (see the module's documentation). Ask
/// [`step`](Self::step) what to do, do it, answer how it went, ask again; call
/// [`stop`](Self::stop) once a stop is asked for.
#[derive(Debug, Clone)]
pub struct DispatchMachine {
    lease_ttl: Duration,
    error_backoff: Duration,
    overlap: ClaimOverlap,
    phase: Phase,
    awaited: Option<Awaited>,
    /// The next batch, claimed while the previous one was published.
    ahead: Option<Batch>,
    /// A batch's mark runs (at most one).
    marking: bool,
    /// While the broker cannot be reached: the pause after the last unsent batch.
    outage_pause: Option<Duration>,
    stopping: bool,
}

impl DispatchMachine {
    /// A dispatcher claiming `batch_size` rows under leases of `lease_ttl`,
    /// pausing `error_backoff` after a store error (and at first after an
    /// unreachable broker).
    #[must_use]
    pub const fn new(batch_size: u32, lease_ttl: Duration, error_backoff: Duration) -> Self {
        Self {
            lease_ttl,
            error_backoff,
            overlap: ClaimOverlap::new(batch_size),
            phase: Phase::Next,
            awaited: None,
            ahead: None,
            marking: false,
            outage_pause: None,
            stopping: false,
        }
    }

    /// What to do next, at `now`.
    ///
    /// # Panics
    /// When asked again before the last step was answered (a defect of the
    /// executor, never of the traffic).
    pub fn step(&mut self, now: Instant) -> DispatchStep {
        assert!(
            self.awaited.is_none(),
            "DispatchMachine::step asked again before {:?} was answered",
            self.awaited
        );
        loop {
            let step = match self.phase {
                Phase::Next => match self.next_batch(now) {
                    Some(step) => step,
                    // The batch ahead was taken: publish it (or, empty, go on).
                    None => continue,
                },
                Phase::InHand(batch) => {
                    // Not while the broker is out (a batch claimed then would only
                    // be given back at the next pause), nor once stopping.
                    let claim_ahead =
                        (self.overlap.overlaps() && self.outage_pause.is_none() && !self.stopping)
                            .then(|| self.overlap.limit());
                    self.phase = Phase::Next;
                    self.awaited = Some(Awaited::Publish);
                    let waited = now.saturating_duration_since(batch.taken.claimed_at);
                    DispatchStep::Publish {
                        budget: publish_budget(self.lease_ttl, waited),
                        claim_ahead,
                    }
                }
                Phase::Empty { overlapped } => {
                    if self.marking {
                        self.awaited = Some(Awaited::FinishMark);
                        DispatchStep::FinishMark
                    } else if overlapped || self.stopping {
                        // An overlapped claim ran while a mark was in flight: what
                        // that mark releases (the next message of a key whose head
                        // it marks sent) was not claimable yet. Claim once more;
                        // the mark is finished now, so this never spins.
                        self.phase = Phase::Next;
                        continue;
                    } else {
                        self.phase = Phase::Next;
                        self.awaited = Some(Awaited::Wait);
                        DispatchStep::Idle
                    }
                }
                Phase::Retreat(pause) => {
                    if self.ahead.is_some() {
                        self.awaited = Some(Awaited::GiveBack);
                        DispatchStep::GiveBack
                    } else {
                        self.phase = Phase::Next;
                        match pause {
                            Some(pause) if !self.stopping => {
                                self.awaited = Some(Awaited::Wait);
                                DispatchStep::Pause(pause)
                            }
                            _ => continue,
                        }
                    }
                }
                Phase::Done => DispatchStep::Done,
            };
            return step;
        }
    }

    /// Between batches: stop, give back or take the batch ahead, finish the mark
    /// first, or claim. `None` when the batch ahead was taken in hand.
    fn next_batch(&mut self, now: Instant) -> Option<DispatchStep> {
        if self.stopping {
            return Some(if self.ahead.is_some() {
                self.awaited = Some(Awaited::GiveBack);
                DispatchStep::GiveBack
            } else if self.marking {
                self.awaited = Some(Awaited::FinishMark);
                DispatchStep::FinishMark
            } else {
                self.phase = Phase::Done;
                DispatchStep::Done
            });
        }
        if let Some(ahead) = self.ahead {
            let waited = now.saturating_duration_since(ahead.taken.claimed_at);
            if publish_budget(self.lease_ttl, waited)
                < publish_budget(self.lease_ttl, Duration::ZERO) / 2
            {
                self.awaited = Some(Awaited::GiveBack);
                return Some(DispatchStep::GiveBack);
            }
            self.ahead = None;
            self.take(ahead);
            return None;
        }
        // Claim while the previous batch is being marked, unless overlapped claims
        // have been coming back empty: then that mark is finished first.
        if self.marking && !self.overlap.overlaps() {
            self.awaited = Some(Awaited::FinishMark);
            return Some(DispatchStep::FinishMark);
        }
        self.awaited = Some(Awaited::Claim {
            overlapped: self.marking,
        });
        Some(DispatchStep::Claim {
            limit: self.overlap.limit(),
            overlapped: self.marking,
        })
    }

    /// `batch` becomes the one to publish (or, empty, to go on from).
    fn take(&mut self, batch: Batch) {
        self.overlap.claimed(batch.overlapped, batch.taken.rows);
        self.phase = if batch.taken.rows == 0 {
            Phase::Empty {
                overlapped: batch.overlapped,
            }
        } else {
            Phase::InHand(batch)
        };
    }

    fn answer(&mut self, what: &'static str, expected: fn(Awaited) -> bool) -> Awaited {
        match self.awaited.take() {
            Some(a) if expected(a) => a,
            other => panic!("DispatchMachine::{what} answers {other:?}"),
        }
    }

    /// Answers [`DispatchStep::Claim`].
    ///
    /// # Panics
    /// When no claim was asked for.
    pub fn claimed(&mut self, taken: ClaimTaken) {
        let Awaited::Claim { overlapped } =
            self.answer("claimed", |a| matches!(a, Awaited::Claim { .. }))
        else {
            unreachable!("answer checked the kind")
        };
        self.take(Batch { taken, overlapped });
    }

    /// Answers [`DispatchStep::Claim`]: the store refused it. Pause, then claim
    /// again.
    ///
    /// # Panics
    /// When no claim was asked for.
    pub fn claim_failed(&mut self) {
        self.answer("claim_failed", |a| matches!(a, Awaited::Claim { .. }));
        self.phase = Phase::Retreat(Some(self.error_backoff));
    }

    /// Answers [`DispatchStep::Publish`]: how the batch came out, and what was
    /// claimed ahead meanwhile (`None` when nothing was, or the claim failed).
    /// The batch's mark is in flight now.
    ///
    /// # Panics
    /// When no publish was asked for.
    pub fn published(&mut self, batch: PublishedBatch, ahead: Option<ClaimTaken>) {
        self.answer("published", |a| a == Awaited::Publish);
        self.marking = true;
        self.ahead = ahead.map(|taken| Batch {
            taken,
            overlapped: true,
        });
        self.phase = if batch.unsent == 0 {
            // The broker takes messages (again).
            self.outage_pause = None;
            Phase::Next
        } else if !batch.broker_unavailable {
            // The batch outlasted its lease's budget: the rest is claimed again at
            // once, the broker is not at fault. The batch ahead, whose lease ran
            // nearly as long meanwhile, is given back too.
            Phase::Retreat(None)
        } else {
            // The broker cannot be reached: the batch ahead is given back now
            // rather than held through the pause (other relays may take it).
            let pause = self
                .outage_pause
                .map_or(self.error_backoff, |d| (d * 2).min(MAX_OUTAGE_PAUSE));
            self.outage_pause = Some(pause);
            Phase::Retreat(Some(pause))
        };
    }

    /// Answers [`DispatchStep::FinishMark`].
    ///
    /// # Panics
    /// When no finished mark was asked for.
    pub fn mark_finished(&mut self) {
        self.answer("mark_finished", |a| a == Awaited::FinishMark);
        self.marking = false;
    }

    /// Answers [`DispatchStep::GiveBack`].
    ///
    /// # Panics
    /// When no give-back was asked for.
    pub fn gave_back(&mut self) {
        self.answer("gave_back", |a| a == Awaited::GiveBack);
        self.ahead = None;
    }

    /// Answers [`DispatchStep::Idle`] and [`DispatchStep::Pause`]: the wait is over.
    ///
    /// # Panics
    /// When no wait was asked for.
    pub fn waited(&mut self) {
        self.answer("waited", |a| a == Awaited::Wait);
    }

    /// A stop is asked for: taken between batches (see the module's
    /// documentation). May be called at any time, more than once; it also ends a
    /// wait in progress.
    pub fn stop(&mut self) {
        self.stopping = true;
        if self.awaited == Some(Awaited::Wait) {
            self.awaited = None;
        }
    }

    /// Whether the outage pause is in force (the broker could not be reached by
    /// the last batch).
    #[must_use]
    pub const fn in_outage(&self) -> bool {
        self.outage_pause.is_some()
    }
}

#[cfg(test)]
mod tests;
