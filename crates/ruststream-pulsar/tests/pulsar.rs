//! Pulsar against a real Pulsar-protocol broker (pulsar-lite, through the test relay):
//! SPEC P1-P7.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Script, eventually, handler, pulsar, unique};
use ruststream::{App, HandlerOutcome, Headers, Running, on};
use ruststream_pulsar::SubType;

async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_ack_is_acknowledged_and_never_sent_again() {
    let pulsar = pulsar().await;
    let topic = unique("p1-ack");
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new().register(on(
            pulsar
                .topic(&topic)
                .subscription("s")
                .ack_timeout(Duration::from_secs(1)),
            handler(Arc::clone(&script)),
        )),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t1");
    pulsar
        .publisher()
        .send(&topic, Some(b"k1"), &headers, b"hello".to_vec())
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "handled", || script.count() == 1).await;
    let call = &script.calls()[0];
    assert_eq!(&call.payload[..], b"hello");
    assert_eq!(call.key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(call.headers.get_str("trace"), Some("t1"));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        script.count(),
        1,
        "acknowledged: never sent again, even after the ack timeout"
    );
    app.stop().await;
}
