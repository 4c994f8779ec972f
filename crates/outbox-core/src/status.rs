//! The lifecycle of each side and the only status changes it allows.
//!
//! ```text
//!  outbox (publishing)                       inbox (consuming)
//!
//!            publish ok                                 handled ok
//!  Pending ─────────────► Sent            Received ─────────────► Consumed
//!   │  ▲                                    │  ▲                    │
//!   │  │ requeue                            │  │ reconsume ─────────┘
//!   ▼  │                                    ▼  │
//!  PublishFailed ──► Sent (retry ok)      ConsumeFailed ──► Consumed (retry ok)
//!   │                                       │
//!   └──────► Dead  (retry budget spent)     └──────► Dead
//! ```
//!
//! Each side has its own status type, [`OutboxStatus`] and [`InboxStatus`], so a
//! name means one thing: the outbox's `sent` is "confirmed by the broker", the
//! inbox's `received` is "received, not yet handled". `Dead` on either side is
//! left only by an operator: `requeue` (outbox, back to `Pending`) or `reconsume`
//! (inbox, back to `Received`). What both sides share (names in storage and on the
//! wire, the transition check, the attempt bookkeeping) is the [`Lifecycle`]
//! trait, which only these two types implement.

use std::fmt;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

use crate::{Decision, Timestamp};

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::OutboxStatus {}
    impl Sealed for super::InboxStatus {}
}

/// Which side of the lifecycle a row is on: the outbox's (publishing) or an
/// inbox's (consuming). Code that is generic over a [`Lifecycle`] reads it as
/// [`Lifecycle::SIDE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// [`OutboxStatus`]: `pending`, `sent`, `publish_failed`, `dead`.
    Outbox,
    /// [`InboxStatus`]: `received`, `consumed`, `consume_failed`, `dead`.
    Inbox,
}

impl Side {
    /// This side's status names, in lifecycle order.
    #[must_use]
    pub const fn status_names(self) -> [&'static str; 4] {
        match self {
            Self::Outbox => [
                OutboxStatus::Pending.as_str(),
                OutboxStatus::Sent.as_str(),
                OutboxStatus::PublishFailed.as_str(),
                OutboxStatus::Dead.as_str(),
            ],
            Self::Inbox => [
                InboxStatus::Received.as_str(),
                InboxStatus::Consumed.as_str(),
                InboxStatus::ConsumeFailed.as_str(),
                InboxStatus::Dead.as_str(),
            ],
        }
    }

    /// What one row of this side is called in messages to people.
    #[must_use]
    pub const fn noun(self) -> &'static str {
        match self {
            Self::Outbox => "message",
            Self::Inbox => "delivery",
        }
    }
}

/// What the two status types share. Sealed: only [`OutboxStatus`] and
/// [`InboxStatus`] implement it.
pub trait Lifecycle:
    sealed::Sealed
    + Copy
    + Eq
    + Hash
    + fmt::Debug
    + fmt::Display
    + Send
    + Sync
    + Serialize
    + for<'de> Deserialize<'de>
    + 'static
{
    /// The side these statuses belong to.
    const SIDE: Side;
    /// Every status of this side, in lifecycle order.
    const ALL: [Self; 4];
    /// The status a new row starts in (`Pending`, `Received`).
    const START: Self;
    /// The status of a successful attempt (`Sent`, `Consumed`).
    const DONE: Self;
    /// The status of a failed attempt that will be retried (`PublishFailed`,
    /// `ConsumeFailed`).
    const FAILED: Self;
    /// The status of a spent retry budget, left only by an operator.
    const DEAD: Self;

    /// The name used in storage, on the wire and in the admin surfaces.
    fn as_str(self) -> &'static str;

    /// Whether the lifecycle allows going from `self` to `next`.
    fn can_become(self, next: Self) -> bool;

    /// The error for the illegal change `from` -> `to`.
    fn illegal(from: Self, to: Self) -> TransitionError;

    /// Moves to `next` if the lifecycle allows it.
    ///
    /// # Errors
    /// [`TransitionError`] when it does not; the status is then unchanged.
    fn transition(self, next: Self) -> Result<Self, TransitionError> {
        if self.can_become(next) {
            Ok(next)
        } else {
            Err(Self::illegal(self, next))
        }
    }

    /// The status named `name` on this side; `None` for a name of the other
    /// side's (or none at all).
    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// Where a message is in the outbox (the publishing side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboxStatus {
    /// Enqueued, not yet confirmed by the broker.
    Pending,
    /// Confirmed by the broker.
    Sent,
    /// The last publish attempt failed; retried at its next attempt time.
    PublishFailed,
    /// The retry budget is spent; waits for an operator.
    Dead,
}

/// Where a delivery is in a consumer's inbox (the consuming side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxStatus {
    /// Received (recorded), not yet handled.
    Received,
    /// Handled successfully.
    Consumed,
    /// The last handler attempt failed; retried at its next attempt time.
    ConsumeFailed,
    /// The retry budget is spent; waits for an operator.
    Dead,
}

impl OutboxStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [Self; 4] = [Self::Pending, Self::Sent, Self::PublishFailed, Self::Dead];

    /// The name used in storage and on the wire (`pending`, `publish_failed`, ...).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::PublishFailed => "publish_failed",
            Self::Dead => "dead",
        }
    }

    /// Whether the lifecycle allows going from `self` to `next`.
    #[must_use]
    pub const fn can_become(self, next: Self) -> bool {
        use OutboxStatus::{Dead, Pending, PublishFailed, Sent};
        matches!(
            (self, next),
            // publishing, first attempt and retries
            (Pending | PublishFailed, Sent | PublishFailed | Dead)
                // operator: requeue a dead or failed publish
                | (Dead | PublishFailed, Pending)
        )
    }

    /// Whether an operator may delete a message in this status: only `Dead`, the one
    /// status no service acts on any more. A `PublishFailed` message is still being
    /// retried (perhaps in flight at this moment), a `Pending` one is about to be
    /// published, and `Sent` rows are removed by retention, whose age rule keeps
    /// them as long as they may matter.
    #[must_use]
    pub const fn can_be_deleted(self) -> bool {
        matches!(self, Self::Dead)
    }

    /// Statuses an operator may delete (see [`OutboxStatus::can_be_deleted`]).
    pub fn deletable() -> impl Iterator<Item = Self> {
        Self::ALL.into_iter().filter(|s| s.can_be_deleted())
    }

    /// Checks that an operator may delete a message in this status.
    ///
    /// # Errors
    /// [`DeleteRefused`] for every status but `Dead`.
    pub const fn check_delete(self) -> Result<(), DeleteRefused> {
        if self.can_be_deleted() {
            Ok(())
        } else {
            Err(DeleteRefused { status: self })
        }
    }
}

impl InboxStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [Self; 4] = [
        Self::Received,
        Self::Consumed,
        Self::ConsumeFailed,
        Self::Dead,
    ];

    /// The name used in storage and on the wire (`received`, `consume_failed`, ...).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Consumed => "consumed",
            Self::ConsumeFailed => "consume_failed",
            Self::Dead => "dead",
        }
    }

    /// Whether the lifecycle allows going from `self` to `next`.
    #[must_use]
    pub const fn can_become(self, next: Self) -> bool {
        use InboxStatus::{ConsumeFailed, Consumed, Dead, Received};
        matches!(
            (self, next),
            // handling, first attempt and retries
            (Received | ConsumeFailed, Consumed | ConsumeFailed | Dead)
                // operator: reconsume a consumed, failed or dead delivery
                | (Consumed | ConsumeFailed | Dead, Received)
        )
    }
}

macro_rules! lifecycle {
    ($ty:ident, $side:ident, $start:ident, $done:ident, $failed:ident) => {
        impl Lifecycle for $ty {
            const SIDE: Side = Side::$side;
            const ALL: [Self; 4] = $ty::ALL;
            const START: Self = $ty::$start;
            const DONE: Self = $ty::$done;
            const FAILED: Self = $ty::$failed;
            const DEAD: Self = $ty::Dead;

            fn as_str(self) -> &'static str {
                $ty::as_str(self)
            }

            fn can_become(self, next: Self) -> bool {
                $ty::can_become(self, next)
            }

            fn illegal(from: Self, to: Self) -> TransitionError {
                TransitionError::$side { from, to }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = UnknownStatus;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <Self as Lifecycle>::parse(s).ok_or_else(|| UnknownStatus {
                    side: Side::$side,
                    name: s.to_owned(),
                })
            }
        }
    };
}

lifecycle!(OutboxStatus, Outbox, Pending, Sent, PublishFailed);
lifecycle!(InboxStatus, Inbox, Received, Consumed, ConsumeFailed);

/// A name that is no status of its side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct UnknownStatus {
    /// The side asked.
    pub side: Side,
    /// The name given.
    pub name: String,
}

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self.side {
            Side::Outbox => "outbox",
            Side::Inbox => "inbox",
        };
        write!(
            f,
            "unknown {side} status {:?}; expected one of {}",
            self.name,
            self.side.status_names().join(", ")
        )
    }
}

/// An illegal status change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// On the outbox's side.
    #[error("a message cannot go from {from} to {to}")]
    Outbox {
        /// The status it had.
        from: OutboxStatus,
        /// The status asked for.
        to: OutboxStatus,
    },
    /// On an inbox's side.
    #[error("a delivery cannot go from {from} to {to}")]
    Inbox {
        /// The status it had.
        from: InboxStatus,
        /// The status asked for.
        to: InboxStatus,
    },
}

/// A delete refused because of the message's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {status} message cannot be deleted; only dead messages can")]
pub struct DeleteRefused {
    /// The status it had.
    pub status: OutboxStatus,
}

/// One side's (publish or consume) attempt bookkeeping, as in the seed's record.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SideState {
    /// Attempts made so far.
    pub attempts: u32,
    /// When the last attempt was made.
    pub last_attempt_at: Option<Timestamp>,
    /// When the next attempt is due (`None` once there will be none).
    pub next_attempt_at: Option<Timestamp>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// When the side succeeded: sent at (publish) or consumed at (consume).
    pub completed_at: Option<Timestamp>,
    /// The last [`FAILED_ATTEMPTS_KEPT`] failed attempts, oldest first: what an
    /// operator reads to see how a message came to fail, not only its last error.
    /// Kept on the record itself, so it goes when the record goes.
    #[serde(default)]
    pub failed_attempts: Vec<FailedAttempt>,
}

/// How many failed attempts a record keeps (the newest): enough to see a pattern
/// (the same error each time, or a change), bounded so a message retried for days
/// does not grow without end.
pub const FAILED_ATTEMPTS_KEPT: usize = 10;

/// One failed attempt of one side: publish or consume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedAttempt {
    /// Which attempt it was (1 for the first), counted as the record's attempts
    /// are: an operator's requeue or reconsume starts them again at 1.
    pub attempt: u32,
    /// When it failed.
    pub at: Timestamp,
    /// Why.
    pub error: String,
}

fn time_delay(d: std::time::Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

/// A status with its side's bookkeeping: the state machine that stores drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Tracked<S: Lifecycle> {
    /// Current status.
    pub status: S,
    /// Attempts of the side that owns this record.
    pub state: SideState,
}

impl<S: Lifecycle> Tracked<S> {
    /// A record that is due at once in its side's start status (`Pending`,
    /// `Received`).
    #[must_use]
    pub fn new(now: Timestamp) -> Self {
        Self {
            status: S::START,
            state: SideState {
                next_attempt_at: Some(now),
                ..SideState::default()
            },
        }
    }

    /// Records a successful attempt (to `Sent` or `Consumed`).
    ///
    /// # Errors
    /// [`TransitionError`] when that is not reachable; nothing changes then.
    pub fn succeed(&mut self, now: Timestamp) -> Result<(), TransitionError> {
        self.status = self.status.transition(S::DONE)?;
        self.state.attempts = self.state.attempts.saturating_add(1);
        self.state.last_attempt_at = Some(now);
        self.state.next_attempt_at = None;
        self.state.completed_at = Some(now);
        Ok(())
    }

    /// Records a failed attempt: the side's failed status with the next attempt
    /// time when `decision` is a retry, `Dead` otherwise.
    ///
    /// # Errors
    /// [`TransitionError`] when the resulting status is not reachable.
    pub fn fail(
        &mut self,
        now: Timestamp,
        error: &str,
        decision: Decision,
    ) -> Result<(), TransitionError> {
        let (next, at) = match decision {
            // Saturating: a delay past the calendar's end never panics.
            Decision::RetryAfter(delay) => (
                S::FAILED,
                Some(
                    now.checked_add(time_delay(delay))
                        .unwrap_or(crate::LATEST_DUE),
                ),
            ),
            Decision::Dead => (S::DEAD, None),
        };
        self.status = self.status.transition(next)?;
        self.state.attempts = self.state.attempts.saturating_add(1);
        self.state.last_attempt_at = Some(now);
        self.state.next_attempt_at = at;
        self.state.last_error = Some(error.to_owned());
        let history = &mut self.state.failed_attempts;
        history.push(FailedAttempt {
            attempt: self.state.attempts,
            at: now,
            error: error.to_owned(),
        });
        if history.len() > FAILED_ATTEMPTS_KEPT {
            history.drain(..history.len() - FAILED_ATTEMPTS_KEPT);
        }
        Ok(())
    }

    /// Operator action: back to the start status (`Pending` to publish again,
    /// `Received` to handle again), due now, with a fresh retry budget.
    ///
    /// # Errors
    /// [`TransitionError`] when the record cannot be revived.
    pub fn revive(&mut self, now: Timestamp) -> Result<(), TransitionError> {
        self.status = self.status.transition(S::START)?;
        self.state.attempts = 0;
        self.state.next_attempt_at = Some(now);
        self.state.completed_at = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;

    fn t0() -> Timestamp {
        Timestamp::from_unix_timestamp(1_700_000_000).expect("valid")
    }

    fn names<S: Lifecycle>() -> Vec<&'static str> {
        S::ALL.into_iter().map(Lifecycle::as_str).collect()
    }

    #[test]
    fn each_side_names_its_own_four_statuses_and_parses_only_those() {
        assert_eq!(
            names::<OutboxStatus>(),
            ["pending", "sent", "publish_failed", "dead"]
        );
        assert_eq!(
            names::<InboxStatus>(),
            ["received", "consumed", "consume_failed", "dead"]
        );
        assert_eq!(
            Side::Outbox.status_names().to_vec(),
            names::<OutboxStatus>()
        );
        assert_eq!(Side::Inbox.status_names().to_vec(), names::<InboxStatus>());
        for s in OutboxStatus::ALL {
            assert_eq!(s.as_str().parse::<OutboxStatus>(), Ok(s));
            assert_eq!(serde_json::to_string(&s).expect("json"), format!("\"{s}\""));
        }
        for s in InboxStatus::ALL {
            assert_eq!(s.as_str().parse::<InboxStatus>(), Ok(s));
            assert_eq!(serde_json::to_string(&s).expect("json"), format!("\"{s}\""));
        }
        assert_eq!(<InboxStatus as Lifecycle>::parse("sent"), None);
        assert_eq!(<InboxStatus as Lifecycle>::parse("pending"), None);
        assert_eq!(<OutboxStatus as Lifecycle>::parse("received"), None);
        assert_eq!(<OutboxStatus as Lifecycle>::parse("consumed"), None);
        assert_eq!(
            "sent"
                .parse::<InboxStatus>()
                .expect_err("outbox name")
                .to_string(),
            "unknown inbox status \"sent\"; expected one of received, consumed, consume_failed, dead"
        );
        let distinct: HashSet<&str> = names::<OutboxStatus>().into_iter().collect();
        assert_eq!(distinct.len(), 4);
    }

    fn check_table<S: Lifecycle>(allowed: &[(S, S)]) {
        for from in S::ALL {
            for to in S::ALL {
                let expected = allowed.contains(&(from, to));
                assert_eq!(from.can_become(to), expected, "{from} -> {to}");
                match from.transition(to) {
                    Ok(s) => assert_eq!(s, to),
                    Err(e) => assert_eq!(e, S::illegal(from, to)),
                }
            }
        }
    }

    #[test]
    fn the_allowed_tables_are_exactly_these() {
        use InboxStatus::{ConsumeFailed, Consumed, Received};
        use OutboxStatus::{Pending, PublishFailed, Sent};
        check_table(&[
            (Pending, Sent),
            (Pending, PublishFailed),
            (Pending, OutboxStatus::Dead),
            (PublishFailed, Sent),
            (PublishFailed, PublishFailed),
            (PublishFailed, OutboxStatus::Dead),
            (PublishFailed, Pending),
            (OutboxStatus::Dead, Pending),
        ]);
        check_table(&[
            (Received, Consumed),
            (Received, ConsumeFailed),
            (Received, InboxStatus::Dead),
            (ConsumeFailed, Consumed),
            (ConsumeFailed, ConsumeFailed),
            (ConsumeFailed, InboxStatus::Dead),
            (ConsumeFailed, Received),
            (Consumed, Received),
            (InboxStatus::Dead, Received),
        ]);
    }

    #[test]
    fn illegal_transitions_are_errors_that_change_nothing_and_name_their_side() {
        let mut rec = Tracked::<OutboxStatus>::new(t0());
        rec.succeed(t0()).expect("legal");
        let before = rec.clone();
        let err = rec.succeed(t0()).expect_err("illegal");
        assert_eq!(err.to_string(), "a message cannot go from sent to sent");
        assert_eq!(rec, before);
        let mut rec = Tracked::<InboxStatus>::new(t0());
        rec.succeed(t0()).expect("legal");
        let err = rec
            .fail(t0(), "x", Decision::RetryAfter(Duration::from_secs(1)))
            .expect_err("illegal");
        assert_eq!(
            err.to_string(),
            "a delivery cannot go from consumed to consume_failed"
        );
        assert!(
            OutboxStatus::Sent
                .transition(OutboxStatus::Pending)
                .is_err()
        );
        assert!(InboxStatus::Dead.transition(InboxStatus::Consumed).is_err());
    }

    #[test]
    fn failure_then_success_keeps_the_counters() {
        let mut rec = Tracked::<OutboxStatus>::new(t0());
        assert_eq!(rec.status, OutboxStatus::Pending);
        rec.fail(
            t0(),
            "broker down",
            Decision::RetryAfter(Duration::from_secs(2)),
        )
        .expect("legal");
        assert_eq!(rec.status, OutboxStatus::PublishFailed);
        assert_eq!(rec.state.attempts, 1);
        assert_eq!(
            rec.state.next_attempt_at,
            Some(t0() + Duration::from_secs(2))
        );
        assert_eq!(rec.state.last_error.as_deref(), Some("broker down"));
        let later = t0() + Duration::from_secs(3);
        rec.succeed(later).expect("legal");
        assert_eq!(rec.status, OutboxStatus::Sent);
        assert_eq!(rec.state.attempts, 2);
        assert_eq!(rec.state.completed_at, Some(later));
        assert_eq!(rec.state.next_attempt_at, None);
    }

    #[test]
    fn dead_then_revive_gets_a_fresh_budget_on_both_sides() {
        let mut rec = Tracked::<OutboxStatus>::new(t0());
        rec.fail(t0(), "x", Decision::Dead).expect("legal");
        assert_eq!(rec.status, OutboxStatus::Dead);
        assert_eq!(rec.state.next_attempt_at, None);
        rec.revive(t0()).expect("legal");
        assert_eq!(rec.status, OutboxStatus::Pending);
        assert_eq!(rec.state.attempts, 0);
        assert_eq!(rec.state.next_attempt_at, Some(t0()));
        assert_eq!(rec.state.last_error.as_deref(), Some("x"), "history kept");

        let mut rec = Tracked::<InboxStatus>::new(t0());
        assert_eq!(rec.status, InboxStatus::Received);
        rec.fail(t0(), "y", Decision::Dead).expect("legal");
        assert_eq!(rec.status, InboxStatus::Dead);
        rec.revive(t0()).expect("legal");
        assert_eq!(rec.status, InboxStatus::Received);
        let mut fresh = Tracked::<InboxStatus>::new(t0());
        assert!(fresh.revive(t0()).is_err(), "received is not revived");
    }

    #[test]
    fn failed_attempts_keep_the_newest_ten_across_a_revive() {
        let mut rec = Tracked::<InboxStatus>::new(t0());
        let retry = Decision::RetryAfter(Duration::from_secs(1));
        for n in 1..=3u64 {
            rec.fail(t0() + Duration::from_secs(n), &format!("e{n}"), retry)
                .expect("legal");
        }
        rec.fail(t0() + Duration::from_secs(4), "e4", Decision::Dead)
            .expect("legal");
        rec.revive(t0()).expect("legal");
        for n in 5..=12u64 {
            rec.fail(t0() + Duration::from_secs(n), &format!("e{n}"), retry)
                .expect("legal");
        }
        rec.succeed(t0() + Duration::from_secs(13)).expect("legal");
        let kept = &rec.state.failed_attempts;
        assert_eq!(kept.len(), FAILED_ATTEMPTS_KEPT);
        let seen: Vec<(u32, &str)> = kept.iter().map(|a| (a.attempt, a.error.as_str())).collect();
        // The oldest two went; numbers start again after the revive; a success is
        // not a failed attempt.
        assert_eq!(
            seen,
            [
                (3, "e3"),
                (4, "e4"),
                (1, "e5"),
                (2, "e6"),
                (3, "e7"),
                (4, "e8"),
                (5, "e9"),
                (6, "e10"),
                (7, "e11"),
                (8, "e12"),
            ]
        );
        assert_eq!(kept[0].at, t0() + Duration::from_secs(3));
    }

    #[test]
    fn only_dead_messages_can_be_deleted() {
        for s in OutboxStatus::ALL {
            assert_eq!(s.can_be_deleted(), s == OutboxStatus::Dead, "{s}");
            assert_eq!(
                s.check_delete(),
                if s == OutboxStatus::Dead {
                    Ok(())
                } else {
                    Err(DeleteRefused { status: s })
                }
            );
        }
        assert_eq!(
            OutboxStatus::deletable().collect::<Vec<_>>(),
            [OutboxStatus::Dead]
        );
        assert_eq!(
            OutboxStatus::Pending
                .check_delete()
                .expect_err("refused")
                .to_string(),
            "a pending message cannot be deleted; only dead messages can"
        );
    }
}
