//! A plain HTTP/1 request (a GET, or `POST /reload`) against a relay's telemetry endpoints: what `sluice status` asks a
//! running relay, and what the tests scrape.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::secret::Secret;

/// Why a GET did not return a body.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GetError {
    #[error("no answer from {addr} within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("{addr}: {message}")]
    Failed { addr: SocketAddr, message: String },
}

/// GETs `path` from `addr`, with `authorization` as the `Authorization` header when given
/// (see [`super::auth::Access::authorization`]): the status code and the body as text.
pub(crate) async fn get(
    addr: SocketAddr,
    path: &str,
    authorization: Option<&Secret>,
    timeout: Duration,
) -> Result<(u16, String), GetError> {
    send(Method::GET, addr, path, authorization, timeout).await
}

/// As [`get`], with another method (`POST /reload`).
pub(crate) async fn send(
    method: Method,
    addr: SocketAddr,
    path: &str,
    authorization: Option<&Secret>,
    timeout: Duration,
) -> Result<(u16, String), GetError> {
    let failed = |message: String| GetError::Failed { addr, message };
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.to_string()))?;
        let driver = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(e.to_string()))?;
        if let Some(authorization) = authorization {
            // The settings refuse credentials a header cannot carry; the error names no value.
            let mut value = hyper::header::HeaderValue::from_str(authorization.expose())
                .map_err(|_| failed("the credentials cannot be sent in a header".into()))?;
            value.set_sensitive(true);
            request
                .headers_mut()
                .insert(hyper::header::AUTHORIZATION, value);
        }
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        driver.abort();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| GetError::Timeout { addr, timeout })?
}
