//! The contract every ruststream transport implements.
//!
//! A transport turns a broker into [`Descriptor`]s (what to read), [`Subscription`]s
//! (deliveries in, settlements out) and a confirmed [`Publish`]. It declares its
//! [`Capabilities`] per subscription, and the [`plan()`] function decides, from those
//! alone, what each [`HandlerOutcome`] becomes. The runtime lives in the `ruststream`
//! crate; nothing here knows a broker or an async runtime.
//!
//! # Who uses what, and how stable it is
//!
//! - **Service authors** meet [`HandlerOutcome`], [`Delivery`]'s readers (payload,
//!   headers, key, address, metadata, attempt), [`Headers`], [`StartAt`], [`Env`] and the
//!   error types, all re-exported by `ruststream`. These follow the workspace's version:
//!   a change that breaks them is a new minor version while it is 0.x, and says so in
//!   the release notes.
//! - **Transport authors** also implement [`Descriptor`], [`Subscription`] and
//!   [`Publish`], fill deliveries with [`Delivery`]'s `refill` and `set_*` methods and the
//!   lazy [`HeaderSource`]/[`PositionSource`], and declare [`Capabilities`]. This contract
//!   moves with the runtime's performance work (the immediate forms `next_now` and
//!   `settle_now` came that way): run the conformance suite (`ruststream`, feature
//!   `conformance`) against a transport after every upgrade.
//! - [`plan()`] and its types are the settlement rules of `docs/spec.md`; their tests are
//!   the spec's.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ruststream_core::{plan, Capabilities, CopyTarget, Declaration, HandlerOutcome, Settle, Verdict};
//!
//! // A broker that settles and counts nothing (Core NATS), with a cap of 3.
//! let mut declaration = Declaration::default();
//! declaration.max_attempts = Some(3);
//! declaration.dead_letter = Some(Arc::from("orders.dead"));
//! declaration.retry_address = Some(Arc::from("orders"));
//! let below = plan(
//!     Verdict::Outcome(HandlerOutcome::retry_after(Duration::from_secs(1))),
//!     1,
//!     &declaration,
//!     &Capabilities::NOTHING,
//! );
//! assert_eq!(below.copy.unwrap().target, CopyTarget::Retry { retry_count: 1 });
//!
//! let at_cap = plan(Verdict::Outcome(HandlerOutcome::retry()), 3, &declaration, &Capabilities::NOTHING);
//! assert_eq!(at_cap.copy.unwrap().target, CopyTarget::DeadLetter);
//! assert_eq!(at_cap.settle, Settle::Nothing);
//! ```

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod capabilities;
mod declaration;
mod delivery;
mod describe;
mod descriptor;
mod due;
mod env;
mod error;
pub mod hash;
mod headers;
mod letters;
mod names;
mod outcome;
mod plan;
mod publish;
mod secret;
mod start;
mod wait;

pub use capabilities::{Capabilities, DeadLetters, DelayedRedelivery, Verb};
pub use declaration::Declaration;
pub use delivery::{Attempt, AttemptSource, Delivery, HeaderSource, Metadata, PositionSource};
pub use describe::Described;
pub use descriptor::{Backlog, BacklogProbe, Descriptor, LinkProbe, StillHeld, Subscription};
pub use due::Held;
pub use env::{Env, EnvError, FromEnvError};
pub use error::{AckError, Cause, ConnectError, PublishError, PublishErrorKind, SubscribeError};
pub use headers::{
    DEAD_LETTER_AT, DEAD_LETTER_ATTEMPTS, DEAD_LETTER_ENTRY, DEAD_LETTER_OFFSET,
    DEAD_LETTER_PARTITION, DEAD_LETTER_PREFIX, DEAD_LETTER_REASON, DEAD_LETTER_REGISTRATION,
    DEAD_LETTER_SEQUENCE, DEAD_LETTER_SOURCE, Headers, MESSAGE_ID_HEADER, MalformedRetryCount,
    REPLAYS_HEADER, RETRY_COUNT_HEADER,
};
pub use letters::{Letter, LetterBox};
pub use names::AddressNames;
pub use outcome::{HandlerOutcome, OutcomeKind};
pub use plan::{CopyTarget, Plan, PlannedCopy, Settle, Verdict, may_copy, plan};
pub use publish::{BoxFuture, Extras, Outgoing, Publish};
pub use secret::{Secret, redact_url, split_userinfo};
pub use start::StartAt;
pub use wait::wait_for_broker;
