//! Redis (S8): two restarts of a redis-server of the test's own.

use std::path::PathBuf;
use std::sync::Arc;

use ruststream::Headers;
use ruststream_faults::{free_port, unique};
use ruststream_redis::Redis;

use crate::support::{Broker, Process, Send, data_dir, path, two_restarts};

/// S8: redis-server SIGKILLed and restarted twice with the append-only file fsynced on
/// every write: every entry whose XADD Redis confirmed is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_redis_two_server_restarts_lose_no_confirmed_message() {
    let port = free_port();
    let data = data_dir("redis-restart");
    let broker = Process::start(
        PathBuf::from("redis-server"),
        vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            path(&data),
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "always".into(),
            "--save".into(),
            String::new(),
        ],
        port,
    )
    .await;
    let url = format!("redis://127.0.0.1:{port}");
    let redis = Redis::connect(&url).await.expect("connect");
    let key = unique("restart");
    let publisher = redis.publisher();
    let send: Send = {
        let key = key.clone();
        Arc::new(move |id: String| {
            let (publisher, key) = (publisher.clone(), key.clone());
            // Confirmed by Redis's reply (on disk: appendfsync always); sent again when not.
            Box::pin(async move {
                publisher
                    .send(&key, &Headers::new(), id.as_bytes())
                    .await
                    .is_ok()
            })
        })
    };
    two_restarts(
        "Redis Streams",
        "redis-server (appendfsync always) SIGKILLed and restarted",
        Broker::Process(Box::new(broker)),
        &["redis", &url, &key, "worker", "ack"],
        send,
        None,
    )
    .await;
    let _ = std::fs::remove_dir_all(&data);
}
