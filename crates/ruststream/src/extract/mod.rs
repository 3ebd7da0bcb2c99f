//! Extractors: what a handler's arguments are made from.

mod types;

use std::fmt;
use std::sync::Arc;

use ruststream_core::{Cause, Delivery};

pub use types::{Decoded, Message, Meta, Payload, ReplyTo, State};

use crate::publisher::Publisher;
pub use crate::state::StateMap;

/// A delivery on its way to a handler, with what the registration shares with it.
// The runtime keeps these boxed and reuses each box for delivery after delivery, the
// registration's context with it: no reference count taken per delivery.
#[derive(Debug)]
pub struct Incoming {
    delivery: Delivery,
    context: Arc<Context>,
}

impl Incoming {
    pub(crate) fn new(delivery: Delivery, context: Arc<Context>) -> Self {
        Self { delivery, context }
    }

    /// The delivery as received.
    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    /// What the registration shares with every call.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The delivery, to be written into (by the fetch, in a reused box).
    pub(crate) fn delivery_mut(&mut self) -> &mut Delivery {
        &mut self.delivery
    }

    /// A box of its own holding a copy of this delivery (its headers read now).
    pub(crate) fn duplicate(&self) -> Box<Incoming> {
        Box::new(Self::new(self.delivery.clone(), Arc::clone(&self.context)))
    }

    /// The delivery runs again in place: one attempt more.
    pub(crate) fn count_attempt(&mut self) {
        self.delivery.count_attempt();
    }
}

/// What a registration shares with every handler call.
#[derive(Debug)]
pub struct Context {
    pub(crate) registration: Arc<str>,
    pub(crate) transport: &'static str,
    pub(crate) state: Arc<StateMap>,
    pub(crate) publisher: Publisher,
}

impl Context {
    /// The registration's name.
    pub fn registration(&self) -> &str {
        &self.registration
    }

    /// The transport's name, as in metrics labels (`kafka`, `jetstream`, `memory`...).
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// The app's state.
    pub fn state(&self) -> &StateMap {
        &self.state
    }

    /// The publisher of the registration's broker.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }
}

/// Why an extractor refused a delivery: what it was extracting, and the cause (a codec's
/// error, as `source()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    extractor: &'static str,
    cause: Cause,
}

impl Rejection {
    /// `extractor` (its type name: `Message<orders::Order>`...) refused the delivery
    /// because of `cause` (an error, or a sentence).
    pub fn new(
        extractor: &'static str,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            extractor,
            cause: Cause::new(cause),
        }
    }

    /// What was being extracted.
    pub fn extractor(&self) -> &'static str {
        self.extractor
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} could not be extracted: {}",
            self.extractor, self.cause
        )
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.cause.as_error())
    }
}

/// A handler argument made from the incoming delivery.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a handler argument",
    note = "handler arguments implement `FromDelivery`: Message<T>, Payload, Headers, Meta, Attempt, Delivery, State<T>, Publisher"
)]
pub trait FromDelivery: Sized + Send + 'static {
    /// Extracts the value; a rejection follows the registration's failure policy (SPEC E1).
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection>;

    /// Checked at startup: what this extractor needs that the app lacks.
    fn requirement(state: &StateMap) -> Option<String> {
        let _ = state;
        None
    }
}
