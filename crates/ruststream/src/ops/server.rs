//! The ops endpoint over HTTP/1.1, served by hyper on a task of its own.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::Ops;

/// Serves until the task is aborted (when the app's subscriptions have all ended).
pub(crate) async fn serve(listener: TcpListener, ops: Arc<Ops>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: say so, pause, go on.
                tracing::warn!(%error, "ops endpoint: accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let ops = Arc::clone(&ops);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(Arc::clone(&ops), request));
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "ops endpoint: connection ended with an error");
            }
        });
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
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /health/live or /health/ready\n".to_owned(),
        ),
    })
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
