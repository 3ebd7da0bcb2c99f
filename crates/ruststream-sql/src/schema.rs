//! The tables, created by [`migrate`](crate::migrate) (or by your own migrations: the SQL
//! is [`SCHEMA`]).

use sqlx::{PgPool, SqlitePool};

/// The SQL that creates the inbox and outbox tables and their indexes; idempotent.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS ruststream_inbox (
    registration text        NOT NULL,
    message_id   text        NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (registration, message_id)
);
CREATE INDEX IF NOT EXISTS ruststream_inbox_received ON ruststream_inbox (received_at);
CREATE TABLE IF NOT EXISTS ruststream_outbox (
    seq           bigserial   PRIMARY KEY,
    id            uuid        NOT NULL DEFAULT gen_random_uuid(),
    address       text        NOT NULL,
    key           bytea,
    header_names  text[]      NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    payload       bytea       NOT NULL,
    bucket        integer     NOT NULL,
    writer        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz
);
CREATE INDEX IF NOT EXISTS ruststream_outbox_unsent
    ON ruststream_outbox (bucket, seq) WHERE sent_at IS NULL;
"#;

/// The SQL that creates the inbox table on SQLite (the outbox is PostgreSQL's only);
/// idempotent. `received_at` is seconds since the Unix epoch.
pub const SQLITE_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS ruststream_inbox (
    registration text NOT NULL,
    message_id   text NOT NULL,
    received_at  real NOT NULL DEFAULT (unixepoch('subsec')),
    PRIMARY KEY (registration, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ruststream_inbox_received ON ruststream_inbox (received_at);
"#;

/// Creates the inbox table on SQLite when missing ([`SQLITE_SCHEMA`]; the outbox is
/// PostgreSQL's only).
pub async fn migrate_sqlite(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(SQLITE_SCHEMA).execute(pool).await?;
    Ok(())
}

/// Creates the tables when missing (safe to run at every start, by several processes).
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    // One migration at a time: CREATE ... IF NOT EXISTS races with itself.
    sqlx::query("SELECT pg_advisory_xact_lock(7274617)")
        .execute(&mut *tx)
        .await?;
    // "already exists, skipping" is no news at every start.
    sqlx::query("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
    tx.commit().await
}
