//! Message headers as an ordered list of name/value pairs.

use bytes::Bytes;

/// The header in which the runtime counts the retry copies that came before a delivery.
///
/// An original without the header is attempt 1, the first copy carries `1` and is
/// attempt 2, and so on (attempt = header + 1).
pub const RETRY_COUNT_HEADER: &str = "x-ruststream-retry-count";

/// A message's own id, which stays the same across redeliveries and copies: the outbox
/// (`ruststream-sql`) writes one on every message, and an inbox skips an id it has seen.
pub const MESSAGE_ID_HEADER: &str = "x-ruststream-id";

/// How many times a dead letter was replayed (`dead-letters replay`): a message
/// replayed more than the replay bound is refused, so a poison message cannot loop
/// through replays for ever.
pub const REPLAYS_HEADER: &str = "x-ruststream-replays";

/// The prefix of the headers a dead letter the runtime publishes adds beside the
/// original's own (SPEC D6): why it was dead-lettered and where it came from. A reader
/// that ignores this prefix sees the last attempt exactly as it arrived.
pub const DEAD_LETTER_PREFIX: &str = "x-ruststream-dead-letter-";

/// Why: the handler's outcome, error, panic or deadline, or why the payload was refused
/// (at most 1 KiB of text, line breaks made spaces).
pub const DEAD_LETTER_REASON: &str = "x-ruststream-dead-letter-reason";

/// The registration that dead-lettered it.
pub const DEAD_LETTER_REGISTRATION: &str = "x-ruststream-dead-letter-registration";

/// The address the original was read from.
pub const DEAD_LETTER_SOURCE: &str = "x-ruststream-dead-letter-source";

/// The attempt it was dead-lettered at (the first delivery is 1).
pub const DEAD_LETTER_ATTEMPTS: &str = "x-ruststream-dead-letter-attempts";

/// When, as an RFC 3339 UTC time with milliseconds.
pub const DEAD_LETTER_AT: &str = "x-ruststream-dead-letter-at";

/// Redis Streams: the original entry's id.
pub const DEAD_LETTER_ENTRY: &str = "x-ruststream-dead-letter-entry";

/// Kafka: the original's partition.
pub const DEAD_LETTER_PARTITION: &str = "x-ruststream-dead-letter-partition";

/// Kafka: the original's offset.
pub const DEAD_LETTER_OFFSET: &str = "x-ruststream-dead-letter-offset";

/// JetStream (and the memory broker): the original's stream sequence.
pub const DEAD_LETTER_SEQUENCE: &str = "x-ruststream-dead-letter-sequence";

/// Headers of a message: ordered name/value pairs; names compare case-sensitively,
/// as NATS and Kafka do.
///
/// Values are bytes because Kafka headers are; [`Headers::get_str`] reads a value as
/// UTF-8 when it is valid.
#[derive(Default, PartialEq, Eq)]
pub struct Headers {
    entries: Vec<(String, Bytes)>,
}

impl Clone for Headers {
    #[inline]
    fn clone(&self) -> Self {
        // Most messages carry none: no call into the list's clone for them.
        if self.entries.is_empty() {
            return Self::new();
        }
        Self {
            entries: self.entries.clone(),
        }
    }
}

impl Headers {
    /// No headers. Does not allocate.
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// Sets `name` to `value`, replacing every earlier value of that name.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<Bytes>) -> &mut Self {
        let name = name.into();
        self.entries.retain(|(n, _)| *n != name);
        self.entries.push((name, value.into()));
        self
    }

    /// Adds a value for `name`, keeping earlier ones (NATS and Kafka allow repeats).
    pub fn append(&mut self, name: impl Into<String>, value: impl Into<Bytes>) -> &mut Self {
        self.entries.push((name.into(), value.into()));
        self
    }

    /// The last value of `name`.
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.entries
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The last value of `name`, when it is valid UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Removes every value of `name`; true when there was one.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|(n, _)| n != name);
        before != self.entries.len()
    }

    /// Every pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Reads [`RETRY_COUNT_HEADER`]: `Ok(None)` when absent, an error when the value is
    /// not a non-negative decimal number. Values beyond `u32::MAX` saturate.
    pub fn retry_count(&self) -> Result<Option<u32>, MalformedRetryCount> {
        let Some(raw) = self.get(RETRY_COUNT_HEADER) else {
            return Ok(None);
        };
        let malformed = || MalformedRetryCount {
            value: String::from_utf8_lossy(raw).chars().take(64).collect(),
        };
        let text = std::str::from_utf8(raw).map_err(|_| malformed())?.trim();
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        // All digits: the only parse failure left is overflow.
        Ok(Some(text.parse::<u32>().unwrap_or(u32::MAX)))
    }
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                self.entries
                    .iter()
                    .map(|(n, v)| (n, String::from_utf8_lossy(v))),
            )
            .finish()
    }
}

impl<N: Into<String>, V: Into<Bytes>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        Self {
            entries: iter
                .into_iter()
                .map(|(n, v)| (n.into(), v.into()))
                .collect(),
        }
    }
}

/// A [`RETRY_COUNT_HEADER`] value that is not a count (negative, not a number, not UTF-8).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header `{RETRY_COUNT_HEADER}` holds {value:?}, which is not a retry count")]
pub struct MalformedRetryCount {
    /// The value as received (lossy UTF-8, first 64 characters).
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_count(value: &'static [u8]) -> Headers {
        [(RETRY_COUNT_HEADER, Bytes::from_static(value))]
            .into_iter()
            .collect()
    }

    #[test]
    fn retry_count_reads_numbers_and_rejects_forgeries() {
        assert_eq!(Headers::new().retry_count(), Ok(None));
        assert_eq!(with_count(b"2").retry_count(), Ok(Some(2)));
        assert_eq!(
            with_count(b"99999999999999999999").retry_count(),
            Ok(Some(u32::MAX))
        );
        assert!(with_count(b"-1").retry_count().is_err());
        assert!(with_count(b"two").retry_count().is_err());
        assert!(with_count(b"").retry_count().is_err());
        assert!(with_count(b"\xff\xfe").retry_count().is_err());
    }

    #[test]
    fn insert_replaces_and_append_keeps() {
        let mut h = Headers::new();
        h.append("a", "1").append("a", "2");
        assert_eq!(h.len(), 2);
        assert_eq!(h.get_str("a"), Some("2"));
        h.insert("a", "3");
        assert_eq!(h.len(), 1);
        assert_eq!(h.get_str("a"), Some("3"));
        assert!(h.remove("a"));
        assert!(h.is_empty());
    }
}
