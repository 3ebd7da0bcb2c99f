//! Adding entries to a stream: `XADD`, confirmed by Redis's reply (with the server's
//! `appendfsync always`, on disk).

use std::sync::Arc;

use redis::aio::ConnectionManager;
use ruststream_core::{
    AddressNames, BoxFuture, Headers, Outgoing, Publish, PublishError, PublishErrorKind,
};

/// The field an entry's payload is written to and read from; every other field is a
/// header.
pub const PAYLOAD_FIELD: &str = "payload";

/// Adds entries to streams by name. Cheap to clone.
#[derive(Clone)]
pub struct RedisPublisher {
    connection: ConnectionManager,
    /// The URL as it may be shown (credentials masked).
    shown: Arc<str>,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisPublisher")
    }
}

impl RedisPublisher {
    pub(crate) fn new(connection: ConnectionManager, shown: Arc<str>) -> Self {
        Self { connection, shown }
    }

    /// Adds `payload` with `headers` to `stream` (`XADD stream * payload … name value …`)
    /// and returns the entry's id once Redis confirmed it. A header named `payload` is
    /// refused (it would be read back as the message).
    pub async fn send(
        &self,
        stream: &str,
        headers: &Headers,
        payload: &[u8],
    ) -> Result<String, PublishError> {
        let command = xadd(stream, headers, payload)?;
        let mut connection = self.connection.clone();
        command
            .query_async::<String>(&mut connection)
            .await
            .map_err(|e| PublishError::new(stream, kind(&e), e))
    }
}

/// What a failed command means for a publish.
pub(crate) fn kind(error: &redis::RedisError) -> PublishErrorKind {
    if error.is_timeout() {
        PublishErrorKind::Timeout
    } else if error.is_connection_dropped() || error.is_io_error() {
        PublishErrorKind::Disconnected
    } else if error.code() == Some("OOM") {
        PublishErrorKind::Full
    } else if error.code() == Some("NOPERM") {
        PublishErrorKind::NotAuthorized
    } else {
        PublishErrorKind::Rejected
    }
}

impl Publish for RedisPublisher {
    fn describe(&self) -> ruststream_core::Described {
        ruststream_core::Described::new("redis", &self.shown)
    }

    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            self.send(&message.address, &message.headers, &message.payload)
                .await
                .map(drop)
        })
    }

    /// One pipeline of `XADD`s: one write, one read of all the replies, a result each
    /// (a failed command fails its own message only; a lost connection, every message of
    /// the pipeline, some of which Redis may have added).
    fn publish_all<'a>(
        &'a self,
        messages: Box<dyn Iterator<Item = Outgoing> + Send + 'a>,
    ) -> BoxFuture<'a, Vec<Result<(), PublishError>>> {
        Box::pin(async move {
            let mut results: Vec<Result<(), PublishError>> =
                Vec::with_capacity(messages.size_hint().0);
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let mut names = AddressNames::default();
            let mut sent = Vec::with_capacity(messages.size_hint().0);
            for message in messages {
                match xadd(&message.address, &message.headers, &message.payload) {
                    Ok(command) => {
                        pipe.add_command(command);
                        sent.push((results.len(), names.get(&message.address)));
                        results.push(Ok(()));
                    }
                    Err(refused) => results.push(Err(refused)),
                }
            }
            if sent.is_empty() {
                return results;
            }
            let mut connection = self.connection.clone();
            match pipe
                .query_async::<Vec<redis::RedisResult<String>>>(&mut connection)
                .await
            {
                Ok(replies) => {
                    for ((i, address), reply) in sent.into_iter().zip(replies) {
                        if let Err(e) = reply {
                            results[i] = Err(PublishError::new(&*address, kind(&e), e));
                        }
                    }
                }
                Err(e) => {
                    for (i, address) in sent {
                        results[i] = Err(PublishError::new(&*address, kind(&e), e.to_string()));
                    }
                }
            }
            results
        })
    }
}

/// The `XADD` of one entry; a header named like the payload field is refused, and so is
/// an empty stream name (Redis would take it as a key; a registration cannot read one).
fn xadd(stream: &str, headers: &Headers, payload: &[u8]) -> Result<redis::Cmd, PublishError> {
    if stream.is_empty() {
        return Err(PublishError::new(
            stream,
            PublishErrorKind::Rejected,
            "the stream name is empty",
        ));
    }
    let mut command = redis::cmd("XADD");
    command.arg(stream).arg("*").arg(PAYLOAD_FIELD).arg(payload);
    for (name, value) in headers.iter() {
        if name == PAYLOAD_FIELD {
            return Err(PublishError::new(
                stream,
                PublishErrorKind::Encode,
                format!("a header named `{PAYLOAD_FIELD}` would be read back as the payload"),
            ));
        }
        command.arg(name).arg(value.as_ref());
    }
    Ok(command)
}
