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

/// The dispatcher's choice for its next claim. Overlapping (the default) hides
/// the previous batch's mark behind the next claim and publish. It buys nothing
/// when the next batch is what that mark releases: a keyed message is claimable
/// only once its key's head is marked sent, so when every key's head is in the
/// batch being marked (keys no more than the batch), the overlapped claim walks
/// the keys, finds nothing, and the dispatcher waits for the mark and claims
/// again: a wasted claim every batch.
///
/// - An overlapped claim that comes back empty: the next claims finish the mark
///   first.
/// - [`PROBE_AFTER`] batches claimed that way: the next claim overlaps again, as
///   a probe; if it comes back empty, another [`PROBE_AFTER`].
/// - A claim with the mark finished that comes back empty: nothing is claimable
///   at all (the backlog is drained; it was not the mark holding rows back), so
///   whatever arrives next is claimed overlapped again. Without this, every idle
///   spell (whose first claim is an overlapped one coming back empty) would cost
///   the next burst of unkeyed traffic its overlap until the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct ClaimOverlap {
    /// While marks are finished first: how many batches have been claimed so;
    /// `None` while claims overlap.
    finishing_first: Option<u32>,
}

impl ClaimOverlap {
    /// Whether the next claim may run while the previous batch's mark is in
    /// flight; if not, that mark is finished before claiming.
    pub(super) const fn overlaps(self) -> bool {
        self.finishing_first.is_none()
    }

    /// Records a claim: whether it ran while a mark was in flight, and how many
    /// rows it took.
    pub(super) fn claimed(&mut self, overlapped: bool, rows: usize) {
        self.finishing_first = match (self.finishing_first, rows) {
            (None, 0) if overlapped => Some(0),
            (None, _) => None,
            (Some(_), 0) => None,
            (Some(n), _) if n + 1 >= PROBE_AFTER => None,
            (Some(n), _) => Some(n + 1),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether each claim overlaps, after reporting `claims` (overlapped, rows)
    /// in turn from the default; the last entry is the answer after them all.
    fn overlaps_after(claims: &[(bool, usize)]) -> Vec<bool> {
        let mut o = ClaimOverlap::default();
        let mut answers = vec![o.overlaps()];
        for &(overlapped, rows) in claims {
            o.claimed(overlapped, rows);
            answers.push(o.overlaps());
        }
        answers
    }

    #[test]
    fn claims_overlap_while_the_overlapped_ones_take_rows() {
        assert!(
            overlaps_after(&[(false, 40), (true, 40), (true, 3), (true, 40)])
                .into_iter()
                .all(|o| o)
        );
    }

    #[test]
    fn an_overlapped_claim_that_comes_back_empty_finishes_the_mark_first_next() {
        assert_eq!(
            overlaps_after(&[(false, 40), (true, 0), (false, 40), (false, 40)]),
            [true, true, false, false, false]
        );
    }

    #[test]
    fn a_claim_with_nothing_in_flight_that_comes_back_empty_changes_nothing() {
        // E.g. an idle dispatcher's polls.
        assert_eq!(overlaps_after(&[(false, 0), (false, 0)]), [true; 3]);
    }

    #[test]
    fn overlapping_is_probed_again_after_so_many_batches() {
        let mut o = ClaimOverlap::default();
        o.claimed(true, 0);
        for _ in 1..PROBE_AFTER {
            o.claimed(false, 40);
            assert!(!o.overlaps());
        }
        o.claimed(false, 40);
        assert!(o.overlaps(), "the probe");
        // The keys still hold the probe back: another PROBE_AFTER batches.
        o.claimed(true, 0);
        for _ in 0..PROBE_AFTER - 1 {
            o.claimed(false, 40);
            assert!(!o.overlaps());
        }
        o.claimed(false, 40);
        assert!(o.overlaps(), "the next probe");
        // Unkeyed rows now: the probe takes some and claims overlap from then on.
        o.claimed(true, 40);
        o.claimed(true, 40);
        assert!(o.overlaps());
    }

    #[test]
    fn steady_keyed_traffic_wastes_one_claim_per_probe() {
        // As the dispatcher loop does it: as many keys as the batch, so an
        // overlapped claim always comes back empty, then the dispatcher claims
        // again with the mark finished and takes a full batch.
        let mut o = ClaimOverlap::default();
        // The first batch: no mark in flight yet.
        o.claimed(false, 40);
        let mut empty = 0;
        for _ in 0..10 * PROBE_AFTER {
            if o.overlaps() {
                o.claimed(true, 0);
                empty += 1;
            }
            o.claimed(false, 40);
        }
        assert_eq!(empty, 10);
    }

    #[test]
    fn a_drained_backlog_lets_the_next_claims_overlap() {
        let mut o = ClaimOverlap::default();
        o.claimed(true, 0);
        o.claimed(false, 40);
        assert!(!o.overlaps());
        // Nothing claimable even with the mark finished: idle.
        o.claimed(false, 0);
        assert!(o.overlaps());
    }
}
