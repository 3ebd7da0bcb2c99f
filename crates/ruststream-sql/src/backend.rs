//! The databases the inbox runs on: PostgreSQL (everything) and SQLite (the inbox only:
//! an embedded database for the quick start and tests).

use std::time::Duration;

use ruststream::core::BoxFuture;
use sqlx::{Pool, Postgres, Sqlite, Transaction};

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::Postgres {}
    impl Sealed for sqlx::Sqlite {}
}

/// A database the inbox runs on: [`Postgres`] or [`Sqlite`]. Sealed; its methods are the
/// crate's own.
pub trait Backend: sqlx::Database + sealed::Sealed {
    /// Records `id` for `registration` in `tx`; `false` when it was there already.
    #[doc(hidden)]
    fn record<'a>(
        tx: &'a mut Transaction<'static, Self>,
        registration: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    /// Deletes the ids recorded more than `horizon` ago; how many.
    #[doc(hidden)]
    fn prune(pool: &Pool<Self>, horizon: Duration) -> BoxFuture<'_, Result<u64, sqlx::Error>>;
}

const RECORD: &str = "INSERT INTO ruststream_inbox (registration, message_id) VALUES ($1, $2) \
                      ON CONFLICT DO NOTHING";

/// The same statements on both databases but for pruning, whose time arithmetic differs;
/// written once for each concrete database (sqlx's generic bounds do not hold across an
/// await in a `Send` future).
macro_rules! backend {
    ($database:ty, $prune:expr) => {
        impl Backend for $database {
            fn record<'a>(
                tx: &'a mut Transaction<'static, Self>,
                registration: &'a str,
                id: &'a str,
            ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
                Box::pin(async move {
                    let done = sqlx::query(RECORD)
                        .bind(registration)
                        .bind(id)
                        .execute(&mut **tx)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            }

            fn prune(
                pool: &Pool<Self>,
                horizon: Duration,
            ) -> BoxFuture<'_, Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    let deleted = sqlx::query($prune)
                        .bind(horizon.as_secs_f64())
                        .execute(pool)
                        .await?;
                    Ok(deleted.rows_affected())
                })
            }
        }
    };
}

backend!(
    Postgres,
    "DELETE FROM ruststream_inbox WHERE received_at < now() - make_interval(secs => $1)"
);
// `received_at` is seconds since the Unix epoch there (SQLITE_SCHEMA).
backend!(
    Sqlite,
    "DELETE FROM ruststream_inbox WHERE received_at < unixepoch('subsec') - $1"
);
