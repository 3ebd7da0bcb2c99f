//! Dead letters read back from their address, for a service's `dead-letters` commands
//! (list, show, replay).

use bytes::Bytes;

use crate::headers::Headers;
use crate::publish::BoxFuture;

/// A dead letter as read back: the broker's id for it and the message as stored.
#[derive(Debug, Clone)]
pub struct Letter {
    /// The broker's id: Kafka `partition@offset`, the JetStream stream sequence, the
    /// Redis entry id, the Pulsar message id, RabbitMQ the order it was read in.
    pub id: String,
    /// The key, where the broker keeps one.
    pub key: Option<Bytes>,
    /// The headers: the original's and the `x-ruststream-dead-letter-*` ones.
    pub headers: Headers,
    /// The payload, unchanged.
    pub payload: Bytes,
}

/// The dead letters at one address ([`Descriptor::dead_letters`]), read from the oldest.
/// A letter is removed only by [`remove`](Self::remove), after its replay was
/// confirmed; whatever was read and not removed stays (a process killed midway leaves
/// it there).
///
/// [`Descriptor::dead_letters`]: crate::Descriptor::dead_letters
pub trait LetterBox: Send {
    /// Up to `limit` letters, oldest first, none removed. Called once per box.
    fn peek(&mut self, limit: usize) -> BoxFuture<'_, Result<Vec<Letter>, String>>;

    /// Removes `letter`, one [`peek`](Self::peek) returned, in the order returned.
    fn remove<'a>(&'a mut self, letter: &'a Letter) -> BoxFuture<'a, Result<(), String>>;

    /// Ends the reading: every removal sent to the broker before this returns (a
    /// process that exits right after a removal must not lose it), the rest let go.
    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Why `--where` (replaying some letters and not others) cannot be honoured here, if
    /// it cannot: a Kafka topic removes by moving an offset past every earlier record.
    fn selective(&self) -> Result<(), String> {
        Ok(())
    }
}
