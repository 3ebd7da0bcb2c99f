//! Connection settings from environment variables: one naming convention for every
//! transport, so a service deploys to another cluster without a code change.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::Secret;

/// Connection settings read from variables named `{PREFIX}_{KEY}`
/// (`RUSTSTREAM_NATS_URL`, `RUSTSTREAM_KAFKA_PASSWORD`, ...). Each transport's
/// `from_env` constructor lists the keys it reads; an empty variable counts as unset.
/// Secrets come out as [`Secret`]s and never appear in an [`EnvError`].
///
/// ```
/// use ruststream_core::Env;
///
/// let env = Env::from_pairs("ORDERS_NATS", [("ORDERS_NATS_URL", "nats://10.0.0.1:4222")]);
/// assert_eq!(env.require("URL").unwrap(), "nats://10.0.0.1:4222");
/// assert_eq!(env.require("USER").unwrap_err().to_string(), "ORDERS_NATS_USER is not set");
/// ```
#[derive(Clone)]
pub struct Env {
    prefix: String,
    /// `None`: the process environment.
    pairs: Option<HashMap<String, String>>,
}

/// Prints the prefix and, for pairs, their names: values may be secrets.
impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.pairs.iter().flat_map(|p| p.keys()).collect();
        names.sort();
        f.debug_struct("Env")
            .field("prefix", &self.prefix)
            .field("pairs", &names)
            .finish()
    }
}

/// A setting missing or unusable. Names the variable, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// A variable the connection needs is not set.
    #[error("{variable} is not set")]
    Missing {
        /// The variable's name.
        variable: String,
    },
    /// Variables that do not go together, or a value that is not one of those allowed.
    #[error("{variables}: {problem}")]
    Invalid {
        /// The variables' names, comma-separated.
        variables: String,
        /// What is wrong.
        problem: String,
    },
}

impl Env {
    /// The process environment, variables named `{prefix}_{KEY}`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            pairs: None,
        }
    }

    /// Variables from `pairs` instead of the process environment (full names, prefix
    /// included): for tests, or settings read from a file.
    pub fn from_pairs<I, K, V>(prefix: impl Into<String>, pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            prefix: prefix.into(),
            pairs: Some(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            ),
        }
    }

    /// The full name of `key`: `{prefix}_{key}`.
    pub fn name(&self, key: &str) -> String {
        format!("{}_{key}", self.prefix)
    }

    /// The value of `{prefix}_{key}`; `None` when unset, empty or not UTF-8.
    pub fn get(&self, key: &str) -> Option<String> {
        let name = self.name(key);
        let value = match &self.pairs {
            Some(pairs) => pairs.get(&name).cloned(),
            None => std::env::var(name).ok(),
        };
        value.filter(|v| !v.is_empty())
    }

    /// The value of `{prefix}_{key}`, or an error naming the variable.
    pub fn require(&self, key: &str) -> Result<String, EnvError> {
        self.get(key).ok_or_else(|| EnvError::Missing {
            variable: self.name(key),
        })
    }

    /// `{prefix}_{key}` as a [`Secret`].
    pub fn secret(&self, key: &str) -> Option<Secret> {
        self.get(key).map(Secret::new)
    }

    /// `{prefix}_{key}` as a file path.
    pub fn path(&self, key: &str) -> Option<PathBuf> {
        self.get(key).map(PathBuf::from)
    }

    /// Two variables that only make sense together (a user and its password, a
    /// certificate and its key): both, neither, or an error naming the one missing.
    pub fn both(&self, first: &str, second: &str) -> Result<Option<(String, String)>, EnvError> {
        match (self.get(first), self.get(second)) {
            (Some(a), Some(b)) => Ok(Some((a, b))),
            (None, None) => Ok(None),
            (Some(_), None) => {
                Err(self.invalid(&[first, second], format!("set {} too", self.name(second))))
            }
            (None, Some(_)) => {
                Err(self.invalid(&[first, second], format!("set {} too", self.name(first))))
            }
        }
    }

    /// The one of `keys` that is set, if any; an error naming them when several are
    /// (kinds of credentials that exclude each other).
    pub fn one_of<'k>(&self, keys: &[&'k str]) -> Result<Option<&'k str>, EnvError> {
        let set: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| self.get(k).is_some())
            .collect();
        match set.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one)),
            _ => Err(self.invalid(&set, "set one of these, not several".into())),
        }
    }

    /// An [`EnvError::Invalid`] naming `keys`' variables.
    pub fn invalid(&self, keys: &[&str], problem: String) -> EnvError {
        EnvError::Invalid {
            variables: keys
                .iter()
                .map(|k| self.name(k))
                .collect::<Vec<_>>()
                .join(", "),
            problem,
        }
    }
}

/// A connection from the environment failed: a setting (names the variable) or the
/// connection itself (the transport's own error).
#[derive(Debug, thiserror::Error)]
pub enum FromEnvError<E: std::error::Error + 'static> {
    /// A setting is missing or unusable.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The settings were read; connecting with them failed.
    #[error(transparent)]
    Connect(E),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_go_together_or_name_the_missing_one() {
        let env = Env::from_pairs("P", [("P_USER", "billing"), ("P_CERT", "")]);
        assert_eq!(
            env.both("USER", "PASSWORD").unwrap_err().to_string(),
            "P_USER, P_PASSWORD: set P_PASSWORD too"
        );
        assert_eq!(
            env.both("CERT", "KEY").unwrap(),
            None,
            "empty counts as unset"
        );
    }

    #[test]
    fn exclusive_kinds_name_every_one_set_and_never_a_value() {
        let env = Env::from_pairs("P", [("P_TOKEN", "t0k"), ("P_NKEY", "SUAB")]);
        let error = env.one_of(&["PASSWORD", "TOKEN", "NKEY"]).unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(shown.contains("P_TOKEN, P_NKEY"), "{shown}");
        assert!(!shown.contains("t0k") && !shown.contains("SUAB"), "{shown}");
        let env = Env::from_pairs("P", [("P_TOKEN", "t0k")]);
        assert_eq!(env.one_of(&["PASSWORD", "TOKEN"]).unwrap(), Some("TOKEN"));
        assert_eq!(format!("{:?}", env.secret("TOKEN")), "Some(***)");
        assert!(!format!("{env:?}").contains("t0k"), "{env:?}");
    }
}
