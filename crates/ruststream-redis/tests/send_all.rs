//! `send_all` against the redis-server the test command starts: one pipeline of `XADD`s,
//! a result for each message, a refused one naming its own stream.

use ruststream::Publisher;
use ruststream::core::{Outgoing, PublishErrorKind};
use ruststream_redis::redis;
use ruststream_test_support::unique_suffix;

mod common;
use common::redis;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_answers_each_message_and_names_the_refused_ones_stream() {
    let redis = redis().await;
    let suffix = unique_suffix();
    let (a, b, plain) = (
        format!("send-all-a-{suffix}"),
        format!("send-all-b-{suffix}"),
        format!("send-all-string-{suffix}"),
    );
    let mut connection = redis.connection();
    let () = redis::cmd("SET")
        .arg(&plain)
        .arg("not a stream")
        .query_async(&mut connection)
        .await
        .expect("SET");
    let mut payload_header = Outgoing::new(a.as_str(), "shadowed");
    payload_header.headers.append("payload", "x");
    let messages = [
        Outgoing::new(a.as_str(), "a1"),
        Outgoing::new(b.as_str(), "b1"),
        payload_header,
        Outgoing::new(plain.as_str(), "wrong type"),
        Outgoing::new(a.as_str(), "a2"),
    ];
    let results = Publisher::new(redis.publish_handle())
        .send_all(messages)
        .await;
    assert_eq!(results.len(), 5);
    let refused = |i: usize, stream: &str, kind: PublishErrorKind| {
        let e = results[i].as_ref().expect_err("refused");
        assert!(e.to_string().contains(stream), "{e}");
        assert_eq!(e.kind(), kind, "{e}");
    };
    refused(2, &a, PublishErrorKind::Encode);
    refused(3, &plain, PublishErrorKind::Rejected);
    for i in [0, 1, 4] {
        assert!(results[i].is_ok(), "message {i}: {:?}", results[i]);
    }
    for (stream, expected) in [(&a, vec!["a1", "a2"]), (&b, vec!["b1"])] {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .expect("XRANGE");
        let payloads: Vec<&str> = entries
            .iter()
            .map(|(_, fields)| fields[0].1.as_str())
            .collect();
        assert_eq!(payloads, expected, "{stream}");
    }
}

/// An empty stream name (an unset setting, say) is refused, not written under the key
/// "" (which Redis would take), and the call's other messages go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_stream_name_is_refused_and_the_others_go_out() {
    let redis = redis().await;
    let stream = format!("send-all-empty-{}", unique_suffix());
    let mut connection = redis.connection();
    let before = entries_under_the_empty_key(&mut connection).await;
    let messages = [
        Outgoing::new("", "to nowhere"),
        Outgoing::new(stream.as_str(), "1"),
    ];
    let results = Publisher::new(redis.publish_handle())
        .send_all(messages)
        .await;
    let refused = results[0].as_ref().expect_err("an empty stream name");
    assert_eq!(refused.kind(), PublishErrorKind::Rejected, "{refused}");
    assert!(refused.to_string().contains("empty"), "{refused}");
    assert!(results[1].is_ok(), "{:?}", results[1]);
    assert_eq!(
        entries_under_the_empty_key(&mut connection).await,
        before,
        "nothing added under the key \"\""
    );
}

async fn entries_under_the_empty_key(connection: &mut redis::aio::ConnectionManager) -> usize {
    redis::cmd("XLEN")
        .arg("")
        .query_async(connection)
        .await
        .expect("XLEN")
}
