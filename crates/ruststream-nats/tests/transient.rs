//! SPEC G3's transient path against a real nats-server: a dead letter whose publish gets
//! no answer (the service's connection runs through a relay that swallows what it sends)
//! is tried 4 times while the original is held, then counts as a refusal; the original
//! comes back later and goes straight to its dead letter, the handler never run again.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Script, create_stream, handler, logs, nats, unique};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_nats::{Nats, async_nats};
use ruststream_test_support::Relay;

/// A stream holding `subject`, a dead-letter stream, and the service's own connection
/// through a relay, whose requests give up after 1 s.
async fn setup(base: &str) -> (Nats, Nats, Relay, String, String) {
    let nats = nats().await;
    let subject = format!("{base}.in");
    let dead = format!("{base}.dead");
    create_stream(&nats, base, std::slice::from_ref(&subject)).await;
    create_stream(&nats, &format!("{base}_DEAD"), std::slice::from_ref(&dead)).await;
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL");
    let relay = Relay::start(url.trim_start_matches("nats://").to_owned()).await;
    let options = async_nats::ConnectOptions::new().request_timeout(Some(Duration::from_secs(1)));
    let service = Nats::connect_with(&format!("nats://{}", relay.address()), options)
        .await
        .expect("connect through the relay");
    (nats, service, relay, subject, dead)
}

async fn stored(nats: &Nats, stream: &str) -> u64 {
    async_nats::jetstream::new(nats.client().clone())
        .get_stream(stream)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .state
        .messages
}

/// Waits up to `limit` for the dead letter, stops the app a second later, and checks
/// that exactly one was stored.
async fn landed_once(nats: &Nats, base: &str, app: ruststream::Running, limit: Duration) {
    let dead_stream = format!("{base}_DEAD");
    let deadline = tokio::time::Instant::now() + limit;
    while stored(nats, &dead_stream).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead letter never landed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    app.stop().await;
    assert_eq!(stored(nats, &dead_stream).await, 1, "stored once");
}

fn tries_logged(dead: &str) -> usize {
    logs()
        .lines()
        .filter(|l| l.contains("copy not confirmed; trying again") && l.contains(dead))
        .count()
}

/// Starts the service: every message is retried, capped at one attempt, so its first
/// `retry()` asks for the dead letter; `on_call` runs in the handler first.
async fn start(
    service: &Nats,
    base: &str,
    subject: &str,
    dead: &str,
    script: &Arc<Script>,
) -> ruststream::Running {
    App::new()
        .register(
            on(
                service
                    .consumer(base, "worker")
                    .filter_subject(subject)
                    .ack_wait(Duration::from_secs(10)),
                handler(Arc::clone(script)),
            )
            .max_attempts(1)
            .dead_letter(dead),
        )
        .start()
        .await
        .expect("start")
}

async fn publish(nats: &Nats, subject: &str) {
    nats.publisher()
        .jetstream(subject, &Headers::new(), Bytes::from_static(b"one"), None)
        .await
        .expect("publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_dead_letter_without_an_answer_is_tried_again_and_lands_once() {
    let base = unique("G3TRANSIENT");
    let (nats, service, relay, subject, dead) = setup(&base).await;
    let relay = Arc::new(relay);
    let cut = Arc::clone(&relay);
    let script = Script::new(move |_| {
        // Nothing the service sends for the next 3 s reaches the server.
        cut.swallow();
        let heal = Arc::clone(&cut);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            heal.heal();
        });
        HandlerOutcome::retry()
    });
    let app = start(&service, &base, &subject, &dead, &script).await;
    publish(&nats, &subject).await;
    landed_once(&nats, &base, app, Duration::from_secs(30)).await;
    assert_eq!(
        script.count(),
        1,
        "the original was held, never redelivered"
    );
    assert!(
        tries_logged(&dead) >= 1,
        "a WARN for each try without an answer"
    );
    assert!(
        !logs().contains("the broker refused the dead letter"),
        "a transient failure that passes is no refusal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_four_unanswered_tries_count_as_a_refusal_and_the_original_comes_back_to_the_dead_letter()
 {
    let base = unique("G3FOURTRIES");
    let (nats, service, relay, subject, dead) = setup(&base).await;
    let relay = Arc::new(relay);
    let cut = Arc::clone(&relay);
    let script = Script::new(move |_| {
        cut.swallow();
        HandlerOutcome::retry()
    });
    let app = start(&service, &base, &subject, &dead, &script).await;
    publish(&nats, &subject).await;
    let read_again = "the original comes back later";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !logs().contains(read_again) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refusal after the tries"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        tries_logged(&dead),
        3,
        "tried 4 times: 3 WARNs, then the refusal"
    );
    // The delayed NAK went into the relay too: the stream gives the original back after
    // its ack_wait (10 s) instead.
    relay.heal();
    landed_once(&nats, &base, app, Duration::from_secs(60)).await;
    assert_eq!(
        script.count(),
        1,
        "the original came back and went straight to its dead letter"
    );
}
