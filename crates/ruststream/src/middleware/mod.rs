//! Middleware: tower-style layers around a registration's handler.
//!
//! A [`Service`] turns an [`Incoming`](crate::extract::Incoming) delivery into a
//! [`Completion`]; a [`Layer`] wraps one service in another. Everything stays statically
//! typed, so a layered handler costs no allocation per message. For a few lines,
//! [`from_fn`] makes a middleware of a closure (two small allocations per delivery).
//!
//! ```
//! use ruststream::middleware::{Layer, Service};
//! use ruststream::extract::Incoming;
//! use ruststream::middleware::Completion;
//!
//! /// Counts deliveries.
//! #[derive(Clone, Default)]
//! struct Count(std::sync::Arc<std::sync::atomic::AtomicUsize>);
//!
//! struct Counted<S> { inner: S, count: Count }
//!
//! impl<S: Service> Layer<S> for Count {
//!     type Service = Counted<S>;
//!     fn layer(&self, inner: S) -> Counted<S> {
//!         Counted { inner, count: self.clone() }
//!     }
//! }
//!
//! impl<S: Service> Service for Counted<S> {
//!     async fn call(&self, incoming: &Incoming) -> Completion {
//!         self.count.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
//!         self.inner.call(incoming).await
//!     }
//! }
//! ```
//!
//! A handler's extractors run when its service's `call` is made, before the returned
//! future is first polled; its body runs when polled. A layer that hands the handler
//! context through a task-local (as `ruststream-sql`'s inbox hands its transaction) sets
//! it around both: `LOCAL.sync_scope(value, || inner.call(incoming))`, then
//! `LOCAL.scope(value, future).await`.

mod completion;
mod from_fn;
mod service;
mod trace;

pub(crate) use completion::Chain;
pub use completion::Completion;
pub use from_fn::{FromFn, FromFnService, Next, from_fn};
pub use service::{Layer, Service};
pub use trace::{Trace, TraceLayer};
