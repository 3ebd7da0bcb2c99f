//! Middleware: tower-style layers around a registration's handler.
//!
//! A [`Service`] turns an [`Incoming`] delivery into a [`Completion`]; a [`Layer`] wraps
//! one service in another. Everything stays statically typed, so a layered handler costs
//! no allocation per message.
//!
//! ```
//! use ruststream::middleware::{Layer, Service};
//! use ruststream::{Completion, Incoming};
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

mod trace;

use std::future::Future;

pub use trace::{Trace, TraceLayer};

use crate::extract::Incoming;
use crate::handler::Completion;

/// Handles one delivery.
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
