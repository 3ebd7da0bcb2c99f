//! The connection every descriptor and publisher of one [`RabbitMq`](crate::RabbitMq)
//! shares, made again when it is lost.
//!
//! lapin's own auto-recovery replays a channel's whole topology after a reconnect and
//! gives the channel up for good when one step fails (a quorum queue whose leader is not
//! elected yet refuses the `basic.consume` for a few seconds after a broker restart):
//! the channel then stays `Reconnecting` and its waiters wait forever. So recovery is
//! ours instead: a lost connection is replaced by a new one on first use, at most one
//! attempt at a time, and each user opens what it needs on it again (the subscription
//! its channel, QoS and consumer; the publisher its confirm channel), trying again after
//! a pause while the broker refuses.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};

/// A lost connection, reconnected on demand.
pub(crate) struct Link {
    /// With the password: never printed (`shown` is).
    url: String,
    shown: Arc<str>,
    timeout: Duration,
    current: Mutex<Arc<Connection>>,
    /// Held while a new connection is being made: one attempt at a time.
    reconnecting: tokio::sync::Mutex<()>,
    /// The last attempt that failed, and when it ended: a user that waited for it gets
    /// its error instead of trying again in turn (with the broker away, many publishes
    /// waiting would otherwise each wait a whole connect timeout, one after another).
    failed: Mutex<Option<(Instant, String)>>,
}

impl Link {
    /// Connects to `url` within `timeout`.
    pub(crate) async fn open(url: &str, timeout: Duration) -> Result<Self, LinkError> {
        let shown: Arc<str> = Arc::from(ruststream_core::redact_url(url).as_ref());
        let connection = connect(url, timeout).await?;
        Ok(Self {
            url: url.to_owned(),
            shown,
            timeout,
            current: Mutex::new(Arc::new(connection)),
            reconnecting: tokio::sync::Mutex::new(()),
            failed: Mutex::new(None),
        })
    }

    /// The broker's URL, password masked.
    pub(crate) fn shown(&self) -> &Arc<str> {
        &self.shown
    }

    /// The broker's (major, minor) version, when it can be read (see `version`).
    pub(crate) async fn server_version(&self) -> Option<(u32, u32)> {
        crate::version::server_version(&self.url, self.timeout).await
    }

    /// The connection in use, connected or not.
    pub(crate) fn current(&self) -> Arc<Connection> {
        Arc::clone(&self.current.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether the connection in use is up (readiness).
    pub(crate) fn is_up(&self) -> bool {
        self.current().status().connected()
    }

    /// A connected connection: the one in use, or a new one made now when it was lost.
    pub(crate) async fn connected(&self) -> Result<Arc<Connection>, LinkError> {
        self.connected_for(Instant::now()).await
    }

    /// [`connected`](Self::connected) for a caller waiting since `asked` (for its turn
    /// at something of its own first): an attempt that failed since then is its answer.
    pub(crate) async fn connected_for(&self, asked: Instant) -> Result<Arc<Connection>, LinkError> {
        let current = self.current();
        if current.status().connected() {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        let current = self.current();
        if current.status().connected() {
            // Another user made it while this one waited.
            return Ok(current);
        }
        let failed = || self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((ended, error)) = &*failed()
            && *ended >= asked
        {
            return Err(LinkError::Waited(error.clone()));
        }
        let fresh = match connect(&self.url, self.timeout).await {
            Ok(connection) => Arc::new(connection),
            Err(e) => {
                *failed() = Some((Instant::now(), e.to_string()));
                return Err(e);
            }
        };
        tracing::info!(url = &*self.shown, "reconnected to RabbitMQ");
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&fresh);
        Ok(fresh)
    }
}

/// Connecting failed: no answer in time, or the broker's refusal.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Refused(#[from] lapin::Error),
    /// An attempt made while this caller waited for its turn failed so.
    #[error("{0} (the attempt made while this one waited)")]
    Waited(String),
}

async fn connect(url: &str, timeout: Duration) -> Result<Connection, LinkError> {
    // No auto-recovery: see the module's documentation.
    let connecting = Connection::connect(url, ConnectionProperties::default());
    tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| LinkError::Timeout(timeout))?
        .map_err(LinkError::Refused)
}
