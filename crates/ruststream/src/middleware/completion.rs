//! What a finished handler call amounts to, before planning.

use std::fmt;

use ruststream_core::{Cause, HandlerOutcome};

use crate::extract::Rejection;

/// How one handler call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The handler returned an outcome.
    Outcome(HandlerOutcome),
    /// The handler returned `Err`: the error itself, its `source()` chain intact (logged
    /// as "error: cause: cause..."). Treated as `retry()`.
    Failed(Cause),
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
            Self::Failed(e) => write!(f, "error: {}", Chain(e)),
            Self::Rejected(r) => write!(f, "rejected: {r}"),
            Self::Panicked(p) => write!(f, "panicked: {p}"),
            Self::TimedOut(d) => write!(f, "cancelled past its deadline of {d:?}"),
        }
    }
}

/// An error and its `source()` chain on one line: "error: cause: cause". A cause whose
/// text the error's own message already ends with is not repeated.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !shown.ends_with(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            next = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;
    use std::fmt;

    #[derive(Debug)]
    struct Outer(&'static str, std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn a_chain_reads_error_then_causes_each_once() {
        let refused = || std::io::Error::other("connection refused");
        let plain = Outer("saving order 7", refused());
        assert_eq!(
            Chain(&plain).to_string(),
            "saving order 7: connection refused"
        );
        // A message that already says its cause (thiserror's "{0}") is not repeated.
        let said = Outer("saving order 7: connection refused", refused());
        assert_eq!(
            Chain(&said).to_string(),
            "saving order 7: connection refused"
        );
    }
}
