//! The message lifecycle and the only status changes it allows.
//!
//! ```text
//!             publish ok              consume ok
//!  Pending ───────────────► Sent ───────────────► Consumed
//!     │  ▲                 ▲ │ ▲                     │
//!     │  │ requeue         │ │ └──── reconsume ──────┘
//!     ▼  │                 │ ▼
//!  PublishFailed ──────────┘ ConsumeFailed ──► Consumed
//!     │  (retry ok)             │
//!     └──────► Dead ◄───────────┘   (retry budget spent)
//! ```
//!
//! The publish side (`Pending`, `PublishFailed`, `Sent`, `Dead`) lives in the producer's
//! outbox; the consume side (`Sent` = received and not yet handled, `ConsumeFailed`,
//! `Consumed`, `Dead`) in the consumer's inbox. `Dead` is left only by an operator:
//! `requeue` (back to `Pending`) or `reconsume` (back to `Sent`).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Decision, Timestamp};

/// Where a message is in its lifecycle. The names are those of the seed service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Enqueued, not yet confirmed by the broker.
    Pending,
    /// Confirmed by the broker (outbox), or received and not yet handled (inbox).
    Sent,
    /// Handled successfully by the consumer.
    Consumed,
    /// The last publish attempt failed; retried at its next attempt time.
    PublishFailed,
    /// The last handler attempt failed; retried at its next attempt time.
    ConsumeFailed,
    /// The retry budget is spent; waits for an operator.
    Dead,
}

impl Status {
    /// Every status, for exhaustive tests and listings.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Sent,
        Self::Consumed,
        Self::PublishFailed,
        Self::ConsumeFailed,
        Self::Dead,
    ];

    /// The name used in storage and on the wire (`pending`, `publish_failed`, ...).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Consumed => "consumed",
            Self::PublishFailed => "publish_failed",
            Self::ConsumeFailed => "consume_failed",
            Self::Dead => "dead",
        }
    }

    /// Whether the lifecycle allows going from `self` to `next`.
    #[must_use]
    pub const fn can_become(self, next: Self) -> bool {
        use Status::{ConsumeFailed, Consumed, Dead, Pending, PublishFailed, Sent};
        matches!(
            (self, next),
            // publishing, first attempt and retries
            (Pending | PublishFailed, Sent | PublishFailed | Dead)
                // consuming, first attempt and retries
                | (Sent | ConsumeFailed, Consumed | ConsumeFailed | Dead)
                // operator: requeue a dead or failed publish
                | (Dead | PublishFailed, Pending)
                // operator: reconsume a consumed, failed or dead delivery
                | (Consumed | ConsumeFailed | Dead, Sent)
        )
    }

    /// Whether an operator may delete a message in this status: only `Dead`, the one
    /// status no service acts on any more. A `PublishFailed` or `ConsumeFailed`
    /// message is still being retried (perhaps in flight at this moment), a
    /// `Pending` one is about to be published, and `Sent`/`Consumed` rows are
    /// removed by retention, whose age rule keeps them as long as they may matter.
    #[must_use]
    pub const fn can_be_deleted(self) -> bool {
        matches!(self, Self::Dead)
    }

    /// Statuses an operator may delete (see [`Status::can_be_deleted`]).
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

    /// Moves to `next` if the lifecycle allows it.
    ///
    /// # Errors
    /// [`TransitionError`] when it does not; the status is then unchanged.
    pub fn transition(self, next: Self) -> Result<Self, TransitionError> {
        if self.can_become(next) {
            Ok(next)
        } else {
            Err(TransitionError {
                from: self,
                to: next,
            })
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown status {s:?}"))
    }
}

/// Which side of the lifecycle a row is on: the outbox's (publishing) or an
/// inbox's (consuming). Each side has its own four statuses, and names them its
/// own way: the lifecycle's `Sent` is `sent` in the outbox and `received` (not
/// yet handled) in an inbox. The one place these names are decided: storage, the
/// admin API, the CLI, the dashboard and logs all ask here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// `pending`, `sent`, `publish_failed`, `dead`.
    Outbox,
    /// `received`, `consumed`, `consume_failed`, `dead`.
    Inbox,
}

impl Side {
    /// This side's statuses, in lifecycle order.
    #[must_use]
    pub const fn statuses(self) -> [Status; 4] {
        match self {
            Self::Outbox => [
                Status::Pending,
                Status::Sent,
                Status::PublishFailed,
                Status::Dead,
            ],
            Self::Inbox => [
                Status::Sent,
                Status::Consumed,
                Status::ConsumeFailed,
                Status::Dead,
            ],
        }
    }

    /// `status`'s name on this side.
    #[must_use]
    pub const fn name(self, status: Status) -> &'static str {
        match (self, status) {
            (Self::Inbox, Status::Sent) => "received",
            (_, s) => s.as_str(),
        }
    }

    /// The status `name` stands for on this side; `None` for a name of the other
    /// side's (or none at all).
    #[must_use]
    pub fn parse(self, name: &str) -> Option<Status> {
        self.statuses().into_iter().find(|s| self.name(*s) == name)
    }
}

/// An illegal status change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a message cannot go from {from} to {to}")]
pub struct TransitionError {
    /// The status it had.
    pub from: Status,
    /// The status asked for.
    pub to: Status,
}

/// A delete refused because of the message's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {status} message cannot be deleted; only dead messages can")]
pub struct DeleteRefused {
    /// The status it had.
    pub status: Status,
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
}

/// A status with its side's bookkeeping: the state machine that stores drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracked {
    /// Current status.
    pub status: Status,
    /// Attempts of the side that owns this record.
    pub state: SideState,
}

impl Tracked {
    /// A record that is due at once in `status` (`Pending` for the outbox, `Sent`
    /// for the inbox).
    #[must_use]
    pub fn new(status: Status, now: Timestamp) -> Self {
        Self {
            status,
            state: SideState {
                next_attempt_at: Some(now),
                ..SideState::default()
            },
        }
    }

    /// Records a successful attempt that moves the record to `next` (`Sent` or
    /// `Consumed`).
    ///
    /// # Errors
    /// [`TransitionError`] when `next` is not reachable; nothing changes then.
    pub fn succeed(&mut self, next: Status, now: Timestamp) -> Result<(), TransitionError> {
        self.status = self.status.transition(next)?;
        self.state.attempts = self.state.attempts.saturating_add(1);
        self.state.last_attempt_at = Some(now);
        self.state.next_attempt_at = None;
        self.state.completed_at = Some(now);
        Ok(())
    }

    /// Records a failed attempt: `failed` (`PublishFailed` or `ConsumeFailed`) with
    /// the next attempt time when `decision` is a retry, `Dead` otherwise.
    ///
    /// # Errors
    /// [`TransitionError`] when the resulting status is not reachable.
    pub fn fail(
        &mut self,
        failed: Status,
        now: Timestamp,
        error: &str,
        decision: Decision,
    ) -> Result<(), TransitionError> {
        let (next, at) = match decision {
            Decision::RetryAfter(delay) => (failed, Some(now + delay)),
            Decision::Dead => (Status::Dead, None),
        };
        self.status = self.status.transition(next)?;
        self.state.attempts = self.state.attempts.saturating_add(1);
        self.state.last_attempt_at = Some(now);
        self.state.next_attempt_at = at;
        self.state.last_error = Some(error.to_owned());
        Ok(())
    }

    /// Operator action: back to `target` (`Pending` to publish again, `Sent` to
    /// consume again), due now, with a fresh retry budget.
    ///
    /// # Errors
    /// [`TransitionError`] when the record cannot be revived to `target`.
    pub fn revive(&mut self, target: Status, now: Timestamp) -> Result<(), TransitionError> {
        self.status = self.status.transition(target)?;
        self.state.attempts = 0;
        self.state.next_attempt_at = Some(now);
        self.state.completed_at = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_names_its_own_four_statuses_and_parses_only_those() {
        assert_eq!(Side::Inbox.name(Status::Sent), "received");
        assert_eq!(Side::Outbox.name(Status::Sent), "sent");
        for side in [Side::Outbox, Side::Inbox] {
            for s in side.statuses() {
                assert_eq!(side.parse(side.name(s)), Some(s));
            }
        }
        assert_eq!(Side::Inbox.parse("sent"), None);
        assert_eq!(Side::Inbox.parse("pending"), None);
        assert_eq!(Side::Outbox.parse("received"), None);
        assert_eq!(Side::Outbox.parse("consumed"), None);
        let all: std::collections::HashSet<Status> = [Side::Outbox, Side::Inbox]
            .into_iter()
            .flat_map(Side::statuses)
            .collect();
        assert_eq!(all.len(), Status::ALL.len(), "every status is on a side");
    }
    use std::time::Duration;

    fn t0() -> Timestamp {
        Timestamp::from_unix_timestamp(1_700_000_000).expect("valid")
    }

    #[test]
    fn the_allowed_table_is_exactly_this() {
        use Status::*;
        let allowed = [
            (Pending, Sent),
            (Pending, PublishFailed),
            (Pending, Dead),
            (PublishFailed, Sent),
            (PublishFailed, PublishFailed),
            (PublishFailed, Dead),
            (PublishFailed, Pending),
            (Sent, Consumed),
            (Sent, ConsumeFailed),
            (Sent, Dead),
            (ConsumeFailed, Consumed),
            (ConsumeFailed, ConsumeFailed),
            (ConsumeFailed, Dead),
            (ConsumeFailed, Sent),
            (Consumed, Sent),
            (Dead, Pending),
            (Dead, Sent),
        ];
        for from in Status::ALL {
            for to in Status::ALL {
                let expected = allowed.contains(&(from, to));
                assert_eq!(from.can_become(to), expected, "{from} -> {to}");
                match from.transition(to) {
                    Ok(s) => assert_eq!(s, to),
                    Err(e) => assert_eq!(e, TransitionError { from, to }),
                }
            }
        }
    }

    #[test]
    fn illegal_transitions_are_errors_that_change_nothing() {
        let mut rec = Tracked::new(Status::Pending, t0());
        let before = rec.clone();
        let err = rec.succeed(Status::Consumed, t0()).expect_err("illegal");
        assert_eq!(
            err.to_string(),
            "a message cannot go from pending to consumed"
        );
        assert_eq!(rec, before);
        assert!(Status::Consumed.transition(Status::Pending).is_err());
        assert!(Status::Sent.transition(Status::Pending).is_err());
        assert!(Status::Dead.transition(Status::Consumed).is_err());
    }

    #[test]
    fn failure_then_success_keeps_the_counters() {
        let mut rec = Tracked::new(Status::Pending, t0());
        rec.fail(
            Status::PublishFailed,
            t0(),
            "broker down",
            Decision::RetryAfter(Duration::from_secs(2)),
        )
        .expect("legal");
        assert_eq!(rec.status, Status::PublishFailed);
        assert_eq!(rec.state.attempts, 1);
        assert_eq!(
            rec.state.next_attempt_at,
            Some(t0() + Duration::from_secs(2))
        );
        assert_eq!(rec.state.last_error.as_deref(), Some("broker down"));
        let later = t0() + Duration::from_secs(3);
        rec.succeed(Status::Sent, later).expect("legal");
        assert_eq!(rec.status, Status::Sent);
        assert_eq!(rec.state.attempts, 2);
        assert_eq!(rec.state.completed_at, Some(later));
        assert_eq!(rec.state.next_attempt_at, None);
    }

    #[test]
    fn dead_then_requeue_gets_a_fresh_budget() {
        let mut rec = Tracked::new(Status::Pending, t0());
        rec.fail(Status::PublishFailed, t0(), "x", Decision::Dead)
            .expect("legal");
        assert_eq!(rec.status, Status::Dead);
        assert_eq!(rec.state.next_attempt_at, None);
        rec.revive(Status::Pending, t0()).expect("legal");
        assert_eq!(rec.status, Status::Pending);
        assert_eq!(rec.state.attempts, 0);
        assert_eq!(rec.state.next_attempt_at, Some(t0()));
        assert_eq!(rec.state.last_error.as_deref(), Some("x"), "history kept");
    }

    #[test]
    fn only_dead_messages_can_be_deleted() {
        for s in Status::ALL {
            assert_eq!(s.can_be_deleted(), s == Status::Dead, "{s}");
            assert_eq!(
                s.check_delete(),
                if s == Status::Dead {
                    Ok(())
                } else {
                    Err(DeleteRefused { status: s })
                }
            );
        }
        assert_eq!(Status::deletable().collect::<Vec<_>>(), [Status::Dead]);
        assert_eq!(
            Status::Pending
                .check_delete()
                .expect_err("refused")
                .to_string(),
            "a pending message cannot be deleted; only dead messages can"
        );
    }

    #[test]
    fn status_names_round_trip() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>(), Ok(s));
            assert_eq!(
                serde_json::to_string(&s).expect("json"),
                format!("\"{}\"", s.as_str())
            );
        }
    }
}
