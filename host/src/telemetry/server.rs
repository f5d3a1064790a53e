//! The HTTP server of a running relay: `/metrics` (Prometheus text format), `/healthz`
//! (alive, workers running), `/readyz` (database and broker reachable) and `/status` (JSON).
//! One background service; what each endpoint answers comes from [`Endpoints`], so this module
//! knows nothing of the relay. Every answer is read from memory: a scrape never queries the
//! database. `/metrics` and `/status` require the credentials of [`Access`], if any;
//! `/healthz` and `/readyz` never do (kubelet probes send none).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::auth::{Access, SharedAccess};
use super::listen::ListenAddr;
use crate::shutdown::Shutdown;

/// The Prometheus text format's content type.
const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
const JSON: &str = "application/json";

/// A health or readiness answer: 200 when `ok`, else 503; `body` says why.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub ok: bool,
    pub body: serde_json::Value,
}

/// What the endpoints answer.
pub(crate) trait Endpoints: Send + Sync + 'static {
    /// The exposition, in the Prometheus text format.
    fn metrics(&self) -> Result<String, std::fmt::Error>;
    fn health(&self) -> Check;
    fn ready(&self) -> Check;
    fn status(&self) -> serde_json::Value;
    /// `POST /reload`: reloads and answers what it did; `None` when it is not served.
    fn reload(&self) -> Option<ReloadFuture>;
}

/// What `POST /reload` waits for.
pub(crate) type ReloadFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Check> + Send>>;

/// Binds the listening socket (at start-up, so a taken port fails the start). A name that
/// resolves to several addresses is served on the first that can be bound, IPv4 first (see
/// [`ListenAddr::resolve`]); the error is the last address's.
pub(crate) async fn bind(listen: &ListenAddr) -> std::io::Result<TcpListener> {
    let mut failed = None;
    for addr in listen.resolve().await? {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) => {
                tracing::debug!(address = %addr, error = %e, "telemetry server: cannot bind");
                failed = Some(std::io::Error::new(e.kind(), format!("{addr}: {e}")));
            }
        }
    }
    Err(failed.unwrap_or_else(|| std::io::Error::other("no address to bind")))
}

/// Serves `endpoints` on `listener` until `stop` fires; open connections are closed then.
/// `/metrics` and `/status` answer 401 to a request without the credentials `access` names
/// at the time of the request.
pub(crate) async fn serve(
    listener: TcpListener,
    endpoints: Arc<dyn Endpoints>,
    access: Arc<SharedAccess>,
    mut stop: Shutdown,
) {
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
        let access = Arc::clone(&access);
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let endpoints = Arc::clone(&endpoints);
                let access = Arc::clone(&access);
                async move {
                    let access = access.current();
                    Ok::<_, Infallible>(answer(&*endpoints, &access, &request).await)
                }
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

async fn answer(
    endpoints: &dyn Endpoints,
    access: &Access,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.uri().path() == "/reload" {
        return reload(endpoints, access, request).await;
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    let path = request.uri().path();
    if PROTECTED.contains(&path) && !authorized(access, request) {
        return unauthorized(access);
    }
    match path {
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
            "not found: /metrics, /healthz, /readyz, /status, /reload\n".into(),
        ),
    }
}

/// `POST /reload`, served with `[telemetry] reload = true` to callers with the credentials
/// only (the settings refuse `reload` without credentials; an open server refuses it too).
async fn reload(
    endpoints: &dyn Endpoints,
    access: &Access,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let Some(reloading) = endpoints.reload().filter(|_| *access != Access::Open) else {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: POST /reload is served with [telemetry] reload = true and credentials\n"
                .into(),
        );
    };
    if request.method() != Method::POST {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "POST only\n".into(),
        );
    }
    if !authorized(access, request) {
        return unauthorized(access);
    }
    let done = reloading.await;
    let status = if done.ok {
        StatusCode::OK
    } else {
        // Read, but something in it did not apply: the body says what.
        StatusCode::UNPROCESSABLE_ENTITY
    };
    respond(status, JSON, done.body.to_string())
}

/// Whether `request` carries the credentials `access` names.
fn authorized(access: &Access, request: &Request<Incoming>) -> bool {
    let authorization = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    access.allows(authorization)
}

/// The endpoints that need the credentials: what they show is the operator's business, and
/// `/metrics` can be costly to scrape in a tight loop.
const PROTECTED: [&str; 2] = ["/metrics", "/status"];

fn unauthorized(access: &Access) -> Response<Full<Bytes>> {
    let mut response = respond(
        StatusCode::UNAUTHORIZED,
        "text/plain",
        "credentials required: see [telemetry] in the relay's config\n".into(),
    );
    if let Some(challenge) = access
        .challenge()
        .and_then(|c| hyper::header::HeaderValue::from_str(&c).ok())
    {
        response
            .headers_mut()
            .insert(hyper::header::WWW_AUTHENTICATE, challenge);
    }
    response
}

fn check(check: Check) -> Response<Full<Bytes>> {
    let status = if check.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    respond(status, JSON, check.body.to_string())
}

/// Every answer is scrubbed of the configuration's secrets (see [`crate::secret`]): a tenant's
/// last error in `/status` quotes what its plugin said, a check's body what a dependency said.
fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let body = crate::secret::scrub(&body).into_owned();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// The address the server listens on, for logs and tests.
pub(crate) fn local_addr(listener: &TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::secret::Secret;
    use crate::telemetry::client::get;

    struct Fixed;

    impl Endpoints for Fixed {
        fn metrics(&self) -> Result<String, std::fmt::Error> {
            Ok("sluice_up 1\n".into())
        }
        fn health(&self) -> Check {
            Check {
                ok: true,
                body: json!({}),
            }
        }
        fn ready(&self) -> Check {
            Check {
                ok: true,
                body: json!({}),
            }
        }
        fn status(&self) -> serde_json::Value {
            json!({ "tenants": [] })
        }
        fn reload(&self) -> Option<ReloadFuture> {
            Some(Box::pin(async {
                Check {
                    ok: true,
                    body: json!({ "reloaded": true }),
                }
            }))
        }
    }

    /// Serves [`Fixed`] with `access` on a free loopback port, bound through a host name.
    async fn serving(access: Access) -> (SocketAddr, crate::shutdown::ShutdownTrigger) {
        let (addr, _, stop) = serving_shared(access).await;
        (addr, stop)
    }

    /// As [`serving`], with the handle that changes the access while it serves.
    async fn serving_shared(
        access: Access,
    ) -> (
        SocketAddr,
        Arc<SharedAccess>,
        crate::shutdown::ShutdownTrigger,
    ) {
        let access = Arc::new(SharedAccess::new(access));
        let listen = ListenAddr::parse("localhost:0").expect("listen");
        let listener = bind(&listen).await.expect("bind");
        let addr = local_addr(&listener).expect("bound");
        assert!(addr.ip().is_loopback(), "{addr}");
        let (trigger, stop) = crate::shutdown::channel();
        tokio::spawn(serve(listener, Arc::new(Fixed), Arc::clone(&access), stop));
        (addr, access, trigger)
    }

    async fn code(addr: SocketAddr, path: &str, authorization: Option<&str>) -> u16 {
        let authorization = authorization.map(Secret::new);
        get(addr, path, authorization.as_ref(), Duration::from_secs(5))
            .await
            .expect("an answer")
            .0
    }

    #[tokio::test]
    async fn metrics_and_status_need_the_token_and_the_probes_do_not() {
        let access = Access::Bearer(Secret::new("t0ken"));
        let (addr, stop) = serving(access).await;
        for path in ["/metrics", "/status"] {
            assert_eq!(code(addr, path, None).await, 401, "{path}");
            assert_eq!(code(addr, path, Some("Bearer wrong")).await, 401, "{path}");
            assert_eq!(
                code(addr, path, Some("Basic dDBrZW4=")).await,
                401,
                "{path}"
            );
            assert_eq!(code(addr, path, Some("Bearer t0ken")).await, 200, "{path}");
        }
        for path in ["/healthz", "/readyz"] {
            assert_eq!(code(addr, path, None).await, 200, "{path}");
        }
        stop.trigger();
    }

    async fn post(addr: SocketAddr, path: &str, authorization: Option<&str>) -> (u16, String) {
        let authorization = authorization.map(Secret::new);
        crate::telemetry::client::send(
            Method::POST,
            addr,
            path,
            authorization.as_ref(),
            Duration::from_secs(5),
        )
        .await
        .expect("an answer")
    }

    #[tokio::test]
    async fn reload_is_a_post_with_the_credentials_and_never_open() {
        let (addr, stop) = serving(Access::Bearer(Secret::new("t0ken"))).await;
        assert_eq!(post(addr, "/reload", None).await.0, 401);
        assert_eq!(post(addr, "/reload", Some("Bearer wrong")).await.0, 401);
        assert_eq!(
            code(addr, "/reload", Some("Bearer t0ken")).await,
            405,
            "a GET"
        );
        let (status, body) = post(addr, "/reload", Some("Bearer t0ken")).await;
        assert_eq!((status, body.as_str()), (200, r#"{"reloaded":true}"#));
        stop.trigger();
        // Without credentials the endpoint does not exist, whatever the settings say.
        let (addr, stop) = serving(Access::Open).await;
        assert_eq!(post(addr, "/reload", None).await.0, 404);
        stop.trigger();
    }

    #[tokio::test]
    async fn new_credentials_apply_to_the_next_request() {
        let (addr, access, stop) = serving_shared(Access::Bearer(Secret::new("old"))).await;
        assert_eq!(code(addr, "/metrics", Some("Bearer old")).await, 200);
        access.set(Access::Bearer(Secret::new("new")));
        assert_eq!(code(addr, "/metrics", Some("Bearer old")).await, 401);
        assert_eq!(code(addr, "/metrics", Some("Bearer new")).await, 200);
        stop.trigger();
    }

    #[tokio::test]
    async fn without_credentials_configured_everything_is_open() {
        let (addr, stop) = serving(Access::Open).await;
        for path in ["/metrics", "/status", "/healthz", "/readyz"] {
            assert_eq!(code(addr, path, None).await, 200, "{path}");
        }
        stop.trigger();
    }

    #[tokio::test]
    async fn a_refusal_carries_the_challenge_of_the_scheme() {
        let access = Access::Basic {
            username: "prom".into(),
            password: Secret::new("pw"),
        };
        let response = unauthorized(&access);
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()[hyper::header::WWW_AUTHENTICATE],
            "Basic realm=\"sluice\""
        );
        let sent = access.authorization().expect("credentials");
        let (addr, stop) = serving(access).await;
        assert_eq!(code(addr, "/status", None).await, 401);
        assert_eq!(code(addr, "/status", Some(sent.expose())).await, 200);
        stop.trigger();
    }
}
