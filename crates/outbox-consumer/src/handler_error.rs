//! What a handler returns on failure: the error, and what it says about retrying
//! ([`FailureClass`]). `?` on any error makes a retryable failure; a handler that
//! knows better says [`HandlerError::permanent`] (dead at once, after this one
//! attempt) or [`HandlerError::retry_after`] (its own delay, within the retry
//! policy's attempts).

use std::fmt;
use std::time::Duration;

use outbox_core::{FailureClass, HandlerFailure};
use outbox_ports::PortError;

/// A boxed error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A handler's failure: its error and its [`FailureClass`].
pub struct HandlerError {
    class: FailureClass,
    error: BoxError,
}

/// What a handler returns: `Ok(())` when handled, else why not.
pub type HandlerResult = Result<(), HandlerError>;

impl HandlerError {
    /// Retried with the retry policy's backoff while its attempts last (what `?`
    /// and `.into()` make).
    pub fn retryable(error: impl Into<BoxError>) -> Self {
        Self {
            class: FailureClass::Retryable,
            error: error.into(),
        }
    }

    /// Never retried: the delivery is dead after this attempt (a value that can
    /// never be handled, a business rule that will not pass on a retry).
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        Self {
            class: FailureClass::Permanent,
            error: error.into(),
        }
    }

    /// Retried after `delay` (instead of the policy's backoff), while the retry
    /// policy's attempts last.
    pub fn retry_after(delay: Duration, error: impl Into<BoxError>) -> Self {
        Self {
            class: FailureClass::RetryAfter(delay),
            error: error.into(),
        }
    }

    /// A store's error as a handler's: permanent when the message can never be
    /// written (an event that cannot be encoded, a message over a limit: a retry
    /// writes the same), retryable otherwise. For `outbox.enqueue(..).await` in a
    /// handler: `.map_err(HandlerError::from_port)?`.
    #[must_use]
    pub fn from_port(error: PortError) -> Self {
        match error {
            PortError::InvalidEvent(_) | PortError::InvalidMessage(_) => Self::permanent(error),
            other => Self::retryable(other),
        }
    }

    /// What it says about retrying.
    #[must_use]
    pub const fn class(&self) -> FailureClass {
        self.class
    }

    /// The error itself.
    #[must_use]
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// As the consumer records it: the error's text as the reason, and the class.
    #[must_use]
    pub fn into_failure(self) -> HandlerFailure {
        HandlerFailure {
            reason: self.error.to_string(),
            class: self.class,
            policy: None,
        }
    }
}

// Everything a boxed error is made from converts (so `?` on any error works in a
// handler, and `"text".into()` too); HandlerError itself is not a std error, which
// keeps this impl from overlapping `From<T> for T`.
impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self::retryable(error)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("class", &self.class)
            .field("error", &self.error)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> Result<(), std::io::Error> {
        Err(std::io::Error::other("disk full"))
    }

    fn handler() -> Result<(), HandlerError> {
        io()?;
        Ok(())
    }

    #[test]
    fn question_mark_is_retryable_and_the_classes_say_what_they_are() {
        let e = handler().expect_err("failed");
        assert_eq!(e.class(), FailureClass::Retryable);
        assert_eq!(e.to_string(), "disk full");
        let f = HandlerError::permanent("no such order").into_failure();
        assert_eq!(f.class, FailureClass::Permanent);
        assert_eq!(f.reason, "no such order");
        let d = Duration::from_secs(7);
        assert_eq!(
            HandlerError::retry_after(d, String::from("rate limited")).class(),
            FailureClass::RetryAfter(d)
        );
        let too_big = PortError::InvalidMessage(outbox_core::MessageError::PayloadTooLarge {
            len: 2,
            max: 1,
        });
        assert_eq!(
            HandlerError::from_port(too_big).class(),
            FailureClass::Permanent
        );
        let gone = PortError::transient("insert", "connection reset");
        assert_eq!(
            HandlerError::from_port(gone).class(),
            FailureClass::Retryable
        );
        let boxed: BoxError = "x".into();
        assert_eq!(HandlerError::from(boxed).class(), FailureClass::Retryable);
    }
}
