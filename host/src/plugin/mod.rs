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
//! - `live`: tenants added, changed and removed while running, and lazy loading
//! - [`settings`]: `[plugins]`, `[plugins.default]` and `[tenants.<name>]` as written
//! - [`inspect`]: what `sluice plugin check` asks of a file
//! - [`supply`]: where a plugin's bytes come from (a file, an OCI registry) and whether to
//!   trust them (`sha256` pins, minisign signatures)
//! - `keys`: which trusted keys may sign which tenant's plugin
//! - `cache_budget`: one size bound for everything under the plugins cache directory
//! - [`budgets`]: the instance memory budgets, as written or sized inside the container's
//!   memory limit ([`memory_limit`]: cgroup v2 / v1)
//!
//! A plugin goes through three forms, each its own type: as written ([`PluginSource`]: a
//! file or a builtin's name), as loaded (a compiled component shared by every tenant that
//! uses the file), and as running (one configured instance per tenant, in its own
//! `wasmtime::Store`).

pub mod budgets;
pub mod builtin;
mod cache_budget;
mod keys;
mod lanes;
pub mod limits;
mod live;
pub mod memory_limit;
pub mod metrics;
pub mod output;
pub mod placement;
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

pub use budgets::InstanceBudgets;
pub use limits::{Limits, TopicPattern};
pub use live::{TenantChangeStatus, TenantChanges};
pub use router::PluginRouter;
pub use settings::{LoadMode, PluginSource, PluginSpec, PluginsSettings};
pub use tenant::status::{InstanceUse, PluginInstances, TenantState, TenantStatus};
pub use wasm::bindings::types::{PluginInfo, RecordSchema, SchemaFormat};

use crate::model::{OutboxRow, RowResult, TenantId};
use crate::problem::Problem;
use crate::text::{MAX_LOGGED, bounded};

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

    /// The plugin `tenant`'s rows run — its configured file, or `builtin:<name>`, as the
    /// metrics' `plugin` label names it — for the transform span's attributes; `None` when
    /// the tenant has none (yet).
    fn plugin_of(&self, tenant: &TenantId) -> Option<String> {
        let _ = tenant;
        None
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

    fn plugin_of(&self, tenant: &TenantId) -> Option<String> {
        T::plugin_of(self, tenant)
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
    /// Every slot of the plugin instance pool of a kind (memories, tables, instances) is in
    /// use: not the plugin's fault. Its tenant makes room by evicting an idle instance, or
    /// waits for a later batch.
    #[error("the plugin instance pool is full: {message}")]
    PoolExhausted {
        /// wasmtime's text, naming the kind of slot.
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
    /// The file is not signed by a key the tenant's section trusts (its own `trusted_keys`,
    /// or `[plugins] trusted_keys`): not loaded for that tenant (quarantined at start-up, the
    /// old version kept on reload).
    #[error("plugin {path} (tenant {tenant}): refused: {reason}")]
    SignerRefused {
        /// The plugin file or OCI reference.
        path: PathBuf,
        /// The tenant whose keys refuse it.
        tenant: String,
        /// Who signed it (and which section trusts that key) and which keys this tenant takes.
        reason: String,
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
    /// (`sluice:plugin/transformer@0.3.0`).
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
