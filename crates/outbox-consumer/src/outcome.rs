//! What became of one handling of a delivery, as the inbox paths report it to the
//! worker (and its telemetry).

use outbox_ports::PortError;

/// What became of one handling of a recorded delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// A redelivery of a message the inbox already holds: no handler ran.
    Duplicate,
    /// The handler succeeded and the row was marked consumed. `counted`: the mark
    /// applied to this attempt's lease (false when another holder took the row over
    /// meanwhile).
    Consumed {
        /// Whether this attempt's mark applied.
        counted: bool,
    },
    /// The handler failed; the failure is stored with its next attempt, or dead.
    Failed(Failure),
}

/// A failed handler attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What the handler (or its timeout, panic, missing registration) reported.
    pub error: String,
    /// The retry policy gave up: the row is dead.
    pub dead: bool,
}

/// A handling whose result the inbox could not record.
#[derive(Debug)]
pub enum Unrecorded {
    /// Nothing was recorded (the inbox could not be reached, or the transaction
    /// holding everything did not commit): the delivery goes back to the broker.
    Nothing(PortError),
    /// The delivery is held in the inbox and its handler ran (`failure`: it failed),
    /// but the outcome could not be recorded: the row is left to its lease and the
    /// consume sweep.
    Outcome {
        /// Why the outcome was not recorded.
        error: PortError,
        /// The handler's failure, when it failed.
        failure: Option<Failure>,
    },
}
