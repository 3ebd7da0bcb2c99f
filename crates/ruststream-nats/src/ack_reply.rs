//! The numbers a JetStream delivery's `$JS.ACK` reply subject carries.

/// What a delivery's `$JS.ACK` reply subject says about it (the counts ruststream uses).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AckInfo {
    pub(crate) delivered: u64,
    pub(crate) stream_sequence: u64,
    pub(crate) consumer_sequence: u64,
    pub(crate) published_ns: i64,
}

impl AckInfo {
    /// Reads the numbers out of both forms the server sends (NATS ADR-15):
    /// `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<nanos>.<pending>`, and the
    /// one with `<domain>.<account hash>.` before the stream and possibly more tokens
    /// after. The client's own `info()` does this too, and also turns the time into a
    /// calendar date nobody here reads: about a third of a delivery's cost.
    pub(crate) fn parse(reply: &str) -> Option<Self> {
        let rest = reply.strip_prefix("$JS.ACK.")?;
        let mut tokens = [""; 9];
        let mut count = 0;
        for token in rest.split('.') {
            if count < tokens.len() {
                tokens[count] = token;
            }
            count += 1;
        }
        let first = match count {
            7 => 2,
            n if n >= 9 => 4,
            _ => return None,
        };
        Some(Self {
            delivered: tokens[first].parse().ok()?,
            stream_sequence: tokens[first + 1].parse().ok()?,
            consumer_sequence: tokens[first + 2].parse().ok()?,
            published_ns: tokens[first + 3].parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::AckInfo;

    #[test]
    fn both_reply_subject_forms_are_read() {
        let expected = AckInfo {
            delivered: 3,
            stream_sequence: 41,
            consumer_sequence: 17,
            published_ns: 1_700_000_000_123_456_789,
        };
        let v1 = "$JS.ACK.ORDERS.worker.3.41.17.1700000000123456789.5";
        let v2 = "$JS.ACK._.ACCHASH.ORDERS.worker.3.41.17.1700000000123456789.5.rnd";
        let v2_short = "$JS.ACK.hub.ACCHASH.ORDERS.worker.3.41.17.1700000000123456789.5";
        for reply in [v1, v2, v2_short] {
            assert_eq!(AckInfo::parse(reply).as_ref(), Some(&expected), "{reply}");
        }
        for bad in ["_INBOX.x.y", "$JS.ACK.a.b.c", "$JS.ACK.S.C.x.41.17.1.5"] {
            assert_eq!(AckInfo::parse(bad), None, "{bad}");
        }
    }
}
