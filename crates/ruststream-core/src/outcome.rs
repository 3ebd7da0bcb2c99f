//! What a handler returns.

use std::time::Duration;

/// What a handler decided about a delivery.
///
/// The framework turns it into the broker operation the spec names for the
/// subscription (see the settlement planner, [`crate::plan()`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandlerOutcome(OutcomeKind);

/// The four outcomes, for matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// Done: never deliver again.
    Ack,
    /// Unwanted: never deliver again (JetStream `+TERM`; elsewhere settled as done).
    Drop,
    /// Deliver again, after `delay` when there is one.
    Retry {
        /// `None` for `retry()`, `Some(d)` for `retry_after(d)`.
        delay: Option<Duration>,
    },
}

impl HandlerOutcome {
    /// The delivery is done.
    pub const fn ack() -> Self {
        Self(OutcomeKind::Ack)
    }

    /// The delivery is unwanted and must not come back.
    pub const fn drop() -> Self {
        Self(OutcomeKind::Drop)
    }

    /// The delivery should be handled again as soon as possible.
    pub const fn retry() -> Self {
        Self(OutcomeKind::Retry { delay: None })
    }

    /// The delivery should be handled again, no earlier than `delay` from now.
    pub const fn retry_after(delay: Duration) -> Self {
        Self(OutcomeKind::Retry { delay: Some(delay) })
    }

    /// Which outcome this is.
    pub const fn kind(self) -> OutcomeKind {
        self.0
    }

    /// A short name for logs and spans: `ack`, `drop`, `retry`, `retry_after`.
    pub const fn name(self) -> &'static str {
        match self.0 {
            OutcomeKind::Ack => "ack",
            OutcomeKind::Drop => "drop",
            OutcomeKind::Retry { delay: None } => "retry",
            OutcomeKind::Retry { delay: Some(_) } => "retry_after",
        }
    }
}

impl std::fmt::Display for HandlerOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            OutcomeKind::Retry { delay: Some(d) } => write!(f, "retry_after({d:?})"),
            _ => write!(f, "{}()", self.name()),
        }
    }
}
