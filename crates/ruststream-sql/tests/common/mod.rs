//! What the tests share: PostgreSQL (the one the test command starts) and unique names.

#![allow(dead_code)]

use std::time::Duration;

use ruststream_sql::migrate;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

fn server() -> String {
    std::env::var("RUSTSTREAM_POSTGRES_URL").expect(
        "RUSTSTREAM_POSTGRES_URL is not set: run the tests with scripts/test, which starts PostgreSQL",
    )
}

async fn connect(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e}"))
}

/// The shared database, migrated.
pub(crate) async fn pool() -> PgPool {
    let pool = connect(&server()).await;
    migrate(&pool).await.expect("migrate");
    pool
}

/// A database of the test's own, migrated: a relay serves every row of its database, so
/// tests running at once must not share one.
pub(crate) async fn own_database() -> PgPool {
    let server = server();
    let admin = connect(&server).await;
    let name = unique("db").replace('-', "_");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("a database of its own");
    let base = server
        .rsplit_once('/')
        .map_or(server.as_str(), |(base, _)| base);
    let pool = connect(&format!("{base}/{name}")).await;
    migrate(&pool).await.expect("migrate");
    pool
}

/// A name no other test (or earlier run) uses.
pub(crate) fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{name}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000_000
    )
}
