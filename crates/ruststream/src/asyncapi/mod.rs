//! The service's description of itself: an [AsyncAPI 3.0.0](https://www.asyncapi.com/docs/reference/specification/v3.0.0)
//! document written from the app's registrations, without connecting to anything.
//!
//! - **servers**: one per broker connection (protocol `kafka`, `nats`, `pulsar`, `amqp`,
//!   `redis`; host and port, never credentials); the memory broker has none.
//! - **channels**: every address read or written: what each registration reads, its
//!   retry address when the runtime publishes retry copies there, its dead letter, and
//!   what the app declares it sends ([`App::sends`](crate::App::sends)).
//! - **operations**: `receive` per registration (with its settlement policy as
//!   `x-ruststream-*` extensions and the broker's bindings: Kafka group and client id,
//!   NATS queue group, AMQP queue), `send` per retry address, dead letter and declared
//!   message.
//! - **messages**: the payload's JSON Schema when the registration declares its type
//!   ([`Registration::schema`](crate::Registration::schema), any type deriving
//!   [`schemars::JsonSchema`]), else an open schema saying none was declared; the headers
//!   the framework writes (the retry count, a dead letter's reasons, SPEC D6).
//!
//! ```
//! use ruststream::{App, HandlerOutcome, Message, memory::MemoryBroker, on};
//! use schemars::JsonSchema; // schemars = "1" in Cargo.toml
//!
//! #[derive(serde::Deserialize, JsonSchema)]
//! struct Order { id: u64 }
//!
//! async fn handle(Message(order): Message<Order>) -> HandlerOutcome { HandlerOutcome::ack() }
//!
//! let broker = MemoryBroker::new();
//! let app = App::new()
//!     .info("orders", "1.4.0")
//!     .register(on(broker.topic("orders"), handle).schema::<Order>().max_attempts(3).dead_letter("orders.dead"));
//! let document = app.asyncapi();
//! assert!(document.json().contains(r#""address": "orders.dead""#));
//! assert!(document.yaml().starts_with("asyncapi: \"3.0.0\""));
//! ```

mod document;
mod page;
mod schema;
mod yaml;

use ruststream_core::Described;
use serde_json::Value;

use crate::publisher::Publisher;

pub(crate) use document::document;
pub(crate) use page::{BUNDLE_PATH, STYLES_PATH, Served};
pub(crate) use schema::MessageSchema;

/// An AsyncAPI 3.0.0 document ([`App::asyncapi`](crate::App::asyncapi)).
#[derive(Debug, Clone, PartialEq)]
pub struct AsyncApi {
    document: Value,
}

impl AsyncApi {
    /// The document as JSON, indented.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(&self.document).unwrap_or_default()
    }

    /// The document as YAML (block style, every string quoted).
    pub fn yaml(&self) -> String {
        yaml::to_yaml(&self.document)
    }

    /// The document as a JSON value, to inspect or amend.
    pub fn value(&self) -> &Value {
        &self.document
    }
}

/// A message the service sends, declared for its description with
/// [`App::sends`](crate::App::sends): the address, the broker (from its publisher) and,
/// optionally, the payload's type.
///
/// ```
/// # use ruststream::{App, Publisher, asyncapi::Sends, memory::MemoryBroker};
/// # #[derive(schemars::JsonSchema)] struct Shipped { id: u64 }
/// let broker = MemoryBroker::new();
/// let app = App::new().sends(Sends::to(&broker.publisher(), "shipments").schema::<Shipped>());
/// assert!(app.asyncapi().json().contains("shipments"));
/// ```
#[derive(Clone)]
pub struct Sends {
    pub(crate) address: String,
    pub(crate) server: Described,
    pub(crate) publisher: Publisher,
    pub(crate) schema: Option<MessageSchema>,
    pub(crate) name: Option<String>,
}

impl Sends {
    /// A message sent to `address` through `publisher`'s broker.
    pub fn to(publisher: &Publisher, address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            server: publisher.as_publish().describe(),
            publisher: publisher.clone(),
            schema: None,
            name: None,
        }
    }

    /// The payload's type, described by its JSON Schema.
    pub fn schema<T: schemars::JsonSchema>(mut self) -> Self {
        self.schema = Some(MessageSchema::of::<T>());
        self
    }

    /// Names the operation (default `send.<address>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

impl std::fmt::Debug for Sends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sends")
            .field("address", &self.address)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// One registration as the document shows it (made by the registration, read here).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) address: String,
    pub(crate) server: Described,
    /// Where retry copies go, when the runtime publishes any.
    pub(crate) retry: Option<String>,
    pub(crate) dead_letter: Option<String>,
    /// Who writes the dead letter: `runtime`, `subscription` or `broker`.
    pub(crate) dead_letter_by: &'static str,
    pub(crate) schema: Option<MessageSchema>,
    /// The settlement policy, as `x-ruststream-<name>` extensions.
    pub(crate) policy: Vec<(&'static str, Value)>,
}

/// What the document is written from.
pub(crate) struct Source<'a> {
    pub(crate) title: &'a str,
    pub(crate) version: &'a str,
    pub(crate) entries: Vec<Entry>,
    pub(crate) sends: &'a [Sends],
}

impl AsyncApi {
    pub(crate) fn from_source(source: Source<'_>) -> Self {
        Self {
            document: document(source),
        }
    }
}
