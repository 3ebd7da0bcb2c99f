//! Rebalance bookkeeping shared by librdkafka's callbacks and the subscription (K5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::ClientContext;
use rdkafka::client::OAuthToken;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;

use crate::security::OAuthBearer;

/// Counts partition moves: every assign or revoke of a partition raises its generation,
/// and any move raises the epoch, which the subscription checks cheaply per record.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    epoch: AtomicU64,
    generations: Mutex<HashMap<(String, i32), u64>>,
}

impl Moves {
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn generation(&self, topic: &str, partition: i32) -> u64 {
        self.generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn moved(&self, partitions: impl Iterator<Item = (String, i32)>) {
        let mut generations = self
            .generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for key in partitions {
            *generations.entry(key).or_default() += 1;
        }
        drop(generations);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// The context of every client this crate makes: librdkafka's log lines go to `tracing`
/// (target `librdkafka`), and OAUTHBEARER tokens come from the caller's callback
/// ([`Sasl::OAuthBearer`](crate::Sasl::OAuthBearer)). The producer's type names it.
#[derive(Debug, Clone, Default)]
pub struct KafkaContext {
    oauth: Option<OAuthBearer>,
    /// Where the start's metadata probe keeps librdkafka's last error event (an
    /// authentication or TLS failure shows only there), for its start error.
    last_error: Option<Arc<Mutex<Option<String>>>>,
}

impl KafkaContext {
    pub(crate) fn new(oauth: Option<OAuthBearer>) -> Self {
        Self {
            oauth,
            last_error: None,
        }
    }

    /// This context, keeping librdkafka's error events for [`last_error`](Self::last_error).
    pub(crate) fn recording_errors(&self) -> Self {
        Self {
            oauth: self.oauth.clone(),
            last_error: Some(Arc::default()),
        }
    }

    /// The last error event librdkafka reported to this context, when it keeps them:
    /// the cause of a failed start that a metadata timeout alone does not tell.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .as_ref()?
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn has_token_callback(&self) -> bool {
        self.oauth.is_some()
    }
}

impl ClientContext for KafkaContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    /// librdkafka's error events (a broker down, an authentication or TLS failure):
    /// logged, and kept for the start error when this context records them. Their text
    /// names brokers and causes, never a credential.
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
        if let Some(last) = &self.last_error {
            let said = if reason.contains(&error.to_string()) {
                reason.to_owned()
            } else {
                format!("{error}: {reason}")
            };
            *last.lock().unwrap_or_else(PoisonError::into_inner) = Some(said);
        }
    }

    fn generate_oauth_token(
        &self,
        _oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        match &self.oauth {
            Some(tokens) => Ok(tokens.token()?),
            None => Err("sasl.mechanism is OAUTHBEARER but no token callback was given: use Sasl::OAuthBearer".into()),
        }
    }
}

/// For consumers of the caller's own (and this crate's metadata probe): nothing beyond
/// librdkafka's defaults.
impl ConsumerContext for KafkaContext {}

/// The consumer context: records partition moves.
pub(crate) struct TrackingContext {
    pub(crate) moves: std::sync::Arc<Moves>,
    pub(crate) base: KafkaContext,
}

impl ClientContext for TrackingContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.base.log(level, facility, message);
    }

    fn generate_oauth_token(
        &self,
        oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.base.generate_oauth_token(oauthbearer_config)
    }
}

impl ConsumerContext for TrackingContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let list = match rebalance {
            Rebalance::Assign(list) | Rebalance::Revoke(list) => list,
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "rebalance error");
                return;
            }
        };
        if let Rebalance::Revoke(_) = rebalance {
            tracing::info!(
                partitions = list.count(),
                "partitions revoked; their tracked state is discarded"
            );
        }
        self.moves.moved(
            list.elements()
                .into_iter()
                .map(|e| (e.topic().to_owned(), e.partition())),
        );
    }
}
