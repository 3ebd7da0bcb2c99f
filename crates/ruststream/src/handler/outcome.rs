//! What a handler may return.

use std::fmt;

use ruststream_core::HandlerOutcome;

use crate::middleware::Completion;

/// What a handler may return: a [`HandlerOutcome`], or `Result<HandlerOutcome, E>` where
/// an `Err` is logged with its `Display` and treated as `retry()`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler outcome",
    label = "not an outcome",
    note = "a handler returns `HandlerOutcome` (`ack()`, `drop()`, `retry()`, `retry_after(d)`) or `Result<HandlerOutcome, E>` with `E: Display`"
)]
pub trait IntoOutcome {
    /// Converts into a completion.
    fn into_completion(self) -> Completion;
}

impl IntoOutcome for HandlerOutcome {
    fn into_completion(self) -> Completion {
        Completion::Outcome(self)
    }
}

impl<E: fmt::Display> IntoOutcome for Result<HandlerOutcome, E> {
    fn into_completion(self) -> Completion {
        match self {
            Ok(o) => Completion::Outcome(o),
            Err(e) => Completion::Failed(e.to_string()),
        }
    }
}
