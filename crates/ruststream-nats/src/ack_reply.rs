//! The numbers a JetStream delivery's `$JS.ACK` reply subject carries.

use async_nats::Subject;
use ruststream_core::{Attempt, Metadata, PositionSource};

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

impl AckReader {
    /// The numbers of `reply`, to be read when first asked for, when it begins as the
    /// last subject read whole did (the common case: checked with one comparison);
    /// `None` otherwise (read it with [`AckReader::read`]).
    #[inline]
    pub(crate) fn later(&self, reply: &Subject) -> Option<Numbers> {
        let form = self.form?;
        reply
            .as_str()
            .starts_with(self.prefix.as_str())
            .then(|| Numbers {
                reply: reply.clone(),
                at: self.prefix.len(),
                form,
            })
    }
}

/// A delivery's position and attempt, read from its reply subject when first asked for
/// (most deliveries are acked without anyone asking).
pub(crate) struct Numbers {
    reply: Subject,
    at: usize,
    form: Form,
}

impl PositionSource for Numbers {
    fn read(&self) -> (Metadata, Attempt) {
        match numbers_of(&self.reply.as_bytes()[self.at..], self.form) {
            Some(info) => info.position(),
            None => {
                // The server's subjects keep their form; not one of them has failed so.
                tracing::warn!(
                    reply = self.reply.as_str(),
                    "a JetStream reply subject whose numbers do not read: counted as the first attempt"
                );
                (Metadata::default(), Attempt::from_broker(1))
            }
        }
    }
}

impl AckInfo {
    /// The delivery's metadata (stream sequence, publish time) and attempt (the server's
    /// `delivered`, N4).
    pub(crate) fn position(&self) -> (Metadata, Attempt) {
        (
            Metadata::sequence(self.stream_sequence)
                .with_timestamp_ms(Some(self.published_ns / 1_000_000)),
            Attempt::from_broker(u32::try_from(self.delivered).unwrap_or(u32::MAX)),
        )
    }

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
    let (delivered, at) = number_then_dot(bytes, 0)?;
    let (stream_sequence, at) = number_then_dot(bytes, at)?;
    let (consumer_sequence, at) = number_then_dot(bytes, at)?;
    let (published_ns, at) = number_then_dot(bytes, at)?;
    let (_pending, at) = number_at(bytes, at)?;
    match (form, bytes.get(at)) {
        (_, None) | (Form::Long, Some(b'.')) => Some(AckInfo {
            delivered,
            stream_sequence,
            consumer_sequence,
            published_ns: i64::try_from(published_ns).ok()?,
        }),
        _ => None,
    }
}

/// The number at `at` and where the token after its `.` begins.
#[inline(always)]
fn number_then_dot(bytes: &[u8], at: usize) -> Option<(u64, usize)> {
    let (n, end) = number_at(bytes, at)?;
    (bytes.get(end) == Some(&b'.')).then_some((n, end + 1))
}

/// The decimal number at `at` and where its digits end. `None` for no digits or an
/// overflow.
///
/// Eight bytes are looked at at once (a JetStream reply carries about forty digits, the
/// time alone nineteen): how many of them are digits, and their value, take a few word
/// operations instead of a loop step per digit.
#[inline(always)]
fn number_at(bytes: &[u8], at: usize) -> Option<(u64, usize)> {
    // Up to 19 digits cannot overflow a u64: no check per word.
    let mut n: u64 = 0;
    let mut end = at;
    loop {
        let word = word_at(bytes, end);
        let digits = leading_digits(word);
        n = n
            .wrapping_mul(POWERS_OF_TEN[digits])
            .wrapping_add(value_of_leading(word, digits));
        end += digits;
        if digits < 8 {
            break;
        }
    }
    match end - at {
        0 => None,
        1..20 => Some((n, end)),
        // Twenty digits or more: read again, checked.
        _ => Some((checked(&bytes[at..end])?, end)),
    }
}

#[cold]
fn checked(digits: &[u8]) -> Option<u64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

const POWERS_OF_TEN: [u64; 9] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
];

/// The eight bytes from `at` as a little-endian word (the first byte lowest), zeros past
/// the end (a zero is no digit).
#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    match bytes.get(at..at + 8) {
        Some(eight) => u64::from_le_bytes(eight.try_into().unwrap_or_default()),
        None => {
            let rest = bytes.get(at..).unwrap_or_default();
            let mut eight = [0u8; 8];
            eight[..rest.len()].copy_from_slice(rest);
            u64::from_le_bytes(eight)
        }
    }
}

/// How many of `word`'s bytes, from the lowest, are ASCII digits before one that is not.
#[inline(always)]
fn leading_digits(word: u64) -> usize {
    const NIBBLES: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const THREES: u64 = 0x3030_3030_3030_3030;
    // A byte is a digit when its high nibble is 3 before and after adding 6 (0x30 to
    // 0x39 stay in 0x3_, 0x3A to 0x3F do not). Only a byte of 0xFA or more carries into
    // the next one up, and it is no digit already: the count stops below it anyway.
    let sixes = word.wrapping_add(0x0606_0606_0606_0606);
    let not_digits = ((word & NIBBLES) ^ THREES) | ((sixes & NIBBLES) ^ THREES);
    (not_digits.trailing_zeros() / 8) as usize
}

/// The value of the `digits` lowest bytes of `word`, all ASCII digits, the lowest byte
/// the most significant.
#[inline(always)]
fn value_of_leading(word: u64, digits: usize) -> u64 {
    if digits == 0 {
        return 0;
    }
    // The digits' values moved to the top bytes, zeros (leading zero digits) below. The
    // bytes above the digits may borrow from each other in the subtraction, but only
    // upwards, and they are shifted out.
    let mut v = word.wrapping_sub(0x3030_3030_3030_3030) << (8 * (8 - digits));
    // Pairs, then fours, then all eight: each step joins neighbours as high * 10^k + low.
    v = ((v & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(10 << 8 | 1)) >> 8;
    v = ((v & 0x00FF_00FF_00FF_00FF).wrapping_mul(100 << 16 | 1)) >> 16;
    ((v & 0x0000_FFFF_0000_FFFF).wrapping_mul(10_000 << 32 | 1)) >> 32
}

#[cfg(test)]
mod tests {
    use super::{AckInfo, AckReader, Attempt, Metadata, PositionSource, Subject};

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

    /// The word-at-a-time reading against `str::parse`, at every length and position.
    #[test]
    fn numbers_read_eight_bytes_at_a_time_agree_with_parse() {
        let mut cases: Vec<String> = vec![
            "0".into(),
            "9".into(),
            "18446744073709551615".into(),
            "18446744073709551616".into(),
            "99999999999999999999".into(),
            "00000000000000000000000001".into(),
            "1844674407370955161".into(),
            "1700000000123456789".into(),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for digits in 1..=22 {
            for _ in 0..40 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let s: String = (0..digits)
                    .map(|i| char::from(b'0' + ((x >> (i % 60)) % 10) as u8))
                    .collect();
                cases.push(s);
            }
        }
        for case in &cases {
            let expected: Option<u64> = case.parse().ok();
            for (tail, after) in [("", None), (".7", Some(&b"7"[..])), (".", Some(&b""[..]))] {
                let text = format!("{case}{tail}");
                let read = super::number_at(text.as_bytes(), 0).map(|(n, end)| {
                    let after = match text.as_bytes().get(end) {
                        None => None,
                        Some(b'.') => Some(&text.as_bytes()[end + 1..]),
                        Some(_) => Some(&b"?"[..]),
                    };
                    (n, after)
                });
                assert_eq!(read, expected.map(|n| (n, after)), "{text}");
            }
            for bad in ["x", ":", "/", "-", " ", "\u{e9}"] {
                let text = format!("{case}{bad}");
                let read = super::number_at(text.as_bytes(), 0);
                assert_eq!(read.map(|(n, _)| n), expected, "{text}");
                assert_eq!(
                    read.map(|(_, end)| end),
                    expected.map(|_| case.len()),
                    "{text}"
                );
            }
        }
        for empty in ["", ".", ".5", "a1"] {
            assert_eq!(super::number_at(empty.as_bytes(), 0), None, "{empty:?}");
        }
        // Read from the middle, as the reply's numbers are.
        assert_eq!(
            super::number_at(b"7.123456789012.5", 2),
            Some((123_456_789_012, 14))
        );
    }

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

    #[test]
    fn n4_numbers_read_later_are_the_servers_and_only_for_the_learned_beginning() {
        let subject = |s: &str| Subject::from(s.to_owned());
        let mut reader = AckReader::default();
        assert!(
            reader.later(&subject(GOOD[0])).is_none(),
            "nothing learned yet: read whole"
        );
        reader.read(GOOD[0]);
        let reply = "$JS.ACK.ORDERS.worker.3.42.18.1700000000123456790.4";
        let later = reader.later(&subject(reply)).expect("the same beginning");
        let (metadata, attempt) = later.read();
        assert_eq!(
            (metadata, attempt),
            AckInfo::parse(reply).unwrap().position()
        );
        assert_eq!((metadata.sequence, attempt.number()), (Some(42), 3));
        assert_eq!(metadata.timestamp_ms, Some(1_700_000_000_123));
        // Another consumer's subject is not read as this one's.
        assert!(
            reader
                .later(&subject("$JS.ACK.ORDERS.other.1.2.3.1700000000123456790.0"))
                .is_none()
        );
        // A tail that does not read counts as the first attempt, with no position.
        let broken = reader
            .later(&subject(
                "$JS.ACK.ORDERS.worker.x.42.18.1700000000123456790.4",
            ))
            .expect("the same beginning");
        assert_eq!(
            broken.read(),
            (Metadata::default(), Attempt::from_broker(1))
        );
    }
}
