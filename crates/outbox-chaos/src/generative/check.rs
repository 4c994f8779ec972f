//! The checker: every committed message's fate from records the processes under
//! test cannot fake, and the violations.
//!
//! - the ledger: a row per message, written by the producer in the message's own
//!   transaction (so the committed messages are exactly the ledger's rows);
//! - the tap: a queue bound to the exchange exactly as the billing queue is (not
//!   `#`, which would route the messages meant to be unroutable), consumed for the
//!   whole round: every copy the broker routed;
//! - the effects: `invoices`, without a primary key, so a message that took effect
//!   twice is two rows, each with the order its effect was applied in
//!   (`billed_seq`);
//! - the outbox and inbox tables and the dead letters, as they are at the end;
//! - what the run's operator did (requeued, deleted).

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

/// A committed message as its producer recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Committed {
    pub(crate) id: Uuid,
    pub(crate) order_id: i64,
    pub(crate) key: Option<String>,
    pub(crate) unroutable: bool,
    pub(crate) refused: bool,
    /// The dead message this one replays (the operator's edit and replay): both
    /// carry the same order, whose effect must be applied once.
    pub(crate) replay_of: Option<Uuid>,
}

/// Everything read at the end of a round (or while waiting for it to settle).
#[derive(Debug, Clone, Default)]
pub(crate) struct Observed {
    pub(crate) committed: Vec<Committed>,
    /// Outbox status by message id (`pending`, `sent`, `publish_failed`, `dead`).
    pub(crate) outbox: HashMap<Uuid, String>,
    /// Unsent keyed messages held behind a dead message of their key
    /// (`on_dead = "block"`): waiting for an operator, by design.
    pub(crate) blocked: HashSet<Uuid>,
    /// The billing consumer's inbox status by message id.
    pub(crate) inbox: HashMap<Uuid, String>,
    /// Message ids kept as dead letters.
    pub(crate) dead_letters: HashSet<Uuid>,
    /// Effects: (order id, message id, the order they were applied in).
    pub(crate) effects: Vec<(i64, Uuid, i64)>,
    /// Copies the tap received, by message id.
    pub(crate) tap: HashMap<Uuid, u32>,
    /// Messages the run's operator deleted.
    pub(crate) deleted: HashSet<Uuid>,
    /// Messages the run's operator requeued or deleted: their order is the
    /// operator's, not checked.
    pub(crate) touched: HashSet<Uuid>,
    /// The billing queue and the tap are empty and nothing is in flight.
    pub(crate) drained: bool,
    /// The consumer handles each key's messages one after another.
    pub(crate) ordered: bool,
    /// Rows of the exchange paused for the whole round that a relay claimed,
    /// published or gave up on (with what it did): none may be.
    pub(crate) held_moved: Vec<(Uuid, String)>,
}

/// What the checker fails a round for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    Lost,
    DuplicateEffect,
    OutOfOrder,
    Stuck,
    /// A message of a paused exchange claimed or published.
    PauseBroken,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) kind: Kind,
    pub(crate) message_id: Uuid,
    pub(crate) what: String,
}

/// A message's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Fate {
    /// Its effect applied.
    Consumed,
    /// Dead in the outbox (publishing given up).
    DeadOutbox,
    /// Dead in the inbox (handling given up, or refused).
    DeadInbox,
    /// Kept as a dead letter.
    DeadLetter,
    /// Deleted by the operator.
    Deleted,
    /// Unsent behind a dead message of its key, waiting for an operator.
    Blocked,
    /// Not there yet: unsent, unfinished in the inbox, or in a queue.
    InProgress,
    /// Marked sent, but the tap never had it, and no inbox row.
    SentNowhere,
    /// Its outbox row is gone, nothing else has it.
    Vanished,
    /// Consumed in the inbox without its effect.
    ConsumedWithoutEffect,
}

/// The verdict on one round's observations.
#[derive(Debug, Clone, Default)]
pub(crate) struct Verdict {
    pub(crate) messages: u64,
    pub(crate) fates: std::collections::BTreeMap<Fate, u64>,
    pub(crate) violations: Vec<Violation>,
    /// Nothing is left in progress.
    pub(crate) settled: bool,
    /// Delivered messages that are nonetheless `dead` in the outbox (a publish
    /// reported failed that reached a queue): no violation, but a replay of one
    /// would apply it twice.
    pub(crate) dead_but_delivered: u64,
    /// Copies the tap received beyond the first.
    pub(crate) duplicate_deliveries: u64,
}

impl Verdict {
    pub(crate) fn count(&self, kind: Kind) -> u64 {
        self.violations.iter().filter(|v| v.kind == kind).count() as u64
    }
}

fn fate(m: &Committed, o: &Observed, effects: u32) -> Fate {
    let outbox = o.outbox.get(&m.id).map(String::as_str);
    let inbox = o.inbox.get(&m.id).map(String::as_str);
    if effects > 0 {
        return Fate::Consumed;
    }
    match inbox {
        Some("dead") => return Fate::DeadInbox,
        Some("consumed") => return Fate::ConsumedWithoutEffect,
        Some(_) => return Fate::InProgress,
        None => {}
    }
    if o.dead_letters.contains(&m.id) {
        return Fate::DeadLetter;
    }
    match outbox {
        Some("dead") => Fate::DeadOutbox,
        Some("pending" | "publish_failed") if o.blocked.contains(&m.id) => Fate::Blocked,
        Some("pending" | "publish_failed") => Fate::InProgress,
        Some(_) if o.tap.contains_key(&m.id) => Fate::InProgress,
        Some(_) if !o.drained => Fate::InProgress,
        Some(_) => Fate::SentNowhere,
        None if o.deleted.contains(&m.id) => Fate::Deleted,
        None => Fate::Vanished,
    }
}

/// Checks the observations of round `seed`. With `last` (the round's time is up),
/// what is still in progress is stuck, and a message that a queue had but the
/// consumer never recorded is lost once the queues are drained.
pub(crate) fn check(o: &Observed, last: bool) -> Verdict {
    let mut effects_of: HashMap<i64, Vec<(i64, Uuid)>> = HashMap::new();
    for (order, id, seq) in &o.effects {
        effects_of.entry(*order).or_default().push((*seq, *id));
    }
    let mut v = Verdict {
        messages: o.committed.len() as u64,
        settled: true,
        duplicate_deliveries: o.tap.values().map(|n| u64::from(n.saturating_sub(1))).sum(),
        ..Verdict::default()
    };
    let mut push = |kind, id, what: String| {
        v.violations.push(Violation {
            kind,
            message_id: id,
            what,
        });
    };
    let mut fates = Vec::with_capacity(o.committed.len());
    let mut reported = HashSet::new();
    for m in &o.committed {
        let effects = if m.refused {
            0
        } else {
            effects_of.get(&m.order_id).map_or(0, Vec::len) as u32
        };
        // Once per order, whether a message or its replay holds it.
        if effects > 1 && reported.insert(m.order_id) {
            push(
                Kind::DuplicateEffect,
                m.id,
                format!("order {}: its effect applied {effects} times", m.order_id),
            );
        }
        let f = fate(m, o, effects);
        let outbox = o.outbox.get(&m.id).map_or("gone", String::as_str);
        match f {
            Fate::SentNowhere => push(
                Kind::Lost,
                m.id,
                format!(
                    "marked {outbox} in the outbox, but no queue had it (the tap never received it) and no consumer recorded it{}",
                    if m.unroutable {
                        "; its routing key is bound nowhere"
                    } else {
                        ""
                    }
                ),
            ),
            Fate::Vanished => push(
                Kind::Lost,
                m.id,
                "committed, its outbox row gone (not deleted by the operator), never delivered"
                    .to_owned(),
            ),
            Fate::ConsumedWithoutEffect => push(
                Kind::Lost,
                m.id,
                "consumed in the inbox, but its effect is not there".to_owned(),
            ),
            Fate::InProgress if last => {
                let inbox = o.inbox.get(&m.id).map(String::as_str);
                if inbox.is_none() && o.tap.contains_key(&m.id) && o.drained {
                    push(
                        Kind::Lost,
                        m.id,
                        format!(
                            "marked {outbox}, routed (the tap has it), the queues drained, but no consumer recorded it"
                        ),
                    );
                } else {
                    push(
                        Kind::Stuck,
                        m.id,
                        format!(
                            "still in progress at the end (outbox {outbox}, inbox {})",
                            inbox.unwrap_or("none")
                        ),
                    );
                }
            }
            Fate::InProgress => v.settled = false,
            _ => {}
        }
        if f == Fate::Consumed && outbox == "dead" {
            v.dead_but_delivered += 1;
        }
        *v.fates.entry(f).or_default() += 1;
        fates.push(f);
    }
    if o.ordered {
        out_of_order(o, &effects_of, &mut v);
    }
    for (id, what) in &o.held_moved {
        v.violations.push(Violation {
            kind: Kind::PauseBroken,
            message_id: *id,
            what: format!("a message of the exchange paused throughout the round moved: {what}"),
        });
    }
    v
}

/// Per key, the first effect of each message in the order they were applied must
/// follow the order ids (commit order within a key). Messages the operator
/// requeued or deleted are left out: their place is the operator's.
fn out_of_order(o: &Observed, effects_of: &HashMap<i64, Vec<(i64, Uuid)>>, v: &mut Verdict) {
    let mut by_key: HashMap<&str, Vec<(i64, i64, Uuid)>> = HashMap::new();
    for m in &o.committed {
        let (Some(key), false) = (m.key.as_deref(), o.touched.contains(&m.id)) else {
            continue;
        };
        if let Some(first) = effects_of.get(&m.order_id).and_then(|e| e.iter().min()) {
            by_key
                .entry(key)
                .or_default()
                .push((first.0, m.order_id, m.id));
        }
    }
    for (key, mut applied) in by_key {
        applied.sort_unstable();
        let mut highest: Option<i64> = None;
        for (_, order, id) in applied {
            match highest {
                Some(h) if order < h => v.violations.push(Violation {
                    kind: Kind::OutOfOrder,
                    message_id: id,
                    what: format!(
                        "key {key}: order {order} applied after order {h}, committed later"
                    ),
                }),
                _ => highest = Some(order),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn msg(n: u128, key: Option<&str>) -> Committed {
        Committed {
            id: id(n),
            order_id: n as i64,
            key: key.map(str::to_owned),
            unroutable: false,
            refused: false,
            replay_of: None,
        }
    }

    /// Three messages, each consumed once in order, the queues drained.
    fn clean() -> Observed {
        let mut o = Observed {
            drained: true,
            ordered: true,
            ..Observed::default()
        };
        for n in 1..=3 {
            o.committed.push(msg(n, Some("k0")));
            o.outbox.insert(id(n), "sent".into());
            o.inbox.insert(id(n), "consumed".into());
            o.effects.push((n as i64, id(n), n as i64));
            o.tap.insert(id(n), 1);
        }
        o
    }

    #[test]
    fn a_clean_round_has_no_violation() {
        let v = check(&clean(), true);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert!(v.settled);
        assert_eq!(v.fates.get(&Fate::Consumed), Some(&3));
    }

    #[test]
    fn a_paused_exchange_s_message_that_moved_breaks_the_pause() {
        let mut o = clean();
        o.held_moved
            .push((id(9), "publish_failed after 1 attempt".into()));
        let v = check(&o, false);
        assert_eq!(v.count(Kind::PauseBroken), 1);
        assert!(v.violations[0].what.contains("paused throughout"));
    }

    #[test]
    fn an_unroutable_message_marked_sent_is_lost() {
        // Defect 1 as the tables show it: sent, never in a queue.
        let mut o = clean();
        let mut m = msg(4, None);
        m.unroutable = true;
        o.committed.push(m);
        o.outbox.insert(id(4), "sent".into());
        let v = check(&o, false);
        assert_eq!(v.count(Kind::Lost), 1);
        assert!(v.violations[0].what.contains("bound nowhere"));
        // Dead instead: accounted for.
        o.outbox.insert(id(4), "dead".into());
        assert!(check(&o, true).violations.is_empty());
    }

    #[test]
    fn a_sent_message_is_in_progress_until_the_queues_are_drained() {
        let mut o = clean();
        o.committed.push(msg(4, None));
        o.outbox.insert(id(4), "sent".into());
        o.drained = false;
        let v = check(&o, false);
        assert!(v.violations.is_empty() && !v.settled);
        let v = check(&o, true);
        assert_eq!(v.count(Kind::Stuck), 1);
    }

    #[test]
    fn routed_but_never_recorded_once_drained_is_lost() {
        let mut o = clean();
        o.committed.push(msg(4, None));
        o.outbox.insert(id(4), "sent".into());
        o.tap.insert(id(4), 1);
        assert!(!check(&o, false).settled);
        assert_eq!(check(&o, true).count(Kind::Lost), 1);
    }

    #[test]
    fn a_vanished_row_is_lost_unless_the_operator_deleted_it() {
        let mut o = clean();
        o.committed.push(msg(4, None));
        assert_eq!(check(&o, false).count(Kind::Lost), 1);
        o.deleted.insert(id(4));
        assert!(check(&o, true).violations.is_empty());
    }

    #[test]
    fn consumed_without_effect_is_lost() {
        let mut o = clean();
        o.effects.retain(|e| e.0 != 2);
        assert_eq!(check(&o, true).count(Kind::Lost), 1);
    }

    #[test]
    fn a_second_effect_is_a_duplicate() {
        let mut o = clean();
        o.effects.push((2, id(99), 10));
        let v = check(&o, true);
        assert_eq!(v.count(Kind::DuplicateEffect), 1);
        assert_eq!(v.violations[0].message_id, id(2));
    }

    #[test]
    fn a_replay_applied_beside_its_delivered_original_is_one_duplicate() {
        // Defect 2's shape: the original dead though delivered, its replay
        // delivered too.
        let mut o = clean();
        o.outbox.insert(id(2), "dead".into());
        let mut replay = msg(20, None);
        replay.order_id = 2;
        replay.replay_of = Some(id(2));
        o.committed.push(replay);
        o.outbox.insert(id(20), "sent".into());
        o.inbox.insert(id(20), "consumed".into());
        o.tap.insert(id(20), 1);
        o.effects.push((2, id(20), 4));
        let v = check(&o, true);
        assert_eq!(v.count(Kind::DuplicateEffect), 1, "{:?}", v.violations);
        assert_eq!(v.violations.len(), 1);
    }

    #[test]
    fn a_key_applied_out_of_commit_order_is_reported_unless_the_operator_moved_it() {
        let mut o = clean();
        // Order 1 applied last.
        o.effects = vec![(2, id(2), 1), (3, id(3), 2), (1, id(1), 3)];
        let v = check(&o, true);
        assert_eq!(v.count(Kind::OutOfOrder), 1, "{:?}", v.violations);
        assert_eq!(v.violations[0].message_id, id(1));
        o.touched.insert(id(1));
        assert!(check(&o, true).violations.is_empty());
        // Not checked when the consumer does not order by key.
        o.touched.clear();
        o.ordered = false;
        assert!(check(&o, true).violations.is_empty());
    }

    #[test]
    fn unfinished_at_the_end_is_stuck_but_blocked_behind_a_dead_head_is_not() {
        let mut o = clean();
        o.committed.push(msg(4, Some("k1")));
        o.outbox.insert(id(4), "pending".into());
        assert!(!check(&o, false).settled);
        assert_eq!(check(&o, true).count(Kind::Stuck), 1);
        o.blocked.insert(id(4));
        let v = check(&o, true);
        assert!(v.violations.is_empty() && v.settled);
        o.blocked.clear();
        o.outbox.insert(id(4), "sent".into());
        o.inbox.insert(id(4), "consume_failed".into());
        assert_eq!(check(&o, true).count(Kind::Stuck), 1);
    }

    #[test]
    fn dead_in_the_inbox_or_as_a_dead_letter_is_accounted_for() {
        let mut o = clean();
        o.committed.push(msg(4, None));
        o.outbox.insert(id(4), "sent".into());
        o.inbox.insert(id(4), "dead".into());
        o.committed.push(msg(5, None));
        o.outbox.insert(id(5), "sent".into());
        o.dead_letters.insert(id(5));
        let v = check(&o, true);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    #[test]
    fn a_dead_message_that_was_delivered_is_counted_not_failed() {
        let mut o = clean();
        o.outbox.insert(id(2), "dead".into());
        let v = check(&o, true);
        assert!(v.violations.is_empty());
        assert_eq!(v.dead_but_delivered, 1);
    }
}
