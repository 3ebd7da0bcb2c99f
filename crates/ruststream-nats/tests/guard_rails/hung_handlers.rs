//! G1, D3: hung handlers on JetStream: they come back with the keepalive on and hold
//! back no other delivery, and the keepalive stops at the deadline.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Script, create_stream, eventually, handler, logs, nats, unique};
use bytes::Bytes;
use futures_util::StreamExt;
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_test_support::reliability;

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
