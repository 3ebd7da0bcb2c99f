//! G4: registrations that would read their own dead letters or name bad subjects are
//! refused at start.

use crate::common::{Script, create_stream, handler, nats, unique};
use ruststream::{App, HandlerOutcome, StartError, on};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_registrations_that_would_read_their_own_dead_letters_or_name_bad_subjects_are_refused()
{
    let nats = nats().await;
    let base = unique("G4LOOP");
    let pattern = format!("{base}.>");
    create_stream(&nats, &base, std::slice::from_ref(&pattern)).await;
    let refused = App::new()
        .register(
            on(
                nats.wildcard(&pattern),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("wildcard")
            .max_attempts(2)
            .dead_letter(format!("{base}.dead"))
            .retry_to(format!("{base}.retry")),
        )
        .register(
            on(
                nats.consumer(&base, "filtered").filter_subject(&pattern),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("filtered")
            .max_attempts(2)
            .dead_letter(format!("{base}.dead")),
        )
        .register(
            on(
                nats.subject(format!("{base}x")),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("bad-names")
            .max_attempts(2)
            .dead_letter("has space")
            .retry_to("a.*"),
        )
        .start()
        .await;
    let Err(StartError::Invalid(violations)) = refused else {
        panic!("started: {refused:?}");
    };
    let text = violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for (name, rule) in [
        ("wildcard", "is read by this registration itself"),
        ("filtered", "is read by this registration itself"),
        ("bad-names", "dead-letter address `has space`"),
        ("bad-names", "retry address `a.*`"),
    ] {
        assert!(
            violations
                .iter()
                .any(|v| v.registration == name && v.rule.contains(rule)),
            "`{name}`: {rule}\n{text}"
        );
    }
    // Unfiltered, the consumer reads what its stream captures: refused when it opens.
    let refused = App::new()
        .register(
            on(
                nats.consumer(&base, "unfiltered"),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .max_attempts(2)
            .dead_letter(format!("{base}.dead")),
        )
        .start()
        .await;
    let Err(StartError::Open { source, .. }) = refused else {
        panic!("started: {refused:?}");
    };
    let detail = source.to_string();
    assert!(
        detail.contains("captured by this consumer's own stream"),
        "{detail}"
    );
}
