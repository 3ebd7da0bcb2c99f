//! The ops endpoint over HTTP/1.1, served by hyper on a task of its own.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Ops;
use crate::asyncapi::{BUNDLE_PATH, STYLES_PATH};

/// Connections held at most: one more is closed at once, unread (a probe or a scrape
/// needs one or two; a client that opens thousands gets no more than this).
pub(crate) const MAX_CONNECTIONS: usize = 128;

/// A connection with no request for this long is closed (a request in progress is
/// finished first): an idle client cannot hold a connection, nor a slot of the limit.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves until the task is aborted (when the app's subscriptions have all ended).
pub(crate) async fn serve(listener: TcpListener, ops: Arc<Ops>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: say so, pause, go on.
                tracing::warn!(%error, "ops endpoint: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(
                limit = MAX_CONNECTIONS,
                "ops endpoint: connection limit reached; closing a new connection"
            );
            drop(stream);
            continue;
        };
        tokio::spawn(connection(stream, Arc::clone(&ops), slot));
    }
}

/// Serves one connection until the client closes it or it idles for [`IDLE_TIMEOUT`].
async fn connection(stream: TcpStream, ops: Arc<Ops>, _slot: OwnedSemaphorePermit) {
    let last = Arc::new(Mutex::new(Instant::now()));
    let seen = Arc::clone(&last);
    let service = service_fn(move |request| {
        *seen.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        answer(Arc::clone(&ops), request)
    });
    let serving = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let mut serving = std::pin::pin!(serving);
    // Idle: shut down gracefully (at once when no request runs); a connection that still
    // has not ended an idle timeout later (a request trickling in) is dropped.
    let mut shut_at: Option<Instant> = None;
    loop {
        let due = match shut_at {
            Some(at) => at + IDLE_TIMEOUT,
            None => *last.lock().unwrap_or_else(PoisonError::into_inner) + IDLE_TIMEOUT,
        };
        tokio::select! {
            ended = serving.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(%error, "ops endpoint: connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(due) => {
                let now = Instant::now();
                if shut_at.is_some() {
                    return;
                }
                if *last.lock().unwrap_or_else(PoisonError::into_inner) + IDLE_TIMEOUT <= now {
                    serving.as_mut().graceful_shutdown();
                    shut_at = Some(now);
                }
            }
        }
    }
}

async fn answer(
    ops: Arc<Ops>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n".to_owned(),
        ));
    }
    Ok(match request.uri().path() {
        "/health/live" => text(StatusCode::OK, "live\n".to_owned()),
        "/health/ready" => {
            let health = Arc::clone(&ops.health);
            // Link probes may block briefly (a Kafka metadata request).
            let reasons = tokio::task::spawn_blocking(move || health.not_ready())
                .await
                .unwrap_or_else(|e| vec![format!("the readiness check failed: {e}")]);
            if reasons.is_empty() {
                text(StatusCode::OK, "ready\n".to_owned())
            } else {
                let body: String = reasons.iter().map(|r| format!("{r}\n")).collect();
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready:\n{body}"),
                )
            }
        }
        "/metrics" => match &ops.metrics {
            Some(metrics) => {
                metrics.refresh().await;
                let mut response = text(StatusCode::OK, metrics.encode());
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                response
            }
            None => text(StatusCode::NOT_FOUND, "metrics are off\n".to_owned()),
        },
        "/asyncapi.json" => file(&ops.asyncapi.json, "application/json"),
        "/asyncapi.yaml" => file(&ops.asyncapi.yaml, "application/yaml"),
        "/asyncapi" => file(&ops.asyncapi.page, "text/html; charset=utf-8"),
        path if path == BUNDLE_PATH && ops.asyncapi.bundle.is_some() => file(
            ops.asyncapi.bundle.as_ref().unwrap_or(&Bytes::new()),
            "text/javascript",
        ),
        path if path == STYLES_PATH && ops.asyncapi.styles.is_some() => file(
            ops.asyncapi.styles.as_ref().unwrap_or(&Bytes::new()),
            "text/css",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /health/live, /health/ready, /asyncapi or /asyncapi.json\n"
                .to_owned(),
        ),
    })
}

fn file(body: &Bytes, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.clone()));
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
