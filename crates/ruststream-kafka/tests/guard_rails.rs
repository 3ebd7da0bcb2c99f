//! The guard rails beyond the seeds (SPEC G2-G4) against the real broker: a dead letter
//! the broker refuses (under `Commit::Auto` and `Commit::Tracked`), an uncapped retry
//! loop, a dead-letter topic the registration reads itself.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{
    Script, brokers, committed, create_topic, eventually, handler, kafka, logs, produce,
    read_topic, topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, StartError, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_test_support::{cpu_share_over, reliability};

/// A service connection whose producer refuses records above 100 kB, as a broker's topic
/// limit would: a 200 kB record can be read but not copied.
fn small_producer() -> Kafka {
    let settings = BTreeMap::from([("message.max.bytes".to_owned(), "100000".to_owned())]);
    Kafka::with_settings(&brokers(), settings).expect("kafka client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_auto_refused_dead_letter_is_tried_again_never_the_handler_and_a_restart_still_has_it() {
    let kafka = kafka().await;
    let (t, dead, group) = (unique("g3auto"), unique("g3autodead"), unique("g"));
    create_topic(&t, 1).await;
    create_topic(&dead, 1).await;
    let big = vec![b'x'; 200_000];
    produce(&kafka, &t, Some("k"), &big, &Headers::new()).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .metrics()
        .register(
            on(
                topic(&small_producer(), &t, &group, Commit::Auto),
                handler(Arc::clone(&script)),
            )
            .name("refused")
            .max_attempts(1)
            .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    eventually(
        Duration::from_secs(30),
        "read again after the refusal",
        || logs().contains("the handler is not run again"),
    )
    .await;
    let window = Duration::from_secs(10);
    let (before, cpu) = (script.count(), cpu_share_over(window).await);
    let runs = script.count() - before;
    assert!(runs <= 6, "{runs} runs in {window:?}: a storm");
    // Issue #46, item 6: read again, the record goes straight to its dead letter; the
    // handler, capped at 1 attempt, ran once.
    assert_eq!(script.count(), 1, "the handler ran past max_attempts(1)");
    // The "copies refused" alert of docs/operating.md fires.
    let refused = ruststream_test_support::ops::metric(
        &app,
        "ruststream_copy_failures_total",
        &["kind=\"refused\""],
    )
    .await;
    assert!(refused >= 2.0, "copies refused counted: {refused}");
    assert!(logs().contains("too large"), "the cause is named");
    assert!(
        logs().contains("the handler is not run again"),
        "the dead letter alone is tried again"
    );
    // A graceful stop while it is refused: the record's offset was stored back.
    app.stop().await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .register(
            on(
                topic(&kafka, &t, &group, Commit::Auto),
                handler(Arc::clone(&script)),
            )
            .max_attempts(1)
            .dead_letter(&dead),
        )
        .start()
        .await
        .expect("restart");
    let letters = read_topic(&dead, 1, 1, Duration::from_secs(30)).await;
    assert_eq!(letters.len(), 1, "dead-lettered after the restart");
    assert_eq!(letters[0].payload.len(), big.len());
    assert!(
        script.count() >= 1,
        "the record came back after the restart"
    );
    app.stop().await;
    reliability(
        "Kafka Commit::Auto",
        &format!(
            "refused dead letter: a 200 kB record, max_attempts(1), the producer's limit 100 kB; {runs} handler runs in {}s of refusal, CPU {:.1}% of a core; graceful restart with room",
            window.as_secs(),
            cpu * 100.0
        ),
        "lost 0 of 1 (offset stored back, partition sought back)",
        "read again with backoff (1 s, 2 s, 4 s...) while refused",
        "1 dead-lettered after the restart",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_tracked_refused_dead_letter_is_held_and_tried_again_later_not_rerun() {
    let kafka = kafka().await;
    let (t, dead, group) = (unique("g3tr"), unique("g3trdead"), unique("g"));
    create_topic(&t, 1).await;
    create_topic(&dead, 1).await;
    produce(&kafka, &t, Some("k"), &vec![b'y'; 200_000], &Headers::new()).await;
    produce(&kafka, &t, Some("k"), b"behind it", &Headers::new()).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .register(
            on(
                topic(&small_producer(), &t, &group, Commit::Tracked),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2)
            .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(30), "the first run", || {
        script.count() >= 1
    })
    .await;
    let window = Duration::from_secs(10);
    let cpu = cpu_share_over(window).await;
    // The retry copy is too large, so it goes to the dead letter at once, which is
    // refused too: held, tried again with backoff, the handler not run again.
    assert_eq!(script.count(), 1, "held, not rerun");
    assert_eq!(
        committed(&group, &t, 0).await.unwrap_or(0),
        0,
        "the position waits for the held record"
    );
    let log = logs();
    assert!(
        log.contains("the retry copy is too large"),
        "too large, then dead letter"
    );
    assert!(log.contains("the original is held unsettled"));
    app.stop().await;
    reliability(
        "Kafka Commit::Tracked",
        &format!(
            "refused dead letter: a 200 kB record, max_attempts(2), the producer's limit 100 kB (retry copy and dead letter both too large); 1 handler run in {}s, CPU {:.1}% of a core",
            window.as_secs(),
            cpu * 100.0
        ),
        "lost 0 of 1 (held unsettled; the committed position waits)",
        "not rerun: the dead letter is tried again with backoff",
        "0 while refused",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_tracked_uncapped_retry_waits_a_floor_instead_of_spinning() {
    let kafka = kafka().await;
    let (t, group) = (unique("g2spin"), unique("g"));
    create_topic(&t, 1).await;
    produce(&kafka, &t, Some("k"), b"always fails", &Headers::new()).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                handler(Arc::clone(&script)),
            )
            .name("spins"),
        )
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(30), "ten runs", || script.count() >= 10).await;
    let window = Duration::from_secs(5);
    let (before, cpu) = (script.count(), cpu_share_over(window).await);
    let runs = script.count() - before;
    // Today's main: about 100,000 runs a second. The floor: 10 ms doubling to 1 s.
    assert!(runs <= 8, "{runs} runs in {window:?}");
    let attempts: Vec<u32> = script.calls().iter().map(|c| c.attempt).take(3).collect();
    assert_eq!(attempts, [1, 2, 3], "each rerun is the next attempt");
    assert!(
        logs()
            .lines()
            .any(|l| l.contains("keeps failing") && l.contains("attempt=10") && l.contains("WARN")),
        "reported at attempt 10"
    );
    app.stop().await;
    reliability(
        "Kafka Commit::Tracked",
        &format!(
            "uncapped retry(): a handler that always retries, no max_attempts; {runs} runs in {}s once past attempt 10, CPU {:.1}% of a core",
            window.as_secs(),
            cpu * 100.0
        ),
        "lost 0 of 1",
        "rerun in place at 10 ms doubling to 1 s; WARN at attempts 10, 100, 1000",
        "none declared",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_a_dead_letter_topic_in_the_registrations_own_list_or_a_bad_name_is_refused() {
    let kafka = kafka().await;
    let (a, b, group) = (unique("g4a"), unique("g4b"), unique("g"));
    let refused = App::new()
        .register(
            on(
                kafka.topics([a.clone(), b.clone()]).group(&group),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("list")
            .max_attempts(2)
            .dead_letter(&b)
            .retry_to(&a),
        )
        .register(
            on(
                kafka.topic(&a).group(&group),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("names")
            .max_attempts(2)
            .dead_letter("orders/dead")
            .retry_to(""),
        )
        .register(
            on(
                kafka.topic(&a).group(&group),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
            .name("uncapped")
            .dead_letter(format!("{a}.dead")),
        )
        .start()
        .await;
    let Err(StartError::Invalid(violations)) = refused else {
        panic!("started: {refused:?}");
    };
    for (name, rule) in [
        ("list", "is read by this registration itself"),
        ("names", "'/' is not allowed in a Kafka topic name"),
        ("names", "the retry address is empty"),
        ("uncapped", "without max_attempts"),
    ] {
        assert!(
            violations
                .iter()
                .any(|v| v.registration == name && v.rule.contains(rule)),
            "`{name}`: {rule} in {violations:?}"
        );
    }
}
