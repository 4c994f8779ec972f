//! The error every port returns.

use outbox_core::{DeleteRefused, EventError, MessageError, TransitionError};

/// A boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a port operation failed, and whether trying again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// A failure that may pass: connection lost, timeout, broker blocked.
    #[error("{operation} failed (retryable): {message}")]
    Transient {
        /// What was being done.
        operation: &'static str,
        /// What went wrong.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A failure that retrying will not fix: bad credentials, missing schema, a bug.
    #[error("{operation} failed: {message}")]
    Fatal {
        /// What was being done.
        operation: &'static str,
        /// What went wrong.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The message or record does not exist.
    #[error("{what} {id} not found")]
    NotFound {
        /// What kind of thing was looked up.
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// The message breaks a limit.
    #[error(transparent)]
    InvalidMessage(#[from] MessageError),
    /// A typed event cannot become a message: its value cannot be encoded, or
    /// the message breaks a limit (names the event's type and Rust type). Nothing
    /// was written.
    #[error(transparent)]
    InvalidEvent(#[from] EventError),
    /// The operation asked for an illegal status change.
    #[error(transparent)]
    IllegalTransition(#[from] TransitionError),
    /// An operator asked to delete a message whose status does not allow it.
    #[error(transparent)]
    NotDeletable(#[from] DeleteRefused),
    /// An operator's action on a message or delivery that a relay, a worker or a
    /// retry holds right now (a live lease, or a row lock of a transaction in
    /// progress): acting on it would race the holder and could double its effect.
    /// Nothing was changed; it may be tried again once the holder is done.
    #[error(
        "{what} {id} is held right now ({holder}); nothing was changed, try again once it is done"
    )]
    Busy {
        /// What kind of thing it is.
        what: &'static str,
        /// Its id.
        id: String,
        /// Who holds it, in words.
        holder: &'static str,
    },
    /// An operator's action that the row's own history refuses (it was replayed
    /// already, it keeps a key's order), with the reason in words. Nothing was
    /// changed, and trying again will not help.
    #[error("{what} {id}: {reason}; nothing was changed")]
    Refused {
        /// What kind of thing it is.
        what: &'static str,
        /// Its id.
        id: String,
        /// Why, in words.
        reason: String,
    },
    /// The time given for the work (what is left of a claim's lease) ran out before
    /// it was done: nothing is known to be wrong with the other side.
    #[error("{operation}: the batch's time (what is left of its lease) ran out")]
    OutOfTime {
        /// What was being done.
        operation: &'static str,
    },
}

impl PortError {
    /// A retryable failure.
    pub fn transient(operation: &'static str, message: impl Into<String>) -> Self {
        Self::Transient {
            operation,
            message: message.into(),
            source: None,
        }
    }

    /// A failure that retrying will not fix.
    pub fn fatal(operation: &'static str, message: impl Into<String>) -> Self {
        Self::Fatal {
            operation,
            message: message.into(),
            source: None,
        }
    }

    /// Whether trying the same operation again may succeed.
    #[must_use]
    pub const fn is_retryable(&self) -> bool {
        matches!(self, Self::Transient { .. } | Self::OutOfTime { .. })
    }

    /// The same failure again, for another message of the batch it ended (a
    /// `PortError` holds its source and is not `Clone`): the kind is kept, the
    /// source becomes text.
    #[must_use]
    pub fn again(&self) -> Self {
        match self {
            Self::OutOfTime { operation } => Self::OutOfTime { operation },
            Self::Fatal { operation, .. } => Self::fatal(operation, self.to_string()),
            Self::Transient { operation, .. } => Self::transient(operation, self.to_string()),
            other => Self::transient("publish", other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_errors_are_retryable() {
        assert!(PortError::transient("claim", "connection reset").is_retryable());
        assert!(!PortError::fatal("claim", "permission denied").is_retryable());
        let nf = PortError::NotFound {
            what: "message",
            id: "x".into(),
        };
        assert!(!nf.is_retryable());
        assert_eq!(nf.to_string(), "message x not found");
    }

    #[test]
    fn an_invalid_event_is_not_retryable_and_reads_as_its_cause() {
        let cause = EventError::Invalid {
            message_type: "order.created",
            rust_type: "shop::OrderCreated",
            error: MessageError::PayloadTooLarge { len: 11, max: 10 },
        };
        let text = cause.to_string();
        let err = PortError::from(cause);
        assert!(matches!(err, PortError::InvalidEvent(_)));
        assert!(!err.is_retryable());
        assert_eq!(err.to_string(), text);
    }
}
