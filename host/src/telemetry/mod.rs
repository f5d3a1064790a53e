//! What a running relay tells an operator: Prometheus metrics (built on `prometheus-client`,
//! exposed in the Prometheus text format) and the small HTTP server for `/metrics`,
//! `/healthz`, `/readyz` and `/status`.
//!
//! This module sits at the bottom of the layers, beside `model`: the relay, the sink, the
//! plugins and the app record into [`Metrics`]; what the endpoints answer is supplied from
//! above through [`server::Endpoints`].
//!
//! - [`auth`]: who may read `/metrics` and `/status` (bearer token, basic auth)
//! - [`client`]: a GET against a running relay's endpoints (`sluice status`, tests)
//! - [`labels`]: bounded label values (only configured tenants get their own)
//! - [`laggards`]: the tenants furthest behind, and the few backlog labels they get
//! - [`listen`]: `[telemetry] listen` (`host:port`, host an IP or a name) and its resolution
//! - [`metrics`]: the metric families, grouped by who records them, and the registry
//! - [`server`]: the HTTP endpoints, one background service
//! - [`settings`]: the `[telemetry]` section

pub(crate) mod auth;
pub(crate) mod client;
pub(crate) mod labels;
pub(crate) mod laggards;
pub(crate) mod listen;
pub(crate) mod metrics;
pub(crate) mod server;
pub(crate) mod settings;

pub(crate) use labels::TenantLabels;
pub(crate) use metrics::{Metrics, TenantSample};
pub(crate) use settings::TelemetrySettings;
