//! The Schema Registry's REST API as Sluice uses it (the Confluent API, which Karapace,
//! Apicurio's `ccompat` and Redpanda serve too): a subject's version, looking a schema up under a
//! subject, registering one. [`RegistryClient`] is the relay's [`SchemaSource`]; `settings` is
//! `[schema_registry]`, `state` whether the registry answers (for `/readyz`).

pub mod settings;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;

use self::settings::RegistrySettings;
use self::state::RegistryState;
use super::settings::SchemaVersion;
use super::source::{RegisteredSchema, RegistryError, SchemaSource};
use crate::secret::Secret;
use crate::text::error_chain;

/// The registry's media type (plain JSON is accepted too).
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// An HTTP client of one registry.
pub struct RegistryClient {
    http: reqwest::Client,
    base: reqwest::Url,
    /// Replaced on SIGHUP when the credentials were rotated ([`RegistryClient::rotate`]).
    auth: std::sync::RwLock<Auth>,
    state: Arc<RegistryState>,
}

/// The credentials requests carry; exposed only where the `Authorization` header is built
/// ([`RegistryClient::authorized`]).
#[derive(Clone, PartialEq, Eq)]
enum Auth {
    None,
    Basic(String, Secret),
    Bearer(Secret),
}

/// A registry answer with a schema (fields absent from some answers are optional).
#[derive(Deserialize)]
struct SchemaAnswer {
    id: Option<u32>,
    version: Option<u32>,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    schema: Option<String>,
    #[serde(default)]
    references: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error_code: Option<i64>,
    message: Option<String>,
}

impl RegistryClient {
    /// A client for `settings` (reads the CA file).
    pub fn new(settings: &RegistrySettings) -> Result<Self, String> {
        let base = reqwest::Url::parse(&settings.url)
            .map_err(|e| format!("schema_registry.url: not a URL ({e})"))?;
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(5)));
        if let Some(ca) = &settings.ca_location {
            let pem = std::fs::read(ca).map_err(|e| {
                format!(
                    "schema_registry.ca_location: cannot read {}: {e}",
                    ca.display()
                )
            })?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| {
                format!(
                    "schema_registry.ca_location: {} is not a PEM certificate: {e}",
                    ca.display()
                )
            })?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder
            .build()
            .map_err(|e| format!("schema_registry: cannot build an HTTP client: {e}"))?;
        Ok(Self {
            http,
            base,
            auth: std::sync::RwLock::new(Auth::of(settings)),
            state: Arc::default(),
        })
    }

    /// Uses the credentials of `settings` (re-read on SIGHUP) from the next request on;
    /// `true` when they changed. The URL, timeout and CA stay as started.
    pub fn rotate(&self, settings: &RegistrySettings) -> bool {
        let fresh = Auth::of(settings);
        let mut auth = self.auth.write().unwrap_or_else(|p| p.into_inner());
        let changed = *auth != fresh;
        *auth = fresh;
        changed
    }

    /// Whether the registry answered the last request.
    pub fn state(&self) -> &Arc<RegistryState> {
        &self.state
    }

    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header(reqwest::header::ACCEPT, MEDIA_TYPE);
        match &*self.auth.read().unwrap_or_else(|p| p.into_inner()) {
            Auth::None => request,
            Auth::Basic(u, p) => request.basic_auth(u, Some(p.expose())),
            Auth::Bearer(t) => request.bearer_auth(t.expose()),
        }
    }

    /// Asks whether the registry answers at all (`GET /subjects`), for the readiness check.
    pub async fn check(&self) -> Result<(), RegistryError> {
        let result = async {
            let request = self.authorized(self.http.get(self.url(&["subjects"])));
            let response = request
                .send()
                .await
                .map_err(|e| unreachable(e, "GET /subjects"))?;
            match response.status().as_u16() {
                200..=299 => Ok(()),
                status => Err(error_of(status, response, "GET /subjects").await),
            }
        }
        .await;
        self.state.record(&result);
        result
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<SchemaAnswer, RegistryError> {
        let result = self.exchange(request, what).await;
        self.state.record(&result);
        result
    }

    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<SchemaAnswer, RegistryError> {
        let response = self
            .authorized(request)
            .send()
            .await
            .map_err(|e| unreachable(e, what))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(error_of(status, response, what).await);
        }
        let answer: SchemaAnswer = response
            .json()
            .await
            .map_err(|e| RegistryError::Failed(format!("{what}: not the registry's JSON: {e}")))?;
        if !answer.references.is_empty() {
            return Err(RegistryError::Unsupported(format!(
                "{what}: the schema has references to other subjects, which Sluice does not \
                 resolve yet; register it self-contained"
            )));
        }
        Ok(answer)
    }
}

impl Auth {
    fn of(settings: &RegistrySettings) -> Self {
        match (
            &settings.username,
            &settings.password,
            &settings.bearer_token,
        ) {
            (Some(u), Some(p), _) => Auth::Basic(u.clone(), p.clone()),
            (_, _, Some(t)) => Auth::Bearer(t.clone()),
            _ => Auth::None,
        }
    }
}

fn unreachable(e: reqwest::Error, what: &str) -> RegistryError {
    // Without the URL, which may carry credentials (`https://user:password@…`); the caller's
    // context names the request. reqwest's Display leaves out the cause (connection refused,
    // timed out): appended.
    let e = e.without_url();
    RegistryError::Unreachable(format!("{what}: {}", error_chain(&e)))
}

async fn error_of(status: u16, response: reqwest::Response, what: &str) -> RegistryError {
    let body = response.text().await.unwrap_or_default();
    let detail = match serde_json::from_str::<ErrorAnswer>(&body) {
        Ok(ErrorAnswer {
            error_code: Some(code),
            message: Some(message),
        }) => format!("{what}: HTTP {status}, error {code}: {message}"),
        _ => format!(
            "{what}: HTTP {status}: {}",
            crate::text::bounded(body.trim(), 200)
        ),
    };
    match status {
        401 | 403 => RegistryError::Unauthorized(detail),
        404 => RegistryError::NotFound(detail),
        400..=499 => RegistryError::Refused(detail),
        _ => RegistryError::Failed(detail),
    }
}

fn registered(
    answer: SchemaAnswer,
    fallback_type: &str,
    fallback_schema: Option<&str>,
    what: &str,
) -> Result<RegisteredSchema, RegistryError> {
    let missing = |field: &str| RegistryError::Failed(format!("{what}: the answer has no {field}"));
    Ok(RegisteredSchema {
        id: answer.id.ok_or_else(|| missing("id"))?,
        version: answer.version,
        // Confluent leaves `schemaType` out for Avro.
        schema_type: answer
            .schema_type
            .unwrap_or_else(|| fallback_type.to_owned()),
        schema: match answer.schema {
            Some(s) => s,
            None => fallback_schema.ok_or_else(|| missing("schema"))?.to_owned(),
        },
    })
}

impl SchemaSource for RegistryClient {
    fn version(
        &self,
        subject: &str,
        version: SchemaVersion,
    ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>> {
        let subject = subject.to_owned();
        Box::pin(async move {
            let v = match version {
                SchemaVersion::Latest => "latest".to_owned(),
                SchemaVersion::Pinned(v) => v.to_string(),
            };
            let what = format!("subject {subject} version {v}");
            let url = self.url(&["subjects", &subject, "versions", &v]);
            let answer = self.send(self.http.get(url), &what).await?;
            registered(answer, "AVRO", None, &what)
        })
    }

    fn find(
        &self,
        subject: &str,
        schema_type: &str,
        schema: &str,
        register: bool,
    ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>> {
        let (subject, schema_type, schema) = (
            subject.to_owned(),
            schema_type.to_owned(),
            schema.to_owned(),
        );
        Box::pin(async move {
            let body = serde_json::json!({"schema": schema, "schemaType": schema_type});
            let (url, what) = if register {
                (
                    self.url(&["subjects", &subject, "versions"]),
                    format!("registering the schema under subject {subject}"),
                )
            } else {
                (
                    self.url(&["subjects", &subject]),
                    format!("looking the schema up under subject {subject}"),
                )
            };
            let request = self
                .http
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, MEDIA_TYPE)
                .body(body.to_string());
            let answer = self.send(request, &what).await?;
            registered(answer, &schema_type, Some(&schema), &what)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::settings::{DEFAULT_LATEST_TTL, DEFAULT_TIMEOUT};
    use super::*;

    fn settings(url: &str) -> RegistrySettings {
        RegistrySettings {
            url: url.into(),
            username: None,
            password: None,
            bearer_token: None,
            timeout: DEFAULT_TIMEOUT,
            ca_location: None,
            latest_ttl: DEFAULT_LATEST_TTL,
        }
    }

    #[test]
    fn a_ca_file_that_cannot_be_read_or_is_not_pem_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = RegistryClient::new(&RegistrySettings {
            ca_location: Some(missing.clone()),
            ..settings("https://registry:8081")
        })
        .err()
        .unwrap();
        assert!(
            e.starts_with(&format!(
                "schema_registry.ca_location: cannot read {}",
                missing.display()
            )),
            "{e}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = RegistryClient::new(&RegistrySettings {
            ca_location: Some(junk),
            ..settings("https://registry:8081")
        })
        .err()
        .unwrap();
        assert!(e.contains("is not a PEM certificate"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_an_outage_and_its_url_credentials_stay_out_of_the_error() {
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        let client = RegistryClient::new(&settings("http://relay:s3cret@127.0.0.1:1")).unwrap();
        let e = client.check().await.unwrap_err();
        assert!(e.is_outage(), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("schema registry unreachable: GET /subjects: "),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
        assert!(!client.state().up());
        assert_eq!(client.state().error(), Some(text));
    }

    #[tokio::test]
    async fn bearer_and_basic_credentials_reach_the_registry_and_a_refusal_is_named() {
        use sluice_testkit::registry::TestRegistry;
        let registry = TestRegistry::start().unwrap();
        registry.require_bearer("t0ken");
        let with = |token: &str| {
            RegistryClient::new(&RegistrySettings {
                bearer_token: Some(token.into()),
                ..settings(&registry.url())
            })
            .unwrap()
        };
        assert_eq!(with("t0ken").check().await, Ok(()));
        let refused = with("wrong").check().await.unwrap_err();
        assert!(
            matches!(&refused, RegistryError::Unauthorized(m) if m.contains("HTTP 401, error 40101")),
            "{refused}"
        );
        assert!(!refused.is_outage(), "a refusal is an answer");

        let registry = TestRegistry::start().unwrap();
        registry.require_basic_auth("relay", "pw");
        let basic = RegistryClient::new(&RegistrySettings {
            username: Some("relay".into()),
            password: Some("pw".into()),
            ..settings(&registry.url())
        })
        .unwrap();
        assert_eq!(basic.check().await, Ok(()));
        let id = registry.register("s-value", "AVRO", "\"string\"");
        let found = basic
            .version("s-value", SchemaVersion::Latest)
            .await
            .unwrap();
        assert_eq!(
            (found.id, found.version, found.schema_type.as_str()),
            (id, Some(1), "AVRO")
        );
    }

    #[tokio::test]
    async fn rotated_credentials_are_used_from_the_next_request() {
        use sluice_testkit::registry::TestRegistry;
        let registry = TestRegistry::start().unwrap();
        registry.require_bearer("new");
        let old = RegistrySettings {
            bearer_token: Some("old".into()),
            ..settings(&registry.url())
        };
        let client = RegistryClient::new(&old).unwrap();
        assert!(client.check().await.is_err());
        let new = RegistrySettings {
            bearer_token: Some("new".into()),
            ..old.clone()
        };
        assert!(client.rotate(&new));
        assert_eq!(client.check().await, Ok(()));
        assert!(!client.rotate(&new), "unchanged");
    }
}
