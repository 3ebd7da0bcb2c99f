//! The guard rails beyond the seeds (SPEC G1-G4) against a real nats-server: a hung
//! handler, a refused dead letter, a retry copy over the server's size limit, a dead
//! letter the registration would read itself.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Script, create_stream, eventually, handler, logs, nats, unique};
use futures_util::StreamExt;
use ruststream::{App, HandlerOutcome, Headers, StartError, on};
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_test_support::{cpu_share_over, reliability};

/// A stream that holds one message and refuses the next (discard new): a dead-letter
/// destination the broker refuses for good.
async fn full_stream(nats: &ruststream_nats::Nats, name: &str, subject: &str) -> stream::Stream {
    let stream = jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            max_messages: 1,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await
        .expect("create the small stream");
    nats.publisher()
        .jetstream(
            subject,
            &Headers::new(),
            Bytes::from_static(b"filler"),
            None,
        )
        .await
        .expect("fill the small stream");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_jetstream_hung_handlers_come_back_with_the_keepalive_on() {
    let nats = nats().await;
    let base = unique("G1HUNG");
    let subject = format!("{base}.in");
    let mut stream = create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    // Each message's first attempt never returns; ack_wait 4 s with the keepalive on (the
    // default), which on its own would renew the stuck deliveries for ever.
    let script = Script::new(|_| HandlerOutcome::ack());
    let hang_first = {
        let script = Arc::clone(&script);
        move |d: ruststream::Delivery| {
            let script = Arc::clone(&script);
            async move {
                let outcome = handler(script)(d.clone()).await;
                if d.attempt().number() == 1 {
                    std::future::pending::<()>().await;
                }
                outcome
            }
        }
    };
    let app = App::new()
        .register(
            on(
                nats.consumer(&base, "worker")
                    .filter_subject(&subject)
                    .ack_wait(Duration::from_secs(4)),
                hang_first,
            )
            .name("hangs")
            .lanes(1)
            .timeout(Duration::from_secs(2)),
        )
        .start()
        .await
        .expect("start");
    for n in 0..3u8 {
        nats.publisher()
            .jetstream(&subject, &Headers::new(), Bytes::from(vec![n]), None)
            .await
            .expect("publish");
    }
    eventually(
        Duration::from_secs(40),
        "every message handled at attempt 2",
        || script.calls().iter().filter(|c| c.attempt == 2).count() == 3,
    )
    .await;
    let info = stream.consumer_info("worker").await.expect("consumer info");
    app.stop().await;
    assert_eq!(info.num_ack_pending, 0, "every message acknowledged");
    let log = logs();
    assert!(
        log.contains("handler passed its deadline and was cancelled")
            && log.contains("registration=\"hangs\"")
            && log.contains(&format!("address=\"{subject}\"")),
        "the cancelled attempt is logged with registration and address"
    );
    let _ = stream.info().await;
    reliability(
        "NATS JetStream",
        "hung handler: 3 messages whose first attempt never returns, lanes(1), timeout(2 s), ack_wait(4 s), keepalive on",
        "lost 0 of 3 (each cancelled at its deadline and redelivered as attempt 2)",
        "0 handled twice",
        "none declared",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_jetstream_dead_letter_refused_by_a_full_stream_is_tried_again_never_the_handler() {
    let nats = nats().await;
    let base = unique("G3FULL");
    let subject = format!("{base}.in");
    let dead = format!("{base}.dead");
    let stream = create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    let mut dead_stream = full_stream(&nats, &format!("{base}_DEAD"), &dead).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .metrics()
        .register(
            on(
                nats.consumer(&base, "worker").filter_subject(&subject),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2)
            .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    for payload in [b"one" as &[u8], b"two"] {
        nats.publisher()
            .jetstream(
                &subject,
                &Headers::new(),
                Bytes::copy_from_slice(payload),
                None,
            )
            .await
            .expect("publish");
    }
    eventually(Duration::from_secs(10), "both at the cap", || {
        script.calls().iter().filter(|c| c.attempt == 2).count() == 2
    })
    .await;
    let window = Duration::from_secs(15);
    let (before, cpu) = (script.count(), cpu_share_over(window).await);
    let runs = script.count() - before;
    // Issue #46, item 6: the originals come back (attempts 3, 4, ...) and only their
    // dead letters are tried again; the handler, capped at 2, never sees attempt 3.
    assert_eq!(runs, 0, "{runs} handler runs past the cap in {window:?}");
    assert!(
        script.calls().iter().all(|c| c.attempt <= 2),
        "attempts the handler saw: {:?}",
        script.calls().iter().map(|c| c.attempt).collect::<Vec<_>>()
    );
    assert!(
        logs().contains("the handler is not run again"),
        "the originals came back and their dead letters were tried again"
    );
    let info = stream.consumer_info("worker").await.expect("consumer info");
    assert_eq!(
        info.num_ack_pending as u64 + info.num_pending,
        2,
        "both originals still held by the stream, none terminated"
    );
    // The "copies refused" alert of docs/operating.md fires.
    let refused = ruststream_test_support::ops::metric(
        &app,
        "ruststream_copy_failures_total",
        &["kind=\"refused\""],
    )
    .await;
    assert!(refused >= 2.0, "copies refused counted: {refused}");
    assert!(
        logs().contains("destination full"),
        "the refusal names its cause"
    );
    // The destination has room again: both dead letters land, the originals terminate.
    let mut config = dead_stream.info().await.expect("info").config.clone();
    config.max_messages = -1;
    jetstream::new(nats.client().clone())
        .update_stream(config)
        .await
        .expect("make room");
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let stored = dead_stream.info().await.expect("info").state.messages;
        let info = stream.consumer_info("worker").await.expect("consumer info");
        if stored == 3 && info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stored {stored} of 3 (the filler and 2 dead letters), pending {} + {}",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
    reliability(
        "NATS JetStream",
        &format!(
            "refused dead letter: 2 messages at max_attempts(2), dead-letter stream full (max_msgs=1, discard new), then given room; {runs} handler runs in {}s of refusal, CPU {:.1}% of a core",
            window.as_secs(),
            cpu * 100.0
        ),
        "lost 0 of 2",
        "the originals come back with backoff (1 s, 2 s, 4 s...) while refused",
        "2 dead-lettered once the stream had room",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_core_retry_copy_over_max_payload_goes_to_the_dead_letter() {
    let nats = nats().await;
    let subject = unique("g3big");
    let dead = format!("{subject}.dead");
    let mut dead_letters = nats.client().subscribe(dead.clone()).await.unwrap();
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .register(
            on(nats.subject(&subject), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    // Fits, but not with the retry-count header added.
    let max = nats.client().server_info().max_payload;
    let payload = Bytes::from(vec![7u8; max - 16]);
    nats.client()
        .publish(subject.clone(), payload.clone())
        .await
        .unwrap();
    let letter = tokio::time::timeout(Duration::from_secs(10), dead_letters.next())
        .await
        .expect("a dead letter")
        .unwrap();
    assert_eq!(letter.payload, payload, "the message as it arrived");
    assert!(
        letter.headers.is_none_or(|h| h.is_empty()),
        "no header added"
    );
    assert_eq!(script.count(), 1, "no copy could carry a second attempt");
    let log = logs();
    assert!(log.contains("too large"), "the cause is named");
    assert!(!log.contains(&format!("{subject}` failed (disconnected)")));
    app.stop().await;
    reliability(
        "NATS Core",
        "near-limit message: payload max_payload - 16 bytes, retry() under max_attempts(3), its retry copy over max_payload",
        "lost 0 of 1",
        "0 handled twice",
        "1 dead-lettered (the message as it arrived, since no copy fits)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_core_refused_dead_letter_is_an_error_that_says_lost() {
    let nats = nats().await;
    let base = unique("G3LOST");
    let subject = format!("{base}.in");
    let dead = format!("{base}.dead");
    full_stream(&nats, &format!("{base}_DEAD"), &dead).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .metrics()
        .register(
            on(nats.subject(&subject), handler(Arc::clone(&script)))
                .max_attempts(2)
                .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    nats.client()
        .publish(subject.clone(), Bytes::from_static(b"doomed"))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the loss is logged", || {
        logs().contains("the message is lost") && logs().contains(&dead)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(script.count(), 2, "max_attempts runs, then no loop");
    let log = logs();
    let line = log
        .lines()
        .find(|l| l.contains("the message is lost") && l.contains(&dead))
        .expect("the line");
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("destination full"), "{line}");
    // The "messages lost" alert of docs/operating.md fires.
    let lost = ruststream_test_support::ops::metric(
        &app,
        "ruststream_copy_failures_total",
        &["kind=\"lost\""],
    )
    .await;
    assert_eq!(lost, 1.0, "the loss is counted");
    app.stop().await;
    reliability(
        "NATS Core",
        "refused dead letter: retry() under max_attempts(2), dead-letter subject captured by a full stream",
        "lost 1 of 1 (Core holds nothing to bring back; logged at ERROR with \"lost\", subject and reason)",
        "0 handled twice",
        "0 (refused)",
    );
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_an_uncapped_delivery_that_keeps_failing_is_reported_at_attempt_10() {
    let nats = nats().await;
    let base = unique("G2WARN");
    let subject = format!("{base}.in");
    create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    let script = Script::new(|d| {
        if d.attempt().number() < 12 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(
            on(
                nats.consumer(&base, "worker").filter_subject(&subject),
                handler(Arc::clone(&script)),
            )
            .name("uncapped"),
        )
        .start()
        .await
        .expect("start");
    nats.publisher()
        .jetstream(&subject, &Headers::new(), Bytes::from_static(b"x"), None)
        .await
        .expect("publish");
    eventually(Duration::from_secs(20), "12 attempts", || {
        script.count() == 12
    })
    .await;
    app.stop().await;
    let log = logs();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("keeps failing") && l.contains(&subject))
        .collect();
    assert_eq!(warnings.len(), 1, "once, at attempt 10: {warnings:?}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("attempt=10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_core_capped_retry_whose_copy_went_out_logs_no_warning() {
    let nats = nats().await;
    let subject = unique("g3quiet");
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(
            on(nats.subject(&subject), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(format!("{subject}.dead")),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    nats.client()
        .publish(subject.clone(), Bytes::from_static(b"once more"))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the copy handled", || {
        script.count() == 2
    })
    .await;
    app.stop().await;
    let log = logs();
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&subject) && (l.contains("WARN") || l.contains("ERROR")))
        .collect();
    assert!(noisy.is_empty(), "the designed path is quiet: {noisy:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d3_the_keepalive_stops_at_the_deadline_so_a_blocking_handler_is_redelivered() {
    let nats = nats().await;
    let base = unique("D3BLOCK");
    let subject = format!("{base}.in");
    create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    // Attempt 1 blocks its thread for 6 s: it cannot be cancelled at its 500 ms deadline.
    // The keepalive stops telling the server it is in progress (three deadlines after
    // hand-over at most), so the server redelivers after ack_wait (2 s) while it blocks.
    let script = Script::new(|_| HandlerOutcome::ack());
    let blocks_first = {
        let script = Arc::clone(&script);
        move |d: ruststream::Delivery| {
            let script = Arc::clone(&script);
            async move {
                if d.attempt().number() == 1 {
                    std::thread::sleep(Duration::from_secs(6));
                }
                handler(script)(d).await
            }
        }
    };
    let app = App::new()
        .register(
            on(
                nats.consumer(&base, "worker")
                    .filter_subject(&subject)
                    .ack_wait(Duration::from_secs(2)),
                blocks_first,
            )
            .timeout(Duration::from_millis(500)),
        )
        .start()
        .await
        .expect("start");
    nats.publisher()
        .jetstream(
            &subject,
            &Headers::new(),
            Bytes::from_static(b"blocks"),
            None,
        )
        .await
        .expect("publish");
    eventually(Duration::from_secs(30), "redelivered as attempt 2", || {
        script.calls().iter().any(|c| c.attempt == 2)
    })
    .await;
    app.stop().await;
}

/// Issue #46, item 15: a handler that awaits first (so the keepalive starts) and then
/// blocks its thread past its deadline gets no `+WPI` after the deadline, counted from
/// its start, so the server redelivers it within deadline + `ack_wait` (SPEC D3, G1).
/// The `+WPI` are watched on the server's ack subjects, and the server's redelivery is
/// seen by the consumer's `num_redelivered`. Before: the keepalive ran for up to three
/// deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d3_no_keepalive_after_the_deadline_of_a_handler_that_awaits_then_blocks() {
    let nats = nats().await;
    let base = unique("D3YIELD");
    let subject = format!("{base}.in");
    create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    let mut acks = nats
        .client()
        .subscribe("$JS.ACK.>")
        .await
        .expect("watch the ack subjects");
    let progress: Arc<std::sync::Mutex<Vec<std::time::Instant>>> = Arc::default();
    let seen = Arc::clone(&progress);
    let stream_name = format!(".{base}.");
    tokio::spawn(async move {
        while let Some(message) = acks.next().await {
            if message.subject.contains(&*stream_name) && &message.payload[..] == b"+WPI" {
                seen.lock().unwrap().push(std::time::Instant::now());
            }
        }
    });
    let started: Arc<std::sync::Mutex<Option<std::time::Instant>>> = Arc::default();
    let script = Script::new(|_| HandlerOutcome::ack());
    let deadline = Duration::from_secs(3);
    let awaits_then_blocks = {
        let (script, started) = (Arc::clone(&script), Arc::clone(&started));
        move |d: ruststream::Delivery| {
            let (script, started) = (Arc::clone(&script), Arc::clone(&started));
            async move {
                if d.attempt().number() == 1 {
                    *started.lock().unwrap() = Some(std::time::Instant::now());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    // Blocks the driver (it cannot cancel the handler at its deadline),
                    // not the rest of the runtime: the client's connection task and the
                    // keepalive run on, as they do beside a service's blocked thread.
                    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_secs(9)));
                }
                handler(script)(d).await
            }
        }
    };
    let app = App::new()
        .register(
            on(
                nats.consumer(&base, "worker")
                    .filter_subject(&subject)
                    .ack_wait(Duration::from_secs(2)),
                awaits_then_blocks,
            )
            .timeout(deadline),
        )
        .start()
        .await
        .expect("start");
    nats.publisher()
        .jetstream(&subject, &Headers::new(), Bytes::from_static(b"x"), None)
        .await
        .expect("publish");
    eventually(Duration::from_secs(40), "redelivered as attempt 2", || {
        script.calls().iter().any(|c| c.attempt == 2)
    })
    .await;
    app.stop().await;
    let start = started.lock().unwrap().expect("attempt 1 ran");
    let told: Vec<Duration> = progress
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - start)
        .collect();
    assert!(
        !told.is_empty(),
        "the keepalive ran while the handler was within its deadline"
    );
    assert!(
        told.iter().all(|t| *t < deadline),
        "+WPI after the deadline of {deadline:?}: {told:?}"
    );
}

/// Issue #46, item 14, on JetStream: with `lanes(4)` and keyless messages, a handler that
/// hangs holds back none of the nine messages published after it (each starts on a free
/// lane). Before: three of them waited 5.7 to 20.7 s behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_jetstream_a_hung_keyless_handler_holds_back_no_other_delivery() {
    let nats = nats().await;
    let base = unique("G1LANES");
    let subject = format!("{base}.in");
    create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let others = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let work = {
        let (release, others) = (Arc::clone(&release), Arc::clone(&others));
        move |d: ruststream::Delivery| {
            let (release, others) = (Arc::clone(&release), Arc::clone(&others));
            async move {
                if &d.payload()[..] == b"hang" {
                    let _ = release.acquire().await;
                } else {
                    others.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(
            on(
                nats.consumer(&base, "worker").filter_subject(&subject),
                work,
            )
            .lanes(4),
        )
        .start()
        .await
        .expect("start");
    for payload in std::iter::once("hang".to_owned()).chain((0..9).map(|n| format!("quick-{n}"))) {
        nats.publisher()
            .jetstream(&subject, &Headers::new(), Bytes::from(payload), None)
            .await
            .expect("publish");
    }
    eventually(
        Duration::from_secs(10),
        "the nine ran while one hangs",
        || others.load(std::sync::atomic::Ordering::SeqCst) == 9,
    )
    .await;
    assert_eq!(release.available_permits(), 0, "still hanging meanwhile");
    release.add_permits(1);
    app.stop().await;
}
