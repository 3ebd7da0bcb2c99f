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

    /// What this layer cannot work with on the registration's broker (`transport`, its
    /// metrics name, and what the broker can do for it): each string one refusal, listed
    /// with the registration's others when the app starts (SPEC E4). None by default.
    fn check(
        &self,
        transport: &'static str,
        capabilities: &ruststream_core::Capabilities,
    ) -> Vec<String> {
        let _ = (transport, capabilities);
        Vec::new()
    }
}
