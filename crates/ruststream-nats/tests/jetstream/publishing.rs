//! N2, N6: JetStream publishing: waiting for the ack, deduplicating by message id, an
//! unanswered stream lookup, and a server without JetStream.

use std::time::Duration;

use crate::common::own_server;
use bytes::Bytes;
use ruststream::Headers;
use ruststream_nats::Nats;

use crate::support::Setup;

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
