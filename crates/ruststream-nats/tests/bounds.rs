//! Bounded start, Core drops counted, one start position (SPEC G7, G8) against a real
//! nats-server.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    Script, assert_waited, create_stream, eventually, forward_later, handler, logs, nats, unique,
};
use ruststream::StartAt;
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_nats::Nats;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_connecting_to_a_closed_port_fails_at_once_naming_the_address() {
    let started = Instant::now();
    let err = Nats::connect("nats://127.0.0.1:1")
        .await
        .expect_err("nothing listens there");
    let took = started.elapsed();
    assert!(err.to_string().contains("nats://127.0.0.1:1"), "{err}");
    assert!(took < Duration::from_secs(15), "failed after {took:?}");
    println!(
        "RELIABILITY|NATS Core and JetStream|guard rail: start against a closed port, connect timeout 10 s: failed after {:.2} s naming the address|none|none|none",
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_new_durable_consumer_reads_the_stream_from_the_start_by_default() {
    let nats = nats().await;
    let name = unique("G8JS");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    for n in 0..3u8 {
        nats.publisher()
            .jetstream(&name, &Headers::new(), Bytes::from(vec![n]), None)
            .await
            .expect("publish");
    }
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            nats.consumer(&name, "new"),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(10), "the 3 earlier messages", || {
        script.count() == 3
    })
    .await;
    app.stop().await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            nats.consumer(&name, "latest").start_at(StartAt::Latest),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    nats.publisher()
        .jetstream(&name, &Headers::new(), Bytes::from_static(b"later"), None)
        .await
        .expect("publish");
    eventually(Duration::from_secs(10), "the later message", || {
        script.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let payloads: Vec<Vec<u8>> = script.calls().iter().map(|c| c.payload.to_vec()).collect();
    assert_eq!(payloads, vec![b"later".to_vec()], "the backlog skipped");
    app.stop().await;
    println!(
        "RELIABILITY|NATS JetStream|guard rail: a new subscription created after 3 messages were sent, default start position|lost 0 of 3 (StartAt::Earliest); with StartAt::Latest the 3 are skipped and a later one is read, as asked|none|none declared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_core_slow_consumer_drops_are_counted_and_reported() {
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL");
    let _ = nats().await; // captures logs
    let service = Nats::connect(&url).await.expect("connect");
    let subject = unique("g7drops");
    let script = Script::slow(Duration::from_millis(1), |_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(service.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .expect("start");
    service.client().flush().await.unwrap();
    let sender = Nats::connect(&url).await.expect("connect");
    let sent = 200_000usize;
    for n in 0..sent {
        sender
            .client()
            .publish(subject.clone(), Bytes::from(n.to_string()))
            .await
            .unwrap();
    }
    sender.client().flush().await.unwrap();
    eventually(Duration::from_secs(30), "drops reported", || {
        service.slow_consumer_drops() > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dropped = service.slow_consumer_drops();
    let on_subject = service.slow_consumer_drops_on(&subject);
    app.stop().await;
    let warning = logs()
        .lines()
        .find(|l| l.contains("Core NATS slow consumer"))
        .map(str::to_owned)
        .expect("reported at WARN");
    assert!(
        warning.contains(&subject),
        "the WARN names the subject: {warning}"
    );
    assert_eq!(
        on_subject, dropped,
        "every drop counted on the registration's subject"
    );
    println!(
        "RELIABILITY|NATS Core|guard rail: {sent} messages published at once to a 1 ms handler: the client's buffer overflows|at least {dropped} reported dropped on the subject (counted from the client's slow-consumer events, WARN naming the subject at most every 10 s)|none|none declared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_a_waiting_start_warns_once_per_interval_and_connects_when_the_server_comes() {
    let _ = nats().await; // captures logs
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL");
    let late = forward_later(
        url.trim_start_matches("nats://").to_owned(),
        Duration::from_secs(5),
    )
    .await;
    let address = format!("nats://{late}");
    let started = Instant::now();
    let nats = Nats::connect_waiting(&address, Duration::from_secs(2))
        .await
        .expect("connected once the server listens");
    let took = started.elapsed();
    let subject = unique("g7wait");
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(nats.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .expect("start");
    nats.client().flush().await.expect("flush");
    nats.client()
        .publish(subject, Bytes::from_static(b"after the wait"))
        .await
        .expect("publish");
    eventually(Duration::from_secs(10), "the message", || {
        script.count() == 1
    })
    .await;
    app.stop().await;
    let warnings = assert_waited(&address, took, Duration::from_secs(5));
    println!(
        "RELIABILITY|NATS Core and JetStream|guard rail: Nats::connect_waiting(warn every 2 s), server listening only after 5 s: connected after {:.1} s with {warnings} WARN line(s) naming the address, then a message handled|none|none|none",
        took.as_secs_f64()
    );
}

/// Issue #47 (G8): a new durable consumer started at a time reads only what the stream
/// stored at or after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_new_durable_consumer_started_at_a_time_reads_from_there() {
    let nats = nats().await;
    let name = unique("G8TIME");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    let send = |payload: &'static [u8]| {
        let (nats, name) = (nats.clone(), name.clone());
        async move {
            nats.publisher()
                .jetstream(&name, &Headers::new(), Bytes::from_static(payload), None)
                .await
                .expect("publish");
        }
    };
    send(b"before-1").await;
    send(b"before-2").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let at = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    send(b"after-1").await;
    send(b"after-2").await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            nats.consumer(&name, "timed").start_at(StartAt::Time(at)),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(10), "the 2 later messages", || {
        script.count() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.stop().await;
    let seen: Vec<Bytes> = script.calls().into_iter().map(|c| c.payload).collect();
    assert_eq!(seen, [&b"after-1"[..], &b"after-2"[..]]);
}

/// Issue #46: the "saturated" alert of docs/operating.md on JetStream: with handlers
/// that hang on every lane, in flight reaches `max_in_flight` (4 running and 1 waiting
/// for a lane) and stays there, fetching paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_jetstream_in_flight_reaches_max_in_flight_and_stays() {
    let nats = nats().await;
    let name = unique("G5SAT");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    for n in 0..20u8 {
        nats.publisher()
            .jetstream(&name, &Headers::new(), Bytes::from(vec![n]), None)
            .await
            .expect("publish");
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let hangs = {
        let gate = Arc::clone(&gate);
        move |_: ruststream::Delivery| {
            let gate = Arc::clone(&gate);
            async move {
                let _ = gate.acquire().await;
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .metrics()
        .register(
            on(nats.consumer(&name, "sat"), hangs)
                .lanes(4)
                .max_in_flight(5),
        )
        .start()
        .await
        .expect("start");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let in_flight =
            ruststream_test_support::ops::metric(&app, "ruststream_in_flight", &[]).await;
        assert!(in_flight <= 5.0, "in flight {in_flight} past the bound");
        if in_flight == 5.0 {
            break;
        }
        assert!(Instant::now() < deadline, "never at the bound");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let in_flight = ruststream_test_support::ops::metric(&app, "ruststream_in_flight", &[]).await;
    assert_eq!(in_flight, 5.0, "stays at the bound while the handlers hang");
    // And the "lanes busy" alert: every lane runs a handler.
    let running = ruststream_test_support::ops::metric(&app, "ruststream_running", &[]).await;
    assert_eq!(running, 4.0, "all 4 lanes run");
    gate.add_permits(100);
    app.stop().await;
}

/// 25 messages to one lane of 200 ms handlers behind a 1 s `ack_wait`: the last starts
/// after 5 s. Any delivery waiting in the client's buffer (pulled, not yet taken by the
/// runtime) and not kept alive would outwait its `ack_wait` and come again. Each is
/// handled once, with `max_in_flight` as given (`None`: the default).
async fn one_slow_lane_handles_each_once(max_in_flight: Option<usize>) {
    let nats = nats().await;
    let name = unique("G5JS");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    let sent = 25u32;
    for n in 0..sent {
        nats.publisher()
            .jetstream(&name, &Headers::new(), Bytes::from(n.to_string()), None)
            .await
            .expect("publish");
    }
    let script = Script::slow(Duration::from_millis(200), |_| HandlerOutcome::ack());
    let mut registration = on(
        nats.consumer(&name, "slow")
            .ack_wait(Duration::from_secs(1)),
        handler(Arc::clone(&script)),
    )
    .lanes(1);
    if let Some(most) = max_in_flight {
        registration = registration.max_in_flight(most);
    }
    let app = App::new()
        .register(registration)
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(30), "every message handled", || {
        script.count() >= sent as usize
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    app.stop().await;
    let mut payloads: Vec<Vec<u8>> = script.calls().iter().map(|c| c.payload.to_vec()).collect();
    let handled = payloads.len();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), sent as usize, "every message handled");
    assert_eq!(handled, sent as usize, "none handled twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_jetstream_is_sent_no_more_than_max_in_flight_so_nothing_outwaits_ack_wait() {
    one_slow_lane_handles_each_once(Some(4)).await;
}

/// With the defaults (`max_in_flight` 1,024, pull batch 200) the runtime holds one
/// running delivery and one waiting for the lane, not `max_in_flight`: what the client
/// pulled ahead is kept alive meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_n1_jetstream_defaults_keep_what_was_pulled_ahead_from_outwaiting_ack_wait() {
    one_slow_lane_handles_each_once(None).await;
}
