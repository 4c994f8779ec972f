//! How many rows the dispatcher claims next, and whether it claims them while an
//! earlier batch is still in flight (being published, or marked) or finishes that
//! batch first. No I/O:
//! the dispatcher reports each claim and asks before the next one.

/// Batches after which a choice made for keyed traffic is tried again: a halved
/// claim limit is doubled, and while marks are finished first, one claim is
/// overlapped (a probe).
///
/// Why a count, and why 16: when the traffic still needs the choice, trying
/// again costs at most one wasted claim per 16 batches instead of one every
/// batch; traffic that no longer needs it (unkeyed rows arriving, keys becoming
/// many more than the batch) lives with it for at most 16 batches a step. Probing
/// when a claim made with the mark finished comes back full would not do: with
/// as many keys as the batch holds, that claim is full every time (each key's
/// next message is claimable once its head is marked), so it would probe, and
/// waste the claim, every batch.
pub const PROBE_AFTER: u32 = 16;

/// Halvings of the claim's limit at the most: down to 1/16 of the batch size.
pub const MAX_SPLIT: u32 = 4;

/// The dispatcher's choice for its next claim: how many rows it asks for
/// ([`limit`](Self::limit)), and whether it claims while an earlier batch is in
/// flight ([`overlaps`](Self::overlaps)): in the dispatcher, while a batch is
/// published (after the previous one's mark is finished), or while a mark runs.
/// Overlapping (the default) hides the claim behind the publish. It buys nothing
/// when the next batch is what the batch in flight releases: a keyed message is
/// claimable only once its key's head is marked sent, so when every key's head is
/// in the batch being published or marked (keys no more than the batch), the
/// overlapped claim walks the keys and finds nothing (the loop then finishes the
/// mark and claims again).
///
/// - An overlapped claim that comes back empty: the limit is halved, at most
///   [`MAX_SPLIT`] times (fewer for a batch too small to halve). A batch then
///   holds at most half the keys, so the next overlapped claim finds the other
///   half's heads free, and the one after it the first half's next messages (that
///   batch's mark finished before the next was handed over): claims and marks
///   overlap again, on half batches. With keys fewer than the halved limit, it
///   halves again.
/// - [`PROBE_AFTER`] batches taken at a halved limit: it is doubled, to see
///   whether the traffic allows more now (unkeyed rows, more keys). An overlapped
///   claim is empty only when nothing at all is free, so this wastes nothing
///   while the halves alternate.
/// - Halved as far as it goes and still empty: halving cannot pay (fewer keys
///   than the smallest limit). The marks are finished first, with full batches,
///   as without halving; after [`PROBE_AFTER`] batches one claim overlaps again,
///   as a probe. A probe that comes back empty goes straight back to finishing
///   the marks first; halving is tried again only once an overlapped claim has
///   taken rows.
/// - A claim with the mark finished that comes back empty: nothing is claimable
///   at all (the backlog is drained; it was not the mark holding rows back), so
///   everything starts over: the full batch, overlapped. Without this, every idle
///   spell (whose first claim is an overlapped one coming back empty) would cost
///   the next burst of unkeyed traffic its full batches and overlap.
///
/// Left alone: halves of very unequal size (251 keys and a batch of 500 alternate
/// batches of 250 and 1) are not rebalanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOverlap {
    /// The dispatcher's batch size: the most a claim asks for.
    batch_size: u32,
    /// How many halvings this batch size allows (up to [`MAX_SPLIT`]).
    max_split: u32,
    /// While marks are finished first: how many batches have been claimed so;
    /// `None` while claims overlap.
    finishing_first: Option<u32>,
    /// The claim's limit is the batch size halved this many times.
    split: u32,
    /// Batches taken at the current halved limit, towards the next doubling.
    at_split: u32,
    /// Halving went as far as it goes and did not help; set until an overlapped
    /// claim takes rows again (or the relay is idle).
    halving_failed: bool,
}

impl ClaimOverlap {
    /// The choice for a dispatcher claiming at most `batch_size` rows.
    pub const fn new(batch_size: u32) -> Self {
        // As many halvings as leave at least one row.
        let mut max_split = 0;
        while max_split < MAX_SPLIT && batch_size >> (max_split + 1) > 0 {
            max_split += 1;
        }
        Self {
            batch_size,
            max_split,
            finishing_first: None,
            split: 0,
            at_split: 0,
            halving_failed: false,
        }
    }

    /// Whether the next claim may run while an earlier batch is in flight (being
    /// published, with the one before it marked first; or being marked); if not,
    /// that batch is published and marked before claiming.
    pub const fn overlaps(self) -> bool {
        self.finishing_first.is_none()
    }

    /// How many rows the next claim asks for.
    pub const fn limit(self) -> u32 {
        self.batch_size >> self.split
    }

    /// Records a claim: whether it ran while an earlier batch was in flight, and
    /// how many rows it took.
    pub fn claimed(&mut self, overlapped: bool, rows: usize) {
        if rows == 0 {
            if !overlapped {
                *self = Self::new(self.batch_size);
            } else if self.finishing_first.is_none()
                && !self.halving_failed
                && self.split < self.max_split
            {
                self.split += 1;
                self.at_split = 0;
            } else {
                self.finishing_first = Some(0);
                self.split = 0;
                self.at_split = 0;
                self.halving_failed = true;
            }
            return;
        }
        if overlapped {
            self.halving_failed = false;
        }
        self.finishing_first = match self.finishing_first {
            Some(n) if n + 1 >= PROBE_AFTER => None,
            Some(n) => Some(n + 1),
            None => {
                if self.split > 0 {
                    self.at_split += 1;
                    if self.at_split >= PROBE_AFTER {
                        self.split -= 1;
                        self.at_split = 0;
                    }
                }
                None
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (overlaps, limit) before each claim of a dispatcher with batches of
    /// 1,000, after reporting `claims` (overlapped, rows) in turn; the last entry
    /// is the answer after them all.
    fn plans_after(claims: &[(bool, usize)]) -> Vec<(bool, u32)> {
        let mut o = ClaimOverlap::new(1000);
        let mut answers = vec![(o.overlaps(), o.limit())];
        for &(overlapped, rows) in claims {
            o.claimed(overlapped, rows);
            answers.push((o.overlaps(), o.limit()));
        }
        answers
    }

    #[test]
    fn claims_overlap_at_the_full_batch_while_the_overlapped_ones_take_rows() {
        assert!(
            plans_after(&[(false, 1000), (true, 1000), (true, 3), (true, 1000)])
                .into_iter()
                .all(|p| p == (true, 1000))
        );
    }

    #[test]
    fn an_overlapped_claim_that_comes_back_empty_halves_the_claim() {
        assert_eq!(
            plans_after(&[(false, 1000), (true, 0), (false, 500), (true, 500)]),
            [
                (true, 1000),
                (true, 1000),
                (true, 500),
                (true, 500),
                (true, 500)
            ]
        );
    }

    #[test]
    fn fewer_keys_than_the_halved_claim_halve_it_again() {
        // 100 keys, batch 1,000: each claim takes every head until the limit is
        // below the keys (62), then the overlapped claim takes the other 38.
        let mut o = ClaimOverlap::new(1000);
        o.claimed(false, 100);
        let mut limits = Vec::new();
        for _ in 0..MAX_SPLIT {
            if o.limit() <= 100 {
                break;
            }
            o.claimed(true, 0);
            limits.push(o.limit());
            o.claimed(false, 100.min(o.limit() as usize));
        }
        assert_eq!(limits, [500, 250, 125, 62]);
        assert!(o.overlaps());
        o.claimed(true, 38);
        assert_eq!((o.overlaps(), o.limit()), (true, 62));
    }

    #[test]
    fn a_claim_with_nothing_in_flight_that_comes_back_empty_starts_over() {
        // E.g. an idle dispatcher's polls; and after a keyed backlog, drained.
        assert_eq!(plans_after(&[(false, 0), (false, 0)]), [(true, 1000); 3]);
        assert_eq!(
            plans_after(&[(true, 0), (false, 500), (false, 0)]).last(),
            Some(&(true, 1000))
        );
    }

    /// Fewer keys (5) than even a sixteenth of the batch: after the halvings the
    /// marks are finished first with full batches, one probe per 16 batches, and
    /// a failed probe goes straight back (no halvings again).
    #[test]
    fn when_halving_cannot_pay_the_marks_are_finished_first_with_full_batches() {
        let mut o = ClaimOverlap::new(1000);
        o.claimed(false, 5);
        let mut wasted = 0;
        while o.overlaps() {
            o.claimed(true, 0);
            wasted += 1;
            if o.overlaps() {
                o.claimed(false, 5);
            }
        }
        assert_eq!(
            wasted,
            MAX_SPLIT + 1,
            "the halvings, then the last empty claim"
        );
        for _ in 0..3 {
            for _ in 0..PROBE_AFTER {
                assert_eq!((o.overlaps(), o.limit()), (false, 1000));
                o.claimed(false, 5);
            }
            assert_eq!((o.overlaps(), o.limit()), (true, 1000), "the probe");
            o.claimed(true, 0);
        }
        assert_eq!((o.overlaps(), o.limit()), (false, 1000));
        // Unkeyed rows now: the probe takes rows, and claims overlap from then on.
        for _ in 0..PROBE_AFTER {
            o.claimed(false, 1000);
        }
        o.claimed(true, 1000);
        o.claimed(true, 1000);
        assert_eq!((o.overlaps(), o.limit()), (true, 1000));
    }

    #[test]
    fn a_halved_claim_is_doubled_again_after_so_many_batches() {
        let mut o = ClaimOverlap::new(1000);
        o.claimed(true, 0);
        for _ in 0..PROBE_AFTER {
            assert_eq!(o.limit(), 500);
            o.claimed(true, 500);
        }
        assert_eq!((o.overlaps(), o.limit()), (true, 1000));
        o.claimed(true, 1000);
        o.claimed(true, 1000);
        assert_eq!((o.overlaps(), o.limit()), (true, 1000));
    }

    /// As many keys as the batch (1,000), as the loop runs it: after the first
    /// full batch, one empty overlapped claim halves the limit, and from then on
    /// every claim overlaps the previous mark and takes the free half of the keys,
    /// doublings included (an overlapped claim takes only what is free).
    #[test]
    fn steady_keyed_traffic_wastes_one_claim_and_then_overlaps() {
        let keys = 1000;
        let mut o = ClaimOverlap::new(1000);
        let mut in_flight = 0;
        let (mut empty, mut overlapped_with_rows) = (0, 0);
        for _ in 0..10 * PROBE_AFTER {
            let overlapped = o.overlaps() && in_flight > 0;
            if !overlapped {
                in_flight = 0;
            }
            let rows = o.limit().min(keys - in_flight);
            if rows == 0 {
                empty += 1;
            } else if overlapped {
                overlapped_with_rows += 1;
            }
            o.claimed(overlapped, rows as usize);
            // After an empty overlapped claim the loop finishes the mark.
            in_flight = rows;
        }
        assert_eq!(empty, 1);
        assert!(
            overlapped_with_rows >= 10 * PROBE_AFTER - 3,
            "{overlapped_with_rows} of {} claims overlapped",
            10 * PROBE_AFTER
        );
    }

    #[test]
    fn a_batch_too_small_to_halve_is_never_halved_to_nothing() {
        let mut o = ClaimOverlap::new(1);
        o.claimed(false, 1);
        o.claimed(true, 0);
        assert_eq!((o.overlaps(), o.limit()), (false, 1), "no halving of 1 row");
        let mut o = ClaimOverlap::new(3);
        o.claimed(true, 0);
        assert_eq!(o.limit(), 1);
        o.claimed(true, 0);
        assert_eq!((o.overlaps(), o.limit()), (false, 3));
        assert_eq!(ClaimOverlap::new(0).limit(), 0, "as configured");
    }
}
