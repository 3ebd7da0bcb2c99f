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

/// `url` as it may be printed: the password in its user-info part replaced by `***`
/// (`nats://user:***@host:4222`), or the whole user-info where it is one word, which
/// brokers read as a token (`nats://***@host:4222`). A comma-separated list of URLs is
/// redacted URL by URL; a URL without credentials comes back unchanged.
///
/// ```
/// use ruststream_core::redact_url;
///
/// assert_eq!(redact_url("nats://app:s3cret@10.0.0.1:4222"), "nats://app:***@10.0.0.1:4222");
/// assert_eq!(redact_url("nats://t0ken@a:4222,nats://b:4222"), "nats://***@a:4222,nats://b:4222");
/// assert_eq!(redact_url("pulsar://broker:6650"), "pulsar://broker:6650");
/// ```
pub fn redact_url(url: &str) -> Cow<'_, str> {
    if !url.contains('@') {
        return Cow::Borrowed(url);
    }
    let parts: Vec<String> = url.split(',').map(redact_one).collect();
    Cow::Owned(parts.join(","))
}

fn redact_one(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let (userinfo, host) = authority.split_at(at);
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{scheme}{shown}{host}{tail}")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_and_tokens_are_masked_and_the_rest_kept() {
        for (url, shown) in [
            ("nats://u:p@h:4222", "nats://u:***@h:4222"),
            ("nats://tok@h", "nats://***@h"),
            ("h:4222", "h:4222"),
            ("u:p@h:4222", "u:***@h:4222"),
            (
                "pulsar+ssl://u:p%40ss@h:6651/path?q=a@b",
                "pulsar+ssl://u:***@h:6651/path?q=a@b",
            ),
            ("nats://a:1@x,nats://y", "nats://a:***@x,nats://y"),
            ("nats://us@er:pa@ss@h", "nats://us@er:***@h"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
