//! The HTTP server of a running relay: `/metrics` (Prometheus text format), `/healthz`
//! (alive, workers running), `/readyz` (database and broker reachable) and `/status` (JSON).
//! One background service; what each endpoint answers comes from [`Endpoints`], so this module
//! knows nothing of the relay. Every answer is read from memory: a scrape never queries the
//! database.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::shutdown::Shutdown;

/// The Prometheus text format's content type.
const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
const JSON: &str = "application/json";

/// A health or readiness answer: 200 when `ok`, else 503; `body` says why.
#[derive(Debug, Clone)]
pub struct Check {
    pub ok: bool,
    pub body: serde_json::Value,
}

/// What the endpoints answer.
pub trait Endpoints: Send + Sync + 'static {
    /// The exposition, in the Prometheus text format.
    fn metrics(&self) -> Result<String, std::fmt::Error>;
    fn health(&self) -> Check;
    fn ready(&self) -> Check;
    fn status(&self) -> serde_json::Value;
}

/// Binds the listening socket (at start-up, so a taken port fails the start).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `endpoints` on `listener` until `stop` fires; open connections are closed then.
pub async fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>, mut stop: Shutdown) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.recv() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: keep serving the others.
                tracing::warn!(error = %e, "telemetry server: accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let endpoints = Arc::clone(&endpoints);
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let endpoints = Arc::clone(&endpoints);
                async move { Ok::<_, Infallible>(answer(&*endpoints, &request)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "telemetry server: connection ended with an error");
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

fn answer(endpoints: &dyn Endpoints, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match request.uri().path() {
        "/metrics" => match endpoints.metrics() {
            Ok(text) => respond(StatusCode::OK, METRICS_CONTENT_TYPE, text),
            Err(_) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "encoding the metrics failed\n".into(),
            ),
        },
        "/healthz" => check(endpoints.health()),
        "/readyz" => check(endpoints.ready()),
        "/status" => respond(StatusCode::OK, JSON, endpoints.status().to_string()),
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: /metrics, /healthz, /readyz, /status\n".into(),
        ),
    }
}

fn check(check: Check) -> Response<Full<Bytes>> {
    let status = if check.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    respond(status, JSON, check.body.to_string())
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// The address the server listens on, for logs and tests.
pub fn local_addr(listener: &TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}
