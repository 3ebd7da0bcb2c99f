//! What a dead letter the runtime publishes says about itself (SPEC D6): headers under
//! [`DEAD_LETTER_PREFIX`] beside the original's own, which stay as they arrived.

use std::time::{SystemTime, UNIX_EPOCH};

use ruststream_core::{
    DEAD_LETTER_AT, DEAD_LETTER_ATTEMPTS, DEAD_LETTER_ENTRY, DEAD_LETTER_OFFSET,
    DEAD_LETTER_PARTITION, DEAD_LETTER_REASON, DEAD_LETTER_REGISTRATION, DEAD_LETTER_SEQUENCE,
    DEAD_LETTER_SOURCE, Delivery, Headers,
};

/// The most a reason says, in bytes.
pub(crate) const REASON_LIMIT: usize = 1024;

/// A reason short enough for a dead letter the full one would make too large.
pub(crate) const SHORT_REASON: usize = 64;

/// Why a delivery is dead-lettered, and by whom.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Why<'a> {
    pub(crate) reason: &'a str,
    pub(crate) registration: &'a str,
    /// Whether the delivery's sequence is a stream's (JetStream, the memory broker), so
    /// it says where the original is; RabbitMQ's is a channel's delivery tag.
    pub(crate) stream_sequence: bool,
}

/// Every header [`stamp`] may write: an earlier dead letter's are taken off first, so
/// what a dead letter says is about this one alone.
const STAMPED: [&str; 9] = [
    DEAD_LETTER_REASON,
    DEAD_LETTER_REGISTRATION,
    DEAD_LETTER_SOURCE,
    DEAD_LETTER_ATTEMPTS,
    DEAD_LETTER_AT,
    DEAD_LETTER_PARTITION,
    DEAD_LETTER_OFFSET,
    DEAD_LETTER_SEQUENCE,
    DEAD_LETTER_ENTRY,
];

/// Adds the dead-letter headers of `delivery` to `headers`, the reason cut to `limit`
/// bytes (`None`: add nothing, the dead letter exactly as it arrived).
pub(crate) fn stamp(
    headers: &mut Headers,
    delivery: &Delivery,
    why: Why<'_>,
    limit: Option<usize>,
) {
    for name in STAMPED {
        headers.remove(name);
    }
    let Some(limit) = limit else {
        return;
    };
    headers.insert(DEAD_LETTER_REASON, cut(why.reason, limit));
    // A name is free text too: one line, so every broker carries it.
    headers.insert(
        DEAD_LETTER_REGISTRATION,
        cut(why.registration, REASON_LIMIT),
    );
    headers.insert(DEAD_LETTER_SOURCE, delivery.address().to_owned());
    headers.insert(
        DEAD_LETTER_ATTEMPTS,
        delivery.attempt().number().to_string(),
    );
    headers.insert(DEAD_LETTER_AT, rfc3339(crate::seeded::now()));
    let meta = delivery.metadata();
    if let (Some(partition), Some(offset)) = (meta.partition, meta.offset) {
        headers.insert(DEAD_LETTER_PARTITION, partition.to_string());
        headers.insert(DEAD_LETTER_OFFSET, offset.to_string());
    }
    if let (Some(sequence), true) = (meta.sequence, why.stream_sequence) {
        headers.insert(DEAD_LETTER_SEQUENCE, sequence.to_string());
    }
}

/// Only the headers [`stamp`] adds (the full reason), for a dead letter the
/// subscription moves with the original's fields as stored.
pub(crate) fn added(delivery: &Delivery, why: Why<'_>) -> Headers {
    let mut headers = Headers::new();
    stamp(&mut headers, delivery, why, Some(REASON_LIMIT));
    headers
}

/// `text` on one line (control characters made spaces: NATS headers carry no line
/// break), at most `limit` bytes, cut at a character boundary.
fn cut(text: &str, limit: usize) -> String {
    let mut out = String::with_capacity(text.len().min(limit));
    for c in text.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > limit {
            break;
        }
        out.push(c);
    }
    out
}

/// `at` as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil(i64::try_from(days).unwrap_or(0));
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (the "civil from days"
/// algorithm: eras of 400 years, March-based years).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::{cut, rfc3339};

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let at =
            |secs, millis| UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis);
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(at(1_796_428_799, 999)), "2026-12-04T23:59:59.999Z");
        assert_eq!(rfc3339(at(4_107_542_400, 0)), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn a_reason_is_one_line_and_cut_at_a_character_boundary() {
        assert_eq!(cut("error:\nline two\r", 100), "error: line two ");
        assert_eq!(cut("ééé", 5), "éé");
        assert_eq!(cut(&"x".repeat(2_000), 1_024).len(), 1_024);
    }

    #[test]
    fn an_earlier_dead_letters_headers_are_replaced_and_none_kept_without_a_limit() {
        use ruststream_core::{DEAD_LETTER_OFFSET, DEAD_LETTER_REASON, Delivery, Headers};
        let mut headers = Headers::new();
        headers
            .insert("trace", "t")
            .insert(DEAD_LETTER_OFFSET, "7")
            .insert(DEAD_LETTER_REASON, "old");
        let delivery = Delivery::new(std::sync::Arc::from("orders"), bytes::Bytes::new());
        let why = super::Why {
            reason: "new\nline",
            registration: "a\nb",
            stream_sequence: true,
        };
        let mut stamped = headers.clone();
        super::stamp(&mut stamped, &delivery, why, Some(1_024));
        assert_eq!(stamped.get_str(DEAD_LETTER_REASON), Some("new line"));
        assert_eq!(stamped.get_str(DEAD_LETTER_OFFSET), None, "not this one's");
        assert_eq!(
            stamped.get_str(super::DEAD_LETTER_REGISTRATION),
            Some("a b")
        );
        super::stamp(&mut headers, &delivery, why, None);
        let left: Vec<&str> = headers.iter().map(|(name, _)| name).collect();
        assert_eq!(left, ["trace"]);
    }
}
