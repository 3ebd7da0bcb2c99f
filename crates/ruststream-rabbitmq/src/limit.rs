//! A quorum queue's own delivery limit (`x-delivery-limit`) against the registration's
//! cap: a limit at or below `max_attempts` would have the broker drop (or dead-letter on
//! its own) a message before the runtime's last attempt and dead letter (R5).
//!
//! A passive declare tells nothing of a queue's arguments, so the limit is read from the
//! broker's refusal of a redeclare on a throwaway channel: it names the first argument
//! that differs and the queue's own value ("… but current is the value '5' …").

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use ruststream_core::{Declaration, SubscribeError};

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
) -> Result<(), SubscribeError> {
    match (probe(connection, queue).await, declaration.max_attempts) {
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

async fn probe(connection: &lapin::Connection, queue: &str) -> Limit {
    tracing::info!(
        address = queue,
        "reading the quorum queue's x-delivery-limit: the broker's refusal of the probe (406 PRECONDITION_FAILED on a throwaway channel) is expected, lapin logs it"
    );
    let channel = match connection.create_channel().await {
        Ok(channel) => channel,
        Err(e) => return Limit::Unknown(e.to_string()),
    };
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    arguments.insert(
        ShortString::from("x-delivery-limit"),
        AMQPValue::LongLongInt(PROBE),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let answer = channel
        .queue_declare(ShortString::from(queue), options, arguments)
        .await;
    match answer {
        Ok(_) => {
            let _ = channel.close(200, ShortString::from("probed")).await;
            Limit::Unknown(
                "the broker took the redeclare without comparing x-delivery-limit".to_owned(),
            )
        }
        // The refusal closed the channel.
        Err(e) => read_refusal(&e.to_string()),
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
