//! Token authentication and TLS trust, typed, given to the `pulsar` client's builder.

use std::path::PathBuf;

use ruststream_core::{Env, Secret};

/// How the client authenticates and whom it trusts over `pulsar+ssl://`: what a managed
/// Pulsar service asks for, given to [`Pulsar::connect_with`](crate::Pulsar::connect_with).
/// The token is a [`Secret`]: `Debug` prints `***`.
///
/// ```
/// use ruststream_core::Secret;
/// use ruststream_pulsar::Security;
///
/// let security = Security::token(Secret::new("eyJhbGciOi.s3cret"))
///     .with_ca("/etc/ssl/pulsar-ca.pem");
/// assert!(!format!("{security:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Security {
    /// A JWT for Pulsar's `token` authentication plugin, sent in the connection's
    /// `CONNECT` command.
    pub token: Option<Secret>,
    /// The CA bundle (PEM) that signed the brokers' certificates, for `pulsar+ssl://`;
    /// the system's when `None`.
    pub ca: Option<PathBuf>,
    /// Whether the broker's certificate must name the host in the URL (default: yes).
    pub skip_hostname_verification: bool,
}

impl Security {
    /// Nothing: plaintext, no authentication (what [`Pulsar::connect`](crate::Pulsar::connect) uses).
    pub fn none() -> Self {
        Self::default()
    }

    /// Authenticates with a token (Pulsar's `token` plugin).
    pub fn token(token: Secret) -> Self {
        Self {
            token: Some(token),
            ..Self::default()
        }
    }

    /// Trusts the brokers' certificates signed by the CA bundle at `ca` (use a
    /// `pulsar+ssl://` URL).
    pub fn with_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.ca = Some(ca.into());
        self
    }

    /// Accepts a broker certificate that does not name the host in the URL (the chain
    /// is still checked). For brokers reached through an address their certificate does
    /// not list; prefer fixing the certificate.
    pub fn without_hostname_verification(mut self) -> Self {
        self.skip_hostname_verification = true;
        self
    }

    /// The settings in the environment (the convention every transport shares, [`Env`]),
    /// with `Env::new("RUSTSTREAM_PULSAR")`: `RUSTSTREAM_PULSAR_TOKEN` (a JWT) and
    /// `RUSTSTREAM_PULSAR_CA` (CA bundle, PEM, for `pulsar+ssl://`); none set is
    /// [`Security::none`].
    pub fn from_env(env: &Env) -> Self {
        Self {
            token: env.secret("TOKEN"),
            ca: env.path("CA"),
            skip_hostname_verification: false,
        }
    }

    /// The builder with these settings applied; an unreadable CA file is an error
    /// naming the file.
    pub(crate) fn apply(
        &self,
        mut builder: pulsar::PulsarBuilder<pulsar::TokioExecutor>,
    ) -> Result<pulsar::PulsarBuilder<pulsar::TokioExecutor>, String> {
        if let Some(token) = &self.token {
            builder = builder.with_auth(pulsar::Authentication {
                name: "token".into(),
                data: token.expose().as_bytes().to_vec(),
            });
        }
        if let Some(ca) = &self.ca {
            builder = builder
                .with_certificate_chain_file(ca)
                .map_err(|e| format!("cannot read the CA bundle `{}`: {e}", ca.display()))?;
        }
        if self.skip_hostname_verification {
            builder = builder.with_tls_hostname_verification_enabled(false);
        }
        Ok(builder)
    }
}
