//! The memory broker and NATS agree on every statement both can express: the same
//! scenario runs on both and must be observed the same way. The memory broker's native
//! mode stands beside JetStream (the broker counts and delays), its `runtime_retries`
//! mode beside Core NATS (the runtime copies and counts in the header).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{Script, create_stream, eventually, handler, nats, unique};
use futures_util::StreamExt;
use ruststream::core::Descriptor;
use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Headers, RETRY_COUNT_HEADER, on};
use ruststream_nats::Nats;

/// What a scenario observed.
#[derive(Debug, PartialEq)]
struct Observed {
    attempts: Vec<u32>,
    retry_headers: Vec<Option<String>>,
    dead_letters: Vec<Bytes>,
}

type Publish = Box<dyn Fn(Bytes) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;
type DeadLetters = Arc<Mutex<Vec<Bytes>>>;

/// Runs `decide` on one message under max_attempts(3) with a dead letter, until `calls`
/// handler runs happened and (if `dead` > 0) the dead letters arrived.
async fn scenario<D: Descriptor>(
    descriptor: D,
    dead_address: String,
    publish: Publish,
    dead_letters: DeadLetters,
    decide: fn(u32) -> HandlerOutcome,
    calls: usize,
    dead: usize,
) -> Observed {
    let script = Script::new(move |d| decide(d.attempt().number()));
    let running = App::new()
        .register(
            on(descriptor, handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(dead_address),
        )
        .start()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    publish(Bytes::from_static(b"same payload")).await;
    eventually(Duration::from_secs(10), "the calls", || {
        script.count() >= calls
    })
    .await;
    eventually(Duration::from_secs(10), "the dead letters", || {
        dead_letters.lock().unwrap().len() >= dead
    })
    .await;
    // Nothing more may happen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    let seen = script.calls();
    Observed {
        attempts: seen.iter().map(|c| c.attempt).collect(),
        retry_headers: seen
            .iter()
            .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
            .collect(),
        dead_letters: dead_letters.lock().unwrap().clone(),
    }
}

fn memory_world(broker: &MemoryBroker) -> (Publish, DeadLetters, String, String) {
    let subject = unique("mem");
    let dead = format!("{subject}.dead");
    let letters: DeadLetters = Arc::default();
    // The memory broker keeps what was published; a reader of the dead-letter address
    // collects it as a NATS subscriber would.
    let reader = broker.clone();
    let (sink, address) = (Arc::clone(&letters), dead.clone());
    tokio::spawn(async move {
        loop {
            let published = reader.published(&address);
            *sink.lock().unwrap() = published.into_iter().map(|m| m.payload).collect();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let publisher = broker.publisher();
    let to = subject.clone();
    let publish: Publish = Box::new(move |payload| {
        let publisher = publisher.clone();
        let to = to.clone();
        Box::pin(async move { publisher.to(to).send_bytes(payload).await.unwrap() })
    });
    (publish, letters, subject, dead)
}

async fn core_world(nats: &Nats) -> (Publish, DeadLetters, String, String) {
    let subject = unique("core");
    let dead = format!("{subject}.dead");
    let letters: DeadLetters = Arc::default();
    let mut sub = nats.client().subscribe(dead.clone()).await.unwrap();
    let sink = Arc::clone(&letters);
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            sink.lock().unwrap().push(m.payload);
        }
    });
    let publisher = nats.publisher();
    let to = subject.clone();
    let publish: Publish = Box::new(move |payload| {
        let publisher = publisher.clone();
        let to = to.clone();
        Box::pin(async move { publisher.core(&to, &Headers::new(), payload).await.unwrap() })
    });
    (publish, letters, subject, dead)
}

async fn jetstream_world(nats: &Nats) -> (Publish, DeadLetters, String, String) {
    let base = unique("AGREE");
    let subject = format!("{base}.in");
    let dead = format!("{base}.dead");
    create_stream(nats, &base, std::slice::from_ref(&subject)).await;
    let letters: DeadLetters = Arc::default();
    let mut sub = nats.client().subscribe(dead.clone()).await.unwrap();
    let sink = Arc::clone(&letters);
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            sink.lock().unwrap().push(m.payload);
        }
    });
    let publisher = nats.publisher();
    let to = subject.clone();
    let publish: Publish = Box::new(move |payload| {
        let publisher = publisher.clone();
        let to = to.clone();
        Box::pin(async move {
            publisher
                .jetstream(&to, &Headers::new(), payload, None)
                .await
                .unwrap();
        })
    });
    (publish, letters, base, dead)
}

fn always_retry(_: u32) -> HandlerOutcome {
    HandlerOutcome::retry()
}

fn retry_after_once(attempt: u32) -> HandlerOutcome {
    if attempt == 1 {
        HandlerOutcome::retry_after(Duration::from_millis(100))
    } else {
        HandlerOutcome::ack()
    }
}

fn drop_it(_: u32) -> HandlerOutcome {
    HandlerOutcome::drop()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_memory_and_jetstream_agree_on_cap_and_dead_letter() {
    let nats = nats().await;
    let broker = MemoryBroker::recording();
    let (p, d, subject, dead) = memory_world(&broker);
    let memory = scenario(broker.topic(subject), dead, p, d, always_retry, 3, 1).await;
    let (p, d, stream, dead) = jetstream_world(&nats).await;
    let js = scenario(
        nats.consumer(&stream, "agree"),
        dead,
        p,
        d,
        always_retry,
        3,
        1,
    )
    .await;
    assert_eq!(memory.attempts, vec![1, 2, 3]);
    assert_eq!(
        memory.dead_letters,
        vec![Bytes::from_static(b"same payload")]
    );
    assert_eq!(memory, js);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_memory_runtime_retries_and_core_agree_on_cap_header_and_dead_letter() {
    let nats = nats().await;
    let broker = MemoryBroker::recording();
    let (p, d, subject, dead) = memory_world(&broker);
    let memory = scenario(
        broker.topic(subject).runtime_retries(),
        dead,
        p,
        d,
        always_retry,
        3,
        1,
    )
    .await;
    let (p, d, subject, dead) = core_world(&nats).await;
    let core = scenario(nats.subject(subject), dead, p, d, always_retry, 3, 1).await;
    assert_eq!(
        memory.retry_headers,
        vec![None, Some("1".into()), Some("2".into())]
    );
    assert_eq!(memory, core);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_memory_and_jetstream_agree_on_retry_after_and_drop() {
    let nats = nats().await;
    for (decide, calls) in [
        (retry_after_once as fn(u32) -> HandlerOutcome, 2),
        (drop_it, 1),
    ] {
        let broker = MemoryBroker::recording();
        let (p, d, subject, dead) = memory_world(&broker);
        let memory = scenario(broker.topic(subject), dead, p, d, decide, calls, 0).await;
        let (p, d, stream, dead) = jetstream_world(&nats).await;
        let js = scenario(
            nats.consumer(&stream, "agree"),
            dead,
            p,
            d,
            decide,
            calls,
            0,
        )
        .await;
        assert_eq!(memory.attempts.len(), calls);
        assert_eq!(memory, js);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n3_memory_runtime_retries_and_core_agree_on_retry_after() {
    let nats = nats().await;
    let broker = MemoryBroker::recording();
    let (p, d, subject, dead) = memory_world(&broker);
    let memory = scenario(
        broker.topic(subject).runtime_retries(),
        dead,
        p,
        d,
        retry_after_once,
        2,
        0,
    )
    .await;
    let (p, d, subject, dead) = core_world(&nats).await;
    let core = scenario(nats.subject(subject), dead, p, d, retry_after_once, 2, 0).await;
    assert_eq!(memory.retry_headers, vec![None, Some("1".into())]);
    assert_eq!(memory, core);
}
