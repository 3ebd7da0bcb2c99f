//! Event-driven services over message brokers.
//!
//! The user guide (getting started, each broker's settlement with diagrams, security,
//! testing, operating) and the spec with the tests of each statement are in the
//! repository's `docs/` (`docs/README.md`; `scripts/book` builds it as a book).
//!
//! Write plain async handlers over typed messages, bind each to a subscription, and
//! return an outcome: [`HandlerOutcome::ack`], [`HandlerOutcome::drop`],
//! [`HandlerOutcome::retry`] or [`HandlerOutcome::retry_after`]. The framework turns each
//! outcome into exactly the broker operation the spec names, counts attempts, caps them
//! with `max_attempts`, moves exhausted messages to a dead-letter address, and shuts down
//! without losing finished work. The same app runs on the in-memory broker with no server.
//!
//! ```
//! use std::time::Duration;
//! use ruststream::{on, App, HandlerOutcome, Message, Meta, memory::MemoryBroker};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Order { id: u64, paid: bool }
//!
//! async fn on_order(Message(order): Message<Order>, meta: Meta) -> HandlerOutcome {
//!     if order.paid {
//!         HandlerOutcome::ack()
//!     } else if meta.attempt.number() < 3 {
//!         HandlerOutcome::retry_after(Duration::from_millis(10))
//!     } else {
//!         HandlerOutcome::drop()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! let app = App::new().register(
//!     on(broker.topic("orders"), on_order)
//!         .max_attempts(5)
//!         .dead_letter("orders.dead"),
//! );
//! let running = app.start().await?;
//! broker.publisher().to("orders").key("42").send(&serde_json::json!({"id": 42, "paid": true})).await?;
//! running.stop().await;
//! # Ok(()) }
//! ```
//!
//! - Handlers take [extractors](extract): [`Message<T>`], [`Payload`], [`Headers`],
//!   [`Meta`], [`Attempt`], [`State<T>`], [`Publisher`].
//! - A [`Registration`] declares `max_attempts`, a dead letter, a retry destination,
//!   `lanes(n)` (per-key order kept), a handler deadline, a [`Backoff`], a
//!   [`FailurePolicy`] and [middleware].
//! - [`App::start`] refuses to start with every broken rule listed ([`StartError`]).
//! - [`testing::TestApp`] runs the production app on the memory broker and records it.
//!
//! # Guard rails (SPEC G1-G4)
//!
//! - **Deadline.** Every handler call runs within [`Registration::timeout`], else the
//!   app's [`App::handler_timeout`] (default [`DEFAULT_HANDLER_TIMEOUT`], 30 s). Past it
//!   the call is cancelled, logged at ERROR, and counts as a failed attempt.
//! - **Backoff.** Without [`Registration::backoff`], a `retry()` comes back at once as
//!   the spec names; an in-place rerun (Kafka `Tracked`, the memory broker's runtime
//!   retries) still waits 10 ms doubling to 1 s. A delivery failing with no cap is reported
//!   at WARN at attempts 10, 100, 1000...; a panic's backtrace is logged once per message.
//! - **Refused copies.** A retry copy or dead letter the broker refuses is never lost
//!   silently: transient failures are tried again; a retry copy too large goes to the dead
//!   letter; otherwise the original comes back later (1 s doubling to 5 min) by whatever
//!   the transport can do ([`core::Capabilities`]: a delayed redelivery, holding it, or
//!   reading it again), and where nothing can (Core NATS) it is logged at ERROR as lost.
//! - **Refusals at start.** A dead letter without `max_attempts`, a dead letter the
//!   registration reads itself, addresses that break the broker's naming rules and
//!   `lanes(n)` above [`MAX_LANES`] refuse to start.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod app;
pub mod asyncapi;
mod backoff;
pub mod batch;
mod cli;
pub mod codec;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod extract;
mod group;
pub mod handler;
mod in_flight;
mod logs;
pub mod memory;
pub mod middleware;
pub mod ops;
mod publisher;
mod registration;
mod runtime;
mod seeded;
mod signals;
mod state;
pub mod testing;
mod trace_context;

pub use app::{
    App, DEFAULT_CLOSE_TIMEOUT, DEFAULT_HANDLER_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, Running,
    StartError, StopHandle, Violation,
};
pub use backoff::Backoff;
pub use batch::BatchOutcome;
pub use codec::{Codec, Json};
pub use extract::{Decoded, FromDelivery, Message, Meta, Payload, ReplyTo, State};
pub use group::Registrations;
pub use handler::{Handler, IntoOutcome};
pub use publisher::{PublishBuilder, Publisher};
pub use registration::{
    DEFAULT_MAX_IN_FLIGHT, FailurePolicy, LaneKey, MAX_CONSUMERS, MAX_LANES, Registration, on,
    on_batch,
};
pub use runtime::COPY_CONFIRM_TIMEOUT;
pub use ruststream_core as core;
pub use ruststream_core::{
    AckError, Attempt, AttemptSource, Delivery, HandlerOutcome, Headers, Metadata, Outgoing,
    PublishError, RETRY_COUNT_HEADER, StartAt,
};
pub use schemars;

/// Checks a handler where it is written: each argument an extractor, the return type an
/// outcome, the future `Send`, each mistake reported at its cause.
///
/// Optional: a handler without it works the same, and a mistake in it is refused where
/// it is registered, with one message for all kinds of mistake. The attribute leaves
/// the function unchanged and costs nothing at run time.
///
/// ```
/// use ruststream::{HandlerOutcome, Message};
///
/// #[ruststream::handler]
/// async fn on_order(Message(order): Message<serde_json::Value>) -> HandlerOutcome {
///     let _ = order;
///     HandlerOutcome::ack()
/// }
/// ```
///
/// A handler holding an `Rc` across an `.await` is reported with the value and the
/// `.await`:
///
/// ```compile_fail
/// use std::rc::Rc;
/// use ruststream::HandlerOutcome;
///
/// #[ruststream::handler]
/// async fn on_order() -> HandlerOutcome {
///     let counter = Rc::new(1);
///     tokio::task::yield_now().await;
///     let _ = counter;
///     HandlerOutcome::ack()
/// }
/// ```
pub use ruststream_macros::handler;

/// What `#[ruststream::handler]` expands to calls; not for direct use.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    /// Compiles when `T` is a handler argument.
    pub fn extractor<T: crate::FromDelivery>() {}

    /// Compiles when `T` is what a handler may return.
    pub fn outcome<T: crate::IntoOutcome>() {}

    /// Compiles when the handler's future may move between threads.
    pub fn send<F: Future + Send>(future: F) {
        drop(future);
    }
}
