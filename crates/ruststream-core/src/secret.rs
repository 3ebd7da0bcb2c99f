//! Secrets that never reach a log: passwords, tokens, keys, and URLs that carry them.

use std::borrow::Cow;
use std::fmt;

/// A password, token or key. `Debug` and `Display` print `***`, so a configuration
/// struct holding one can be logged whole; [`expose`](Self::expose) hands the value to
/// the client that needs it, and nothing else should call it.
///
/// ```
/// use ruststream_core::Secret;
///
/// let password = Secret::new("s3cret");
/// assert_eq!(format!("{password} {password:?}"), "*** ***");
/// assert_eq!(password.expose(), "s3cret");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret from environment variable `name`; `None` when it is unset or not
    /// UTF-8.
    pub fn from_env(name: &str) -> Option<Self> {
        std::env::var(name).ok().map(Self)
    }

    /// The value, for the client call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `url` as it may be printed: its user-info (user name, password or token) replaced by
/// `***` (`nats://***@host:4222`).
///
/// A password may hold any character, `/`, `,`, `?`, `#`, `:` and `@` included, so the
/// user-info is taken to run from the scheme's `://` (or the start) to the **last** `@`
/// in the whole text, and all of it is masked: a token holding a `:` reads like
/// `user:password`, so not even a user name is shown. Where that reading is ambiguous (a
/// list of URLs, an `@` in a query) more is masked than needed, never less: a host can
/// vanish from the printed text, a password cannot appear in it. A URL without `@` comes
/// back unchanged.
///
/// ```
/// use ruststream_core::redact_url;
///
/// assert_eq!(redact_url("nats://app:s3cret@10.0.0.1:4222"), "nats://***@10.0.0.1:4222");
/// assert_eq!(redact_url("redis://app:Wr0ng/Pass,w0rd@h:6379/0"), "redis://***@h:6379/0");
/// assert_eq!(redact_url("nats://t0ken@a:4222,nats://b:4222"), "nats://***@a:4222,nats://b:4222");
/// assert_eq!(redact_url("pulsar://broker:6650"), "pulsar://broker:6650");
/// ```
pub fn redact_url(url: &str) -> Cow<'_, str> {
    match split_userinfo(url) {
        Some((prefix, _, rest)) => Cow::Owned(format!("{prefix}***{rest}")),
        None => Cow::Borrowed(url),
    }
}

/// `url` split around its user-info, as [`redact_url`] reads it: the scheme with its
/// `://` (or nothing), the user-info (everything up to the last `@`), and the rest from
/// that `@` on. `None` when the text holds no `@`. The transports that move credentials
/// out of a URL before handing it to their client use the same reading.
///
/// ```
/// use ruststream_core::split_userinfo;
///
/// assert_eq!(split_userinfo("nats://u:p/w@h:4222"), Some(("nats://", "u:p/w", "@h:4222")));
/// assert_eq!(split_userinfo("h:4222"), None);
/// ```
pub fn split_userinfo(url: &str) -> Option<(&str, &str, &str)> {
    let at = url.rfind('@')?;
    let start = scheme_len(url).filter(|&end| end <= at).unwrap_or(0);
    Some((&url[..start], &url[start..at], &url[at..]))
}

/// The length of a leading `scheme://` (RFC 3986: a letter, then letters, digits, `+`,
/// `-` or `.`), when the text starts with one.
fn scheme_len(url: &str) -> Option<usize> {
    let colon = url.find("://")?;
    let scheme = &url[..colon];
    let mut chars = scheme.chars();
    let starts = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (starts && rest).then_some(colon + 3)
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_and_tokens_are_masked_and_the_rest_kept() {
        for (url, shown) in [
            ("nats://u:p@h:4222", "nats://***@h:4222"),
            ("nats://tok@h", "nats://***@h"),
            ("h:4222", "h:4222"),
            ("u:p@h:4222", "***@h:4222"),
            (
                "pulsar+ssl://u:p%40ss@h:6651/path",
                "pulsar+ssl://***@h:6651/path",
            ),
            // An `@` in a query: the host is masked with the rest, never a password shown.
            ("pulsar://u:p@h:6651/path?q=a@b", "pulsar://***@b"),
            ("nats://a:1@x,nats://y", "nats://***@x,nats://y"),
            ("nats://us@er:pa@ss@h", "nats://***@h"),
            // Issue #46: characters that ended the authority or split a list too early.
            (
                "redis://billing:Wrong/Passw0rd-777@host:6379",
                "redis://***@host:6379",
            ),
            ("redis://u:R3dis,S3cret@h:6379", "redis://***@h:6379"),
            ("amqp://u:a#b?c@h:5672/%2f", "amqp://***@h:5672/%2f"),
            ("u:a://b@h", "***@h"),
            ("nats://h1,nats://u:p@h2", "nats://***@h2"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    /// A small deterministic generator (xorshift64): the property test below draws many
    /// passwords from it and must fail the same way on every run.
    struct Draw(u64);

    impl Draw {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// A password of 4 to 40 characters of any kind: every printable ASCII character
        /// (the URL delimiters among them), whitespace, controls and non-ASCII letters;
        /// every third one percent-encoded as a careful user would write it.
        fn password(&mut self) -> String {
            const ODD: [char; 8] = ['\t', ' ', '\u{7f}', 'é', 'ß', '密', '🔑', '\u{0}'];
            let len = 4 + self.below(37);
            let raw: String = (0..len)
                .map(|_| match self.below(10) {
                    0 => ODD[self.below(ODD.len())],
                    _ => char::from(b' ' + self.below(95) as u8),
                })
                .collect();
            if self.below(3) == 0 {
                raw.bytes().map(|b| format!("%{b:02X}")).collect()
            } else {
                raw
            }
        }
    }

    fn windows(text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        chars.windows(4).map(|w| w.iter().collect()).collect()
    }

    /// Issue #46, item 1: whatever a password holds, no 4 characters of it in a row are
    /// printed, in every URL form a transport takes (a list included).
    #[test]
    fn no_part_of_any_password_is_ever_printed() {
        let forms = [
            "nats://billing:{}@nats.example:4222",
            "nats://billing:{}@a.example:4222,nats://b.example:4223",
            "tls://{}@nats.example:4222",
            "redis://billing:{}@redis.example:6379/0",
            "rediss://:{}@redis.example:6380",
            "amqp://billing:{}@rabbit.example:5672/%2f",
            "amqps://billing:{}@rabbit.example:5671/vhost?heartbeat=10",
            "pulsar://billing:{}@pulsar.example:6650",
            "pulsar+ssl://billing:{}@pulsar.example:6651",
            "billing:{}@kafka.example:9092",
        ];
        let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
        let mut checked = 0;
        while checked < 20_000 {
            let password = draw.password();
            let form = forms[draw.below(forms.len())];
            let skeleton = format!("{} ***", form.replace("{}", ""));
            if windows(&password)
                .iter()
                .any(|w| skeleton.contains(w.as_str()))
            {
                continue; // shares text with the rest of the URL: no test of a leak
            }
            let url = form.replace("{}", &password);
            let shown = redact_url(&url);
            for window in windows(&password) {
                assert!(
                    !shown.contains(&window),
                    "{window:?} of the password shows in {shown:?} (from {url:?})"
                );
            }
            assert!(shown.contains(".example"), "the host is kept: {shown}");
            checked += 1;
        }
    }
}
