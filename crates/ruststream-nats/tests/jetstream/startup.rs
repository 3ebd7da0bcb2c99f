//! E4, N6: what a start refuses or warns about: a missing or unknown stream, a dead-letter
//! subject no stream captures.

use crate::common::{Script, handler, logs, nats, unique};
use ruststream::{App, HandlerOutcome, StartError, on};

use crate::support::Setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_is_a_startup_error_naming_it() {
    let nats = nats().await;
    let missing = unique("MISSING");
    let script = Script::new(|_| HandlerOutcome::ack());
    let err = App::new()
        .register(on(nats.consumer(&missing, "worker"), handler(script)).name("billing"))
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, StartError::Open { .. }));
    let text = err.to_string();
    assert!(
        text.contains(&format!("stream `{missing}`")) && text.contains("billing"),
        "{text}"
    );
}

/// An unknown stream is refused at start, with the registration, the stream and the
/// server's answer named; nothing keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_a_consumer_on_an_unknown_stream_refuses_to_start() {
    let nats = nats().await;
    let missing = unique("MISSING");
    let started = App::new()
        .register(
            on(
                nats.consumer(&missing, "billing")
                    .filter_subject("nowhere.in"),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("billing"),
        )
        .start()
        .await;
    let Err(error) = started else {
        panic!("a consumer on an unknown stream started");
    };
    let text = error.to_string();
    assert!(text.contains("billing"), "{text}");
    assert!(text.contains(&missing), "{text}");
}

/// N6: dead letters to a subject no stream captures would go out on Core NATS; the start
/// says so in a warning naming the subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_a_dead_letter_subject_no_stream_captures_is_warned_about_at_start() {
    let setup = Setup::new("UNKNOWNDEAD").await;
    let nowhere = format!("{}.nowhere", unique("dead"));
    let running = App::new()
        .register(
            on(
                setup
                    .nats
                    .consumer(setup.base.clone(), "billing")
                    .filter_subject(format!("{}.in", setup.base)),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .max_attempts(3)
            .dead_letter(&nowhere),
        )
        .start()
        .await
        .expect("it starts");
    let logged = logs();
    assert!(
        logged.contains("no JetStream stream captures the dead-letter subject")
            && logged.contains(&nowhere),
        "{logged}"
    );
    running.stop().await;
}
