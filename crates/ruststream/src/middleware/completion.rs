//! What a finished handler call amounts to, before planning.

use std::fmt;

use ruststream_core::HandlerOutcome;

use crate::extract::Rejection;

/// How one handler call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The handler returned an outcome.
    Outcome(HandlerOutcome),
    /// The handler returned `Err`; its `Display` text. Treated as `retry()`.
    Failed(String),
    /// An extractor refused the delivery (an undecodable payload); the registration's
    /// failure policy decides.
    Rejected(Rejection),
    /// The handler panicked; the panic message. Treated as `retry()` (SPEC E2).
    Panicked(String),
    /// The handler ran past its deadline and was cancelled (SPEC G1). Treated as
    /// `retry()`: a failed attempt.
    TimedOut(std::time::Duration),
}

impl Completion {
    /// The outcome the runtime acts on for errors and panics (`retry()`), or the
    /// handler's own; `None` for a rejection, which the failure policy decides.
    pub fn outcome(&self) -> Option<HandlerOutcome> {
        match self {
            Self::Outcome(o) => Some(*o),
            Self::Failed(_) | Self::Panicked(_) | Self::TimedOut(_) => {
                Some(HandlerOutcome::retry())
            }
            Self::Rejected(_) => None,
        }
    }
}

impl fmt::Display for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Outcome(o) => write!(f, "{o}"),
            Self::Failed(e) => write!(f, "error: {e}"),
            Self::Rejected(r) => write!(f, "rejected: {r}"),
            Self::Panicked(p) => write!(f, "panicked: {p}"),
            Self::TimedOut(d) => write!(f, "cancelled past its deadline of {d:?}"),
        }
    }
}
