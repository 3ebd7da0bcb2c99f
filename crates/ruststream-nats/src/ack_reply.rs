//! The numbers a JetStream delivery's `$JS.ACK` reply subject carries.

/// What a delivery's `$JS.ACK` reply subject says about it (the counts ruststream uses).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AckInfo {
    pub(crate) delivered: u64,
    pub(crate) stream_sequence: u64,
    pub(crate) consumer_sequence: u64,
    pub(crate) published_ns: i64,
}

/// The two forms the server sends (NATS ADR-15), by what precedes the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `$JS.ACK.<stream>.<consumer>.` then exactly five numbers.
    Short,
    /// `$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.` then five numbers and
    /// possibly more tokens.
    Long,
}

/// Reads the reply subjects of one consumer. They all begin alike (the same stream and
/// consumer, in the same form), so the beginning is learned from the first one, and
/// each later subject is read as that beginning (one comparison) and the numbers after
/// it: about 600 instructions a delivery (callgrind) where splitting the whole subject
/// with `str::split` and `str::parse` cost about 1,500.
#[derive(Debug, Default)]
pub(crate) struct AckReader {
    /// Everything before the numbers, as the last fully read subject had it.
    prefix: String,
    form: Option<Form>,
}

impl AckReader {
    /// The numbers of `reply`, or `None` when it is no `$JS.ACK` subject.
    pub(crate) fn read(&mut self, reply: &str) -> Option<AckInfo> {
        if let Some(form) = self.form
            && let Some(numbers) = reply.strip_prefix(self.prefix.as_str())
            && let Some(info) = numbers_of(numbers.as_bytes(), form)
        {
            return Some(info);
        }
        let (info, form, at) = AckInfo::parse_with_form(reply)?;
        self.prefix.clear();
        self.prefix.push_str(&reply[..at]);
        self.form = Some(form);
        Some(info)
    }
}

impl AckInfo {
    /// Reads the numbers out of both forms the server sends (NATS ADR-15):
    /// `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<nanos>.<pending>`, and the
    /// one with `<domain>.<account hash>.` before the stream and possibly more tokens
    /// after. The client's own `info()` does this too, and also turns the time into a
    /// calendar date nobody here reads.
    #[cfg(test)]
    pub(crate) fn parse(reply: &str) -> Option<Self> {
        Self::parse_with_form(reply).map(|(info, _, _)| info)
    }

    /// The numbers, the form, and where the numbers begin in `reply`.
    fn parse_with_form(reply: &str) -> Option<(Self, Form, usize)> {
        const ACK: &str = "$JS.ACK.";
        let rest = reply.strip_prefix(ACK)?.as_bytes();
        let dots = rest.iter().filter(|b| **b == b'.').count();
        let (form, skip) = match dots + 1 {
            7 => (Form::Short, 2),
            n if n >= 9 => (Form::Long, 4),
            _ => return None,
        };
        // Where the token after the `skip` first ones begins.
        let at = rest
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'.')
            .nth(skip - 1)
            .map(|(i, _)| i + 1)?;
        let info = numbers_of(&rest[at..], form)?;
        Some((info, form, ACK.len() + at))
    }
}

/// `<delivered>.<sseq>.<cseq>.<nanos>.<pending>`, then nothing more (`Short`) or more
/// tokens (`Long`).
fn numbers_of(bytes: &[u8], form: Form) -> Option<AckInfo> {
    let mut rest = bytes;
    let mut next = || {
        let (n, after) = number(rest)?;
        rest = after?;
        Some(n)
    };
    let info = AckInfo {
        delivered: next()?,
        stream_sequence: next()?,
        consumer_sequence: next()?,
        published_ns: i64::try_from(next()?).ok()?,
    };
    let (_pending, after) = number(rest)?;
    match (form, after) {
        (Form::Short, Some(_)) => None,
        _ => Some(info),
    }
}

/// The decimal number at the start of `bytes`, ended by a `.` or the end, and what
/// follows the `.` (`None` at the end). `None` for an empty token, anything but digits,
/// or an overflow.
#[allow(clippy::type_complexity)]
fn number(bytes: &[u8]) -> Option<(u64, Option<&[u8]>)> {
    // One pass, no overflow check per digit: up to 19 digits cannot overflow a u64.
    let mut n: u64 = 0;
    let mut length = 0;
    for byte in bytes {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        n = n.wrapping_mul(10).wrapping_add(u64::from(digit));
        length += 1;
    }
    let n = match length {
        0 => return None,
        1..20 => n,
        // Twenty digits or more: read again, checked.
        _ => std::str::from_utf8(&bytes[..length]).ok()?.parse().ok()?,
    };
    match bytes.get(length) {
        None => Some((n, None)),
        Some(b'.') => Some((n, Some(&bytes[length + 1..]))),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{AckInfo, AckReader};

    fn expected() -> AckInfo {
        AckInfo {
            delivered: 3,
            stream_sequence: 41,
            consumer_sequence: 17,
            published_ns: 1_700_000_000_123_456_789,
        }
    }

    const GOOD: [&str; 3] = [
        "$JS.ACK.ORDERS.worker.3.41.17.1700000000123456789.5",
        "$JS.ACK._.ACCHASH.ORDERS.worker.3.41.17.1700000000123456789.5.rnd",
        "$JS.ACK.hub.ACCHASH.ORDERS.worker.3.41.17.1700000000123456789.5",
    ];

    const BAD: [&str; 10] = [
        "_INBOX.x.y",
        "$JS.ACK.a.b.c",
        "$JS.ACK.S.C.x.41.17.1.5",
        "$JS.ACK.S.C.3.41..1.5",
        "$JS.ACK.S.C.3.41.-17.1.5",
        "$JS.ACK.S.C.3.41.17.99999999999999999999.5",
        "$JS.ACK.S.C.3.41.17.9223372036854775808.5",
        "$JS.ACK.S.C.3.41.17.1",
        "$JS.ACK.S.C.3.41.17.1.",
        "$JS.ACK.S.C.3.41.+17.1.5",
    ];

    #[test]
    fn both_reply_subject_forms_are_read() {
        for reply in GOOD {
            assert_eq!(AckInfo::parse(reply).as_ref(), Some(&expected()), "{reply}");
        }
        for bad in BAD {
            assert_eq!(AckInfo::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_reader_learns_the_beginning_and_reads_whatever_comes_after() {
        for first in GOOD {
            let mut reader = AckReader::default();
            assert_eq!(reader.read(first), Some(expected()), "{first}");
            // Every subject after, whichever form and consumer, reads as on its own.
            for reply in GOOD.iter().chain(&BAD) {
                assert_eq!(
                    reader.read(reply),
                    AckInfo::parse(reply),
                    "{reply} after {first}"
                );
            }
            // The learned beginning followed by a wrong tail is refused, not misread.
            let tail_less = first.rsplit_once(".3.41.").map(|(head, _)| head).unwrap();
            for tail in ["3.41.17.1.5.6", "3.41.17", "3.x.17.1.5", ""] {
                let reply = format!("{tail_less}.{tail}");
                assert_eq!(
                    reader.read(&reply),
                    AckInfo::parse(&reply),
                    "{reply} after {first}"
                );
            }
        }
        // Numbers after the learned beginning are read anew each time.
        let mut reader = AckReader::default();
        reader.read(GOOD[0]);
        let later = reader
            .read("$JS.ACK.ORDERS.worker.1.42.18.1700000000123456790.4")
            .unwrap();
        assert_eq!(
            (
                later.delivered,
                later.stream_sequence,
                later.consumer_sequence
            ),
            (1, 42, 18)
        );
    }
}
