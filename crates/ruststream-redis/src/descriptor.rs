//! The Redis Streams descriptor: a stream, a consumer group, where a new group starts, the
//! claim timeout and how much is read ahead.

use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream_core::{
    Capabilities, DeadLetters, Declaration, DelayedRedelivery, Descriptor, Publish, SubscribeError,
    Verb,
};

use tokio::sync::mpsc;

use crate::Redis;
use crate::reader::{Reader, Shared, create_group};
use crate::subscription::RedisSubscription;

use ruststream_core::StartAt;

/// The id a group created at `start` begins after (`XGROUP CREATE`): `0` (every entry),
/// `$` (only new ones), or for a time the last id before it, since an entry id is the
/// millisecond it was added (`<ms>-<seq>`): the group reads every entry added at or
/// after that time.
pub(crate) fn group_start(start: StartAt) -> String {
    match start {
        StartAt::Latest => "$".to_owned(),
        StartAt::Time(time) => {
            let ms = time
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            match ms.checked_sub(1) {
                Some(before) => format!("{before}-{}", u64::MAX),
                None => "0".to_owned(),
            }
        }
        // `Earliest`, and whatever later versions of `StartAt` add.
        _ => "0".to_owned(),
    }
}

/// How long an entry nobody keeps alive stays with the consumer that read it before
/// another consumer of the group claims it, unless set (like JetStream's `ack_wait`).
pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(30);

/// How many entries one `XREADGROUP` reads ahead, unless set.
pub const DEFAULT_BATCH: usize = 64;

/// One stream read by one consumer group.
#[derive(Clone)]
pub struct RedisStream {
    pub(crate) redis: Redis,
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) consumer: Option<String>,
    pub(crate) start: StartAt,
    pub(crate) claim_timeout: Duration,
    pub(crate) batch: usize,
}

impl std::fmt::Debug for RedisStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStream")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .finish()
    }
}

impl RedisStream {
    pub(crate) fn new(redis: Redis, stream: String, group: String) -> Self {
        Self {
            redis,
            stream,
            group,
            consumer: None,
            start: StartAt::Earliest,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            batch: DEFAULT_BATCH,
        }
    }

    /// This subscription's consumer name in the group (default
    /// `<hostname>-<pid>-<n>`, n counting the subscriptions this process opened). With a
    /// name that stays the same across restarts, a restarted service reads its own
    /// pending entries again at once instead of after the claim timeout; two
    /// subscriptions open at once must not share one. A registration with
    /// `consumers(n)` names its consumers `<name>-0` to `<name>-<n-1>`.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// Where the group begins when it is created at start (default
    /// [`StartAt::Earliest`]; `Latest` reads only entries added after; `Time(t)` every
    /// entry added at or after `t`, as entry ids are times); an existing group keeps its
    /// position (SPEC G8).
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// How long an entry idles with a consumer that stopped keeping it alive before
    /// another consumer claims it (default [`DEFAULT_CLAIM_TIMEOUT`]): how soon the work
    /// of a crashed service is taken over. Live entries are kept alive every third of it.
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// How many entries one read takes ahead (default [`DEFAULT_BATCH`]); at least 1.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// The consumer name, and whether it was named here (not by the user). Of several
    /// consumers (`consumers(n)`), the one numbered `i` is `<name>-<i>`.
    pub(crate) fn consumer_name(&self, declaration: &Declaration) -> (String, bool) {
        match &self.consumer {
            Some(name) if declaration.consumer_count() > 1 => {
                (format!("{name}-{}", declaration.consumer), false)
            }
            Some(name) => (name.clone(), false),
            None => (crate::consumers::generated_name(), true),
        }
    }
}

/// What every Redis stream subscription can do (S2-S6).
pub(crate) const CAPABILITIES: Capabilities = Capabilities::NOTHING
    .with_ack(Verb::Native)
    .with_drop(Verb::Native)
    .with_redeliver(Verb::Native)
    // Pending in Redis meanwhile, kept alive by the service: a crash loses the wait only.
    .with_delayed_redelivery(DelayedRedelivery::Held { limit: None })
    .with_native_count(true)
    .with_dead_letters(DeadLetters::Subscription)
    .with_holds_original(true);

impl Descriptor for RedisStream {
    type Subscription = RedisSubscription;

    fn address(&self) -> &str {
        &self.stream
    }

    fn transport(&self) -> &'static str {
        "redis"
    }

    /// None: Redis holds and counts retries, so no copy is ever published (S6).
    fn retry_address(&self) -> Option<&str> {
        None
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn check(&self, _declaration: &Declaration) -> Vec<String> {
        let mut broken = Vec::new();
        if self.group.is_empty() {
            broken.push("the consumer group name is empty".to_owned());
        }
        if self.consumer.as_deref() == Some("") {
            broken.push("the consumer name is empty".to_owned());
        }
        if self.claim_timeout < Duration::from_millis(100) {
            broken.push(format!(
                "claim_timeout({:?}) is below 100 ms: entries would be claimed away while they run",
                self.claim_timeout
            ));
        }
        if self.batch == 0 {
            broken.push("batch(0) would read nothing: use at least 1".to_owned());
        }
        if let Some(rule) = stream_rule(&self.stream) {
            broken.push(rule);
        }
        broken
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        stream_rule(address)
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(self.redis.publisher())
    }

    fn describe(&self) -> ruststream_core::Described {
        self.redis.publisher().describe().group(&self.group)
    }

    /// The dead-letter stream, read with `XRANGE` and emptied with `XDEL`.
    async fn dead_letters(
        &self,
        address: &str,
    ) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
        Ok(Box::new(crate::letters::RedisLetters {
            connection: self.redis.connection(),
            stream: address.to_owned(),
        }))
    }

    /// The server answers a `PING` (stream and group are made at start when missing).
    async fn verify(&self) -> Result<(), String> {
        let mut connection = self.redis.connection();
        let command = redis::cmd("PING");
        let ping = command.query_async::<String>(&mut connection);
        match tokio::time::timeout(Duration::from_secs(5), ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("Redis did not answer: {e}")),
            Err(_) => Err("Redis did not answer within 5s".to_owned()),
        }
    }

    /// Creates the group when missing (where `start_at` says), removes consumers that
    /// left, and starts the reader task.
    async fn open(self, declaration: &Declaration) -> Result<RedisSubscription, SubscribeError> {
        let stream = self.stream.as_str();
        let mut commands = self.redis.connection();
        let start = group_start(self.start);
        create_group(&mut commands, stream, &self.group, &start)
            .await
            .map_err(|e| {
                let what = format!("creating consumer group `{}`: {e}", self.group);
                SubscribeError::new(stream, what)
            })?;
        let reader = self
            .redis
            .reader()
            .await
            .map_err(|e| SubscribeError::new(stream, e))?;
        crate::consumers::remove_departed(&mut commands, stream, &self.group).await;
        let (consumer, named_here) = self.consumer_name(declaration);
        let shared = Arc::new(Shared {
            stream: Arc::from(stream),
            group: self.group.clone(),
            consumer,
            named_here,
            claim_timeout: self.claim_timeout,
            batch: self.batch,
            start,
            known: Mutex::default(),
            up: AtomicBool::new(true),
            closing: AtomicBool::new(false),
            reader_id: AtomicI64::new(0),
        });
        let (tx, rx) = mpsc::channel(self.batch);
        let reading = Reader::new(Arc::clone(&shared), reader, commands.clone(), tx).run();
        let reading = tokio::spawn(reading);
        let dead_letter = declaration.dead_letter.clone();
        Ok(RedisSubscription::new(
            shared,
            commands,
            rx,
            reading,
            dead_letter,
        ))
    }
}

/// Why `stream` is not a stream name ruststream reads or writes, or `None`.
fn stream_rule(stream: &str) -> Option<String> {
    stream
        .is_empty()
        .then(|| "a Redis stream name is not empty".to_owned())
}
