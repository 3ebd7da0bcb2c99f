//! Errors of the contract: settlement, publishing, subscribing.
//!
//! Each error keeps what caused it: the client's own error stays reachable through
//! [`std::error::Error::source`], and the error's `Display` reads "what failed: why", so
//! one line in a log says both while a reporter that walks the chain finds the client's
//! error as a value (its type, its own chain).

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What caused an error: the client's error, or a sentence where there is none. Shared
/// (`Arc`), so the errors that carry it stay `Clone`.
///
/// Transparent in a chain: it reads as the error it holds, and its `source()` is that
/// error's source. [`downcast_ref`](Self::downcast_ref) reaches the client's error as a
/// value.
#[derive(Clone)]
pub struct Cause(Arc<dyn StdError + Send + Sync + 'static>);

impl Cause {
    /// A cause from an error value or a message (`&str`, `String`).
    pub fn new(cause: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self(Arc::from(cause.into()))
    }

    /// `error` stopped `what` (a sentence: "storing offset 41 of orders/0"): reads
    /// "what: error", with `error` as the next `source()`.
    pub fn context(
        what: impl Into<String>,
        error: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self(Arc::new(Doing {
            what: what.into(),
            error: error.into(),
        }))
    }

    /// The cause as an error, for `source()`.
    pub fn as_error(&self) -> &(dyn StdError + 'static) {
        &*self.0
    }

    /// The error held, when it is an `E` (the client's own error type).
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
}

impl StdError for Cause {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// What was being done when an error stopped it.
#[derive(Debug)]
struct Doing {
    what: String,
    error: Box<dyn StdError + Send + Sync + 'static>,
}

impl fmt::Display for Doing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.error)
    }
}

impl StdError for Doing {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.error)
    }
}

/// Two causes are equal when they read the same (the client's error types rarely
/// compare).
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

/// A settlement the transport could not carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The broker has no operation for this outcome (Core NATS settles nothing;
    /// Kafka `Commit::Auto` cannot bring a record back).
    #[error("the broker has no operation for `{verb}` on this subscription")]
    Unsupported {
        /// The verb asked for: `ack`, `drop`, `retry`.
        verb: &'static str,
    },
    /// A delayed redelivery the subscription cannot hold that long (Pulsar: a delay not
    /// shorter than `ack_timeout`, because the client's timer would bring it back first).
    #[error("retry_after({delay:?}) refused: the subscription's limit is {limit:?} (ack_timeout)")]
    DelayTooLong {
        /// The delay asked for.
        delay: Duration,
        /// The longest delay the subscription can hold, exclusive.
        limit: Duration,
    },
    /// The broker or connection failed while settling; the client's error is the source.
    #[error("settlement failed: {0}")]
    Failed(#[source] Cause),
}

impl AckError {
    /// The broker or connection failed while settling, because of `cause`.
    pub fn failed(cause: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self::Failed(Cause::new(cause))
    }
}

/// What kind of failure a [`PublishError`] is. [`is_transient`](Self::is_transient) tells
/// the two families apart: a transient failure may pass if tried again (the connection
/// is back, the broker answers in time); a permanent one is the broker's answer about
/// this message or address and will be the same next time (SPEC G3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The broker refused the message for a reason not named below.
    Rejected,
    /// No confirmation arrived in time. Transient.
    Timeout,
    /// The connection is gone. Transient.
    Disconnected,
    /// The message could not be encoded (a header the broker cannot carry).
    Encode,
    /// Nobody answered a request.
    NoResponders,
    /// The message is larger than the broker or the address accepts.
    TooLarge,
    /// The destination is full and refuses new messages (a JetStream stream at its
    /// limits with the discard-new policy, storage exhausted).
    Full,
    /// No such destination (no stream captures the subject, an unknown topic).
    NoSuchAddress,
    /// The credentials may not publish there.
    NotAuthorized,
}

impl PublishErrorKind {
    /// True for failures that may pass when tried again ([`Timeout`](Self::Timeout),
    /// [`Disconnected`](Self::Disconnected)); false for the broker's refusals.
    pub const fn is_transient(self) -> bool {
        matches!(self, Self::Timeout | Self::Disconnected)
    }
}

impl std::fmt::Display for PublishErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rejected => "rejected",
            Self::Timeout => "timed out",
            Self::Disconnected => "disconnected",
            Self::Encode => "cannot be encoded",
            Self::NoResponders => "no responders",
            Self::TooLarge => "too large",
            Self::Full => "destination full",
            Self::NoSuchAddress => "no such destination",
            Self::NotAuthorized => "not authorized",
        })
    }
}

/// A publish that was not confirmed by the broker: the address, the
/// [kind](PublishErrorKind) of failure, and its cause (the client's error, as `source()`).
///
/// One pointer wide: a `Result<(), PublishError>` is what every publish returns and what
/// `send_all` returns for each of many messages.
#[derive(Clone, PartialEq, Eq)]
pub struct PublishError(Box<Unconfirmed>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Unconfirmed {
    address: String,
    kind: PublishErrorKind,
    cause: Cause,
}

impl PublishError {
    /// A publish to `address` failed with `kind`, because of `cause` (the client's error,
    /// or a sentence).
    pub fn new(
        address: impl AsRef<str>,
        kind: PublishErrorKind,
        cause: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self(Box::new(Unconfirmed {
            address: address.as_ref().to_owned(),
            kind,
            cause: Cause::new(cause),
        }))
    }

    /// The address published to.
    pub fn address(&self) -> &str {
        &self.0.address
    }

    /// The kind of failure; [`PublishErrorKind::is_transient`] tells whether trying again
    /// may help.
    pub fn kind(&self) -> PublishErrorKind {
        self.0.kind
    }
}

impl fmt::Debug for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishError")
            .field("address", &self.0.address)
            .field("kind", &self.0.kind)
            .field("cause", &self.0.cause)
            .finish()
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Unconfirmed {
            address,
            kind,
            cause,
        } = &*self.0;
        write!(f, "publishing to `{address}` failed: {kind}: {cause}")
    }
}

impl StdError for PublishError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0.cause)
    }
}

/// A transport could not connect to its broker: which broker, where (the URL with its
/// password or token masked), and why (the client's error, as `source()`). The
/// transports that have nothing of their own to add return this one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot connect to {broker} at `{url}`: {cause}")]
pub struct ConnectError {
    broker: &'static str,
    url: String,
    #[source]
    cause: Cause,
}

impl ConnectError {
    /// Connecting to `broker` (`"RabbitMQ"`) at `url` failed because of `cause`. The URL
    /// is masked here ([`redact_url`](crate::redact_url)): pass it as it was given.
    pub fn new(
        broker: &'static str,
        url: &str,
        cause: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            broker,
            url: crate::redact_url(url).into_owned(),
            cause: Cause::new(cause),
        }
    }

    /// The broker's URL, its password or token masked.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Which broker (`"Pulsar"`, `"RabbitMQ"`, `"Redis"`).
    pub fn broker(&self) -> &'static str {
        self.broker
    }
}

/// A subscription that could not be opened or read: the address and the cause (the
/// client's error, as `source()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subscription on `{address}`: {cause}")]
pub struct SubscribeError {
    address: String,
    #[source]
    cause: Cause,
}

impl SubscribeError {
    /// Subscribing to or reading `address` failed because of `cause` (the client's
    /// error, or a sentence).
    pub fn new(
        address: impl Into<String>,
        cause: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            address: address.into(),
            cause: Cause::new(cause),
        }
    }

    /// The descriptor's address.
    pub fn address(&self) -> &str {
        &self.address
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection reset")]
    struct ClientError;

    #[test]
    fn the_cause_stays_reachable_as_a_value() {
        let error = PublishError::new("orders", PublishErrorKind::Disconnected, ClientError);
        assert_eq!(
            error.to_string(),
            "publishing to `orders` failed: disconnected: connection reset"
        );
        let cause = error.source().expect("a source");
        let cause = cause.downcast_ref::<Cause>().expect("the cause");
        assert!(cause.downcast_ref::<ClientError>().is_some());
    }

    #[test]
    fn a_publish_result_is_one_pointer_wide() {
        // `send_all` answers with one per message: 100,000 of them are 0.8 MB, not 4.8.
        assert_eq!(
            std::mem::size_of::<Result<(), PublishError>>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn context_reads_what_then_why_and_chains_to_the_error() {
        let error = AckError::Failed(Cause::context("storing offset 41 of orders/0", ClientError));
        assert_eq!(
            error.to_string(),
            "settlement failed: storing offset 41 of orders/0: connection reset"
        );
        // AckError -> Cause (transparent: its source is the context's source) -> ClientError.
        let next = error
            .source()
            .and_then(|c| c.source())
            .expect("the client error");
        assert!(next.downcast_ref::<ClientError>().is_some());
    }

    #[test]
    fn a_sentence_is_a_cause_too() {
        let error = SubscribeError::new("orders", "no stream captures `orders`");
        assert_eq!(error.address(), "orders");
        assert_eq!(
            error.to_string(),
            "subscription on `orders`: no stream captures `orders`"
        );
    }
}

#[cfg(test)]
mod connect_tests {
    use super::ConnectError;

    #[test]
    fn a_connect_error_names_broker_and_address_never_the_password() {
        let error = ConnectError::new("Redis", "redis://app:hunter2@cache:6379", "refused");
        let shown = format!("{error} {error:?}");
        assert!(
            shown.contains("cannot connect to Redis at `redis://***@cache:6379`: refused"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(error.broker(), "Redis");
        assert!(std::error::Error::source(&error).is_some());
    }
}
