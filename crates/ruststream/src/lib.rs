//! Event-driven services over message brokers.
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
//!   `lanes(n)` (per-key order kept), a [`FailurePolicy`] and [middleware].
//! - [`App::start`] refuses to start with every broken rule listed ([`StartError`]).
//! - [`testing::TestApp`] runs the production app on the memory broker and records it.

mod app;
mod backoff;
pub mod codec;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod extract;
mod fast_hash;
pub mod handler;
pub mod memory;
pub mod middleware;
mod publisher;
mod registration;
mod runtime;
mod state;
pub mod testing;

pub use app::{
    App, DEFAULT_HANDLER_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, Running, StartError, StopHandle,
    Violation,
};
pub use backoff::Backoff;
pub use codec::{Codec, Json};
pub use extract::{
    Context, Decoded, FromDelivery, Incoming, Message, Meta, Payload, Rejection, ReplyTo, State,
};
pub use handler::{Completion, Handler, IntoOutcome};
pub use publisher::{PublishBuilder, Publisher};
pub use registration::{FailurePolicy, LaneKey, MAX_LANES, Registration, on};
pub use ruststream_core as core;
pub use ruststream_core::{
    AckError, Attempt, AttemptSource, Delivery, HandlerOutcome, Headers, Metadata, Outgoing,
    PublishError, RETRY_COUNT_HEADER,
};
pub use state::StateMap;
