//! Rebalance bookkeeping shared by librdkafka's callbacks and the subscription (K5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::TopicPartitionList;
use rdkafka::client::OAuthToken;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};

use crate::security::OAuthBearer;

/// Counts partition moves: every assign or revoke of a partition raises its generation,
/// and any move raises the epoch, which the subscription checks cheaply per record. Also
/// where a revoke finds the positions settled but not stored yet (`Commit::Tracked`).
#[derive(Debug, Default)]
pub(crate) struct Moves {
    epoch: AtomicU64,
    generations: Mutex<HashMap<(String, i32), u64>>,
    unstored: Mutex<Vec<Unstored>>,
}

/// Where the group is to resume a partition, settled but not stored yet: [`NOTHING`], or
/// the offset. Written by the subscription, taken by it when it stores, or by a revoke.
#[derive(Debug)]
struct Unstored {
    topic: Arc<str>,
    partition: i32,
    resume_at: Arc<AtomicI64>,
}

/// An [`Unstored`] cell's value when nothing waits to be stored.
pub(crate) const NOTHING: i64 = -1;

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

    /// The cell where `topic`/`partition`'s position waits to be stored.
    pub(crate) fn unstored(&self, topic: &Arc<str>, partition: i32) -> Arc<AtomicI64> {
        let resume_at = Arc::new(AtomicI64::new(NOTHING));
        self.unstored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Unstored {
                topic: Arc::clone(topic),
                partition,
                resume_at: Arc::clone(&resume_at),
            });
        resume_at
    }

    /// Takes the positions waiting to be stored of the partitions in `revoked`: the
    /// revoke stores them before librdkafka commits the partitions away.
    pub(crate) fn take_unstored(&self, revoked: &TopicPartitionList) -> TopicPartitionList {
        let mut due = TopicPartitionList::new();
        let unstored = self.unstored.lock().unwrap_or_else(PoisonError::into_inner);
        for cell in unstored.iter() {
            if revoked
                .find_partition(&cell.topic, cell.partition)
                .is_none()
            {
                continue;
            }
            let resume_at = cell.resume_at.swap(NOTHING, Ordering::Relaxed);
            if resume_at != NOTHING {
                let offset = rdkafka::Offset::Offset(resume_at);
                // Only an invalid offset is refused, and this one is not.
                let _ = due.add_partition_offset(&cell.topic, cell.partition, offset);
            }
        }
        due
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
    /// librdkafka's error events said at WARN lately, shared by the clients made from
    /// one `Kafka`.
    repeats: Arc<Repeats>,
}

/// While a broker is away, librdkafka reports the same error event every second or so
/// per client (`AllBrokersDown`, a refused connect): each kind of error is said at WARN
/// at most once a minute, with how many were said only at DEBUG since. A kind is the
/// event's `KafkaError` text, which rdkafka makes from the error code alone
/// (`KafkaError::Global`), so the map holds at most one entry per librdkafka error code.
#[derive(Debug, Default)]
struct Repeats(Mutex<HashMap<String, (Instant, u64)>>);

/// How often one kind of librdkafka error event is said at WARN while it repeats.
const REPEAT_EVERY: Duration = Duration::from_secs(60);

impl Repeats {
    /// An error event of kind `key` at `now`: `Some(how many were quiet since the last
    /// loud one)` when this one is loud.
    fn note(&self, key: &str, now: Instant, every: Duration) -> Option<u64> {
        let mut said = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match said.get_mut(key) {
            Some((at, quiet)) if now.duration_since(*at) < every => {
                *quiet += 1;
                None
            }
            Some((at, quiet)) => {
                *at = now;
                Some(std::mem::take(quiet))
            }
            None => {
                said.insert(key.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

impl KafkaContext {
    pub(crate) fn new(oauth: Option<OAuthBearer>) -> Self {
        Self {
            oauth,
            last_error: None,
            repeats: Arc::default(),
        }
    }

    /// This context, keeping librdkafka's error events for [`last_error`](Self::last_error).
    pub(crate) fn recording_errors(&self) -> Self {
        Self {
            oauth: self.oauth.clone(),
            last_error: Some(Arc::default()),
            repeats: Arc::clone(&self.repeats),
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
    /// logged (each kind at WARN at most once a minute while it repeats, the others at
    /// DEBUG), and kept for the start error when this context records them. Their text
    /// names brokers and causes, never a credential.
    fn error(&self, error: KafkaError, reason: &str) {
        match self
            .repeats
            .note(&error.to_string(), Instant::now(), REPEAT_EVERY)
        {
            Some(quiet) => {
                tracing::warn!(target: "librdkafka", %error, since_last_logged = quiet, "{reason}");
            }
            None => tracing::debug!(target: "librdkafka", %error, "{reason}"),
        }
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

/// The consumer context: records partition moves, and counts the events a poll serves
/// (see [`served`](Self::served)).
pub(crate) struct TrackingContext {
    pub(crate) moves: std::sync::Arc<Moves>,
    pub(crate) base: KafkaContext,
    served: AtomicU64,
}

impl TrackingContext {
    pub(crate) fn new(moves: Arc<Moves>, base: KafkaContext) -> Self {
        Self {
            moves,
            base,
            served: AtomicU64::new(0),
        }
    }

    /// How many events polls served through this context (a rebalance, a commit's
    /// result, statistics, a log line, a token refresh): a poll that answers nothing
    /// while this moved served one, and the queue may hold records behind it.
    #[inline]
    pub(crate) fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn serving(&self) {
        self.served.fetch_add(1, Ordering::Relaxed);
    }
}

impl ClientContext for TrackingContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.serving();
        self.base.log(level, facility, message);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.serving();
        self.base.stats_raw(statistics);
    }

    /// As the base context's (without it, rdkafka's default logs every event at ERROR:
    /// six lines a second while a broker is away).
    fn error(&self, error: KafkaError, reason: &str) {
        self.base.error(error, reason);
    }

    fn generate_oauth_token(
        &self,
        oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.serving();
        self.base.generate_oauth_token(oauthbearer_config)
    }
}

impl TrackingContext {
    /// Stores the positions settled but not stored yet on the partitions `revoked`, so
    /// the commit librdkafka makes as it lets them go includes them (K3): the next
    /// reader starts after everything that finished here.
    fn store_before_revoke(&self, consumer: &BaseConsumer<Self>, revoked: &TopicPartitionList) {
        let due = self.moves.take_unstored(revoked);
        if due.count() == 0 {
            return;
        }
        if let Err(error) = consumer.store_offsets(&due) {
            tracing::warn!(%error, "storing the settled positions of revoked partitions failed; their next reader may read those records again");
        }
    }
}

impl ConsumerContext for TrackingContext {
    fn commit_callback(&self, _result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        self.serving();
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        self.serving();
        let list = match rebalance {
            Rebalance::Assign(list) | Rebalance::Revoke(list) => list,
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "rebalance error");
                return;
            }
        };
        if let Rebalance::Revoke(_) = rebalance {
            self.store_before_revoke(consumer, list);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_error_is_loud_once_a_minute_with_how_many_were_quiet() {
        let repeats = Repeats::default();
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(repeats.note("AllBrokersDown", at(0), REPEAT_EVERY), Some(0));
        assert_eq!(repeats.note("AllBrokersDown", at(1), REPEAT_EVERY), None);
        assert_eq!(repeats.note("AllBrokersDown", at(2), REPEAT_EVERY), None);
        assert_eq!(
            repeats.note("BrokerTransportFailure", at(2), REPEAT_EVERY),
            Some(0),
            "another kind is news"
        );
        assert_eq!(
            repeats.note("AllBrokersDown", at(60), REPEAT_EVERY),
            Some(2),
            "a minute on: loud again, with the two left quiet"
        );
        assert_eq!(repeats.note("AllBrokersDown", at(61), REPEAT_EVERY), None);
    }

    #[test]
    fn the_consumer_context_reports_errors_through_the_shared_throttle() {
        let base = KafkaContext::default();
        let consumer = TrackingContext::new(Arc::default(), base.clone());
        let down = || KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AllBrokersDown);
        base.error(down(), "1/1 brokers are down");
        consumer.error(down(), "1/1 brokers are down");
        let said = base.repeats.0.lock().unwrap();
        assert_eq!(
            said.get(&down().to_string()).map(|(_, quiet)| *quiet),
            Some(1),
            "the consumer's event went through the base context, quietly"
        );
    }
}
