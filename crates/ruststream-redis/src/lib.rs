//! Redis Streams transport for ruststream: a stream read by a consumer group
//! (`XREADGROUP`), over the `redis` crate's tokio connection manager.
//!
//! What each outcome becomes (SPEC S1-S8, in `docs/spec.md`):
//!
//! | outcome | Redis |
//! |---|---|
//! | `ack()` | `XACK`, batched: one for every entry settled since the last, sent before `next` waits |
//! | `drop()` | `XACK` as for ack (the entry stays in the stream: trimming is the stream's retention) |
//! | `retry()` | `XCLAIM` to this consumer at once: counted by Redis, delivered again first |
//! | `retry_after(d)` | the entry stays pending in Redis; after d, `XCLAIM` as above |
//! | no outcome | nothing: claimed by a consumer of the group once idle for the claim timeout |
//! | at `max_attempts` | the entry as stored added to the dead-letter stream and acknowledged, in one `MULTI`/`EXEC` |
//!
//! Attempts are Redis's delivery count of the pending entry (1 when first read, +1 at
//! each claim), so they survive a restart of the service. Entries live in the service
//! (read ahead, running, waiting out `retry_after`) are kept from other consumers by a
//! keepalive (`XCLAIM … JUSTID`, which counts nothing) every third of the claim timeout;
//! when the service dies, another consumer claims them once the claim timeout passed.
//!
//! An entry's field `payload` is the message; every other field is a header. The
//! [`RedisPublisher`] writes entries that way (`XADD`, confirmed by Redis's reply).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use ruststream::{App, HandlerOutcome, Message, on};
//! use ruststream_redis::Redis;
//!
//! async fn bill(Message(order): Message<u64>) -> HandlerOutcome {
//!     let _ = order;
//!     HandlerOutcome::ack()
//! }
//!
//! let redis = Redis::connect("redis://127.0.0.1:6379").await?;
//! App::new()
//!     .register(
//!         on(redis.stream("orders", "billing"), bill)
//!             .max_attempts(5)
//!             .dead_letter("orders.dead"),
//!     )
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod consumers;
mod descriptor;
mod entry;
mod letters;
mod publish;
mod reader;
pub mod subscription;

use std::sync::Arc;
use std::time::Duration;

pub use descriptor::{DEFAULT_BATCH, DEFAULT_CLAIM_TIMEOUT, RedisStream};
pub use publish::{PAYLOAD_FIELD, RedisPublisher};
pub use redis;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ruststream_core::Cause;

/// How long [`Redis::connect`] waits for the server (SPEC G7).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one command may take before it counts as failed (blocking reads excepted).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A Redis server, shared by descriptors and publishers. Cheap to clone.
#[derive(Clone)]
pub struct Redis {
    client: redis::Client,
    commands: ConnectionManager,
    url: Arc<str>,
    timeout: Duration,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").field("url", &self.url).finish()
    }
}

/// The connection could not be made: the broker's URL (password masked) and why.
pub use ruststream_core::ConnectError;

impl Redis {
    /// Connects to `url` (`redis://[user:password@]host:6379[/db]`, `rediss://` for TLS),
    /// failing after [`DEFAULT_CONNECT_TIMEOUT`] with an error naming the address
    /// (password masked).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_within(url, DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects to `url`, failing after `timeout`. A connection lost later is made again
    /// by the connection manager (each attempt within `timeout`): commands fail while
    /// the server is away, and reading resumes once it is back.
    pub async fn connect_within(url: &str, timeout: Duration) -> Result<Self, ConnectError> {
        let shown: Arc<str> = Arc::from(ruststream_core::redact_url(url).as_ref());
        let fail = |source: Cause| ConnectError::new("Redis", url, source);
        let client = redis::Client::open(url).map_err(|e| fail(Cause::new(e)))?;
        let commands = manager(&client, timeout, Some(COMMAND_TIMEOUT))
            .await
            .map_err(fail)?;
        Ok(Self {
            client,
            commands,
            url: shown.clone(),
            timeout,
        })
    }

    /// Connects with the URL from the environment (the convention every transport
    /// shares, [`Env`](ruststream_core::Env)): `{PREFIX}_URL`, credentials inside it.
    /// The password is masked in every error.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use ruststream_core::Env;
    /// let redis = ruststream_redis::Redis::connect_from_env(&Env::new("RUSTSTREAM_REDIS")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_from_env(
        env: &ruststream_core::Env,
    ) -> Result<Self, ruststream_core::FromEnvError<ConnectError>> {
        let url = env.require("URL")?;
        Self::connect(&url)
            .await
            .map_err(ruststream_core::FromEnvError::Connect)
    }

    /// A connection for commands of your own (shared, reconnecting).
    pub fn connection(&self) -> ConnectionManager {
        self.commands.clone()
    }

    /// A subscription on `stream` as consumer group `group` (created at start when
    /// missing; see [`RedisStream`]).
    pub fn stream(&self, stream: impl Into<String>, group: impl Into<String>) -> RedisStream {
        RedisStream::new(self.clone(), stream.into(), group.into())
    }

    /// Adds entries to streams (`XADD`), confirmed by Redis's reply.
    pub fn publisher(&self) -> RedisPublisher {
        RedisPublisher::new(self.commands.clone(), Arc::clone(&self.url))
    }

    /// The confirmed publish, for `ruststream::Publisher::new`: the one publishing shape of
    /// every transport (`.to(stream).header(..).send(&v)`).
    pub fn publish_handle(&self) -> Arc<dyn ruststream_core::Publish> {
        Arc::new(self.publisher())
    }

    /// A connection of its own for blocking reads (no response timeout).
    pub(crate) async fn reader(&self) -> Result<ConnectionManager, Cause> {
        manager(&self.client, self.timeout, None).await
    }
}

async fn manager(
    client: &redis::Client,
    timeout: Duration,
    response: Option<Duration>,
) -> Result<ConnectionManager, Cause> {
    // One plain attempt first: the connection manager retries a refusal (a wrong
    // password, a TLS failure) until the timeout, which would hide the server's answer.
    let probing = client.get_multiplexed_async_connection();
    drop(
        tokio::time::timeout(timeout, probing)
            .await
            .map_err(|_| Cause::new(format!("no answer within {timeout:?}")))?
            .map_err(Cause::new)?,
    );
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(response);
    let connecting = ConnectionManager::new_with_config(client.clone(), config);
    tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| Cause::new(format!("no answer within {timeout:?}")))?
        .map_err(Cause::new)
}
