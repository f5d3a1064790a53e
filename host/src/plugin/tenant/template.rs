//! A tenant's plugin as configured ([`TenantTemplate`]: code, config, limits) and the live,
//! configured instance made from it ([`PluginInstance`]).

use std::sync::Arc;

use crate::encoding::MessageFormats;
use crate::plugin::PluginError;
use crate::plugin::builtin::Builtin;
use crate::plugin::keys::KeyScope;
use crate::plugin::limits::Limits;
use crate::plugin::supply::Sha256Pin;
use crate::plugin::tenant::quarantine::Quarantine;
use crate::plugin::tenant::watch::Watch;
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::wasm::host_api::TenantShared;
use crate::plugin::wasm::instance::WasmInstance;
use crate::problem::Problem;

/// A tenant's transform logic as configured: everything needed to (re)create its
/// [`PluginInstance`].
pub(crate) struct TenantTemplate {
    pub(crate) code: PluginCode,
    pub(crate) config: Vec<(String, String)>,
    pub(crate) limits: Limits,
    /// `key_format`/`value_format` of the tenant's section (`None`: both raw).
    pub(crate) formats: Option<Arc<MessageFormats>>,
    /// The section's `sha256`: no instance is made of a file with another digest.
    pub(crate) pin: Option<Sha256Pin>,
    /// The keys that may sign the section's file (`None`: signatures are not checked for it).
    pub(crate) keys: Option<Arc<KeyScope>>,
    /// Set while this plugin + config cannot start; shared by every tenant using the template.
    pub(crate) quarantine: Quarantine,
    /// How the plugin is named in logs, statuses and metric labels (made once: it is read
    /// for every tenant group of every batch).
    described: String,
}

/// A tenant's plugin as loaded: the compiled component (shared by every tenant using the
/// file), a builtin, or a file that failed to load.
#[derive(Clone)]
pub(crate) enum PluginCode {
    Wasm(Arc<LoadedPlugin>),
    Builtin(String),
    /// A file that failed to load at start-up (without `strict_startup`): its tenants are
    /// quarantined until a reload loads it.
    Broken {
        path: std::path::PathBuf,
        reason: String,
    },
    /// A file not compiled yet (`[plugins] load = "lazy"`): the router loads it in the
    /// background on the tenant's first row, and leaves the tenant out of claims meanwhile.
    Pending(std::path::PathBuf),
}

impl TenantTemplate {
    pub(crate) fn new(code: PluginCode, config: Vec<(String, String)>, limits: Limits) -> Self {
        let described = match &code {
            PluginCode::Builtin(name) => format!("builtin:{name}"),
            PluginCode::Wasm(plugin) => plugin.path().display().to_string(),
            PluginCode::Broken { path, .. } | PluginCode::Pending(path) => {
                path.display().to_string()
            }
        };
        Self {
            code,
            config,
            limits,
            formats: None,
            pin: None,
            keys: None,
            quarantine: Quarantine::default(),
            described,
        }
    }

    /// The template with the section's message formats.
    pub(crate) fn with_formats(mut self, formats: Option<Arc<MessageFormats>>) -> Self {
        self.formats = formats;
        self
    }

    /// [`TenantTemplate::with_formats`], the formats reading the schemas this template's
    /// plugin declares (a reload's new file declares its own).
    pub(crate) fn with_declared_formats(self, formats: Option<Arc<MessageFormats>>) -> Self {
        let formats = formats.map(|f| match &self.code {
            PluginCode::Wasm(plugin) => Arc::new(MessageFormats {
                declared: Arc::clone(plugin.declared_schemas()),
                ..(*f).clone()
            }),
            PluginCode::Builtin(_) | PluginCode::Broken { .. } | PluginCode::Pending(_) => f,
        });
        self.with_formats(formats)
    }

    /// The template with its section's `sha256` pin.
    pub(crate) fn pinned(mut self, pin: Option<Sha256Pin>) -> Self {
        self.pin = pin;
        self
    }

    /// Why `plugin` may not run for `tenant` under this template's pin, if it may not.
    pub(crate) fn pin_refuses(&self, plugin: &LoadedPlugin, tenant: &str) -> Option<PluginError> {
        let pin = self.pin.as_ref()?;
        (!pin.matches(plugin.digest())).then(|| PluginError::PinMismatch {
            path: plugin.path().to_owned(),
            tenant: tenant.to_owned(),
            expected: pin.to_string(),
            found: plugin.digest().to_owned(),
        })
    }

    /// The template with the keys that may sign its section's file.
    pub(crate) fn signed_by(mut self, keys: Option<Arc<KeyScope>>) -> Self {
        self.keys = keys;
        self
    }

    /// Why `plugin` may not run for `tenant` under this template's pin or keys, if it may not.
    pub(crate) fn refuses(&self, plugin: &LoadedPlugin, tenant: &str) -> Option<PluginError> {
        self.pin_refuses(plugin, tenant).or_else(|| {
            let reason = self.keys.as_ref()?.refuses(plugin.signer())?;
            Some(PluginError::SignerRefused {
                path: plugin.path().to_owned(),
                tenant: tenant.to_owned(),
                reason,
            })
        })
    }

    /// The template, its quarantine an event of `watch` (see [`Watch`]).
    pub(crate) fn watched_by(mut self, watch: &Arc<Watch>) -> Self {
        self.quarantine = Quarantine::watched_by(watch);
        self
    }

    /// The plugin file, for WASM plugins.
    pub(crate) fn path(&self) -> Option<&std::path::Path> {
        match &self.code {
            PluginCode::Wasm(plugin) => Some(plugin.path()),
            PluginCode::Broken { path, .. } | PluginCode::Pending(path) => Some(path),
            PluginCode::Builtin(_) => None,
        }
    }

    /// The loaded file's content hash (WASM plugins).
    pub(crate) fn digest(&self) -> Option<&str> {
        match &self.code {
            PluginCode::Wasm(plugin) => Some(plugin.digest()),
            PluginCode::Builtin(_) | PluginCode::Broken { .. } | PluginCode::Pending(_) => None,
        }
    }

    /// Where the loaded bytes came from (WASM plugins): the file or the OCI reference.
    pub(crate) fn source(&self) -> Option<&str> {
        match &self.code {
            PluginCode::Wasm(plugin) => Some(plugin.source()),
            PluginCode::Builtin(_) | PluginCode::Broken { .. } | PluginCode::Pending(_) => None,
        }
    }

    /// The trusted key that signed the loaded bytes.
    pub(crate) fn signer(&self) -> Option<&crate::plugin::supply::Signer> {
        match &self.code {
            PluginCode::Wasm(plugin) => plugin.signer(),
            PluginCode::Builtin(_) | PluginCode::Broken { .. } | PluginCode::Pending(_) => None,
        }
    }

    /// The version the plugin reports about itself: a WASM plugin's `info()` (known once an
    /// instance was created), Sluice's own for builtins.
    pub(crate) fn version(&self) -> Option<&str> {
        match &self.code {
            PluginCode::Wasm(plugin) => plugin.version(),
            PluginCode::Builtin(_) => Some(env!("CARGO_PKG_VERSION")),
            PluginCode::Broken { .. } | PluginCode::Pending(_) => None,
        }
    }

    /// Whether the plugin waits for its first row to be compiled (`load = "lazy"`).
    pub(crate) fn pending(&self) -> bool {
        matches!(self.code, PluginCode::Pending(_))
    }

    /// The same config, limits, formats and pin with other code, not quarantined.
    pub(crate) fn with_code(&self, code: PluginCode) -> Self {
        TenantTemplate::new(code, self.config.clone(), self.limits.clone())
            .with_declared_formats(self.formats.clone())
            .pinned(self.pin.clone())
            .signed_by(self.keys.clone())
    }

    /// How the plugin is named in logs and statuses.
    pub(crate) fn describe(&self) -> &str {
        &self.described
    }
}

/// A live, configured plugin for one tenant.
pub(crate) enum PluginInstance {
    /// A component instantiated in the tenant's own `wasmtime::Store`.
    Wasm(Box<WasmInstance>),
    Builtin(Builtin),
}

impl PluginInstance {
    /// Instantiates and configures `template` for the tenant of `shared`.
    pub(crate) fn create(
        template: &TenantTemplate,
        shared: &Arc<TenantShared>,
    ) -> Result<Self, PluginError> {
        match &template.code {
            PluginCode::Wasm(plugin) => {
                // Checked here, where every instance is made: start-up, reloads, retries,
                // and tenants first seen later all go through it.
                if let Some(refused) = template.refuses(plugin, &shared.tenant().to_string()) {
                    return Err(refused);
                }
                WasmInstance::create(plugin, shared, &template.config, &template.limits)
                    .map(|i| Self::Wasm(Box::new(i)))
            }
            PluginCode::Builtin(name) => Builtin::configure(name, &template.config)
                .map(Self::Builtin)
                .map_err(|message| {
                    let key = format!("builtin {name:?} (tenant {})", shared.tenant());
                    Problem::new(key, message).into()
                }),
            PluginCode::Broken { path, reason } => {
                Err(PluginError::bad_plugin(path, reason.clone()))
            }
            PluginCode::Pending(path) => Err(PluginError::bad_plugin(
                path,
                "not compiled yet (plugins.load = \"lazy\")".to_owned(),
            )),
        }
    }
}
