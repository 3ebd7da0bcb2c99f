//! What the modules of this test binary share: a stream and its dead-letter stream of a
//! test's own (`Setup`), and starting an app.

use crate::common::{create_stream, nats, unique};
use bytes::Bytes;
use ruststream::{App, Headers, Running};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{consumer, stream::Stream};

pub(crate) struct Setup {
    pub(crate) nats: Nats,
    pub(crate) base: String,
    pub(crate) stream: Stream,
    pub(crate) dead_stream: Stream,
}

impl Setup {
    pub(crate) async fn new(prefix: &str) -> Self {
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

    pub(crate) fn subject(&self) -> String {
        format!("{}.in", self.base)
    }

    pub(crate) fn dead(&self) -> String {
        format!("{}.dead", self.base)
    }

    pub(crate) fn consumer(&self) -> ruststream_nats::JetStreamConsumer {
        self.nats.consumer(&self.base, "worker")
    }

    pub(crate) async fn publish(&self, payload: &'static [u8], headers: &Headers) -> u64 {
        self.nats
            .publisher()
            .jetstream(&self.subject(), headers, Bytes::from_static(payload), None)
            .await
            .expect("publish")
            .sequence
    }

    pub(crate) async fn info(&self) -> consumer::Info {
        self.stream
            .consumer_info("worker")
            .await
            .expect("consumer info")
    }

    pub(crate) async fn messages(stream: &Stream) -> u64 {
        let mut stream = stream.clone();
        stream.info().await.expect("stream info").state.messages
    }
}

pub(crate) async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}
