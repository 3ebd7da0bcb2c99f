//! Encryption and authentication, typed, turned into librdkafka's settings.

use std::path::PathBuf;

use ruststream_core::Secret;

/// How the clients encrypt and authenticate: what a managed Kafka service asks for,
/// typed, turned into librdkafka's `security.protocol`, `ssl.*` and `sasl.*` settings
/// for the producer and every consumer ([`Kafka::with_security`](crate::Kafka::with_security)).
/// Passwords are [`Secret`]s: `Debug` prints `***`.
///
/// ```
/// use ruststream_kafka::{Sasl, Security, Tls};
/// use ruststream_core::Secret;
///
/// let security = Security::SaslTls(
///     Sasl::ScramSha512 { user: "billing".into(), password: Secret::new("s3cret") },
///     Tls::with_ca("/etc/ssl/kafka-ca.pem"),
/// );
/// assert!(!format!("{security:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Security {
    /// TLS, no SASL (`security.protocol=SSL`); a client certificate authenticates where
    /// the cluster asks for one.
    Tls(Tls),
    /// SASL over plaintext (`SASL_PLAINTEXT`): for a trusted network only, the password
    /// of `Plain` crosses it readable.
    Sasl(Sasl),
    /// SASL over TLS (`SASL_SSL`): what managed Kafka services ask for.
    SaslTls(Sasl, Tls),
}

/// TLS files (PEM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tls {
    /// The CA bundle that signed the brokers' certificates (`ssl.ca.location`); the
    /// system's when `None`.
    pub ca: Option<PathBuf>,
    /// The client's certificate (`ssl.certificate.location`).
    pub certificate: Option<PathBuf>,
    /// The client certificate's key (`ssl.key.location`).
    pub key: Option<PathBuf>,
    /// The key's password (`ssl.key.password`).
    pub key_password: Option<Secret>,
}

impl Tls {
    /// Trusts the brokers' certificates signed by the CA bundle at `ca`.
    pub fn with_ca(ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: Some(ca.into()),
            ..Self::default()
        }
    }

    /// Adds a client certificate and its key.
    pub fn client_certificate(
        mut self,
        certificate: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.certificate = Some(certificate.into());
        self.key = Some(key.into());
        self
    }
}

/// A SASL mechanism and its credentials. (OAUTHBEARER needs a token callback, which
/// `Kafka::with_settings` does not carry: not offered yet.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sasl {
    /// `PLAIN`: the password sent as is (use it over TLS).
    Plain {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// `SCRAM-SHA-256`.
    ScramSha256 {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// `SCRAM-SHA-512`.
    ScramSha512 {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
}

impl Security {
    /// The librdkafka settings these stand for.
    pub(crate) fn settings(&self) -> Vec<(&'static str, String)> {
        let (protocol, sasl, tls) = match self {
            Self::Tls(tls) => ("SSL", None, Some(tls)),
            Self::Sasl(sasl) => ("SASL_PLAINTEXT", Some(sasl), None),
            Self::SaslTls(sasl, tls) => ("SASL_SSL", Some(sasl), Some(tls)),
        };
        let mut settings = vec![("security.protocol", protocol.to_owned())];
        if let Some(sasl) = sasl {
            let (mechanism, user, password) = match sasl {
                Sasl::Plain { user, password } => ("PLAIN", user, password),
                Sasl::ScramSha256 { user, password } => ("SCRAM-SHA-256", user, password),
                Sasl::ScramSha512 { user, password } => ("SCRAM-SHA-512", user, password),
            };
            settings.push(("sasl.mechanism", mechanism.to_owned()));
            settings.push(("sasl.username", user.clone()));
            settings.push(("sasl.password", password.expose().to_owned()));
        }
        if let Some(tls) = tls {
            let path = |p: &PathBuf| p.to_string_lossy().into_owned();
            let files = [
                ("ssl.ca.location", &tls.ca),
                ("ssl.certificate.location", &tls.certificate),
                ("ssl.key.location", &tls.key),
            ];
            for (key, file) in files {
                if let Some(file) = file {
                    settings.push((key, path(file)));
                }
            }
            if let Some(password) = &tls.key_password {
                settings.push(("ssl.key.password", password.expose().to_owned()));
            }
        }
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mechanism_maps_to_librdkafka_settings() {
        let sasl = Sasl::ScramSha256 {
            user: "u".into(),
            password: Secret::new("p"),
        };
        let settings = Security::SaslTls(sasl, Tls::with_ca("/ca.pem")).settings();
        assert_eq!(
            settings,
            vec![
                ("security.protocol", "SASL_SSL".to_owned()),
                ("sasl.mechanism", "SCRAM-SHA-256".to_owned()),
                ("sasl.username", "u".to_owned()),
                ("sasl.password", "p".to_owned()),
                ("ssl.ca.location", "/ca.pem".to_owned()),
            ]
        );
        let plain = Sasl::Plain {
            user: "u".into(),
            password: Secret::new("p"),
        };
        assert_eq!(
            Security::Sasl(plain).settings()[..2],
            [
                ("security.protocol", "SASL_PLAINTEXT".to_owned()),
                ("sasl.mechanism", "PLAIN".to_owned())
            ]
        );
    }
}
