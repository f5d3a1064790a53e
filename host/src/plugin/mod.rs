//! The plugin host: what the relay sees of it — [`RowTransformer`], implemented by
//! [`PluginRouter`] — and, private behind it, the wasmtime sandbox.
//!
//! Read in this order:
//! - [`router`]: routing rows to their tenants for the relay, start-up quarantine, the cap on
//!   instances of tenants without their own entry, the status read API
//! - `tenant/`: one tenant (its plugin template and instance, breaker, quarantine, per-batch
//!   budgets) and what the router reports about it
//! - `wasm/`: the wasmtime side — engine and epoch ticker, loading a component, a tenant's
//!   `wasmtime::Store` and the guest calls (each bounded in wall-clock time), the host API guests
//!   call
//! - [`limits`]: a tenant's sandbox limits as data, the topic allow-list, the `wasmtime::Store`
//!   limiter
//! - [`metrics`]: what a batch's plugin calls record (time and outcomes per tenant)
//! - [`output`]: what the host accepts from a plugin, and the headers it stamps
//! - [`builtin`]: routing plugins compiled into the host (no WASM)
//! - [`reload`]: hot reload and quarantine retries
//! - [`settings`]: `[plugins]`, `[plugins.default]` and `[tenants.<name>]` as written
//! - [`inspect`]: what `sluice plugin check` asks of a file
//! - [`supply`]: where a plugin's bytes come from (a file, an OCI registry) and whether to
//!   trust them (`sha256` pins, minisign signatures)
//!
//! A plugin goes through three forms, each its own type: as written ([`PluginSource`]: a
//! file or a builtin's name), as loaded (a compiled component shared by every tenant that
//! uses the file), and as running (one configured instance per tenant, in its own
//! `wasmtime::Store`).

pub mod builtin;
mod lanes;
pub mod limits;
pub mod metrics;
pub mod output;
mod reload;
mod router;
pub mod settings;
pub mod supply;
mod tenant;
mod wasm;

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use limits::{Limits, TopicPattern};
pub use router::PluginRouter;
pub use settings::{PluginSource, PluginSpec, PluginsSettings};
pub use tenant::status::{InstanceUse, PluginInstances, TenantState, TenantStatus};
pub use wasm::bindings::types::{PluginInfo, RecordSchema, SchemaFormat};

use crate::model::{OutboundMessage, OutboxRow, TenantId};
use crate::problem::Problem;
use crate::text::{MAX_LOGGED, bounded};

/// The messages of one row, or why the row could not be transformed.
pub type RowResult = Result<Vec<OutboundMessage>, TransformFailure>;

/// Turns claimed rows into messages. Implementations: [`PluginRouter`] (WASM plugins).
pub trait RowTransformer: Send + Sync + 'static {
    /// One result per input row, in the same order.
    fn transform(&self, rows: Arc<[OutboxRow]>) -> impl Future<Output = Vec<RowResult>> + Send;

    /// Tenants whose rows should not be claimed right now (circuit breaker open, or a plugin
    /// call of theirs has been running for a while).
    fn paused_tenants(&self) -> Vec<TenantId> {
        Vec::new()
    }

    /// Feeds what publishing did with one tenant's rows of a batch back into that tenant's
    /// health (its circuit breaker): `delivered` rows had every message acknowledged;
    /// `refused` rows had a message refused for a reason of the tenant's own making (routed to
    /// a topic the broker lacks, too large for the broker). Broker outages are not reported:
    /// they are nobody's fault and must not pause tenants.
    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        let _ = (tenant, delivered, refused);
    }
}

impl<T: RowTransformer> RowTransformer for Arc<T> {
    fn transform(&self, rows: Arc<[OutboxRow]>) -> impl Future<Output = Vec<RowResult>> + Send {
        T::transform(self, rows)
    }

    fn paused_tenants(&self) -> Vec<TenantId> {
        T::paused_tenants(self)
    }

    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        T::record_publish(self, tenant, delivered, refused)
    }
}

/// Why a row was not transformed. Every variant fails the row closed: nothing of it is
/// published.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransformFailure {
    /// The plugin reported a transient error: the row is retried with back-off.
    #[error("plugin error (retryable) {code}: {message}")]
    Retryable {
        /// The plugin's error code (bounded).
        code: String,
        /// The plugin's error text (bounded).
        message: String,
    },
    /// The plugin refused the row for good: it goes dead at once.
    #[error("plugin error (permanent) {code}: {message}")]
    Permanent {
        /// The plugin's error code (bounded).
        code: String,
        /// The plugin's error text (bounded).
        message: String,
    },
    /// Trap or memory cap; the instance was discarded.
    #[error("{0}")]
    Trapped(String),
    /// The call ran into its `call_timeout`; the instance was discarded and the tenant paused.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Not run in this batch: the tenant's plugin used up the batch's time budget, or was busy
    /// in another batch. The row is put back untouched (no attempt counted).
    #[error("deferred: {0}")]
    Deferred(String),
    /// The plugin returned something the host refuses to publish.
    #[error("invalid plugin output: {0}")]
    InvalidOutput(String),
    /// Neither a `[tenants.<name>]` entry nor `[plugins.default]` covers the row's tenant.
    #[error("no plugin for tenant {0:?}: add [tenants.{0}] or [plugins.default]")]
    NoPlugin(TenantId),
    /// The message does not fit its registry schema (`value_format`/`key_format`): the row's
    /// own fault, dead at once like a permanent plugin error.
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// No schema to encode with (registry down, subject or version missing, schema of another
    /// format): retried without counting an attempt, never dead-lettered.
    #[error("schema unavailable: {0}")]
    SchemaUnavailable(String),
    /// The tenant's instance could not be (re)created.
    #[error("plugin unavailable: {0}")]
    Unavailable(String),
    /// The tenant's circuit breaker is open, or the tenant is quarantined; the row was not
    /// run and waits `remaining` without an attempt being counted.
    #[error("{}", paused_message(tenant, remaining, reason))]
    Paused {
        /// The paused tenant.
        tenant: TenantId,
        /// Time left until its rows are tried again.
        remaining: std::time::Duration,
        /// Breaker or quarantine.
        reason: PauseReason,
    },
}

/// Why a tenant's rows are not run for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseReason {
    /// Its circuit breaker is open.
    CircuitBreaker,
    /// Its plugin failed to load, instantiate or configure (the reason, bounded); retried
    /// with back-off and on reload.
    Quarantined(String),
}

fn paused_message(
    tenant: &TenantId,
    remaining: &std::time::Duration,
    reason: &PauseReason,
) -> String {
    let remaining = humantime::format_duration(*remaining);
    match reason {
        PauseReason::CircuitBreaker => {
            format!("tenant {tenant} paused by its circuit breaker for another {remaining}")
        }
        PauseReason::Quarantined(why) => format!(
            "tenant {tenant} quarantined: its plugin failed to start ({why}); next try in {remaining}"
        ),
    }
}

/// Errors loading or setting up plugins. At start-up they quarantine the tenant, or stop
/// `sluice run` with `[plugins] strict_startup = true`. The message says the cause too (it is
/// what `last_error` and the quarantine reason keep); the cause is kept as the source where
/// there is one. A guest's own text (`configure`'s error, a trap's reason with the guest's
/// output) is not an error value: it stays in the message, bounded.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The wasmtime engine could not be created.
    #[error("plugin engine: {source:#}")]
    Engine {
        /// wasmtime's error.
        #[source]
        source: wasmtime::Error,
    },
    /// The thread that advances wasmtime's epoch (enforcing `call_timeout`) could not be spawned.
    #[error("plugin engine: cannot start epoch ticker thread: {source}")]
    EpochTicker {
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// A plugin file could not be read, parsed or compiled.
    #[error("plugin {path}: {message}")]
    BadPlugin {
        /// The plugin file.
        path: PathBuf,
        /// What is wrong with it, cause included.
        message: String,
        /// Reading the file, parsing it, or wasmtime refusing it ([`ComponentError`]).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Instantiating the plugin for a tenant, or its `configure` call, trapped or timed out.
    #[error("plugin {path} (tenant {tenant}): instantiation failed: {message}")]
    Instantiate {
        /// The plugin file.
        path: PathBuf,
        /// The tenant it was instantiated for.
        tenant: TenantId,
        /// The trap's reason, with the guest's output (bounded).
        message: String,
    },
    /// The plugin's `configure` returned an error for this tenant's `config`.
    #[error("plugin {path} (tenant {tenant}) rejected its config: {message}")]
    Configure {
        /// The plugin file.
        path: PathBuf,
        /// The tenant whose `config` was rejected.
        tenant: TenantId,
        /// The plugin's error text (bounded).
        message: String,
    },
    /// The file's digest is not the one the tenant's `sha256` pins: it is not loaded for
    /// that tenant (quarantined at start-up, the old version kept on reload).
    #[error(
        "plugin {path} (tenant {tenant}): refused: its sha256 pin is {expected}, but the \
         plugin's bytes are {found}"
    )]
    PinMismatch {
        /// The plugin file or OCI reference.
        path: PathBuf,
        /// The tenant whose pin it is (the default plugin's: `[plugins.default]`).
        tenant: String,
        /// The pinned digest.
        expected: String,
        /// The digest of the bytes found.
        found: String,
    },
    /// A plugin setting is invalid or missing (or a builtin refused its `config`): the key
    /// (e.g. `tenants.acme.path`) and what is wrong with it.
    #[error("config {0}")]
    Config(#[from] Problem),
}

impl PluginError {
    fn engine(source: wasmtime::Error) -> Self {
        Self::Engine { source }
    }

    /// A [`PluginError::BadPlugin`] without an underlying error.
    pub(crate) fn bad_plugin(path: &Path, message: String) -> Self {
        Self::BadPlugin {
            path: path.to_owned(),
            message,
            source: None,
        }
    }
}

/// wasmtime refusing a plugin file (not a component, imports or exports that do not match),
/// kept as a [`PluginError::BadPlugin`]'s cause. Its text quotes names the plugin's author
/// chose, so it shows bounded and escaped, like the message that quotes it, and its own
/// causes only within that text.
#[derive(Debug)]
pub struct ComponentError(wasmtime::Error);

impl ComponentError {
    /// wasmtime's error itself (its text unbounded).
    pub fn wasmtime_error(&self) -> &wasmtime::Error {
        &self.0
    }
}

impl fmt::Display for ComponentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bounded(&format!("{:#}", self.0), MAX_LOGGED))
    }
}

impl std::error::Error for ComponentError {}

/// What `sluice plugin check` shows of a file.
#[derive(Debug, Clone)]
pub struct PluginCheck {
    /// Its `info()`, the text escaped and cut.
    pub info: PluginInfo,
    /// The contract interface it exports, with the version of the WIT it was built against
    /// (`sluice:plugin/transformer@0.2.0`).
    pub contract: String,
    /// `sha256:` and the file's SHA-256 in hex, as `/status` and `sluice_plugin_info` show it.
    pub digest: String,
    /// The file, or the OCI reference with the manifest digest it resolved to.
    pub source: String,
    /// The trusted key that signed it (when `supply` has trusted keys).
    pub signer: Option<supply::Signer>,
}

/// Validates the plugin `path` (a file or an `oci://` reference, fetched and verified by
/// `supply`) against the world and returns what `sluice plugin check` shows of it
/// ([`PluginCheck`]). Instantiation and `info()` are bounded by the default `call_timeout`,
/// time spent sleeping in host calls included, so a hostile file cannot hang the command.
pub fn inspect(path: &Path, supply: &supply::PluginSupply) -> Result<PluginCheck, PluginError> {
    let engine = wasm::engine::PluginEngine::new(wasm::engine::MIN_POOLED_INSTANCES)?;
    let plugin = Arc::new(wasm::component::LoadedPlugin::load_fetched(
        &engine,
        path,
        supply.fetch(path)?,
        router::compile_cache(&PluginsSettings::default()).as_ref(),
    )?);
    let shared = wasm::host_api::TenantShared::new(TenantId::none());
    let mut instance =
        wasm::instance::WasmInstance::instantiate(&plugin, &shared, &Limits::default())?;
    let info = instance
        .info()
        .map_err(|message| PluginError::bad_plugin(path, format!("info() failed: {message}")))?;
    Ok(PluginCheck {
        info,
        contract: plugin.contract().to_owned(),
        digest: plugin.digest().to_owned(),
        source: plugin.source().to_owned(),
        signer: plugin.signer().cloned(),
    })
}
