//! Stream entries as Redis returns them, and their ids.

use std::fmt;

use bytes::Bytes;
use redis::Value;
use ruststream_core::Headers;

use crate::publish::PAYLOAD_FIELD;

/// A stream entry id (`<milliseconds>-<sequence>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct EntryId {
    pub(crate) ms: u64,
    pub(crate) seq: u64,
}

impl EntryId {
    pub(crate) fn parse(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?;
        let (ms, seq) = text.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl redis::ToRedisArgs for EntryId {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self);
    }
}

/// One entry read or claimed, with the delivery count Redis holds for it.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: EntryId,
    pub(crate) count: u32,
    pub(crate) fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    /// The payload (field `payload`; empty without one) and the other fields as headers.
    pub(crate) fn split(self) -> (Bytes, Headers, bool) {
        let mut payload = None;
        let mut headers = Headers::new();
        for (name, value) in self.fields {
            if name == PAYLOAD_FIELD.as_bytes() && payload.is_none() {
                payload = Some(Bytes::from(value));
            } else {
                headers.insert(String::from_utf8_lossy(&name).into_owned(), value);
            }
        }
        let found = payload.is_some();
        (payload.unwrap_or_default(), headers, found)
    }
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn into_bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

fn items(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) | Value::Set(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => Vec::new(),
    }
}

/// The entries of a list of `[id, [field, value, …]]` (`XCLAIM`, one stream of
/// `XREADGROUP`), each with `count`. Deleted entries (a nil field list) are left out.
pub(crate) fn entries(value: Value, count: impl Fn(EntryId) -> u32) -> Vec<Entry> {
    items(value)
        .into_iter()
        .filter_map(|entry| {
            let mut parts = items(entry).into_iter();
            let id = EntryId::parse(bytes(&parts.next()?)?)?;
            let fields = parts.next()?;
            if matches!(fields, Value::Nil) {
                return None;
            }
            let mut flat = items(fields).into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                pairs.push((into_bytes(name)?, into_bytes(value)?));
            }
            Some(Entry {
                id,
                count: count(id),
                fields: pairs,
            })
        })
        .collect()
}

/// The entries of an `XREADGROUP` reply on one stream (nil when the block timed out).
pub(crate) fn read_reply(value: Value) -> Vec<Entry> {
    // RESP2: [[key, entries]]; RESP3: {key: entries}.
    let mut streams = items(value).into_iter();
    let first = streams.next();
    let entries_value = match first {
        Some(Value::Array(pair)) => pair.into_iter().nth(1),
        // Flattened map: key, entries.
        Some(_) => streams.next(),
        None => None,
    };
    entries_value.map_or_else(Vec::new, |v| entries(v, |_| 1))
}

/// `(id, delivery count)` of each row of an extended `XPENDING` reply
/// (`[id, consumer, idle, count]`).
pub(crate) fn pending(value: Value) -> Vec<(EntryId, u32)> {
    items(value)
        .into_iter()
        .filter_map(|row| {
            let row = items(row);
            let id = EntryId::parse(bytes(row.first()?)?)?;
            let count = match row.get(3)? {
                Value::Int(n) => u32::try_from(*n).ok()?,
                other => std::str::from_utf8(bytes(other)?).ok()?.parse().ok()?,
            };
            Some((id, count))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn ids_parse_and_print_back() {
        let id = EntryId::parse(b"1796113370669-3").expect("an id");
        assert_eq!((id.ms, id.seq), (1_796_113_370_669, 3));
        assert_eq!(id.to_string(), "1796113370669-3");
        for bad in [&b"12"[..], b"a-1", b"1-", b""] {
            assert_eq!(EntryId::parse(bad), None);
        }
    }

    #[test]
    fn a_read_reply_gives_entries_with_payload_and_headers() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("orders"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("payload"), bulk("{}"), bulk("h"), bulk("v")]),
                ]),
                // Deleted since it was delivered: left out.
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let mut entries = read_reply(reply);
        assert_eq!(entries.len(), 1);
        let entry = entries.remove(0);
        assert_eq!((entry.id.to_string(), entry.count), ("1-0".to_owned(), 1));
        let (payload, headers, found) = entry.split();
        assert!(found);
        assert_eq!(&payload[..], b"{}");
        assert_eq!(headers.get_str("h"), Some("v"));
        assert!(read_reply(Value::Nil).is_empty());
    }

    #[test]
    fn pending_rows_give_ids_and_counts() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("5-1"),
            bulk("c"),
            Value::Int(10),
            Value::Int(3),
        ])]);
        let rows = pending(reply);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].0.to_string(), rows[0].1), ("5-1".to_owned(), 3));
    }
}
