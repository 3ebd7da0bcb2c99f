//! Effectively-once side effects for ruststream services on PostgreSQL.
//!
//! Every broker here delivers at least once, so a handler that writes to a database may
//! see a message twice (after a crash, a rebalance, a lost acknowledgement), and a
//! service that writes to its database and then publishes loses or invents events when
//! it dies between the two. This crate closes both gaps with the database's own
//! transactions:
//!
//! - [`Inbox`]: a layer that records each message's id in the handler's transaction, so a
//!   message seen before is skipped, and commits before the broker settlement.
//! - [`Outbox`]: publishing inside a transaction writes a row; a [`Relay`] publishes the
//!   committed rows, in order per key, and marks them sent once the broker confirmed.
//!
//! Queries are checked at run time: building needs no database. [`migrate`] creates the
//! tables ([`SCHEMA`] is their SQL, for your own migrations). See the guide's
//! "Effectively once with a database".

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod backend;
mod batch;
mod inbox;
mod outbox;
mod schema;

pub use backend::Backend;
pub use batch::{BatchInbox, BatchTx};
pub use inbox::{DEFAULT_HORIZON, Inbox, InboxService, Tx, TxGuard};
pub use outbox::{BUCKETS, DEFAULT_MAX_LAG, DEFAULT_PUBLISH_TIMEOUT, Outbox, OutboxMessage, Relay};
pub use schema::{SCHEMA, SQLITE_SCHEMA, migrate, migrate_sqlite};
pub use sqlx;
