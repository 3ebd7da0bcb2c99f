//! Publishing retry copies and dead letters, confirmed before the original settles.

use std::time::Duration;

use ruststream_core::{
    Capabilities, Copy, CopyTarget, Declaration, Delivery, Outgoing, Publish, PublishError,
    PublishErrorKind, RETRY_COUNT_HEADER, Settle, Verb,
};

/// How often a copy is tried before the original is given back instead.
const TRIES: u32 = 3;

/// Builds the copy the plan asks for.
pub(crate) fn outgoing(
    delivery: &Delivery,
    copy: &Copy,
    declaration: &Declaration,
) -> Result<Outgoing, PublishError> {
    let missing = |what: &str| {
        PublishError::new(
            delivery.address(),
            PublishErrorKind::Rejected,
            format!("the registration declares no {what} address"),
        )
    };
    let (address, headers) = match copy.target {
        CopyTarget::DeadLetter => {
            let address = declaration
                .dead_letter
                .as_deref()
                .ok_or_else(|| missing("dead-letter"))?;
            // Exactly as it arrived: payload, key and headers unchanged (SPEC N6, K7).
            (address, delivery.headers().clone())
        }
        CopyTarget::Retry { retry_count } => {
            let address = declaration
                .retry_address
                .as_deref()
                .ok_or_else(|| missing("retry"))?;
            let mut headers = delivery.headers().clone();
            headers.insert(RETRY_COUNT_HEADER, retry_count.to_string());
            (address, headers)
        }
    };
    Ok(Outgoing {
        address: address.to_owned(),
        payload: delivery.payload().clone(),
        headers,
        key: delivery.key().cloned(),
    })
}

/// Publishes the copy, trying a few times; then says how to settle the original:
/// as planned when the broker confirmed the copy, else given back to the broker so
/// nothing is lost (SPEC: a failed publish never loses the original).
pub(crate) async fn publish(
    publisher: &dyn Publish,
    registration: &str,
    delivery: &Delivery,
    copy: &Copy,
    declaration: &Declaration,
    capabilities: &Capabilities,
    planned: Settle,
) -> Settle {
    let result = match outgoing(delivery, copy, declaration) {
        Ok(message) => publish_with_tries(publisher, message).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => planned,
        Err(error) => {
            let fallback = if capabilities.redeliver == Verb::Native {
                Settle::Redeliver
            } else {
                Settle::Nothing
            };
            tracing::error!(
                registration,
                address = delivery.address(),
                %error,
                original = ?fallback,
                "the copy was not confirmed; the original is not settled as planned"
            );
            fallback
        }
    }
}

async fn publish_with_tries(
    publisher: &dyn Publish,
    message: Outgoing,
) -> Result<(), PublishError> {
    let mut backoff = Duration::from_millis(50);
    let mut tried = 1;
    loop {
        match publisher.publish(message.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if tried >= TRIES => return Err(e),
            Err(e) => {
                tracing::warn!(address = %message.address, error = %e, tried, "copy not confirmed; trying again");
                tokio::time::sleep(backoff).await;
                backoff *= 4;
                tried += 1;
            }
        }
    }
}
