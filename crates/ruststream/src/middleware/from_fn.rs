//! A middleware written as a closure.

use std::future::Future;

use ruststream_core::BoxFuture;

use super::completion::Completion;
use super::service::{Layer, Service};
use crate::extract::Incoming;

/// The future a closure middleware returns: `Box::pin(async move { .. })`.
type BoxCompletion<'a> = BoxFuture<'a, Completion>;

/// A middleware from a closure that gets the delivery and the rest of the chain
/// (`next.run(incoming)`), for what fits in a few lines: timing, a log line, turning one
/// completion into another. It costs two small allocations per delivery (the closure's
/// future and the rest of the chain's, both boxed); write a [`Layer`] for none.
///
/// ```
/// use std::time::Instant;
/// use ruststream::middleware::from_fn;
/// use ruststream::{on, HandlerOutcome, Message, memory::MemoryBroker};
///
/// async fn handle(Message(n): Message<u32>) -> HandlerOutcome {
///     HandlerOutcome::ack()
/// }
///
/// let broker = MemoryBroker::new();
/// let registration = on(broker.topic("numbers"), handle).layer(from_fn(|incoming, next| {
///     Box::pin(async move {
///         let started = Instant::now();
///         let completion = next.run(incoming).await;
///         tracing::info!(took = ?started.elapsed(), %completion, "handled");
///         completion
///     })
/// }));
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: for<'a> Fn(&'a Incoming, Next<'a>) -> BoxCompletion<'a> + Clone + Send + Sync + 'static,
{
    FromFn { f }
}

/// The rest of a registration's chain, handed to a [`from_fn`] closure.
pub struct Next<'a> {
    inner: &'a dyn Chain,
}

impl<'a> Next<'a> {
    /// Runs the rest of the chain (the handler, and the layers inside this one).
    pub fn run(self, incoming: &'a Incoming) -> BoxCompletion<'a> {
        self.inner.call_boxed(incoming)
    }
}

/// A service behind a pointer, so a closure need not name its type.
trait Chain: Send + Sync {
    fn call_boxed<'a>(&'a self, incoming: &'a Incoming) -> BoxCompletion<'a>;
}

impl<S: Service> Chain for S {
    fn call_boxed<'a>(&'a self, incoming: &'a Incoming) -> BoxCompletion<'a> {
        Box::pin(self.call(incoming))
    }
}

/// The layer [`from_fn`] makes; it wraps a service in [`FromFnService`].
#[derive(Clone)]
pub struct FromFn<F> {
    f: F,
}

/// A service wrapped by a [`from_fn`] closure (what [`FromFn`] makes; never named).
#[doc(hidden)]
pub struct FromFnService<S, F> {
    inner: S,
    f: F,
}

impl<S, F> Layer<S> for FromFn<F>
where
    S: Service,
    F: for<'a> Fn(&'a Incoming, Next<'a>) -> BoxCompletion<'a> + Clone + Send + Sync + 'static,
{
    type Service = FromFnService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        FromFnService {
            inner,
            f: self.f.clone(),
        }
    }
}

impl<S, F> Service for FromFnService<S, F>
where
    S: Service,
    F: for<'a> Fn(&'a Incoming, Next<'a>) -> BoxCompletion<'a> + Clone + Send + Sync + 'static,
{
    fn call<'a>(&'a self, incoming: &'a Incoming) -> impl Future<Output = Completion> + Send + 'a {
        (self.f)(incoming, Next { inner: &self.inner })
    }
}
