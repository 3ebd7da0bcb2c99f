//! K7: records kept whole in the client's queue: headers read on request, payloads
//! decoded in place, copies carrying their bytes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{
    committed_becomes, create_topic, eventually, kafka, logs, produce, read_topic, topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, RETRY_COUNT_HEADER, on};
use ruststream_kafka::Commit;

use crate::support::start;

/// Records waiting in the client's queue are kept whole and their headers read only when
/// asked: what a handler's `Headers` and `Attempt` see is what was produced, the attempt
/// is the retry-count header's (K7, D4), and a malformed count reads as the first attempt
/// and is logged, as when the headers were read at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_headers_read_on_request_are_the_records_own() {
    let kafka = kafka().await;
    let (t, group) = (unique("lazyhdr"), unique("g"));
    create_topic(&t, 1).await;
    let mut counted = Headers::new();
    counted
        .insert(RETRY_COUNT_HEADER, "2")
        .insert("trace", "abc");
    let mut malformed = Headers::new();
    malformed.insert(RETRY_COUNT_HEADER, "bogus");
    // Produced before the app starts: a backlog the consumer finds in its queue.
    for (payload, headers) in [
        (&b"counted"[..], &counted),
        (b"plain", &Headers::new()),
        (b"malformed", &malformed),
        (b"unread", &counted),
    ] {
        produce(&kafka, &t, None, payload, headers).await;
    }
    type Seen = Arc<Mutex<Vec<(String, u32, Option<String>, usize)>>>;
    let seen: Seen = Arc::default();
    let app = start(App::new().state(Arc::clone(&seen)).register(on(
        topic(&kafka, &t, &group, Commit::Tracked),
        async |ruststream::Payload(payload): ruststream::Payload,
               headers: Option<Headers>,
               attempt: Option<ruststream::Attempt>,
               ruststream::State(seen): ruststream::State<Seen>| {
            let payload = String::from_utf8_lossy(&payload).into_owned();
            // The last one asks for nothing: it is acked without its headers read.
            if payload != "unread" {
                let headers = headers.expect("headers");
                let trace = headers
                    .get("trace")
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                let attempt = attempt.expect("attempt").number();
                seen.lock()
                    .unwrap()
                    .push((payload, attempt, trace, headers.len()));
            } else {
                seen.lock().unwrap().push((payload, 0, None, 0));
            }
            HandlerOutcome::ack()
        },
    )))
    .await;
    eventually(Duration::from_secs(30), "all four handled", || {
        seen.lock().unwrap().len() == 4
    })
    .await;
    committed_becomes(&group, &t, 0, 4, Duration::from_secs(10)).await;
    app.stop().await;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("counted".to_owned(), 3, Some("abc".to_owned()), 2),
            ("plain".to_owned(), 1, None, 0),
            ("malformed".to_owned(), 1, None, 1),
            ("unread".to_owned(), 0, None, 0),
        ]
    );
    assert!(
        logs().contains("counting it as the first attempt"),
        "the malformed count is logged when read"
    );
}

/// Records found in the client's queue are kept whole and decoded where they are; what
/// leaves the handler with them (a delayed copy, a dead letter) carries their bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_a_record_kept_whole_is_decoded_in_place_and_its_copies_carry_its_bytes() {
    #[derive(serde::Deserialize)]
    struct N {
        n: u32,
    }
    let kafka = kafka().await;
    let (t, dead, group) = (unique("inplace"), unique("inplacedead"), unique("g"));
    create_topic(&t, 1).await;
    create_topic(&dead, 1).await;
    // A backlog the consumer finds in its queue.
    for payload in [&b"{\"n\":1}"[..], b"{\"n\":2}", b"\x00not json\xff"] {
        produce(&kafka, &t, None, payload, &Headers::new()).await;
    }
    type Seen = Arc<Mutex<Vec<(u32, u32)>>>;
    let seen: Seen = Arc::default();
    let app = start(
        App::new().state(Arc::clone(&seen)).register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                async |ruststream::Message(N { n }): ruststream::Message<N>,
                       attempt: ruststream::Attempt,
                       ruststream::State(seen): ruststream::State<Seen>| {
                    seen.lock().unwrap().push((n, attempt.number()));
                    if n == 2 && attempt.number() == 1 {
                        HandlerOutcome::retry_after(Duration::from_millis(200))
                    } else {
                        HandlerOutcome::ack()
                    }
                },
            )
            .max_attempts(3)
            .dead_letter(&dead),
        ),
    )
    .await;
    let letters = read_topic(&dead, 1, 1, Duration::from_secs(30)).await;
    assert_eq!(letters.len(), 1, "the undecodable record, dead-lettered");
    assert_eq!(&letters[0].payload[..], b"\x00not json\xff");
    eventually(Duration::from_secs(30), "the copy is handled", || {
        seen.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), [(1, 1), (2, 1), (2, 2)]);
    let records = read_topic(&t, 1, 4, Duration::from_secs(10)).await;
    let copy = records.iter().find(|r| r.offset == 3).expect("the copy");
    assert_eq!(&copy.payload[..], b"{\"n\":2}", "the delayed copy's bytes");
    assert_eq!(copy.header(RETRY_COUNT_HEADER), Some("1"));
    committed_becomes(&group, &t, 0, 4, Duration::from_secs(10)).await;
    app.stop().await;
}
