//! The dispatcher's decisions: examples of each rule, then every interleaving of
//! claims, publishes, outages, slow batches and stops against a model executor.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const TTL: Duration = Duration::from_secs(60);
const BACKOFF: Duration = Duration::from_secs(1);

fn machine(batch_size: u32) -> DispatchMachine {
    DispatchMachine::new(batch_size, TTL, BACKOFF)
}

fn taken(rows: usize, claimed_at: Instant) -> ClaimTaken {
    ClaimTaken { rows, claimed_at }
}

const ALL_SENT: PublishedBatch = PublishedBatch {
    unsent: 0,
    broker_unavailable: false,
};
const BROKER_OUT: PublishedBatch = PublishedBatch {
    unsent: 10,
    broker_unavailable: true,
};
const OUT_OF_TIME: PublishedBatch = PublishedBatch {
    unsent: 10,
    broker_unavailable: false,
};

#[test]
fn a_batch_is_published_while_the_next_is_claimed_ahead() {
    let t = Instant::now();
    let mut m = machine(500);
    assert_eq!(
        m.step(t),
        DispatchStep::Claim {
            limit: 500,
            overlapped: false
        }
    );
    m.claimed(taken(500, t));
    assert_eq!(
        m.step(t),
        DispatchStep::Publish {
            budget: publish_budget(TTL, Duration::ZERO),
            claim_ahead: Some(500)
        }
    );
    m.published(ALL_SENT, Some(taken(500, t)));
    // The batch ahead is published next, its budget what is left of its lease,
    // while the first batch's mark finishes inside that step.
    let later = t + Duration::from_secs(3);
    assert_eq!(
        m.step(later),
        DispatchStep::Publish {
            budget: publish_budget(TTL, Duration::from_secs(3)),
            claim_ahead: Some(500)
        }
    );
}

#[test]
fn a_batch_ahead_past_half_its_budget_is_given_back_and_a_fresh_one_claimed() {
    let t = Instant::now();
    let mut m = machine(500);
    m.step(t);
    m.claimed(taken(500, t));
    m.step(t);
    m.published(ALL_SENT, Some(taken(500, t)));
    let half = publish_budget(TTL, Duration::ZERO) / 2;
    let late = t + half + Duration::from_millis(1);
    assert_eq!(m.step(late), DispatchStep::GiveBack);
    m.gave_back();
    assert_eq!(
        m.step(late),
        DispatchStep::Claim {
            limit: 500,
            overlapped: true
        },
        "claimed while the first batch's mark is still in flight"
    );
}

#[test]
fn an_empty_claim_with_nothing_in_flight_waits_for_work() {
    let t = Instant::now();
    let mut m = machine(500);
    m.step(t);
    m.claimed(taken(0, t));
    assert_eq!(m.step(t), DispatchStep::Idle);
    m.waited();
    assert!(matches!(m.step(t), DispatchStep::Claim { .. }));
}

#[test]
fn an_empty_overlapped_claim_finishes_the_mark_and_claims_once_more() {
    let t = Instant::now();
    let mut m = machine(500);
    m.step(t);
    m.claimed(taken(500, t));
    m.step(t);
    m.published(ALL_SENT, Some(taken(0, t)));
    assert_eq!(m.step(t), DispatchStep::FinishMark);
    m.mark_finished();
    assert_eq!(
        m.step(t),
        DispatchStep::Claim {
            limit: 250,
            overlapped: false
        },
        "halved: the empty overlapped claim says the keys are in flight"
    );
    m.claimed(taken(0, t));
    assert_eq!(m.step(t), DispatchStep::Idle, "not a third claim");
}

/// Answers every step (claims full, no batch ahead to give back being anything
/// but taken) until the next publish; the pauses met on the way.
fn pauses_until_publish(m: &mut DispatchMachine, t: Instant) -> (Vec<Duration>, Option<u32>) {
    let mut pauses = Vec::new();
    loop {
        match m.step(t) {
            DispatchStep::Publish { claim_ahead, .. } => return (pauses, claim_ahead),
            DispatchStep::Claim { limit, .. } => m.claimed(taken(limit as usize, t)),
            DispatchStep::FinishMark => m.mark_finished(),
            DispatchStep::GiveBack => m.gave_back(),
            DispatchStep::Pause(p) => {
                pauses.push(p);
                m.waited();
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn an_unreachable_broker_pauses_doubling_and_claims_nothing_ahead() {
    let t = Instant::now();
    let mut m = machine(100);
    let (_, first_ahead) = pauses_until_publish(&mut m, t);
    assert_eq!(first_ahead, Some(100));
    let mut pauses = Vec::new();
    let mut ahead = first_ahead;
    for _ in 0..9 {
        m.published(BROKER_OUT, ahead.map(|n| taken(n as usize, t)));
        assert!(m.in_outage());
        let (p, next_ahead) = pauses_until_publish(&mut m, t);
        pauses.extend(p);
        assert_eq!(next_ahead, None, "claimed ahead during an outage");
        ahead = next_ahead;
    }
    let secs: Vec<u64> = pauses.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30, 30]);
    // The broker is back: the pause is forgotten, claims ahead again.
    m.published(ALL_SENT, None);
    assert!(!m.in_outage());
    let (p, ahead) = pauses_until_publish(&mut m, t);
    assert!(p.is_empty());
    assert_eq!(ahead, Some(100));
}

#[test]
fn a_batch_out_of_time_is_claimed_again_at_once_and_its_batch_ahead_given_back() {
    let t = Instant::now();
    let mut m = machine(100);
    m.step(t);
    m.claimed(taken(100, t));
    m.step(t);
    m.published(OUT_OF_TIME, Some(taken(100, t)));
    assert_eq!(m.step(t), DispatchStep::GiveBack);
    m.gave_back();
    assert!(
        matches!(m.step(t), DispatchStep::Claim { .. }),
        "no pause: the broker is not at fault"
    );
    assert!(!m.in_outage());
}

#[test]
fn a_failed_claim_pauses_the_error_backoff() {
    let t = Instant::now();
    let mut m = machine(100);
    m.step(t);
    m.claim_failed();
    assert_eq!(m.step(t), DispatchStep::Pause(BACKOFF));
    m.waited();
    assert!(matches!(m.step(t), DispatchStep::Claim { .. }));
}

#[test]
fn a_stop_gives_back_the_batch_ahead_and_finishes_the_mark() {
    let t = Instant::now();
    let mut m = machine(100);
    m.step(t);
    m.claimed(taken(100, t));
    m.step(t);
    m.published(ALL_SENT, Some(taken(100, t)));
    m.stop();
    assert_eq!(m.step(t), DispatchStep::GiveBack);
    m.gave_back();
    assert_eq!(m.step(t), DispatchStep::FinishMark);
    m.mark_finished();
    assert_eq!(m.step(t), DispatchStep::Done);
    assert_eq!(m.step(t), DispatchStep::Done);
}

#[test]
fn a_batch_in_hand_at_a_stop_is_published_without_claiming_ahead() {
    let t = Instant::now();
    let mut m = machine(100);
    m.step(t);
    m.claimed(taken(100, t));
    m.stop();
    assert_eq!(
        m.step(t),
        DispatchStep::Publish {
            budget: publish_budget(TTL, Duration::ZERO),
            claim_ahead: None
        }
    );
    m.published(ALL_SENT, None);
    assert_eq!(m.step(t), DispatchStep::FinishMark);
    m.mark_finished();
    assert_eq!(m.step(t), DispatchStep::Done);
}

#[test]
fn a_stop_ends_a_wait() {
    let t = Instant::now();
    let mut m = machine(100);
    m.step(t);
    m.claimed(taken(0, t));
    assert_eq!(m.step(t), DispatchStep::Idle);
    m.stop();
    assert_eq!(m.step(t), DispatchStep::Done);
}

#[test]
#[should_panic(expected = "before")]
fn a_step_asked_twice_without_an_answer_is_a_defect() {
    let t = Instant::now();
    let mut m = machine(100);
    m.step(t);
    m.step(t);
}

#[test]
fn the_idle_wait_follows_the_next_due_time() {
    let poll = Duration::from_secs(1);
    assert_eq!(idle_wait(None, poll), poll);
    assert_eq!(idle_wait(Some(Duration::from_secs(5)), poll), poll);
    assert_eq!(
        idle_wait(Some(Duration::from_millis(100)), poll),
        Duration::from_millis(105)
    );
    assert_eq!(idle_wait(Some(Duration::ZERO), poll), MIN_DUE_WAIT);
}

/// How the model world answers one step: drawn per step.
#[derive(Debug, Clone, Copy)]
struct Answer {
    /// Milliseconds that pass before the step is taken.
    elapsed_ms: u64,
    /// A claim's share of its limit: 0 empty, 255 full.
    fill: u8,
    /// A claim fails (store error) when this is 0.
    claim_fails: u8,
    /// 0: all confirmed; 1: some unsent, out of time; 2: the broker out.
    publish: u8,
    /// The claim ahead fails.
    ahead_fails: bool,
}

fn answers() -> impl Strategy<Value = Vec<Answer>> {
    prop::collection::vec(
        (
            prop_oneof![3 => 0u64..50, 1 => 0u64..40_000],
            any::<u8>(),
            0u8..12,
            prop_oneof![6 => Just(0u8), 1 => Just(1u8), 2 => Just(2u8)],
            prop::bool::weighted(0.1),
        )
            .prop_map(
                |(elapsed_ms, fill, claim_fails, publish, ahead_fails)| Answer {
                    elapsed_ms,
                    fill,
                    claim_fails,
                    publish,
                    ahead_fails,
                },
            ),
        1..200,
    )
}

/// A batch as the model executor holds it.
#[derive(Debug, Clone, Copy)]
struct Held {
    id: u32,
    rows: usize,
    claimed_at: Instant,
    /// Claimed ahead, while another batch was published.
    ahead: bool,
    /// Claimed ahead of a batch that came back unsent: to be given back (the
    /// broker is out, or its lease ran nearly as long as the slow batch's).
    to_give_back: bool,
}

/// The model executor: carries out each step, checks what the machine asks of it
/// against what it holds, and counts every batch's end.
#[derive(Debug)]
struct Model {
    batch_size: u32,
    now: Instant,
    next_id: u32,
    /// The batch claimed and not yet published (in hand, or claimed ahead).
    unpublished: Option<Held>,
    /// The batch whose mark is in flight.
    marking: Option<u32>,
    /// How each batch ended: published, or given back.
    ended: HashMap<u32, &'static str>,
    in_outage: bool,
    /// Batches claimed with rows (each must end once).
    claimed_with_rows: usize,
    /// The pause owed before the next claim (a failed claim: the backoff; an
    /// unreachable broker: the outage pause), unless a stop comes first.
    pause_owed: Option<Duration>,
    /// The outage pause the last unreachable broker called for (doubling).
    outage_pause: Option<Duration>,
    /// The last claim with nothing in flight came back empty, and no wait since.
    idle_claim_empty: bool,
    steps_since_stop: Option<u32>,
}

impl Model {
    fn end(&mut self, held: Held, how: &'static str) -> Result<(), TestCaseError> {
        prop_assert!(
            self.ended.insert(held.id, how).is_none(),
            "batch {} ended twice",
            held.id
        );
        Ok(())
    }

    fn claim(&mut self, limit: u32, fill: u8, ahead: bool) -> Held {
        self.next_id += 1;
        let rows = (u64::from(limit) * u64::from(fill) / 255) as usize;
        if rows > 0 {
            self.claimed_with_rows += 1;
        }
        Held {
            id: self.next_id,
            rows,
            claimed_at: self.now,
            ahead,
            to_give_back: false,
        }
    }

    /// Carries out `step` as `answer` says.
    fn execute(
        &mut self,
        m: &mut DispatchMachine,
        step: DispatchStep,
        answer: Answer,
    ) -> Result<(), TestCaseError> {
        let full_budget = publish_budget(TTL, Duration::ZERO);
        if let Some(n) = self.steps_since_stop.as_mut() {
            *n += 1;
            prop_assert!(*n <= 6, "not done within six steps of a stop");
            prop_assert!(
                !matches!(step, DispatchStep::Claim { .. }),
                "claimed after a stop"
            );
        }
        match step {
            DispatchStep::Claim { limit, overlapped } => {
                prop_assert!(self.unpublished.is_none(), "claimed while holding a batch");
                prop_assert_eq!(overlapped, self.marking.is_some());
                let split = (0..=MAX_SPLIT).find(|k| self.batch_size >> k == limit);
                prop_assert!(split.is_some(), "limit {} of {}", limit, self.batch_size);
                prop_assert!(limit > 0 || self.batch_size == 0);
                prop_assert!(
                    self.pause_owed.is_none(),
                    "claimed without the pause owed ({:?})",
                    self.pause_owed
                );
                if answer.claim_fails == 0 {
                    self.pause_owed = Some(BACKOFF);
                    m.claim_failed();
                    return Ok(());
                }
                let held = self.claim(limit, answer.fill, false);
                if held.rows == 0 && !overlapped {
                    prop_assert!(
                        !self.idle_claim_empty,
                        "two empty claims with nothing in flight and no wait between (a spin)"
                    );
                    self.idle_claim_empty = true;
                }
                if held.rows > 0 {
                    self.unpublished = Some(held);
                }
                m.claimed(taken(held.rows, held.claimed_at));
            }
            DispatchStep::Publish {
                budget,
                claim_ahead,
            } => {
                let Some(held) = self.unpublished.take() else {
                    return Err(TestCaseError::fail("published nothing"));
                };
                let waited = self.now.saturating_duration_since(held.claimed_at);
                prop_assert_eq!(budget, publish_budget(TTL, waited));
                // A batch claimed ahead that waited through half its budget is
                // never published.
                prop_assert!(
                    !held.ahead || budget >= full_budget / 2,
                    "published a batch claimed ahead with {:?} of {:?} left",
                    budget,
                    full_budget
                );
                if self.in_outage || self.steps_since_stop.is_some() {
                    prop_assert_eq!(
                        claim_ahead,
                        None,
                        "claimed ahead during an outage or a stop"
                    );
                }
                prop_assert!(
                    !held.to_give_back,
                    "published a batch claimed ahead of an unsent one"
                );
                self.end(held, "published")?;
                // The previous mark is finished inside the publish step; this
                // batch's mark is in flight after it.
                self.marking = Some(held.id);
                let ahead = match claim_ahead {
                    Some(limit) if !answer.ahead_fails => {
                        let ahead = self.claim(limit, answer.fill, true);
                        if ahead.rows > 0 {
                            self.unpublished = Some(ahead);
                        }
                        Some(taken(ahead.rows, ahead.claimed_at))
                    }
                    _ => None,
                };
                let outcome = match answer.publish {
                    0 => ALL_SENT,
                    1 => OUT_OF_TIME,
                    _ => BROKER_OUT,
                };
                if let Some(ahead) = self.unpublished.as_mut() {
                    ahead.to_give_back = outcome.unsent > 0;
                }
                self.in_outage = match answer.publish {
                    0 => false,
                    1 => self.in_outage,
                    _ => true,
                };
                match answer.publish {
                    0 => self.outage_pause = None,
                    1 => {}
                    _ => {
                        let pause = self
                            .outage_pause
                            .map_or(BACKOFF, |d| (d * 2).min(MAX_OUTAGE_PAUSE));
                        self.outage_pause = Some(pause);
                        self.pause_owed = Some(pause);
                    }
                }
                m.published(outcome, ahead);
            }
            DispatchStep::FinishMark => {
                prop_assert!(self.marking.take().is_some(), "finished no mark");
                m.mark_finished();
            }
            DispatchStep::GiveBack => {
                if let Some(held) = self.unpublished {
                    // Given back only when stale, claimed ahead of an unsent
                    // batch, or at a stop: never a fresh one that could go out.
                    let left =
                        publish_budget(TTL, self.now.saturating_duration_since(held.claimed_at));
                    prop_assert!(
                        held.to_give_back
                            || self.steps_since_stop.is_some()
                            || left < full_budget / 2,
                        "gave back a batch with {:?} of {:?} left",
                        left,
                        full_budget
                    );
                }
                if let Some(held) = self.unpublished.take() {
                    self.end(held, "given back")?;
                }
                m.gave_back();
            }
            DispatchStep::Idle => {
                prop_assert!(self.marking.is_none(), "idle with a mark in flight");
                prop_assert!(self.unpublished.is_none(), "idle holding a batch");
                self.idle_claim_empty = false;
                m.waited();
            }
            DispatchStep::Pause(pause) => {
                prop_assert!(pause >= BACKOFF && pause <= MAX_OUTAGE_PAUSE, "{:?}", pause);
                prop_assert_eq!(Some(pause), self.pause_owed.take(), "a pause not owed");
                prop_assert!(self.unpublished.is_none(), "paused holding a batch");
                self.idle_claim_empty = false;
                m.waited();
            }
            DispatchStep::Done => {
                prop_assert!(self.steps_since_stop.is_some(), "done without a stop");
                prop_assert!(self.unpublished.is_none(), "stopped holding a batch");
                prop_assert!(self.marking.is_none(), "stopped with a mark in flight");
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Whatever the store and the broker answer and whenever the stop comes:
    /// every claimed batch ends exactly once (published or given back), at most
    /// one mark is in flight and only a running one is finished, no stale batch
    /// is published, nothing is claimed ahead during an outage or after a stop,
    /// the loop never spins on empty claims, and a stop ends with nothing held
    /// within a few steps.
    #[test]
    fn every_batch_ends_once_and_a_stop_leaves_nothing_held(
        batch_size in prop_oneof![Just(1u32), Just(3), 1u32..2_000],
        answers in answers(),
        stop_at in any::<prop::sample::Index>(),
    ) {
        let mut m = machine(batch_size);
        let mut model = Model {
            batch_size,
            now: Instant::now(),
            next_id: 0,
            unpublished: None,
            marking: None,
            ended: HashMap::new(),
            in_outage: false,
            claimed_with_rows: 0,
            pause_owed: None,
            outage_pause: None,
            idle_claim_empty: false,
            steps_since_stop: None,
        };
        let stop_at = stop_at.index(answers.len());
        let mut done = false;
        for (i, answer) in answers.iter().enumerate() {
            if i == stop_at {
                m.stop();
                model.steps_since_stop = Some(0);
                // A stop may skip the pause owed.
                model.pause_owed = None;
            }
            model.now += Duration::from_millis(answer.elapsed_ms);
            let step = m.step(model.now);
            model.execute(&mut m, step, *answer)?;
            if step == DispatchStep::Done {
                done = true;
                break;
            }
        }
        // The world ends here: a stop (if none came yet), answered kindly, ends it.
        if model.steps_since_stop.is_none() {
            m.stop();
            model.steps_since_stop = Some(0);
            model.pause_owed = None;
        }
        let kind = Answer { elapsed_ms: 0, fill: 255, claim_fails: 1, publish: 0, ahead_fails: false };
        while !done {
            let step = m.step(model.now);
            model.execute(&mut m, step, kind)?;
            done = step == DispatchStep::Done;
        }
        prop_assert_eq!(model.ended.len(), model.claimed_with_rows, "a batch never ended");
    }
}
