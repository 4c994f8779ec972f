//! The per-key lanes of a consumer that keeps order by key, as a state machine
//! without I/O: deliveries join their key's lane in the order the broker hands
//! them over; each starts only when every earlier delivery of its key has left
//! (handled, or dropped at shutdown). `outbox_consumer`'s worker only wakes the
//! delivery whose turn this says it is.

use std::collections::{HashMap, VecDeque};

/// A delivery's place in its key's lane: its number, unique for the lanes' life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

/// The lanes: per key, the deliveries that joined and have not left, in joining
/// order; the first is the one whose turn it is.
#[derive(Debug, Default, Clone)]
pub struct KeyLanes {
    lanes: HashMap<String, VecDeque<Ticket>>,
    next: u64,
}

impl KeyLanes {
    /// An empty set of lanes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A delivery of `key` joins its lane: its ticket, and whether it may start
    /// now (no earlier delivery of the key is still there).
    pub fn join(&mut self, key: &str) -> (Ticket, bool) {
        let ticket = Ticket(self.next);
        self.next += 1;
        let lane = self.lanes.entry(key.to_owned()).or_default();
        lane.push_back(ticket);
        (ticket, lane.len() == 1)
    }

    /// The delivery holding `ticket` leaves `key`'s lane, finished or dropped
    /// before its turn came; the ticket whose turn it is now, if its leaving
    /// gave one its turn (only the first of a lane leaving does; one dropped while
    /// it waited lets no one go ahead of the deliveries before it). A ticket not
    /// in the lane is ignored.
    pub fn leave(&mut self, key: &str, ticket: Ticket) -> Option<Ticket> {
        let lane = self.lanes.get_mut(key)?;
        let at = lane.iter().position(|t| *t == ticket)?;
        lane.remove(at);
        let next = if at == 0 { lane.front().copied() } else { None };
        if lane.is_empty() {
            self.lanes.remove(key);
        }
        next
    }

    /// Keys with a delivery in their lane.
    #[must_use]
    pub fn keys(&self) -> usize {
        self.lanes.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_key_goes_one_at_a_time_in_joining_order() {
        let mut lanes = KeyLanes::new();
        let (a1, a1_now) = lanes.join("a");
        let (b1, b1_now) = lanes.join("b");
        let (a2, a2_now) = lanes.join("a");
        let (a3, a3_now) = lanes.join("a");
        assert!(a1_now && b1_now && !a2_now && !a3_now);
        assert_eq!(lanes.leave("a", a1), Some(a2));
        assert_eq!(lanes.leave("b", b1), None);
        assert_eq!(lanes.leave("a", a2), Some(a3));
        assert_eq!(lanes.leave("a", a3), None);
        assert_eq!(lanes.keys(), 0, "an empty lane is forgotten");
    }

    #[test]
    fn one_dropped_while_waiting_lets_no_one_past_the_running_one() {
        let mut lanes = KeyLanes::new();
        let (a1, _) = lanes.join("a");
        let (a2, _) = lanes.join("a");
        let (a3, _) = lanes.join("a");
        assert_eq!(lanes.leave("a", a2), None, "a1 still runs");
        assert_eq!(lanes.leave("a", a1), Some(a3));
        assert_eq!(lanes.leave("a", a1), None, "left already: ignored");
    }

    /// What a run of joins and leaves does: the ticket of each join, in order.
    #[derive(Debug, Clone)]
    enum Op {
        Join(u8),
        /// The delivery at this index among those in a lane leaves.
        Leave(prop::sample::Index),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                (0u8..4).prop_map(Op::Join),
                any::<prop::sample::Index>().prop_map(Op::Leave),
            ],
            1..300,
        )
    }

    proptest! {
        /// Whatever joins and leaves (finished or dropped waiting) in whatever
        /// order: a delivery runs only once every earlier one of its key has
        /// left, so at most one per key runs; and whenever the first of a lane
        /// leaves, the next one is told, so none waits for ever.
        #[test]
        fn each_key_runs_one_at_a_time_in_order_and_none_is_forgotten(ops in ops()) {
            let mut lanes = KeyLanes::new();
            // What the executor knows: per ticket its key; which may run.
            let mut present: Vec<(Ticket, String)> = Vec::new();
            let mut running: BTreeSet<Ticket> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Join(k) => {
                        let key = format!("k{k}");
                        let (ticket, now) = lanes.join(&key);
                        let earlier = present.iter().any(|(_, other)| *other == key);
                        prop_assert_eq!(now, !earlier);
                        if now {
                            running.insert(ticket);
                        }
                        present.push((ticket, key));
                    }
                    Op::Leave(i) if !present.is_empty() => {
                        let (ticket, key) = present.remove(i.index(present.len()));
                        let was_running = running.remove(&ticket);
                        let next = lanes.leave(&key, ticket);
                        let first_left = present.iter().find(|(_, other)| *other == key);
                        match next {
                            Some(n) => {
                                prop_assert!(was_running, "a waiting one let another go");
                                prop_assert_eq!(Some(n), first_left.map(|(t, _)| *t));
                                running.insert(n);
                            }
                            None => prop_assert!(
                                !was_running || first_left.is_none(),
                                "the first of a lane left and the next was not told"
                            ),
                        }
                    }
                    Op::Leave(_) => {}
                }
                // Each running delivery is the first of its key still there.
                for t in &running {
                    let (_, key) = present.iter().find(|(p, _)| p == t).expect("present");
                    let first = present.iter().find(|(_, other)| other == key).map(|(p, _)| *p);
                    prop_assert_eq!(first, Some(*t));
                }
                let keys: BTreeSet<&String> = present.iter().map(|(_, k)| k).collect();
                prop_assert_eq!(running.len(), keys.len(), "a key with deliveries and none running");
                prop_assert_eq!(lanes.keys(), keys.len());
            }
        }
    }
}
