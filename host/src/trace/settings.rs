//! `[tracing]`: where the relay's spans go (an OpenTelemetry collector's OTLP/HTTP endpoint),
//! under which service name, how rows without a parent are sampled, and how much the export
//! may hold or wait. Without the section no exporter runs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::problem::Problem;
use crate::secret::Secret;

/// The `service.name` spans are exported under.
pub const DEFAULT_SERVICE_NAME: &str = "sluice";
/// Rows without a parent span are all traced: the OpenTelemetry SDKs' default
/// (`parentbased_always_on`). Rows with a parent follow its sampled flag whatever this is.
pub const DEFAULT_SAMPLE_RATIO: f64 = 1.0;
/// How long one export request may take, retries included: the OpenTelemetry SDKs' default
/// (`OTEL_EXPORTER_OTLP_TIMEOUT`).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Spans held for export at most; past it new spans are dropped (and counted). The SDKs'
/// batch span processor default (`OTEL_BSP_MAX_QUEUE_SIZE`).
pub const DEFAULT_QUEUE_SIZE: usize = 2_048;
/// Largest `queue_size` accepted: a few hundred MiB of spans is already a memory problem.
pub const MAX_QUEUE_SIZE: usize = 1_000_000;
/// The OTLP/HTTP path of traces, appended to an endpoint given without a path.
pub const TRACES_PATH: &str = "/v1/traces";

/// `[tracing]`; unset keys take their defaults. (`Debug` shows no header value: they are
/// [`Secret`]s.)
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSettings {
    /// The collector's OTLP/HTTP (protobuf) URL, e.g. `http://otel-collector:4318`; required.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Share of rows without a parent span that are traced, 0.0–1.0.
    pub sample_ratio: f64,
    /// Longest one export may take; a collector slower than that loses the spans.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
    /// Spans held for export at most.
    pub queue_size: usize,
    /// HTTP headers sent with every export (an `Authorization` or API key header, usually
    /// given as `${env:…}` or `${file:…}`).
    pub headers: BTreeMap<String, Secret>,
}

impl Default for TracingSettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            sample_ratio: DEFAULT_SAMPLE_RATIO,
            export_timeout: DEFAULT_EXPORT_TIMEOUT,
            queue_size: DEFAULT_QUEUE_SIZE,
            headers: BTreeMap::new(),
        }
    }
}

impl TracingSettings {
    /// The URL spans are posted to: the endpoint with [`TRACES_PATH`] when it has no path of
    /// its own (`http://collector:4318` → `http://collector:4318/v1/traces`), as written
    /// otherwise. `None` while the endpoint is missing or invalid (see [`Self::problems`]).
    pub fn traces_url(&self) -> Option<String> {
        let url = url::Url::parse(self.otlp_endpoint.as_deref()?).ok()?;
        Some(if url.path() == "/" || url.path().is_empty() {
            format!("{}{TRACES_PATH}", url.as_str().trim_end_matches('/'))
        } else {
            url.to_string()
        })
    }

    /// Everything wrong with the section, each at its `tracing.…` key.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        match self.otlp_endpoint.as_deref() {
            None => problems.push(Problem::new(
                "tracing.otlp_endpoint",
                "required: the collector's OTLP/HTTP URL, e.g. \"http://otel-collector:4318\"",
            )),
            Some(endpoint) => {
                if let Err(why) = check_endpoint(endpoint) {
                    problems.push(Problem::new("tracing.otlp_endpoint", why));
                }
            }
        }
        if self.service_name.trim().is_empty() {
            problems.push(Problem::new("tracing.service_name", "must not be empty"));
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            problems.push(Problem::new(
                "tracing.sample_ratio",
                "must be between 0.0 and 1.0",
            ));
        }
        if self.export_timeout.is_zero() {
            problems.push(Problem::new(
                "tracing.export_timeout",
                "must be greater than 0",
            ));
        }
        if self.queue_size == 0 || self.queue_size > MAX_QUEUE_SIZE {
            problems.push(Problem::new(
                "tracing.queue_size",
                format!("must be between 1 and {MAX_QUEUE_SIZE}"),
            ));
        }
        for (name, value) in &self.headers {
            let valid_name = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !valid_name {
                problems.push(Problem::new(
                    format!("tracing.headers.{name}"),
                    "is not a valid HTTP header name",
                ));
            } else if value
                .expose()
                .bytes()
                .any(|b| (b < b' ' && b != b'\t') || b == 0x7f)
            {
                problems.push(Problem::new(
                    format!("tracing.headers.{name}"),
                    "holds a control character, which an HTTP header value cannot carry",
                ));
            }
        }
        problems
    }
}

/// Why an `otlp_endpoint` cannot be posted to, if it cannot.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let url = url::Url::parse(endpoint).map_err(|e| {
        format!("{endpoint:?} is not a URL ({e}); expected e.g. \"http://otel-collector:4318\"")
    })?;
    if url.cannot_be_a_base() {
        // `host:port`, as gRPC clients take it: parsed as a scheme `host`.
        return Err(format!(
            "{endpoint:?} has no http:// or https:// scheme; write it as \"http://{endpoint}\""
        ));
    }
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{endpoint:?}: the scheme must be http or https (OTLP over HTTP/protobuf), not {:?}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{endpoint:?} names no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{endpoint:?}: a query or fragment is not allowed"));
    }
    // The exporter sends no `user:password@` of the URL: the collector would refuse every
    // export (401) with nothing saying why.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{:?} carries credentials, which the exporter does not send; give them as a \
             header instead, e.g. headers = {{ authorization = \"Basic ${{env:OTLP_BASIC}}\" }}",
            crate::secret::redact_url(endpoint)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml: &str) -> TracingSettings {
        toml::from_str(toml).unwrap()
    }

    fn keys(s: &TracingSettings) -> Vec<String> {
        s.problems().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn defaults_follow_the_opentelemetry_sdks() {
        let s = settings("otlp_endpoint = \"http://127.0.0.1:4318\"");
        assert_eq!(s.service_name, "sluice");
        assert_eq!(s.sample_ratio, 1.0);
        assert_eq!(s.export_timeout, Duration::from_secs(10));
        assert_eq!(s.queue_size, 2_048);
        assert!(s.problems().is_empty());
    }

    #[test]
    fn the_traces_path_is_added_to_an_endpoint_without_one() {
        let url = |e: &str| {
            settings(&format!("otlp_endpoint = {e:?}"))
                .traces_url()
                .unwrap()
        };
        assert_eq!(url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(url("https://c/otlp/v1/traces"), "https://c/otlp/v1/traces");
    }

    #[test]
    fn a_bad_endpoint_or_value_is_named_by_its_key() {
        for endpoint in [
            "c:4318",
            "grpc://c:4317",
            "not a url",
            "http://",
            "http://c?x=1",
            "https://alice:s3cret@c:4318",
            "https://alice@c:4318",
        ] {
            let s = settings(&format!("otlp_endpoint = {endpoint:?}"));
            assert_eq!(keys(&s), ["tracing.otlp_endpoint"], "{endpoint}");
        }
        assert_eq!(keys(&settings("")), ["tracing.otlp_endpoint"]);
        let s = settings(
            "otlp_endpoint = \"http://c:4318\"\nsample_ratio = 1.5\nqueue_size = 0\n\
             export_timeout = \"0s\"\nservice_name = \"\"\nheaders = { \"a b\" = \"x\" }",
        );
        assert_eq!(
            keys(&s),
            [
                "tracing.service_name",
                "tracing.sample_ratio",
                "tracing.export_timeout",
                "tracing.queue_size",
                "tracing.headers.a b"
            ]
        );
    }

    #[test]
    fn credentials_in_the_endpoint_are_refused_without_being_shown() {
        let s = settings("otlp_endpoint = \"https://alice:s3cret-pw@c:4318\"");
        let problems = s.problems();
        assert_eq!(problems.len(), 1);
        let text = problems[0].reason();
        assert!(text.contains("headers"), "{text}");
        assert!(!text.contains("s3cret-pw"), "{text}");
    }

    #[test]
    fn header_values_are_secrets() {
        let s = settings(
            "otlp_endpoint = \"http://c:4318\"\nheaders = { authorization = \"Bearer Hidden-Token-7\" }",
        );
        assert!(!format!("{s:?}").contains("Hidden-Token-7"));
        assert_eq!(s.headers["authorization"].expose(), "Bearer Hidden-Token-7");
    }
}
