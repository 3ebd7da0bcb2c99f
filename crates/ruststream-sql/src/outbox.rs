//! The outbox: messages written as rows in the caller's transaction, and the relay that
//! publishes the committed ones, in order per key, marking each sent only once the broker
//! confirmed it.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ruststream::core::{Headers, MESSAGE_ID_HEADER, Outgoing};
use ruststream::ops::{Reading, Watch};
use ruststream::{Json, Publisher};
use serde::Serialize;
use sqlx::postgres::{PgConnection, PgListener};
use sqlx::{PgPool, Row};

/// How many buckets keys are hashed into. A relay serves a bucket alone (an advisory
/// lock held while it publishes the bucket's rows), so a key's rows go out in order while
/// several relays share the table.
pub const BUCKETS: i32 = 16;

/// How long a relay waits for one row's confirmation unless told otherwise.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// How old the oldest unsent row may be before the relay's [watch](Relay::watch) reports
/// the service not ready, unless told otherwise.
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(60);

/// The advisory-lock namespace of the buckets.
const LOCK_SPACE: i32 = 7_274_618;

/// The channel a write notifies relays on.
const CHANNEL: &str = "ruststream_outbox";

/// A message on its way into the outbox: [`Outbox::to`], then a key and headers as the
/// publisher takes them, then [`send`](Self::send) in the caller's transaction.
#[derive(Debug)]
#[must_use = "nothing is written until `send` or `send_bytes` is awaited"]
pub struct OutboxMessage {
    message: Outgoing,
}

/// Writes messages in the caller's database transaction: they are published by a
/// [`Relay`] once (and only if) that transaction commits.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
/// use ruststream_sql::Outbox;
///
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 7").execute(&mut *tx).await?;
/// Outbox::to("payments").key("7").send(&mut *tx, &serde_json::json!({"order": 7})).await?;
/// tx.commit().await?; // the row and the message, together or neither
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Outbox;

impl Outbox {
    /// Starts a message to `address`.
    pub fn to(address: impl AsRef<str>) -> OutboxMessage {
        OutboxMessage {
            message: Outgoing::new(address.as_ref(), Bytes::new()),
        }
    }

    /// The unsent rows: how many, and how long the oldest has waited (outbox lag).
    pub async fn lag(pool: &PgPool) -> Result<(i64, Duration), sqlx::Error> {
        let row = sqlx::query(
            "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 \
             FROM ruststream_outbox WHERE sent_at IS NULL",
        )
        .fetch_one(pool)
        .await?;
        let seconds: f64 = row.try_get(1)?;
        Ok((row.try_get(0)?, Duration::from_secs_f64(seconds.max(0.0))))
    }
}

impl OutboxMessage {
    /// Sets the key: a key's messages are published in the order they were written.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.message.key = Some(key.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.message.headers.append(name, value);
        self
    }

    /// Encodes `value` as JSON and writes it; returns its id (`x-ruststream-id`).
    pub async fn send<T: Serialize + ?Sized>(
        self,
        conn: &mut PgConnection,
        value: &T,
    ) -> Result<String, sqlx::Error> {
        use ruststream::Codec;
        let payload = Json::encode(value).map_err(sqlx::Error::Encode)?;
        self.send_bytes(conn, payload).await
    }

    /// Writes `payload` as it is; returns its id (`x-ruststream-id`).
    pub async fn send_bytes(
        mut self,
        conn: &mut PgConnection,
        payload: impl Into<Bytes>,
    ) -> Result<String, sqlx::Error> {
        self.message.payload = payload.into();
        write(conn, &self.message).await
    }
}

/// The row of `message`, and a notification relays receive at commit.
async fn write(conn: &mut PgConnection, message: &Outgoing) -> Result<String, sqlx::Error> {
    let (names, values): (Vec<String>, Vec<Vec<u8>>) = message
        .headers
        .iter()
        .map(|(n, v)| (n.to_owned(), v.to_vec()))
        .unzip();
    let row = sqlx::query(
        "INSERT INTO ruststream_outbox (address, key, header_names, header_values, payload, bucket) \
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id::text",
    )
    .bind(&*message.address)
    .bind(message.key.as_deref())
    .bind(names)
    .bind(values)
    .bind(message.payload.as_ref())
    .bind(bucket(message.key.as_deref()))
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(&mut *conn)
        .await?;
    row.try_get(0)
}

/// A key's bucket (FNV-1a, stable across processes and versions); a keyless message's
/// is any.
fn bucket(key: Option<&[u8]>) -> i32 {
    let hash = match key {
        Some(key) => key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        }),
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos())),
    };
    i32::try_from(hash % BUCKETS as u64).unwrap_or(0)
}

/// Publishes committed outbox rows through `publisher`, bucket by bucket, each row only
/// after the previous of its bucket was confirmed, and marks a row sent only once the
/// broker confirmed it. A row whose publish fails stays, and its bucket waits for the
/// next round (so its key keeps its order). It wakes on the writers' notifications and
/// polls as a fallback. A row is published only once every transaction that could still
/// write an earlier row has ended, so rows of a key go out in the order they were
/// written even when their transactions commit out of order.
///
/// At least once: a relay that dies after a publish and before marking the row sends it
/// again; the message carries its `x-ruststream-id`, which an [`Inbox`](crate::Inbox)
/// skips the second time.
#[derive(Debug, Clone)]
pub struct Relay {
    pool: PgPool,
    publisher: Publisher,
    poll: Duration,
    batch: i64,
    publish_timeout: Duration,
    max_lag: Duration,
    /// The outbox as the last round left it, for the watch.
    measured: Arc<Mutex<Option<Measured>>>,
}

/// The unsent rows after a round.
#[derive(Debug, Clone, Copy)]
struct Measured {
    unsent: i64,
    oldest: Duration,
    at: Instant,
}

impl Relay {
    /// A relay publishing `pool`'s outbox rows through `publisher`.
    pub fn new(pool: PgPool, publisher: Publisher) -> Self {
        Self {
            pool,
            publisher,
            poll: Duration::from_secs(1),
            batch: 500,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            max_lag: DEFAULT_MAX_LAG,
            measured: Arc::default(),
        }
    }

    /// How long the oldest unsent row may wait, and a round take, before the relay's
    /// [watch](Self::watch) reports the service not ready (default [`DEFAULT_MAX_LAG`],
    /// 60 s).
    pub fn max_lag(mut self, lag: Duration) -> Self {
        self.max_lag = lag;
        self
    }

    /// The outbox lag for the ops endpoint, measured after each of this relay's rounds:
    /// `ruststream_outbox_unsent` (rows) and `ruststream_outbox_oldest_unsent_seconds`,
    /// and not ready while the oldest unsent row waited longer than
    /// [`max_lag`](Self::max_lag), or no round finished for that long (a relay stuck or
    /// not running). Add it with `App::new().watch(relay.watch())`.
    pub fn watch(&self) -> Arc<dyn Watch> {
        Arc::new(LagWatch {
            measured: Arc::clone(&self.measured),
            max_lag: self.max_lag,
            since: Instant::now(),
        })
    }

    /// How often it looks without a notification (default 1 s).
    pub fn poll_every(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How long one row's confirmation is waited for (default
    /// [`DEFAULT_PUBLISH_TIMEOUT`], 30 s); past it the row counts as refused: it stays,
    /// and its bucket waits for the next round, so a broker that never answers holds no
    /// lock or transaction for ever.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Runs until `stop` completes (a row being published is finished first).
    pub async fn run(self, stop: impl Future<Output = ()> + Send) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        let mut stop = std::pin::pin!(stop);
        let mut complaints = Complaints::default();
        loop {
            let start = bucket(None);
            let mut trouble = None;
            for i in 0..BUCKETS {
                match self.serve((start + i) % BUCKETS).await {
                    Ok(None) => {}
                    Ok(Some(refused)) => trouble = Some(refused),
                    Err(e) => {
                        trouble = Some(format!("the database: {e}"));
                        break;
                    }
                }
            }
            self.measure().await;
            let Some(trouble) = trouble else {
                complaints.over();
                tokio::select! {
                    () = &mut stop => return Ok(()),
                    heard = listener.recv() => {
                        // The database away: wait a poll before asking again, not spin.
                        if heard.is_err() {
                            tokio::time::sleep(self.poll).await;
                        }
                    }
                    () = tokio::time::sleep(self.poll) => {}
                }
                continue;
            };
            // A broker or database away: the next round after a poll, whatever the
            // writers notify meanwhile (they would start one at every write).
            complaints.complain(&trouble);
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(self.poll) => {}
            }
        }
    }

    /// Records the outbox lag for the watch.
    async fn measure(&self) {
        match Outbox::lag(&self.pool).await {
            Ok((unsent, oldest)) => {
                let now = Measured {
                    unsent,
                    oldest,
                    at: Instant::now(),
                };
                *self.measured.lock().unwrap_or_else(PoisonError::into_inner) = Some(now);
            }
            Err(e) => tracing::debug!(error = %e, "outbox relay: the lag could not be measured"),
        }
    }

    /// Publishes what `bucket` holds, if no other relay serves it now; why a row was not
    /// published, if one was not (the bucket then waits for the next round).
    async fn serve(&self, bucket: i32) -> Result<Option<String>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
            .bind(LOCK_SPACE)
            .bind(bucket)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            return Ok(None);
        }
        let rows = sqlx::query(
            "SELECT seq, id::text, address, key, header_names, header_values, payload \
             FROM ruststream_outbox \
             WHERE bucket = $1 AND sent_at IS NULL \
               AND writer < pg_snapshot_xmin(pg_current_snapshot()) \
             ORDER BY seq LIMIT $2",
        )
        .bind(bucket)
        .bind(self.batch)
        .fetch_all(&mut *tx)
        .await?;
        let mut refused = None;
        for row in rows {
            let seq: i64 = row.try_get(0)?;
            let message = outgoing(&row)?;
            let published =
                tokio::time::timeout(self.publish_timeout, self.publisher.publish(message));
            let error = match published.await {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error.to_string()),
                Err(_) => Some(format!("no confirmation within {:?}", self.publish_timeout)),
            };
            if let Some(error) = error {
                refused = Some(format!("row {seq} was not published: {error}"));
                break;
            }
            sqlx::query("UPDATE ruststream_outbox SET sent_at = now() WHERE seq = $1")
                .bind(seq)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(refused)
    }
}

/// What a relay says while rounds fail: the first failure of a run at WARN, then at most
/// one a minute with how many went to DEBUG meanwhile, and an INFO when a round works
/// again.
#[derive(Debug, Default)]
struct Complaints {
    /// When the last WARN was written, while rounds fail.
    logged: Option<Instant>,
    quiet: u64,
}

/// How often a relay whose rounds keep failing says so at WARN.
const COMPLAIN_EVERY: Duration = Duration::from_secs(60);

impl Complaints {
    fn complain(&mut self, trouble: &str) {
        if self.logged.is_some_and(|at| at.elapsed() < COMPLAIN_EVERY) {
            self.quiet += 1;
            tracing::debug!(%trouble, "outbox relay: a round failed; trying again after a poll");
            return;
        }
        tracing::warn!(%trouble, since_last_logged = self.quiet, "outbox relay: a round failed; its rows wait, trying again after each poll");
        self.logged = Some(Instant::now());
        self.quiet = 0;
    }

    fn over(&mut self) {
        if self.logged.take().is_some() {
            tracing::info!(
                since_last_logged = self.quiet,
                "outbox relay: a round went through again"
            );
            self.quiet = 0;
        }
    }
}

/// A relay's lag as the ops endpoint shows it.
struct LagWatch {
    measured: Arc<Mutex<Option<Measured>>>,
    max_lag: Duration,
    since: Instant,
}

impl LagWatch {
    fn measured(&self) -> Option<Measured> {
        *self.measured.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Watch for LagWatch {
    fn readings(&self) -> Vec<Reading> {
        let Some(m) = self.measured() else {
            return Vec::new();
        };
        vec![
            Reading::gauge(
                "ruststream_outbox_unsent",
                "outbox rows not yet published",
                m.unsent as f64,
            ),
            Reading::gauge(
                "ruststream_outbox_oldest_unsent_seconds",
                "how long the oldest unsent outbox row has waited, at the relay's last round",
                m.oldest.as_secs_f64(),
            ),
        ]
    }

    fn not_ready(&self) -> Option<String> {
        let max = self.max_lag;
        match self.measured() {
            None if self.since.elapsed() > max => Some(format!(
                "outbox relay: no round finished in {:.0?} (is it running?)",
                self.since.elapsed()
            )),
            None => None,
            Some(m) if m.at.elapsed() > max => Some(format!(
                "outbox relay: its last round finished {:.0?} ago (over {max:?})",
                m.at.elapsed()
            )),
            Some(m) if m.oldest > max => Some(format!(
                "outbox lag: {} rows unsent, the oldest for {:.0?} (over {max:?})",
                m.unsent, m.oldest
            )),
            Some(_) => None,
        }
    }
}

/// The message a row holds, with its id as `x-ruststream-id`.
fn outgoing(row: &sqlx::postgres::PgRow) -> Result<Outgoing, sqlx::Error> {
    let id: String = row.try_get(1)?;
    let address: String = row.try_get(2)?;
    let key: Option<Vec<u8>> = row.try_get(3)?;
    let names: Vec<String> = row.try_get(4)?;
    let values: Vec<Vec<u8>> = row.try_get(5)?;
    let payload: Vec<u8> = row.try_get(6)?;
    let mut headers = Headers::new();
    for (name, value) in names.into_iter().zip(values) {
        headers.append(name, value);
    }
    headers.insert(MESSAGE_ID_HEADER, id);
    let mut message = Outgoing::new(address, payload);
    message.key = key.map(Bytes::from);
    message.headers = headers;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::{BUCKETS, bucket};

    #[test]
    fn a_key_always_lands_in_the_same_bucket() {
        let first = bucket(Some(b"order-7"));
        assert!((0..BUCKETS).contains(&first));
        for _ in 0..10 {
            assert_eq!(bucket(Some(b"order-7")), first);
        }
        let spread: std::collections::BTreeSet<i32> = (0..200)
            .map(|i| bucket(Some(format!("k{i}").as_bytes())))
            .collect();
        assert!(spread.len() > BUCKETS as usize / 2, "{spread:?}");
    }
}
