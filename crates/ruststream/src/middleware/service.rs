//! The two traits of a middleware: a service handles a delivery, a layer wraps one.

use std::future::Future;

use super::completion::Completion;
use crate::extract::Incoming;

/// Handles one delivery.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a ruststream service",
    note = "when an error at `on(..)` says the handler is not a ruststream handler, this one follows from it: fix the handler"
)]
pub trait Service: Send + Sync + 'static {
    /// Handles `incoming`.
    fn call<'a>(&'a self, incoming: &'a Incoming) -> impl Future<Output = Completion> + Send + 'a;
}

/// Wraps a service in another.
pub trait Layer<S> {
    /// The wrapped service.
    type Service: Service;

    /// Wraps `inner`.
    fn layer(&self, inner: S) -> Self::Service;
}
