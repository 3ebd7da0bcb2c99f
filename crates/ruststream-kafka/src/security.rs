//! Encryption and authentication, typed, turned into librdkafka's settings.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use ruststream_core::{Env, EnvError, Secret};

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

/// A SASL mechanism and its credentials.
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
    /// `OAUTHBEARER`: tokens from a callback of the caller's (an identity provider's
    /// client), asked for when a client starts and again before each token expires.
    OAuthBearer(OAuthBearer),
}

/// The token callback of [`Sasl::OAuthBearer`]. librdkafka calls it from its own thread,
/// so it must not block for long; a failure is logged by librdkafka and asked again.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use ruststream_core::Secret;
/// use ruststream_kafka::{BearerToken, OAuthBearer, Sasl, Security, Tls};
///
/// let tokens = OAuthBearer::new(|| {
///     // Ask the identity provider here.
///     Ok(BearerToken {
///         token: Secret::new("eyJhbGciOi..."),
///         principal: "billing".into(),
///         expires_at: SystemTime::now() + Duration::from_secs(3600),
///     })
/// });
/// let security = Security::SaslTls(Sasl::OAuthBearer(tokens), Tls::default());
/// ```
#[derive(Clone)]
pub struct OAuthBearer(Arc<TokenFn>);

type TokenFn = dyn Fn() -> Result<BearerToken, String> + Send + Sync;

/// One OAUTHBEARER token and what librdkafka needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BearerToken {
    /// The token (a JWT, usually).
    pub token: Secret,
    /// The Kafka principal it stands for.
    pub principal: String,
    /// When it expires; librdkafka asks for the next one before.
    pub expires_at: SystemTime,
}

impl OAuthBearer {
    /// Tokens from `callback`; an `Err` is the reason no token could be had.
    pub fn new(callback: impl Fn() -> Result<BearerToken, String> + Send + Sync + 'static) -> Self {
        Self(Arc::new(callback))
    }

    /// A token, in librdkafka's terms.
    pub(crate) fn token(&self) -> Result<rdkafka::client::OAuthToken, String> {
        let token = (self.0)()?;
        let expires = token
            .expires_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|_| "the token expired before 1970".to_owned())?;
        Ok(rdkafka::client::OAuthToken {
            token: token.token.expose().to_owned(),
            principal_name: token.principal,
            lifetime_ms: i64::try_from(expires.as_millis()).unwrap_or(i64::MAX),
        })
    }
}

impl std::fmt::Debug for OAuthBearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OAuthBearer(<callback>)")
    }
}

/// The same callback (the same `OAuthBearer` or a clone of it).
impl PartialEq for OAuthBearer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OAuthBearer {}

impl Security {
    /// The security settings in the environment (the convention every transport shares,
    /// [`Env`]); `None` when none is set (plaintext). With `Env::new("RUSTSTREAM_KAFKA")`:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `RUSTSTREAM_KAFKA_SASL_MECHANISM` | `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` |
    /// | `RUSTSTREAM_KAFKA_USER` + `_PASSWORD` | SASL credentials (with a mechanism) |
    /// | `RUSTSTREAM_KAFKA_TLS` | `true`: TLS, trusting the system's CAs |
    /// | `RUSTSTREAM_KAFKA_CA` | CA bundle (PEM) to trust; implies TLS |
    /// | `RUSTSTREAM_KAFKA_CERT` + `_KEY` | client certificate and key (PEM); imply TLS |
    /// | `RUSTSTREAM_KAFKA_KEY_PASSWORD` | the key's password |
    ///
    /// ```
    /// use ruststream_core::Env;
    /// use ruststream_kafka::{Sasl, Security, Tls};
    ///
    /// let env = Env::from_pairs("K", [
    ///     ("K_SASL_MECHANISM", "SCRAM-SHA-512"), ("K_USER", "billing"),
    ///     ("K_PASSWORD", "s3cret"), ("K_CA", "/etc/ssl/kafka-ca.pem"),
    /// ]);
    /// let Some(Security::SaslTls(Sasl::ScramSha512 { user, .. }, tls)) = Security::from_env(&env)? else {
    ///     panic!("SASL over TLS")
    /// };
    /// assert_eq!((user.as_str(), tls), ("billing", Tls::with_ca("/etc/ssl/kafka-ca.pem")));
    /// # Ok::<(), ruststream_core::EnvError>(())
    /// ```
    pub fn from_env(env: &Env) -> Result<Option<Self>, EnvError> {
        let credentials = env.both("USER", "PASSWORD")?;
        let sasl = match (env.get("SASL_MECHANISM"), credentials) {
            (None, None) => None,
            (Some(mechanism), Some((user, password))) => {
                let password = Secret::new(password);
                Some(match mechanism.to_ascii_uppercase().as_str() {
                    "PLAIN" => Sasl::Plain { user, password },
                    "SCRAM-SHA-256" => Sasl::ScramSha256 { user, password },
                    "SCRAM-SHA-512" => Sasl::ScramSha512 { user, password },
                    _ => {
                        return Err(env.invalid(
                            &["SASL_MECHANISM"],
                            format!(
                                "`{mechanism}` is none of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 \
                                 (OAUTHBEARER takes a token callback: Sasl::OAuthBearer, in code)"
                            ),
                        ));
                    }
                })
            }
            (Some(_), None) => {
                return Err(env.invalid(
                    &["SASL_MECHANISM", "USER", "PASSWORD"],
                    "set the user and password too".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(env.invalid(
                    &["USER", "PASSWORD", "SASL_MECHANISM"],
                    "set the mechanism too (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)".into(),
                ));
            }
        };
        let client = env.both("CERT", "KEY")?;
        let wants_tls = match env.get("TLS").map(|v| v.to_ascii_lowercase()) {
            None => false,
            Some(v) if v == "true" || v == "1" => true,
            Some(v) if v == "false" || v == "0" => false,
            Some(v) => {
                return Err(env.invalid(&["TLS"], format!("`{v}` is neither true nor false")));
            }
        };
        let tls = (wants_tls || env.get("CA").is_some() || client.is_some()).then(|| {
            let (certificate, key) = client.map(|(c, k)| (c.into(), k.into())).unzip();
            Tls {
                ca: env.path("CA"),
                certificate,
                key,
                key_password: env.secret("KEY_PASSWORD"),
            }
        });
        Ok(match (sasl, tls) {
            (None, None) => None,
            (Some(sasl), None) => Some(Self::Sasl(sasl)),
            (None, Some(tls)) => Some(Self::Tls(tls)),
            (Some(sasl), Some(tls)) => Some(Self::SaslTls(sasl, tls)),
        })
    }

    /// The OAUTHBEARER token callback, if these use one.
    pub(crate) fn oauth(&self) -> Option<&OAuthBearer> {
        match self {
            Self::Sasl(Sasl::OAuthBearer(tokens)) | Self::SaslTls(Sasl::OAuthBearer(tokens), _) => {
                Some(tokens)
            }
            _ => None,
        }
    }

    /// The librdkafka settings these stand for.
    pub(crate) fn settings(&self) -> Vec<(&'static str, String)> {
        let (protocol, sasl, tls) = match self {
            Self::Tls(tls) => ("SSL", None, Some(tls)),
            Self::Sasl(sasl) => ("SASL_PLAINTEXT", Some(sasl), None),
            Self::SaslTls(sasl, tls) => ("SASL_SSL", Some(sasl), Some(tls)),
        };
        let mut settings = vec![("security.protocol", protocol.to_owned())];
        if let Some(sasl) = sasl {
            let (mechanism, credentials) = match sasl {
                Sasl::Plain { user, password } => ("PLAIN", Some((user, password))),
                Sasl::ScramSha256 { user, password } => ("SCRAM-SHA-256", Some((user, password))),
                Sasl::ScramSha512 { user, password } => ("SCRAM-SHA-512", Some((user, password))),
                Sasl::OAuthBearer(_) => ("OAUTHBEARER", None),
            };
            settings.push(("sasl.mechanism", mechanism.to_owned()));
            if let Some((user, password)) = credentials {
                settings.push(("sasl.username", user.clone()));
                settings.push(("sasl.password", password.expose().to_owned()));
            }
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
        let bearer = Sasl::OAuthBearer(OAuthBearer::new(|| Err("no provider".into())));
        assert_eq!(
            Security::Sasl(bearer).settings(),
            [
                ("security.protocol", "SASL_PLAINTEXT".to_owned()),
                ("sasl.mechanism", "OAUTHBEARER".to_owned())
            ]
        );
        assert_eq!(
            Security::Sasl(plain).settings()[..2],
            [
                ("security.protocol", "SASL_PLAINTEXT".to_owned()),
                ("sasl.mechanism", "PLAIN".to_owned())
            ]
        );
    }
}

#[cfg(test)]
mod from_env {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs("K", pairs.iter().map(|(k, v)| (format!("K_{k}"), *v)))
    }

    #[test]
    fn nothing_set_is_plaintext_and_each_kind_reads_as_typed() {
        assert_eq!(Security::from_env(&env(&[])).unwrap(), None);
        assert_eq!(
            Security::from_env(&env(&[("TLS", "true")])).unwrap(),
            Some(Security::Tls(Tls::default()))
        );
        let sasl = env(&[
            ("SASL_MECHANISM", "plain"),
            ("USER", "u"),
            ("PASSWORD", "p"),
        ]);
        assert_eq!(
            Security::from_env(&sasl).unwrap(),
            Some(Security::Sasl(Sasl::Plain {
                user: "u".into(),
                password: Secret::new("p")
            }))
        );
        let mutual = env(&[
            ("CERT", "/c.pem"),
            ("KEY", "/k.pem"),
            ("KEY_PASSWORD", "kp"),
        ]);
        let Some(Security::Tls(tls)) = Security::from_env(&mutual).unwrap() else {
            panic!("a client certificate implies TLS");
        };
        assert_eq!(
            (tls.certificate, tls.key, tls.key_password),
            (
                Some("/c.pem".into()),
                Some("/k.pem".into()),
                Some(Secret::new("kp"))
            )
        );
    }

    #[test]
    fn unusable_settings_name_the_variables_and_never_the_password() {
        let cases: [(&[(&str, &str)], &str); 4] = [
            (&[("USER", "u"), ("PASSWORD", "pw-91")], "K_SASL_MECHANISM"),
            (
                &[
                    ("SASL_MECHANISM", "GSSAPI"),
                    ("USER", "u"),
                    ("PASSWORD", "pw-91"),
                ],
                "GSSAPI",
            ),
            (&[("SASL_MECHANISM", "PLAIN")], "K_USER"),
            (&[("USER", "u")], "set K_PASSWORD too"),
        ];
        for (pairs, named) in cases {
            let error = Security::from_env(&env(pairs)).unwrap_err();
            let shown = format!("{error} {error:?}");
            assert!(shown.contains(named), "{pairs:?}: {shown}");
            assert!(!shown.contains("pw-91"), "{shown}");
        }
    }
}
