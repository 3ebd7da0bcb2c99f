//! The keepalive sends progress for slow handlers and for deliveries waiting for their
//! lane, so neither burns attempts.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Script, eventually, handler};
use ruststream::{App, HandlerOutcome, Headers, on};

use crate::support::{Setup, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_sends_progress_so_a_slow_handler_does_not_burn_attempts() {
    let s = Setup::new("WPI").await;
    let script = Script::slow(Duration::from_millis(2500), |_| HandlerOutcome::ack());
    let app = start(
        App::new().register(
            on(
                s.consumer().ack_wait(Duration::from_secs(1)),
                handler(Arc::clone(&script)),
            )
            .lanes(2),
        ),
    )
    .await;
    s.publish(b"slow", &Headers::new()).await;
    eventually(Duration::from_secs(5), "handled", || script.count() == 1).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(script.count(), 1, "+WPI kept it from being redelivered");
    assert_eq!(s.info().await.num_ack_pending, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_also_covers_deliveries_waiting_for_their_lane() {
    let s = Setup::new("WPIQ").await;
    // One lane, handlers of 1.5 s, ack_wait 1 s: the second delivery waits 1.5 s in the
    // lane's queue and the third 3 s before they start, both past ack_wait. The runtime
    // tells the keepalive of them at hand-over (they cannot start at once), so none is
    // redelivered.
    let script = Script::slow(Duration::from_millis(1500), |_| HandlerOutcome::ack());
    let app = start(
        App::new().register(
            on(
                s.consumer().ack_wait(Duration::from_secs(1)),
                handler(Arc::clone(&script)),
            )
            .lanes(1),
        ),
    )
    .await;
    for payload in [&b"first"[..], b"second", b"third"] {
        s.publish(payload, &Headers::new()).await;
    }
    eventually(Duration::from_secs(10), "all three handled", || {
        script.count() == 3
    })
    .await;
    // Time for a redelivery of any of them to show.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let calls = script.calls();
    assert_eq!(calls.len(), 3, "none came again: {calls:?}");
    assert!(
        calls.iter().all(|c| c.attempt == 1),
        "each ran once, as attempt 1: {calls:?}"
    );
    assert_eq!(s.info().await.num_ack_pending, 0);
    app.stop().await;
}
