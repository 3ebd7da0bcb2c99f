//! JetStream against a real nats-server: SPEC N1, N4-N7 and the beyond-the-seeds items,
//! observed on the server's side (consumer info, stream contents).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Script, create_stream, eventually, handler, logs, nats, own_server, unique};
use ruststream::{App, HandlerOutcome, Headers, Running, StartError, on};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, consumer, stream::Stream};

struct Setup {
    nats: Nats,
    base: String,
    stream: Stream,
    dead_stream: Stream,
}

impl Setup {
    async fn new(prefix: &str) -> Self {
        let nats = nats().await;
        let base = unique(prefix);
        let stream = create_stream(&nats, &base, &[format!("{base}.in")]).await;
        let dead_stream =
            create_stream(&nats, &format!("{base}_DEAD"), &[format!("{base}.dead")]).await;
        Self {
            nats,
            base,
            stream,
            dead_stream,
        }
    }

    fn subject(&self) -> String {
        format!("{}.in", self.base)
    }

    fn dead(&self) -> String {
        format!("{}.dead", self.base)
    }

    fn consumer(&self) -> ruststream_nats::JetStreamConsumer {
        self.nats.consumer(&self.base, "worker")
    }

    async fn publish(&self, payload: &'static [u8], headers: &Headers) -> u64 {
        self.nats
            .publisher()
            .jetstream(&self.subject(), headers, Bytes::from_static(payload), None)
            .await
            .expect("publish")
            .sequence
    }

    async fn info(&self) -> consumer::Info {
        self.stream
            .consumer_info("worker")
            .await
            .expect("consumer info")
    }

    async fn messages(stream: &Stream) -> u64 {
        let mut stream = stream.clone();
        stream.info().await.expect("stream info").state.messages
    }
}

async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_ack_sends_plus_ack_and_is_never_redelivered() {
    let s = Setup::new("N1ACK").await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        s.consumer().ack_wait(Duration::from_millis(500)),
        handler(Arc::clone(&script)),
    )))
    .await;
    let seq = s.publish(b"one", &Headers::new()).await;
    eventually(Duration::from_secs(5), "handled", || script.count() == 1).await;
    let mut info = s.info().await;
    for _ in 0..50 {
        if info.ack_floor.stream_sequence == seq {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        info = s.info().await;
    }
    assert_eq!(
        info.ack_floor.stream_sequence, seq,
        "the ack floor moved past it"
    );
    assert_eq!(info.num_ack_pending, 0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(script.count(), 1, "never sent again, even after ack_wait");
    assert_eq!(script.calls()[0].attempt, 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_retry_sends_nak_and_the_same_sequence_comes_back_at_once_delivered_plus_one() {
    let s = Setup::new("N1NAK").await;
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(s.consumer(), handler(Arc::clone(&script))))).await;
    let seq = s.publish(b"again", &Headers::new()).await;
    eventually(Duration::from_secs(5), "redelivered", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(
        calls.iter().all(|c| c.sequence == Some(seq)),
        "same stream sequence"
    );
    assert!(
        calls[1].at - calls[0].at < Duration::from_secs(5),
        "at once, not after ack_wait (30 s)"
    );
    app.stop().await;
    let info = s.info().await;
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(
        info.num_redelivered, 0,
        "nothing left waiting for redelivery"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_retry_after_sends_nak_with_delay_redelivered_no_earlier_and_nothing_published() {
    let s = Setup::new("N1DELAY").await;
    let delay = Duration::from_millis(800);
    let script = Script::new(move |d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(delay)
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(s.consumer(), handler(Arc::clone(&script))))).await;
    let seq = s.publish(b"later", &Headers::new()).await;
    eventually(Duration::from_secs(10), "redelivered", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert!(
        calls[1].at - calls[0].at >= delay,
        "came back after {:?}",
        calls[1].at - calls[0].at
    );
    assert_eq!((calls[1].attempt, calls[1].sequence), (2, Some(seq)));
    assert_eq!(Setup::messages(&s.stream).await, 1, "no copy was published");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_drop_sends_term_and_is_never_redelivered() {
    use futures_util::StreamExt;

    let s = Setup::new("N1TERM").await;
    // The server announces each +TERM (an +ACK would not be): what tells drop from ack.
    let mut terminated = s
        .nats
        .client()
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{}.worker",
            s.base
        ))
        .await
        .expect("advisories");
    let script = Script::new(|_| HandlerOutcome::drop());
    let app = start(App::new().register(on(
        s.consumer().ack_wait(Duration::from_millis(400)),
        handler(Arc::clone(&script)),
    )))
    .await;
    let seq = s.publish(b"unwanted", &Headers::new()).await;
    eventually(Duration::from_secs(5), "handled", || script.count() == 1).await;
    let advisory = tokio::time::timeout(Duration::from_secs(5), terminated.next())
        .await
        .expect("a MSG_TERMINATED advisory: the server got +TERM")
        .expect("subscribed");
    let advisory: serde_json::Value =
        serde_json::from_slice(&advisory.payload).expect("a JSON advisory");
    assert_eq!(advisory["stream_seq"], seq, "{advisory}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(script.count(), 1, "+TERM: never sent again");
    assert_eq!(s.info().await.num_ack_pending, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n4_no_outcome_is_redelivered_after_ack_wait_and_counts_as_an_attempt() {
    let s = Setup::new("N4WAIT").await;
    let ack_wait = Duration::from_secs(1);
    // Attempt 1 outlives ack_wait. With the keepalive on (the default) the handler
    // deadline is what ends it (D3, G1): no `+WPI` past it, so it comes back as the next
    // attempt, no earlier than ack_wait.
    let script = Script::new(|_| HandlerOutcome::ack());
    let slow_first = {
        let script = Arc::clone(&script);
        move |d: ruststream::Delivery| {
            let script = Arc::clone(&script);
            async move {
                let first = d.attempt().number() == 1;
                let outcome = handler(script)(d).await;
                if first {
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                }
                outcome
            }
        }
    };
    let app = start(
        App::new().register(
            on(s.consumer().ack_wait(ack_wait), slow_first)
                .lanes(2)
                .timeout(ack_wait),
        ),
    )
    .await;
    let seq = s.publish(b"slow", &Headers::new()).await;
    eventually(
        Duration::from_secs(10),
        "redelivered after ack_wait",
        || script.count() == 2,
    )
    .await;
    let calls = script.calls();
    assert_eq!(
        calls[1].attempt, 2,
        "the server's delivered counts the expiry"
    );
    assert_eq!(calls[1].sequence, Some(seq));
    assert!(calls[1].at - calls[0].at >= ack_wait - Duration::from_millis(50));
    app.stop().await;
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n5_below_the_cap_naks_with_the_delay_and_copies_nothing() {
    let s = Setup::new("N5").await;
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_millis(200)));
    let app = start(
        App::new().register(
            on(s.consumer(), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(s.dead()),
        ),
    )
    .await;
    let seq = s.publish(b"x", &Headers::new()).await;
    eventually(Duration::from_secs(10), "three attempts", || {
        script.count() == 3
    })
    .await;
    let calls = script.calls();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(calls.iter().all(|c| c.sequence == Some(seq)));
    assert!(
        calls
            .windows(2)
            .all(|w| w[1].at - w[0].at >= Duration::from_millis(200))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while Setup::messages(&s.dead_stream).await == 0 {
        assert!(Instant::now() < deadline, "no dead letter at the cap");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.stop().await;
    assert_eq!(
        Setup::messages(&s.stream).await,
        1,
        "the stream holds only the original"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_at_the_cap_the_dead_letter_is_byte_identical_and_the_original_terminated() {
    let s = Setup::new("N6DLQ").await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                s.consumer().ack_wait(Duration::from_millis(500)),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2)
            .dead_letter(s.dead()),
        ),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "abc-123").insert("tenant", "eu");
    s.publish(b"\x00\x01not json\xff", &headers).await;
    let dead_stream = s.dead_stream.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Setup::messages(&dead_stream).await == 0 {
        assert!(Instant::now() < deadline, "no dead letter stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dead = dead_stream.get_raw_message(1).await.expect("dead letter");
    assert_eq!(&dead.payload[..], b"\x00\x01not json\xff");
    assert_eq!(
        dead.headers.get("trace").map(|v| v.as_str()),
        Some("abc-123")
    );
    assert_eq!(dead.headers.get("tenant").map(|v| v.as_str()), Some("eu"));
    // Nothing lost or changed; what is added says why, under its own prefix (D6).
    let added = dead
        .headers
        .iter()
        .filter(|(name, _)| {
            AsRef::<str>::as_ref(name).starts_with(ruststream::core::DEAD_LETTER_PREFIX)
        })
        .count();
    assert_eq!(
        dead.headers.len() - added,
        2,
        "no header of its own added or lost"
    );
    assert_eq!(
        dead.headers
            .get(ruststream::core::DEAD_LETTER_REASON)
            .map(|v| v.as_str()),
        Some("retry()")
    );
    assert_eq!(
        dead.headers
            .get(ruststream::core::DEAD_LETTER_SEQUENCE)
            .map(|v| v.as_str()),
        Some("1"),
        "the original's stream sequence"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        script.count(),
        2,
        "terminated after the dead letter: never redelivered"
    );
    assert_eq!(s.info().await.num_ack_pending, 0);
    assert_eq!(
        Setup::messages(&dead_stream).await,
        1,
        "exactly one dead letter"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_at_the_cap_without_dead_letter_sends_term() {
    let s = Setup::new("N6TERM").await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                s.consumer().ack_wait(Duration::from_millis(400)),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2),
        ),
    )
    .await;
    s.publish(b"x", &Headers::new()).await;
    eventually(Duration::from_secs(5), "two attempts", || {
        script.count() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(script.count(), 2);
    assert_eq!(s.info().await.num_ack_pending, 0);
    assert_eq!(Setup::messages(&s.dead_stream).await, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n7_the_consumer_has_no_max_deliver() {
    let s = Setup::new("N7").await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new().register(
            on(s.consumer(), handler(script))
                .max_attempts(3)
                .dead_letter(s.dead()),
        ),
    )
    .await;
    let info = s.info().await;
    assert!(
        info.config.max_deliver <= 0,
        "max_deliver is {}",
        info.config.max_deliver
    );
    assert_eq!(info.config.ack_policy, consumer::AckPolicy::Explicit);
    app.stop().await;
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_ack_reports_a_settlement_the_server_did_not_take() {
    let s = Setup::new("DOUBLE").await;
    let js = jetstream::new(s.nats.client().clone());
    let base = s.base.clone();
    // The handler removes its own consumer, so no server takes the ack.
    let removes_consumer = move |_d: ruststream::Delivery| {
        let js = js.clone();
        let base = base.clone();
        async move {
            js.delete_consumer_from_stream("worker", &base)
                .await
                .expect("delete consumer");
            HandlerOutcome::ack()
        }
    };
    let app = start(App::new().register(on(s.consumer().double_ack(true), removes_consumer))).await;
    s.publish(b"x", &Headers::new()).await;
    eventually(
        Duration::from_secs(10),
        "the failed settlement is logged",
        || logs().contains("settlement failed"),
    )
    .await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_publish_waits_for_the_ack_and_deduplicates_by_msg_id() {
    let s = Setup::new("DEDUP").await;
    let publisher = s.nats.publisher();
    let payload = Bytes::from_static(b"once");
    let first = publisher
        .jetstream(
            &s.subject(),
            &Headers::new(),
            payload.clone(),
            Some("order-1"),
        )
        .await
        .unwrap();
    let second = publisher
        .jetstream(&s.subject(), &Headers::new(), payload, Some("order-1"))
        .await
        .unwrap();
    assert_eq!(first.stream, s.base);
    assert!(!first.duplicate && second.duplicate);
    assert_eq!(second.sequence, first.sequence);
    assert_eq!(Setup::messages(&s.stream).await, 1);
}

/// The one publishing shape (`ruststream::Publisher`) on JetStream: the message id as a
/// typed option deduplicates like `jetstream(.., Some(id))`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_common_publisher_deduplicates_by_the_message_id_option() {
    let s = Setup::new("COMMONPUB").await;
    let publisher = ruststream::Publisher::new(s.nats.publish_handle());
    for _ in 0..2 {
        publisher
            .to(s.subject())
            .header("h", "v")
            .with(ruststream_nats::MessageId("order-1".to_owned()))
            .send_bytes(Bytes::from_static(b"once"))
            .await
            .unwrap();
    }
    assert_eq!(Setup::messages(&s.stream).await, 1);
}

/// A server that completes the handshake and answers pings, and answers nothing else:
/// every JetStream API request to it goes unanswered.
async fn silent_server() -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let info = format!(
                    "INFO {{\"server_id\":\"silent\",\"version\":\"2.15.1\",\"host\":\"127.0.0.1\",\"port\":{},\"headers\":true,\"max_payload\":1048576,\"proto\":1}}\r\n",
                    address.port()
                );
                if write.write_all(info.as_bytes()).await.is_err() {
                    return;
                }
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.starts_with("PING") && write.write_all(b"PONG\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("nats://{address}")
}

/// N6: a dead letter (or any publish through the `Publish` contract) asks the server
/// whether a stream captures its subject. When no answer comes, the publish fails (so
/// the original is not settled) instead of going out on Core NATS, where nothing keeps
/// it and a flush would have "confirmed" it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_an_unanswered_stream_lookup_fails_the_publish() {
    let nats = Nats::connect(&silent_server().await)
        .await
        .expect("the handshake completes");
    let publisher = ruststream::Publisher::new(nats.publish_handle());
    let sent = publisher
        .publish(ruststream::Outgoing::new(
            "orders.dead",
            Bytes::from_static(b"letter"),
        ))
        .await;
    let error = sent.expect_err("an unanswered lookup is not a Core publish");
    assert_eq!(error.address(), "orders.dead");
    assert!(
        error.to_string().contains("whether a stream captures"),
        "{error}"
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

/// A server without JetStream answers the stream lookup with "no responders": that is an
/// answer, so a publish through the `Publish` contract goes out on Core NATS and arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_publishing_on_a_server_without_jetstream_goes_core() {
    let server = own_server::<&str>(&[]).await;
    let nats = Nats::connect(&format!("nats://{}", server.address))
        .await
        .expect("nats-server without JetStream answers");
    let mut subscriber = nats
        .client()
        .subscribe("plain.subject")
        .await
        .expect("subscribe");
    nats.client().flush().await.expect("flush");
    let publisher = ruststream::Publisher::new(nats.publish_handle());
    for _ in 0..2 {
        // The second publish uses the remembered answer.
        publisher
            .publish(ruststream::Outgoing::new(
                "plain.subject",
                Bytes::from_static(b"core"),
            ))
            .await
            .expect("a server without JetStream takes a Core publish");
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            futures_util::StreamExt::next(&mut subscriber),
        )
        .await
        .expect("delivered within 5 s")
        .expect("subscription open");
        assert_eq!(&got.payload[..], b"core");
    }
}
