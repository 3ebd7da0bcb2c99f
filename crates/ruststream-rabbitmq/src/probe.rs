//! What a queue's arguments say, read at start: its kind (`x-queue-type`) against the one
//! the descriptor names (R6), and a quorum queue's own delivery limit (`x-delivery-limit`)
//! against the registration's cap: a limit at or below `max_attempts` would have the
//! broker drop (or dead-letter on its own) a message before the runtime's last attempt
//! and dead letter (R5).
//!
//! A passive declare tells nothing of a queue's arguments, so they are read from the
//! broker's refusal of a redeclare on a throwaway channel: it names the first argument
//! that differs and the queue's own value ("… but current is '5'").

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use ruststream_core::{Declaration, SubscribeError};

use crate::QueueKind;

/// A limit no queue has: what the redeclare offers so the broker names the real one.
const PROBE: i64 = 987_654_321;

/// What the probe learnt of the queue's delivery limit.
#[derive(Debug, PartialEq, Eq)]
enum Limit {
    /// The queue sets none.
    Unset,
    Set(i64),
    /// The broker named another argument first, or did not answer as expected.
    Unknown(String),
}

/// Refuses the start when the quorum queue's delivery limit would cut the registration's
/// attempts short; warns when it cannot tell, or when an uncapped `retry()` meets one.
pub(crate) async fn check_delivery_limit(
    connection: &lapin::Connection,
    queue: &str,
    declaration: &Declaration,
    version: Option<(u32, u32)>,
) -> Result<(), SubscribeError> {
    match (probe(connection, queue).await, declaration.max_attempts) {
        // RabbitMQ 4.0 and later give a queue without the argument a limit of 20, unless
        // a policy sets another, which no probe sees: said, not refused.
        (Limit::Unset, max) if version.is_some_and(|(major, _)| major >= 4) => {
            if max.is_none_or(|max| max >= 20) {
                tracing::warn!(
                    address = queue,
                    max_attempts = max,
                    "the quorum queue has no x-delivery-limit, so RabbitMQ 4 drops a message after 20 returns unless a policy says otherwise: set x-delivery-limit above max_attempts (-1 for none)"
                );
            }
            Ok(())
        }
        (Limit::Set(limit), Some(max)) if limit >= 0 && limit <= i64::from(max) => {
            Err(SubscribeError::new(
                queue,
                format!(
                    "the quorum queue's x-delivery-limit is {limit}, at or below max_attempts({max}): \
                     the broker would drop (or dead-letter itself) a message before its last \
                     attempt and the runtime's dead letter; raise the limit above {max} or lower \
                     max_attempts"
                ),
            ))
        }
        (Limit::Set(limit), None) if limit >= 0 => {
            tracing::warn!(
                address = queue,
                limit,
                "the quorum queue's x-delivery-limit cuts an uncapped retry() short: the broker drops a message after that many returns"
            );
            Ok(())
        }
        (Limit::Unknown(why), _) => {
            tracing::warn!(address = queue, %why, "the quorum queue's x-delivery-limit could not be read; make sure it is above max_attempts (RabbitMQ 4.0 and later set 20 by default)");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Refuses the start when the queue, which the service does not declare, is of another
/// kind than the descriptor names: a quorum queue read as classic would count attempts
/// twice, a classic one read as quorum not at all.
pub(crate) async fn check_kind(
    connection: &lapin::Connection,
    queue: &str,
    kind: QueueKind,
) -> Result<(), SubscribeError> {
    let named = kind_name(kind);
    let refusal = match redeclare(connection, queue, named, None).await {
        Ok(()) => return Ok(()),
        Err(text) => text,
    };
    if !refusal.contains("'x-queue-type'") {
        tracing::warn!(address = queue, why = %refusal, "the queue's kind could not be read");
        return Ok(());
    }
    let current = refusal
        .split_once("current is ")
        .map_or("another kind", |(_, current)| current);
    Err(SubscribeError::new(
        queue,
        format!(
            "the queue is not a {named} queue as the descriptor says (x-queue-type: current is \
             {current}): set `.kind(..)` to the queue's kind"
        ),
    ))
}

fn kind_name(kind: QueueKind) -> &'static str {
    match kind {
        QueueKind::Classic => "classic",
        QueueKind::Quorum => "quorum",
    }
}

/// Redeclares `queue` (durable, of kind `named`, with `limit` when given) on a channel of
/// its own: `Err` with the broker's refusal when an argument differs.
async fn redeclare(
    connection: &lapin::Connection,
    queue: &str,
    named: &str,
    limit: Option<i64>,
) -> Result<(), String> {
    tracing::info!(
        address = queue,
        "reading the queue's arguments: a refusal of this redeclare (406 PRECONDITION_FAILED on a throwaway channel) is expected, and lapin logs it"
    );
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from(named)),
    );
    if let Some(limit) = limit {
        arguments.insert(
            ShortString::from("x-delivery-limit"),
            AMQPValue::LongLongInt(limit),
        );
    }
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    // A refusal closes the channel.
    channel
        .queue_declare(ShortString::from(queue), options, arguments)
        .await
        .map_err(|e| e.to_string())?;
    let _ = channel.close(200, ShortString::from("probed")).await;
    Ok(())
}

async fn probe(connection: &lapin::Connection, queue: &str) -> Limit {
    match redeclare(connection, queue, "quorum", Some(PROBE)).await {
        Ok(()) => Limit::Unknown(
            "the broker took the redeclare without comparing x-delivery-limit".to_owned(),
        ),
        Err(text) => read_refusal(&text),
    }
}

/// The queue's limit from the broker's `PRECONDITION_FAILED` text.
fn read_refusal(text: &str) -> Limit {
    if !text.contains("'x-delivery-limit'") {
        return Limit::Unknown(text.to_owned());
    }
    let Some((_, current)) = text.split_once("current is ") else {
        return Limit::Unknown(text.to_owned());
    };
    if current.starts_with("none") {
        return Limit::Unset;
    }
    // 3.10 says `current is '5'`; other versions `current is the value '5' of type …`.
    let current = current.strip_prefix("the value ").unwrap_or(current);
    current
        .strip_prefix('\'')
        .and_then(|rest| rest.split('\'').next())
        .and_then(|value| value.parse().ok())
        .map_or_else(|| Limit::Unknown(text.to_owned()), Limit::Set)
}

#[cfg(test)]
mod tests {
    use super::{Limit, read_refusal};

    #[test]
    fn r5_the_limit_is_read_from_the_brokers_refusal() {
        let set = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in \
                   vhost '/': received the value '987654321' of type 'long' but current is the \
                   value '5' of type 'long'";
        assert_eq!(read_refusal(set), Limit::Set(5));
        let set_310 = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' \
                       in vhost '/': received '987654321' but current is '3'";
        assert_eq!(read_refusal(set_310), Limit::Set(3));
        let unset = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in \
                     vhost '/': received the value '987654321' of type 'long' but current is none";
        assert_eq!(read_refusal(unset), Limit::Unset);
        let other = "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q'";
        assert!(matches!(read_refusal(other), Limit::Unknown(_)));
    }
}
