//! Pauses set by operators: an exchange whose messages the relays hold pending,
//! a consumer whose workers take no deliveries. Stored where every instance reads
//! them, so that all obey and a restart keeps them.

use std::fmt;

use async_trait::async_trait;
use outbox_core::Timestamp;

use crate::PortError;

/// Longest name a pause accepts, in characters (an AMQP exchange name is at most
/// 255 bytes, so every exchange fits).
pub const MAX_PAUSE_NAME_CHARS: usize = 255;

/// What a pause holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PauseKind {
    /// The relays claim none of the exchange's messages (a keyed message of it
    /// holds its key's later messages back, so each key's order is kept).
    Exchange,
    /// The consumer's workers take no deliveries and its retry sweep runs no
    /// handler.
    Consumer,
}

impl PauseKind {
    /// `exchange` or `consumer`, as stored and as the API spells it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Exchange => "exchange",
            Self::Consumer => "consumer",
        }
    }

    /// The kind spelled `s` ([`as_str`](Self::as_str)).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "exchange" => Some(Self::Exchange),
            "consumer" => Some(Self::Consumer),
            _ => None,
        }
    }
}

impl fmt::Display for PauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One pause in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    /// An exchange or a consumer.
    pub kind: PauseKind,
    /// The exchange's or consumer's name.
    pub name: String,
    /// When it was paused, by the store's clock (`None`: a time no
    /// [`Timestamp`] can hold).
    pub since: Option<Timestamp>,
    /// Who paused it (the operator's name).
    pub by: String,
}

/// Why a name cannot be paused: empty, longer than [`MAX_PAUSE_NAME_CHARS`], or
/// holding a control character (Unicode's `Cc`: U+0000 to U+001F, U+007F to
/// U+009F). `None`: it can.
#[must_use]
pub fn invalid_pause_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.chars().count() > MAX_PAUSE_NAME_CHARS {
        Some("is longer than 255 characters")
    } else if name.chars().any(char::is_control) {
        Some("holds a control character")
    } else {
        None
    }
}

/// Where pauses are kept. The outbox store's claims and the inbox's
/// [`consumer_paused`](crate::InboxConsumerPath::consumer_paused) read the same
/// place, so a pause written here holds every relay and consumer of the store.
#[cfg_attr(feature = "mocks", mockall::automock)]
#[async_trait]
pub trait PauseStore: Send + Sync {
    /// Pauses `name`, recording `by`. `true`: it was not paused before (a pause
    /// already in force is left as it was, its time and author kept).
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn pause(&self, kind: PauseKind, name: &str, by: &str) -> Result<bool, PortError>;

    /// Lifts the pause of `name`. `true`: it was paused.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn resume(&self, kind: PauseKind, name: &str) -> Result<bool, PortError>;

    /// Every pause in force, by kind and then name.
    ///
    /// # Errors
    /// [`PortError::Transient`] when the store cannot be reached.
    async fn pauses(&self) -> Result<Vec<Pause>, PortError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_back_as_written() {
        for kind in [PauseKind::Exchange, PauseKind::Consumer] {
            assert_eq!(PauseKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(PauseKind::parse("queue"), None);
    }

    #[test]
    fn names_that_cannot_be_paused_say_why() {
        assert_eq!(invalid_pause_name(""), Some("must not be empty"));
        assert_eq!(
            invalid_pause_name("a\nb"),
            Some("holds a control character")
        );
        assert_eq!(
            invalid_pause_name(&"x".repeat(256)),
            Some("is longer than 255 characters")
        );
        assert_eq!(invalid_pause_name(&"x".repeat(255)), None);
        assert_eq!(
            invalid_pause_name(&"é".repeat(255)),
            None,
            "characters, not bytes"
        );
        assert_eq!(
            invalid_pause_name("a\u{85}b"),
            Some("holds a control character")
        );
        assert_eq!(invalid_pause_name("orders.shard-1"), None);
    }
}
