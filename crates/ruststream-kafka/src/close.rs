//! Closing librdkafka handles off the async runtime, with a deadline: dropping a consumer
//! can block its thread for a long time (or forever, see rust-rdkafka issue 509).

use std::time::Duration;

/// Runs `work` on a thread of its own and waits at most `deadline` for it. A thread that
/// does not finish is left behind (detached, it does not keep the process alive) and
/// logged, rather than blocking the caller.
pub(crate) async fn off_runtime<T: Send + 'static>(
    what: &str,
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("ruststream-kafka-close".to_owned())
        .spawn(move || {
            let _ = tx.send(work());
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start a thread to {what}");
        return None;
    }
    match tokio::time::timeout(deadline, rx).await {
        Ok(Ok(value)) => Some(value),
        _ => {
            tracing::warn!(
                ?deadline,
                "gave up waiting to {what}; its thread is left behind"
            );
            None
        }
    }
}
