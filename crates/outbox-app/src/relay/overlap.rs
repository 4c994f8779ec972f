//! Whether the dispatcher claims its next batch while the previous batch's mark is
//! still in flight, or finishes that mark first. No I/O: the dispatcher reports
//! each claim and asks before the next one.

/// Batches claimed with the mark finished first after which one claim is
/// overlapped again, to see whether overlapping pays again.
///
/// Why a count, and why 16: steady keyed traffic pays one wasted claim per probe,
/// so one in 16 batches instead of one every batch; traffic that can overlap
/// again (unkeyed rows arriving, keys becoming many more than the batch) goes
/// without overlapping for at most 16 batches, once. Probing when a claim made
/// with the mark finished comes back full would not do: with as many keys as the
/// batch holds, that claim is full every time (each key's next message is
/// claimable once its head is marked), so it would probe, and waste the claim,
/// every batch as before.
pub(super) const PROBE_AFTER: u32 = 16;

/// Halvings of the claim's limit at the most: down to 1/16 of the batch size.
pub(super) const MAX_SPLIT: u32 = 4;

/// The dispatcher's choice for its next claim: how many rows it asks for, and
/// whether it claims while the previous batch's mark is in flight. Overlapping
/// (the default) hides that mark behind the next claim and publish. It buys
/// nothing when the next batch is what that mark releases: a keyed message is
/// claimable only once its key's head is marked sent, so when every key's head is
/// in the batch being marked (keys no more than the batch), the overlapped claim
/// walks the keys and finds nothing.
///
/// - An overlapped claim that comes back empty: the claim's limit is halved (at
///   most [`MAX_SPLIT`] times) and the next claim finishes the mark first. A
///   batch then holds at most half the keys, so the next overlapped claim finds
///   the other half's heads free, and the one after it the first half's next
///   messages (that batch's mark finished before the next was handed over):
///   claims and marks overlap again, on half batches. With keys fewer than the
///   halved limit, it halves again.
/// - Halved [`MAX_SPLIT`] times and still empty: the next claims finish the mark
///   first (fewer keys than a sixteenth of the batch; overlapping cannot pay).
///   After [`PROBE_AFTER`] batches claimed that way, one claim overlaps again, as
///   a probe; if it comes back empty, another [`PROBE_AFTER`].
/// - [`PROBE_AFTER`] batches taken at a halved limit: the limit is doubled again,
///   to see whether the traffic allows it now (unkeyed rows, more keys); one
///   wasted claim per probe when it does not.
/// - A claim with the mark finished that comes back empty: nothing is claimable
///   at all (the backlog is drained; it was not the mark holding rows back), so
///   everything starts over: the full batch, overlapped. Without this, every idle
///   spell (whose first claim is an overlapped one coming back empty) would cost
///   the next burst of unkeyed traffic its full batches and overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct ClaimOverlap {
    /// While marks are finished first: how many batches have been claimed so;
    /// `None` while claims overlap.
    finishing_first: Option<u32>,
    /// The claim's limit is the batch size halved this many times.
    split: u32,
    /// The next claim finishes the mark first, once (right after a halving).
    finish_once: bool,
    /// Batches taken at the current halved limit, towards the next doubling.
    at_split: u32,
}

impl ClaimOverlap {
    /// Whether the next claim may run while the previous batch's mark is in
    /// flight; if not, that mark is finished before claiming.
    pub(super) const fn overlaps(self) -> bool {
        self.finishing_first.is_none() && !self.finish_once
    }

    /// How many rows the next claim asks for, of a batch of `batch_size`.
    pub(super) const fn limit(self, batch_size: u32) -> u32 {
        let halved = batch_size >> self.split;
        if halved == 0 { 1 } else { halved }
    }

    /// Records a claim: whether it ran while a mark was in flight, and how many
    /// rows it took.
    pub(super) fn claimed(&mut self, overlapped: bool, rows: usize) {
        if rows == 0 {
            if !overlapped {
                *self = Self::default();
            } else if self.finishing_first.is_none() && self.split < MAX_SPLIT {
                self.split += 1;
                self.finish_once = true;
                self.at_split = 0;
            } else {
                self.finishing_first = Some(0);
            }
            return;
        }
        self.finish_once = false;
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

    /// (overlaps, limit of a batch of 1,000) before each claim, after reporting
    /// `claims` (overlapped, rows) in turn from the default; the last entry is the
    /// answer after them all.
    fn plans_after(claims: &[(bool, usize)]) -> Vec<(bool, u32)> {
        let mut o = ClaimOverlap::default();
        let mut answers = vec![(o.overlaps(), o.limit(1000))];
        for &(overlapped, rows) in claims {
            o.claimed(overlapped, rows);
            answers.push((o.overlaps(), o.limit(1000)));
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
    fn an_overlapped_claim_that_comes_back_empty_halves_the_claim_and_finishes_the_mark_once() {
        assert_eq!(
            plans_after(&[
                (false, 1000),
                (true, 0),
                (false, 500),
                (true, 500),
                (true, 500)
            ]),
            [
                (true, 1000),
                (true, 1000),
                (false, 500),
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
        let mut o = ClaimOverlap::default();
        o.claimed(false, 100);
        let mut limits = Vec::new();
        while o.limit(1000) > 100 {
            o.claimed(true, 0);
            assert!(!o.overlaps(), "the mark is finished first after a halving");
            limits.push(o.limit(1000));
            o.claimed(false, 100);
        }
        assert_eq!(limits, [500, 250, 125, 62]);
        assert!(o.overlaps());
        o.claimed(false, 62);
        o.claimed(true, 38);
        assert_eq!((o.overlaps(), o.limit(1000)), (true, 62));
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

    #[test]
    fn after_the_last_halving_the_marks_are_finished_first_and_overlapping_is_probed() {
        let mut o = ClaimOverlap::default();
        for _ in 0..MAX_SPLIT {
            o.claimed(true, 0);
            o.claimed(false, 5);
        }
        assert_eq!((o.overlaps(), o.limit(1000)), (true, 1000 >> MAX_SPLIT));
        // Even a sixteenth of the batch holds every key: finish the marks first.
        o.claimed(true, 0);
        for _ in 1..PROBE_AFTER {
            o.claimed(false, 5);
            assert!(!o.overlaps());
        }
        o.claimed(false, 5);
        assert!(o.overlaps(), "the probe");
        o.claimed(true, 0);
        assert!(!o.overlaps(), "the keys still hold the probe back");
        assert_eq!(o.limit(1000), 1000 >> MAX_SPLIT);
    }

    #[test]
    fn a_halved_claim_is_doubled_again_after_so_many_batches() {
        let mut o = ClaimOverlap::default();
        o.claimed(true, 0);
        for _ in 0..PROBE_AFTER {
            assert_eq!(o.limit(1000), 500);
            o.claimed(o.overlaps(), 500);
        }
        assert_eq!((o.overlaps(), o.limit(1000)), (true, 1000), "the probe");
        // Unkeyed rows now: the full batch is taken, overlapped, from then on.
        o.claimed(true, 1000);
        o.claimed(true, 1000);
        assert_eq!((o.overlaps(), o.limit(1000)), (true, 1000));
    }

    #[test]
    fn steady_keyed_traffic_wastes_one_claim_per_probe() {
        // As many keys as the batch (1,000): a full claim leaves no head for the
        // overlapped one; half batches alternate between the two halves of the
        // keys, so every overlapped claim at half the batch takes 500.
        let keys = 1000;
        let mut o = ClaimOverlap::default();
        let mut in_flight = 0;
        let mut empty = 0;
        for _ in 0..10 * (PROBE_AFTER + 1) {
            let overlapped = o.overlaps() && in_flight > 0;
            if !overlapped {
                in_flight = 0;
            }
            let rows = o.limit(1000).min(keys - in_flight) as usize;
            if rows == 0 {
                empty += 1;
            }
            o.claimed(overlapped, rows);
            in_flight = rows as u32;
        }
        assert!(empty <= 11, "{empty} empty claims in 170");
    }

    #[test]
    fn the_limit_is_never_zero() {
        let mut o = ClaimOverlap::default();
        for _ in 0..MAX_SPLIT {
            o.claimed(true, 0);
        }
        assert_eq!(o.limit(3), 1);
        assert_eq!(o.limit(1), 1);
    }
}
