//! Core NATS against a real nats-server: SPEC N2, N3, N5, N6, N8, queue groups and
//! request/reply.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Script, eventually, handler, logs, nats, unique};
use futures_util::StreamExt;
use ruststream::{
    App, HandlerOutcome, Headers, Message, Publisher, RETRY_COUNT_HEADER, ReplyTo, on,
};
use ruststream_nats::{Nats, RequestError};

async fn publish(nats: &Nats, subject: &str, payload: &'static [u8], headers: &Headers) {
    nats.publisher()
        .core(subject, headers, Bytes::from_static(payload))
        .await
        .expect("core publish");
}

/// Waits until the app's subscriptions are known to the server, so a publish right
/// after reaches them (Core NATS keeps nothing for late subscribers).
async fn subscribed(nats: &Nats) {
    nats.client().flush().await.expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_core_ack_drop_and_retry_answer_unsupported_and_it_is_logged() {
    let nats = nats().await;
    let subject = unique("n2");
    let script = Script::new(|d| match &d.payload()[..] {
        b"ack" => HandlerOutcome::ack(),
        b"drop" => HandlerOutcome::drop(),
        _ => HandlerOutcome::retry(),
    });
    let app = App::new()
        .register(on(nats.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    for payload in [&b"ack"[..], b"drop", b"retry"] {
        publish(&nats, &subject, payload, &Headers::new()).await;
    }
    eventually(Duration::from_secs(5), "three calls", || {
        script.count() == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(script.count(), 3, "at most once: nothing comes back");
    let logs = logs();
    for verb in ["ack", "drop", "retry"] {
        assert!(
            logs.contains(&format!("the broker has no operation for `{verb}`")),
            "Unsupported for {verb} not logged:\n{logs}"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n3_core_retry_after_publishes_a_copy_after_the_delay() {
    let nats = nats().await;
    let subject = unique("n3delay");
    let delay = Duration::from_millis(400);
    let script = Script::new(move |d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(delay)
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(on(nats.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    let mut headers = Headers::new();
    headers.insert("trace", "t1");
    publish(&nats, &subject, b"later", &headers).await;
    eventually(Duration::from_secs(5), "the copy arrives", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert!(
        calls[1].at - calls[0].at >= delay,
        "copy after {:?}",
        calls[1].at - calls[0].at
    );
    assert_eq!(calls[0].headers.get_str(RETRY_COUNT_HEADER), None);
    assert_eq!(calls[1].headers.get_str(RETRY_COUNT_HEADER), Some("1"));
    assert_eq!(
        calls[1].headers.get_str("trace"),
        Some("t1"),
        "headers kept"
    );
    assert_eq!(calls[1].attempt, 2, "attempt = header + 1");
    assert_eq!(calls[1].payload, calls[0].payload);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_core_declared_retry_copies_at_once_then_dead_letters_as_arrived() {
    let nats = nats().await;
    let subject = unique("n6core");
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
        .unwrap();
    subscribed(&nats).await;
    let mut headers = Headers::new();
    headers.insert("trace", "t2");
    publish(&nats, &subject, b"\x00raw\xff", &headers).await;
    let letter = tokio::time::timeout(Duration::from_secs(5), dead_letters.next())
        .await
        .expect("a dead letter")
        .unwrap();
    let calls = script.calls();
    assert_eq!(calls.len(), 3, "the handler ran max_attempts times");
    let counts: Vec<Option<&str>> = calls
        .iter()
        .map(|c| c.headers.get_str(RETRY_COUNT_HEADER))
        .collect();
    assert_eq!(counts, vec![None, Some("1"), Some("2")]);
    assert_eq!(&letter.payload[..], b"\x00raw\xff", "payload unchanged");
    let letter_headers = letter.headers.expect("headers");
    assert_eq!(letter_headers.get("trace").map(|v| v.as_str()), Some("t2"));
    assert_eq!(
        letter_headers.get(RETRY_COUNT_HEADER).map(|v| v.as_str()),
        Some("2"),
        "as the last attempt arrived"
    );
    assert!(
        logs().contains("the broker has no operation for `retry`"),
        "N3: Unsupported reported"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), dead_letters.next())
            .await
            .is_err(),
        "exactly one dead letter"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_core_at_the_cap_without_dead_letter_lets_it_go() {
    let nats = nats().await;
    let subject = unique("n6go");
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .register(on(nats.subject(&subject), handler(Arc::clone(&script))).max_attempts(2))
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    publish(&nats, &subject, b"x", &Headers::new()).await;
    eventually(Duration::from_secs(5), "two attempts", || {
        script.count() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(script.count(), 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n5_core_wildcard_refuses_to_start_without_a_retry_subject() {
    let nats = nats().await;
    let base = unique("n5wild");
    let script = Script::new(|_| HandlerOutcome::ack());
    let err = App::new()
        .register(
            on(
                nats.wildcard(format!("{base}.*")),
                handler(Arc::clone(&script)),
            )
            .name("wild"),
        )
        .register(
            on(
                nats.wildcard(format!("{base}.>")),
                handler(Arc::clone(&script)),
            )
            .name("capped")
            .max_attempts(3),
        )
        .register(
            on(
                nats.subject(format!("{base}.*")),
                handler(Arc::clone(&script)),
            )
            .name("misused"),
        )
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 rule(s) broken"), "{err}");
    assert!(
        err.contains(&format!("registration `wild` on `{base}.*`")),
        "{err}"
    );
    assert!(
        err.contains(&format!("registration `capped` on `{base}.>`")),
        "{err}"
    );
    assert!(err.contains("read it with CoreWildcard"), "{err}");
    assert!(err.contains(".retry_to(address)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n5_core_wildcard_copies_go_to_the_named_subject() {
    let nats = nats().await;
    let base = unique("n5named");
    let retry_subject = format!("{base}.retry");
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(50))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(
            on(
                nats.wildcard(format!("{base}.*")),
                handler(Arc::clone(&script)),
            )
            .retry_to(&retry_subject),
        )
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    publish(&nats, &format!("{base}.eu"), b"x", &Headers::new()).await;
    eventually(Duration::from_secs(5), "the copy is handled", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert_eq!(calls[0].address, format!("{base}.eu"));
    assert_eq!(calls[1].address, retry_subject);
    assert_eq!(calls[1].headers.get_str(RETRY_COUNT_HEADER), Some("1"));
    app.stop().await;
}

#[test]
fn n8_a_waiting_core_copy_is_lost_when_the_process_dies() {
    // The service runs on its own runtime, which is torn down without any shutdown, as
    // a crash would: the in-process timer dies with it.
    let service = tokio::runtime::Runtime::new().unwrap();
    let (client, subject, script) = service.block_on(async {
        let nats = nats().await;
        let subject = unique("n8");
        let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_millis(700)));
        let running = App::new()
            .register(on(nats.subject(&subject), handler(Arc::clone(&script))))
            .start()
            .await
            .unwrap();
        std::mem::forget(running);
        subscribed(&nats).await;
        (nats, subject, script)
    });
    drop(client);
    let observer = tokio::runtime::Runtime::new().unwrap();
    observer.block_on(async {
        let watcher = nats().await;
        let mut seen = watcher.client().subscribe(subject.clone()).await.unwrap();
        watcher.client().flush().await.unwrap();
        publish(&watcher, &subject, b"x", &Headers::new()).await;
        let original = tokio::time::timeout(Duration::from_secs(5), seen.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&original.payload[..], b"x");
        eventually(Duration::from_secs(5), "handled once", || {
            script.count() == 1
        })
        .await;
        service.shutdown_background();
        let copy = tokio::time::timeout(Duration::from_millis(1500), seen.next()).await;
        assert!(
            copy.is_err(),
            "no copy was published after the crash: it is lost (N8)"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_a_graceful_stop_publishes_a_waiting_core_copy_early_instead_of_losing_it() {
    let nats = nats().await;
    let subject = unique("n8stop");
    let mut seen = nats.client().subscribe(subject.clone()).await.unwrap();
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(60)));
    let app = App::new()
        .register(on(nats.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    publish(&nats, &subject, b"x", &Headers::new()).await;
    let _original = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "handled", || script.count() == 1).await;
    let stopped = Instant::now();
    app.stop().await;
    let copy = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .unwrap()
        .unwrap();
    assert!(stopped.elapsed() < Duration::from_secs(10));
    assert_eq!(
        copy.headers
            .unwrap()
            .get(RETRY_COUNT_HEADER)
            .map(|v| v.as_str()),
        Some("1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_groups_split_the_work() {
    let nats = nats().await;
    let subject = unique("queue");
    let a = Script::new(|_| HandlerOutcome::ack());
    let b = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(
            on(
                nats.subject(&subject).queue_group("workers"),
                handler(Arc::clone(&a)),
            )
            .name("a"),
        )
        .register(
            on(
                nats.subject(&subject).queue_group("workers"),
                handler(Arc::clone(&b)),
            )
            .name("b"),
        )
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    for _ in 0..100 {
        publish(&nats, &subject, b"job", &Headers::new()).await;
    }
    eventually(Duration::from_secs(5), "all handled", || {
        a.count() + b.count() == 100
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.count() + b.count(), 100, "each message once");
    assert!(
        a.count() > 0 && b.count() > 0,
        "split: {} / {}",
        a.count(),
        b.count()
    );
    app.stop().await;
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Quote {
    id: u64,
    cents: u64,
}

async fn price(Message(id): Message<u64>, reply: ReplyTo, publisher: Publisher) -> HandlerOutcome {
    match publisher
        .to(&*reply.0)
        .send(&Quote {
            id,
            cents: id * 100,
        })
        .await
    {
        Ok(()) => HandlerOutcome::ack(),
        Err(_) => HandlerOutcome::drop(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_reply_returns_typed_replies() {
    let nats = nats().await;
    let subject = unique("price");
    let app = App::new()
        .register(on(nats.subject(&subject), price))
        .start()
        .await
        .unwrap();
    subscribed(&nats).await;
    let quote: Quote = nats
        .publisher()
        .request(&subject, &7u64, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(quote, Quote { id: 7, cents: 700 });
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_without_responders_fails_fast() {
    let nats = nats().await;
    let subject = unique("nobody");
    let started = Instant::now();
    let err = nats
        .publisher()
        .request::<_, Quote>(&subject, &1u64, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RequestError::NoResponders {
            subject: subject.clone()
        }
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_times_out_at_the_callers_timeout() {
    let nats = nats().await;
    let subject = unique("silent");
    // Someone listens but never answers.
    let _silent = nats.client().subscribe(subject.clone()).await.unwrap();
    nats.client().flush().await.unwrap();
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let err = nats
        .publisher()
        .request::<_, Quote>(&subject, &1u64, timeout)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err, RequestError::TimedOut { subject, timeout });
    assert!(took >= timeout && took < timeout * 5, "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_are_refused_by_name_not_sent() {
    let nats = nats().await;
    let mut headers = Headers::new();
    headers.insert("x", "a\r\nInjected: yes");
    let err = nats
        .publisher()
        .core(&unique("hostile"), &headers, Bytes::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`x`"), "{err}");
}
