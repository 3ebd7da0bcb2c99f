//! Headers between ruststream (bytes values, ordered) and NATS (text values).

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use ruststream_core::{Headers, PublishError, PublishErrorKind};

/// NATS headers as ruststream headers. NATS keeps no order between names; values of one
/// name keep theirs.
pub(crate) fn from_nats(map: Option<&HeaderMap>) -> Headers {
    let mut headers = Headers::new();
    if let Some(map) = map {
        for (name, values) in map.iter() {
            let name: &str = name.as_ref();
            for value in values {
                headers.append(name, Bytes::copy_from_slice(value.as_str().as_bytes()));
            }
        }
    }
    headers
}

/// ruststream headers as NATS headers; a name or value NATS cannot carry (not text, a
/// line break, a `:` in a name) is refused with the header named, never sent mangled.
#[inline]
pub(crate) fn to_nats(headers: &Headers, subject: &str) -> Result<Option<HeaderMap>, PublishError> {
    if headers.is_empty() {
        return Ok(None);
    }
    header_map(headers, subject).map(Some)
}

#[inline(never)]
fn header_map(headers: &Headers, subject: &str) -> Result<HeaderMap, PublishError> {
    let refuse = |detail: String| PublishError::new(subject, PublishErrorKind::Rejected, detail);
    let mut map = HeaderMap::new();
    for (name, value) in headers.iter() {
        let header = HeaderName::from_str(name).map_err(|_| {
            refuse(format!(
                "header name {name:?} is not a valid NATS header name"
            ))
        })?;
        let text = std::str::from_utf8(value).map_err(|_| {
            refuse(format!(
                "header `{name}` is not valid UTF-8, which NATS headers need"
            ))
        })?;
        let value = HeaderValue::from_str(text)
            .map_err(|_| refuse(format!("header `{name}` contains a line break")))?;
        map.append(header, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_repeated_values() {
        let mut h = Headers::new();
        h.append("a", "1").append("a", "2").append("b", "x");
        let map = to_nats(&h, "s").unwrap();
        let back = from_nats(map.as_ref());
        assert_eq!(back.len(), 3);
        assert_eq!(back.get_str("b"), Some("x"));
        let a: Vec<&str> = back
            .iter()
            .filter(|(n, _)| *n == "a")
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
            .collect();
        assert_eq!(a, vec!["1", "2"]);
    }

    #[test]
    fn hostile_headers_are_refused_with_their_name() {
        let mut h = Headers::new();
        h.insert("bad", &b"\xff"[..]);
        let e = to_nats(&h, "orders").unwrap_err();
        assert!(e.to_string().contains("`bad`") && e.address() == "orders");
        let mut h = Headers::new();
        h.insert("x", "a\r\nInjected: 1");
        assert!(to_nats(&h, "orders").is_err());
        let mut h = Headers::new();
        h.insert("a:b", "1");
        assert!(to_nats(&h, "orders").is_err());
    }
}
