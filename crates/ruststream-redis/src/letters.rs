//! A dead-letter stream read back: `XRANGE` from the oldest, `XDEL` once replayed.

use redis::aio::ConnectionManager;
use ruststream_core::{BoxFuture, Letter, LetterBox};

use crate::entry::entries;

/// The dead letters in one stream.
pub(crate) struct RedisLetters {
    pub(crate) connection: ConnectionManager,
    pub(crate) stream: String,
}

impl LetterBox for RedisLetters {
    fn peek(&mut self, limit: usize) -> BoxFuture<'_, Result<Vec<Letter>, String>> {
        Box::pin(async move {
            let reply: redis::Value = redis::cmd("XRANGE")
                .arg(&self.stream)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(limit)
                .query_async(&mut self.connection)
                .await
                .map_err(|e| format!("XRANGE {}: {e}", self.stream))?;
            Ok(entries(reply, |_| 0)
                .into_iter()
                .map(|entry| {
                    let id = entry.id.to_string();
                    let (payload, headers, _) = entry.split();
                    Letter {
                        id,
                        key: None,
                        headers,
                        payload,
                    }
                })
                .collect())
        })
    }

    fn remove<'a>(&'a mut self, letter: &'a Letter) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            redis::cmd("XDEL")
                .arg(&self.stream)
                .arg(&letter.id)
                .query_async::<u64>(&mut self.connection)
                .await
                .map(drop)
                .map_err(|e| format!("XDEL {} {}: {e}", self.stream, letter.id))
        })
    }
}
