//! The plugin settings as written in `sluice.toml` — `[plugins]`, `[plugins.default]`,
//! `[tenants.<name>]` — with their defaults and the checks each key gets on its own. How a
//! tenant inherits from `[plugins.default]` is here too ([`PluginSpec::inherit`]), and what
//! `config check` warns about in it ([`PluginSpec::inheritance_warnings`]); the router and
//! `plugin test --tenant` only apply it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess};
use serde::{Deserialize, Deserializer};

use crate::encoding::FormatsSpec;
use crate::plugin::builtin::Builtin;
use crate::plugin::limits::LimitsSpec;
use crate::plugin::supply::Sha256Pin;
use crate::plugin::supply::oci::{OciLocation, OciRegistrySettings};
use crate::plugin::wasm::engine::MAX_POOLED_INSTANCES;
use crate::problem::Problem;
use crate::setting_group::{KnownKey, SettingGroup, at_least_one, concat_keys, setting_group};
use crate::text::toml_scalar;

/// Environment variable that overrides `plugins.cache_dir` (also for `sluice plugin …`).
pub const PLUGIN_CACHE_ENV: &str = "SLUICE_PLUGIN_CACHE_DIR";

/// The compile cache directory: the environment override, else `configured`, else the user's
/// cache directory. An empty path disables caching.
pub fn plugin_cache_dir(configured: Option<&Path>) -> Option<PathBuf> {
    let chosen = match std::env::var_os(PLUGIN_CACHE_ENV) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => configured.map(Path::to_path_buf),
    };
    match chosen {
        Some(dir) if dir.as_os_str().is_empty() => None,
        Some(dir) => Some(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("sluice").join("plugins")),
    }
}

/// The most `max_unconfigured_instances` may be: half of the instances one process pools
/// (16,384 of 32,768), the other half for tenants with their own entry.
pub const MAX_UNCONFIGURED_INSTANCES: usize = MAX_POOLED_INSTANCES as usize / 2;

setting_group! {
    /// `[plugins]`: the default plugin, the compile cache, what start-up does with a plugin
    /// that fails, who may sign plugins and where they are pulled from, and the instance
    /// budgets. The defaults' reasons: `cache_max_mb` — a Python or JavaScript plugin's entry
    /// is ~35 MB and every rebuild adds one; the two memory budgets have none written here:
    /// left out, they are sized at start from the container's memory limit
    /// ([`crate::plugin::budgets`]).
    pub struct PluginsSpec => PluginsSettings {
        /// Compiled plugins are cached here, one file per plugin content hash and wasmtime version/settings, so restarts skip compilation (seconds for Python/JS components). `""` disables the cache. The environment variable `SLUICE_PLUGIN_CACHE_DIR` overrides it (also for `sluice plugin check/test`). The directory must be writable only by the user Sluice runs as: cached files are loaded as native code.
        cache_dir: PathBuf => "`$XDG_CACHE_HOME/sluice/plugins`, else `~/.cache/sluice/plugins`";
        /// Most MiB Sluice keeps under `cache_dir`: compiled plugins (`*.cwasm`) and OCI plugins pulled into `oci/` share it (neither has a share of its own). After each compile or pull, and once at start-up, the least recently used of these files (by file time, renewed on every use) are removed until the rest fit — never a file a plugin loaded in this process needs: its compiled code, and an OCI plugin's component, signature and tag (what a start during a registry outage falls back to). When those alone pass the bound, the directory stays over it and a warning says so. Other files in the directory are not touched, except what an interrupted write left behind (a temporary file of Sluice's not written to for an hour: a relay killed mid-compile), which goes whatever the bound. Each rebuild of a Python/JavaScript plugin adds a ~35 MB entry. `sluice plugin check FILE.wasm` precompiles a file into the cache at deploy time ([plugins.md](plugins.md#checking-and-trying-a-plugin)).
        cache_max_mb: u64 = 1024 => "`1024`";
        /// The plugin for rows whose tenant has no `[tenants.<name>]` entry, and for rows without a tenant ([below](#pluginsdefault)).
        default: PluginSpec => "—";
        /// A directory of tenant files, relative to the config file: `acme.toml` holds the keys of `[tenants.acme]` at its top level (no header; relative paths in it are relative to it). `*.toml` files only, symlinks followed (a mounted Kubernetes ConfigMap or Secret works as it is); hidden files and other names (`.acme.toml.swp`, `acme.toml~`, `..data`) are ignored. A tenant may be defined here or in `[tenants]`, not both. Watched while the relay runs: a new file starts its tenant, a changed one rebuilds it, a deleted one stops it ([operations.md](operations.md#changing-tenants-live)).
        tenants_dir: PathBuf => "—";
        /// When a tenant's plugin is compiled and started: `"eager"` — every configured tenant at start-up and on reload (a rejected `config` is reported then); `"lazy"` — on the tenant's first due row (its rows wait, left out of claims, while its plugin compiles in the background; other tenants do not wait). Lazy suits thousands of tenants with distinct plugins: start-up and `/readyz` do not wait for them. `[plugins.default]` is always started at once. `config check` starts every plugin either way. Not with `strict_startup = true`.
        load: LoadMode = LoadMode::Eager => "`\"eager\"`";
        /// What `sluice run` does when a tenant's plugin cannot start (the file does not load; instantiation or `configure` fails or exceeds `call_timeout`): `false` quarantines that tenant — the reason is logged, its rows wait unclaimed with no attempt counted, starting is retried with back-off (5 s doubling to 5 min), on file change and on SIGHUP — and runs the others; `true` refuses to start, naming the plugin and the reason. A failing `[plugins.default]` quarantines every tenant that uses it ([plugins.md](plugins.md#the-sandbox-and-its-limits)).
        strict_startup: bool = false => "`false`";
        /// minisign public keys (each the base64 line of a `.pub` file, or a whole `.pub` file, e.g. `"${file:/etc/sluice/keys/release.pub}"`). When set, every `.wasm` plugin must carry a valid signature of its exact bytes by one of them (`<path>.minisig`, or a signature layer of an OCI plugin); an unsigned or wrongly signed plugin is not loaded (its tenants quarantined, or the old version kept on reload). A section's own `trusted_keys` (`[tenants.<name>]`, `[plugins.default]`) replaces these for its plugin ([plugins.md](plugins.md#keys-per-tenant)). Read at start ([plugins.md](plugins.md#sign)).
        trusted_keys: Vec<String> = Vec::new() => "`[]`";
        /// `[plugins.registries."<host[:port]>"]`: how to reach an OCI registry that `oci://` plugin paths name: `username` + `password` (usually `${file:…}`; basic auth, or a bearer token the registry's token service issues for them), `plain_http = true` (no TLS: loopback or in-cluster registries), `ca_location` (PEM file of the registry's CA; a relative path is relative to the config file, and `config check` reads it even while no plugin uses the registry), `timeout` (per request, default `"60s"`). Registries without an entry are pulled anonymously over HTTPS ([plugins.md](plugins.md#push-and-pull-oci-registries)).
        registries: BTreeMap<String, OciRegistrySettings> = BTreeMap::new() => "—";
        /// Most live plugin instances kept for tenants without their own `[tenants.<name>]` entry (rows carry free-form tenant values), and most such tenants remembered between batches (breaker, counters). A tenant that needs an instance when this or `unconfigured_instances_memory_mb` is reached takes the place of an idle one (least recently used, by a clock sweep): its rows run in the same batch; they are put back for a later batch only when every other instance is in use at that moment. 1–16,384 (one process pools at most 32,768 plugin instances; the other half is kept for tenants with their own entry).
        max_unconfigured_instances: usize = 1024 => "`1024`", check unconfigured_instances;
        /// Most linear memory (MiB) those instances hold together, as measured after each call; past it, idle instances are dropped as above. A Rust plugin's instance holds about 1 MiB, a Python or JavaScript one tens of MiB. The first instance is always allowed. At least 1. Left out under a container (cgroup) memory limit, it is one fifth of what the limit leaves plugins, if that is less than 512 ([below](#memory-under-a-container-limit)).
        unconfigured_instances_memory_mb: usize => "`512`, less under a memory limit", check at_least_one;
        /// Most linear memory (MiB) the instances of tenants with their own `[tenants.<name>]` entry, and of rows without a tenant, hold together. Every such tenant's plugin is instantiated and configured at start-up and on reload (so a rejected config is reported then), but past this budget idle instances are dropped, least recently used first, and created again for their tenant's next row: memory follows the tenants that have rows, not how many are configured. A separate budget from the one above, so free-form tenants never take a configured tenant's instance. With more configured tenants than one process can pool instances for (15,872 or more with the default `max_unconfigured_instances`), their live instances are also capped in number: half of what `max_unconfigured_instances` leaves of 32,768 ([plugins.md](plugins.md#the-sandbox-and-its-limits)). At least 1. Left out under a container (cgroup) memory limit, it is four fifths of what the limit leaves plugins, if that is less than 2048 ([below](#memory-under-a-container-limit)).
        configured_instances_memory_mb: usize => "`2048`, less under a memory limit", check at_least_one;
    }
}

fn unconfigured_instances(count: &usize) -> Result<(), String> {
    match *count {
        0 => Err("must be at least 1".into()),
        n if n > MAX_UNCONFIGURED_INSTANCES => Err(format!(
            "must be at most {MAX_UNCONFIGURED_INSTANCES}: one process pools at most \
             {MAX_POOLED_INSTANCES} plugin instances, and tenants with their own entry need \
             the rest"
        )),
        _ => Ok(()),
    }
}

/// A plugin, its configuration and its sandbox limits: `[plugins.default]` (which must name
/// a `path` or `builtin`) and `[tenants.<name>]` (keys left out are taken from
/// `[plugins.default]` as [`PluginSpec::inherit`] says). The limit and format keys are
/// written at the section's top level, beside `path`; each group is declared once
/// ([`LimitsSpec`], [`FormatsSpec`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginSpec {
    /// Path to the `.wasm` component (relative paths are resolved against the config file), or
    /// an OCI reference: `oci://host[:port]/repository:tag` or `…@sha256:<manifest digest>`.
    pub path: Option<PathBuf>,
    /// The SHA-256 the component's bytes must have (`sluice plugin check` prints it): any
    /// other file is refused. Goes with `path`: a tenant that runs the default plugin takes
    /// `[plugins.default]`'s.
    pub sha256: Option<String>,
    /// A routing plugin compiled into Sluice instead of a `.wasm` file (see
    /// [`Builtin`]); exclusive with `path`.
    pub builtin: Option<String>,
    /// minisign public keys, one of which must have signed this section's component: when
    /// set, they replace `[plugins] trusted_keys` for it (see [`crate::plugin::keys`]). Goes
    /// with `path`, as `sha256` does.
    pub trusted_keys: Option<Vec<String>>,
    /// Passed to the plugin's `configure` as string pairs.
    pub config: Option<BTreeMap<String, toml::Value>>,
    /// The broker this section's messages go to (`"kafka"`, `"nats"`, `"rabbitmq"`,
    /// `"redis"`; `None`: `[plugins.default]`'s, else Kafka). A tenant takes it from
    /// `[plugins.default]` whether or not it names its own plugin: where messages go is the
    /// platform's choice, as the sandbox limits are.
    pub broker: Option<crate::model::Broker>,
    /// The sandbox limits (`memory_mb`, `call_timeout`, `allowed_topics`, `max_*`, the
    /// circuit breaker).
    pub limits: LimitsSpec,
    /// The Schema Registry keys (`value_format`, `subject_strategy`, …; docs/schema-registry.md).
    pub formats: FormatsSpec,
    /// Rows per plugin call from the first row on (1: `transform` only); `None`: the relay's
    /// probation, then `transform-batch` chunks. Not a config key: set by `sluice plugin test
    /// --batch-size`.
    pub call_batch_rows: Option<usize>,
}

/// A plugin section's own keys; the groups' follow, in the order an unknown key's error
/// lists them.
const OWN_KEYS: &[&str] = &[
    "path",
    "sha256",
    "builtin",
    "config",
    "trusted_keys",
    "broker",
];
const KEY_COUNT: usize = OWN_KEYS.len() + LimitsSpec::KEYS.len() + FormatsSpec::KEYS.len();
static PLUGIN_KEYS: [&str; KEY_COUNT] =
    concat_keys(&[OWN_KEYS, LimitsSpec::KEYS, FormatsSpec::KEYS]);

impl<'de> Deserialize<'de> for PluginSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = PluginSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("struct PluginSpec")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PluginSpec, A::Error> {
                let mut spec = PluginSpec::default();
                while let Some(key) = map.next_key_seed(KnownKey(&PLUGIN_KEYS))? {
                    match key {
                        "path" => spec.path = Some(map.next_value()?),
                        "sha256" => spec.sha256 = Some(map.next_value()?),
                        "builtin" => spec.builtin = Some(map.next_value()?),
                        "config" => spec.config = Some(map.next_value()?),
                        "trusted_keys" => spec.trusted_keys = Some(map.next_value()?),
                        "broker" => spec.broker = Some(map.next_value()?),
                        // Known (the seed checked it), so one of the groups reads it.
                        other => {
                            if !spec.limits.read_key(other, &mut map)? {
                                spec.formats.read_key(other, &mut map)?;
                            }
                        }
                    }
                }
                Ok(spec)
            }
        }
        deserializer.deserialize_struct("PluginSpec", &PLUGIN_KEYS, Visitor)
    }
}

/// Where a tenant's transform logic comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginSource {
    /// A WebAssembly component file.
    Wasm(PathBuf),
    /// A plugin built into Sluice, by name.
    Builtin(String),
}

/// When configured tenants' plugins are compiled and started (`[plugins] load`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadMode {
    /// Every configured tenant at start-up and on reload.
    #[default]
    Eager,
    /// On the tenant's first due row, in the background.
    Lazy,
}

impl PluginsSettings {
    /// Problems with `[plugins]` itself and `[plugins.default]`.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = self.key_problems("plugins");
        if let Some(default) = &self.default {
            problems.extend(default.problems("plugins.default", true));
        }
        if let Err((at, message)) = crate::plugin::supply::TrustedKeys::parse(&self.trusted_keys) {
            problems.push(Problem::new(format!("plugins.trusted_keys[{at}]"), message));
        }
        for (host, registry) in &self.registries {
            problems.extend(registry.problems(&format!("plugins.registries.\"{host}\"")));
        }
        if self.strict_startup && self.load == LoadMode::Lazy {
            problems.push(Problem::new(
                "plugins.load",
                "\"lazy\" starts tenants' plugins on their first row, so strict_startup = true \
                 (refuse to start when one cannot start) cannot apply; use one or the other",
            ));
        }
        problems
    }
}

impl PluginSpec {
    /// This tenant's entry completed from `[plugins.default]` — the one inheritance rule:
    ///
    /// - a tenant that names no plugin (no `path`, no `builtin`) runs the default plugin and
    ///   takes every key it leaves out from `[plugins.default]`: the plugin, its `config` (as a
    ///   whole: a tenant's `config` replaces the default's, tables are not merged), its
    ///   `allowed_topics` and each sandbox limit;
    /// - a tenant that names its own plugin takes neither `config` nor `allowed_topics` from
    ///   `[plugins.default]` — they describe the default plugin's routing, which its own
    ///   plugin does not share — only the sandbox limits it leaves out (`memory_mb`,
    ///   `call_timeout`, `max_*`, the circuit breaker …), which are the platform's.
    pub fn inherit(&self, default: Option<&PluginSpec>) -> PluginSpec {
        let Some(default) = default else {
            return self.clone();
        };
        let own_plugin = self.names_plugin();
        let mut limits = self.limits.clone().or(&default.limits);
        if own_plugin {
            limits.allowed_topics = self.limits.allowed_topics.clone();
        }
        // The pin and the keys vouch for the file `path` names: they go with it.
        let (path, sha256, builtin, trusted_keys) = match own_plugin {
            true => (
                self.path.clone(),
                self.sha256.clone(),
                self.builtin.clone(),
                self.trusted_keys.clone(),
            ),
            false => (
                default.path.clone(),
                default.sha256.clone(),
                default.builtin.clone(),
                default.trusted_keys.clone(),
            ),
        };
        let config = match own_plugin {
            true => self.config.clone(),
            false => self.config.clone().or_else(|| default.config.clone()),
        };
        PluginSpec {
            path,
            sha256,
            builtin,
            trusted_keys,
            config,
            broker: self.broker.or(default.broker),
            limits,
            formats: self.formats.clone().or(&default.formats),
            call_batch_rows: self.call_batch_rows.or(default.call_batch_rows),
        }
    }

    /// Resolves relative schema file paths against the config file's directory.
    pub fn resolve_schema_paths(&mut self, base: &Path) {
        FormatsSpec::resolve_paths(&mut self.formats.value_schema, base);
        FormatsSpec::resolve_paths(&mut self.formats.key_schema, base);
    }

    /// The limits of this (resolved) section, with its broker.
    pub fn resolved_limits(&self) -> Result<crate::plugin::limits::Limits, String> {
        let mut limits =
            crate::plugin::limits::Limits::resolve(&self.limits, self.call_batch_rows)?;
        limits.broker = self.broker();
        Ok(limits)
    }

    /// The broker this section's messages go to (Kafka when it names none).
    pub fn broker(&self) -> crate::model::Broker {
        self.broker.unwrap_or_default()
    }

    /// Whether this entry names its own plugin (`path` or `builtin`).
    pub fn names_plugin(&self) -> bool {
        self.path.is_some() || self.builtin.is_some()
    }

    /// Where [`PluginSpec::inherit`] may not do what this tenant's author expects, each at
    /// `key` + sub-key, saying what happens and how to say it explicitly: `config check` warns
    /// about them without failing.
    pub fn inheritance_warnings(&self, key: &str, default: Option<&PluginSpec>) -> Vec<Problem> {
        let Some(default) = default else {
            return Vec::new();
        };
        let mut warnings = Vec::new();
        let default_config = default.config.as_ref().filter(|c| !c.is_empty());
        if self.names_plugin() {
            if let (None, Some(inherited)) = (&self.config, default_config) {
                warnings.push(Problem::new(
                    format!("{key}.config"),
                    format!(
                        "not set, and a tenant with its own plugin does not take \
                         [plugins.default]'s config: its plugin gets no {} (set `config` \
                         here, or `config = {{}}` if it needs none)",
                        keys(inherited)
                    ),
                ));
            }
            if let (None, Some(inherited)) =
                (&self.limits.allowed_topics, &default.limits.allowed_topics)
            {
                warnings.push(Problem::new(
                    format!("{key}.allowed_topics"),
                    format!(
                        "not set, and a tenant with its own plugin does not take \
                         [plugins.default]'s allowed_topics ({}): its plugin may route to any \
                         topic (set `allowed_topics` here, or [\"*\"] to allow any topic)",
                        inherited.join(", ")
                    ),
                ));
            }
        } else if let (Some(own), Some(inherited)) = (&self.config, default_config) {
            let dropped: BTreeMap<String, toml::Value> = inherited
                .iter()
                .filter(|(k, _)| !own.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !dropped.is_empty() {
                warnings.push(Problem::new(
                    format!("{key}.config"),
                    format!(
                        "replaces [plugins.default]'s config as a whole (the tables are not \
                         merged): the default plugin gets no {} for this tenant (repeat the \
                         keys it needs here)",
                        keys(&dropped)
                    ),
                ));
            }
        }
        warnings
    }

    /// Problems with this entry on its own, each at `key` or one of its sub-keys;
    /// `required`: whether it must name its plugin (`[plugins.default]` must).
    pub fn problems(&self, key: &str, required: bool) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Err(m) = validate_source(&self.path, &self.builtin, required) {
            problems.push(Problem::new(key, m));
        }
        if let Some(Some(Err(m))) = self
            .path
            .as_ref()
            .map(|p| OciLocation::parse(&p.to_string_lossy()))
        {
            problems.push(Problem::new(format!("{key}.path"), m));
        }
        if let Some(pin) = &self.sha256 {
            if let Err(m) = Sha256Pin::parse(pin) {
                problems.push(Problem::new(format!("{key}.sha256"), m));
            } else if self.path.is_none() {
                problems.push(Problem::new(
                    format!("{key}.sha256"),
                    match &self.builtin {
                        Some(_) => "pins a `.wasm` component; a builtin has none",
                        None => {
                            "pins the component `path` names: set `path` here too (a tenant \
                             that runs [plugins.default] takes its pin)"
                        }
                    },
                ));
            }
        }
        problems.extend(self.trusted_keys_problems(key));
        if let Some(config) = &self.config
            && let Err(problem) = validate_config_table(key, config)
        {
            problems.push(problem);
        }
        problems.extend(self.limits.key_problems(key));
        problems.extend(self.formats.key_problems(key));
        problems
    }

    /// Problems with this section's own `trusted_keys`: each key must parse, the list must not
    /// be empty (that would turn signatures off for it), and it needs the `path` it vouches for.
    fn trusted_keys_problems(&self, key: &str) -> Vec<Problem> {
        let Some(keys) = &self.trusted_keys else {
            return Vec::new();
        };
        let at = format!("{key}.trusted_keys");
        if keys.is_empty() {
            return vec![Problem::new(
                at,
                "is empty: list the keys that may sign this plugin, or leave the key out to \
                 use [plugins] trusted_keys",
            )];
        }
        if let Err((index, message)) = crate::plugin::supply::TrustedKeys::parse(keys) {
            return vec![Problem::new(format!("{at}[{index}]"), message)];
        }
        if self.path.is_none() {
            return vec![Problem::new(
                at,
                match &self.builtin {
                    Some(_) => "vouch for a `.wasm` component; a builtin is not signed",
                    None => {
                        "vouch for the component `path` names: set `path` here too (a tenant \
                         that runs [plugins.default] takes its trusted_keys)"
                    }
                },
            )];
        }
        Vec::new()
    }

    /// The plugin's `configure` pairs.
    pub fn config_pairs(&self) -> Vec<(String, String)> {
        self.config.as_ref().map(config_pairs).unwrap_or_default()
    }

    /// `path` or `builtin`, whichever is set (validation ensures not both).
    pub fn source(&self) -> Option<PluginSource> {
        match (&self.path, &self.builtin) {
            (Some(p), _) => Some(PluginSource::Wasm(p.clone())),
            (None, Some(b)) => Some(PluginSource::Builtin(b.clone())),
            (None, None) => None,
        }
    }

    /// The `sha256` pin, parsed (`None` when unset or malformed: validation reports that).
    pub fn pin(&self) -> Option<Sha256Pin> {
        self.sha256
            .as_deref()
            .and_then(|p| Sha256Pin::parse(p).ok())
    }
}

/// A `config` table's keys for a message: `topic_prefix` or `keys a, b`. Names only: the
/// values may be secrets.
fn keys(table: &BTreeMap<String, toml::Value>) -> String {
    let names: Vec<&str> = table.keys().map(String::as_str).collect();
    match names.as_slice() {
        [one] => format!("`{one}`"),
        many => format!("keys {}", many.join(", ")),
    }
}

/// Converts a plugin `config` table to the string pairs `configure` receives.
pub fn config_pairs(table: &BTreeMap<String, toml::Value>) -> Vec<(String, String)> {
    table
        .iter()
        .filter_map(|(k, v)| toml_scalar(v).map(|v| (k.clone(), v)))
        .collect()
}

/// `key`'s `config` table: scalar values only.
fn validate_config_table(key: &str, table: &BTreeMap<String, toml::Value>) -> Result<(), Problem> {
    for (k, v) in table {
        if toml_scalar(v).is_none() {
            return Err(Problem::new(
                format!("{key}.config.{k}"),
                "plugin config values must be strings, numbers or booleans",
            ));
        }
    }
    Ok(())
}

fn validate_source(
    path: &Option<PathBuf>,
    builtin: &Option<String>,
    required: bool,
) -> Result<(), String> {
    match (path, builtin) {
        (Some(_), Some(_)) => Err("set either `path` or `builtin`, not both".into()),
        (None, None) if required => Err("needs `path` (a .wasm component) or `builtin`".into()),
        (_, Some(name)) => Builtin::check_name(name).map_err(|m| format!("builtin: {m}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::setting_group::undocumented;

    fn spec(toml: &str) -> PluginSpec {
        toml::from_str(toml).unwrap()
    }

    const DEFAULT: &str = "builtin = \"route-by-aggregate\"\nconfig = { topic_prefix = \"d.\" }\n\
                           allowed_topics = [\"d.*\"]\nmemory_mb = 64\ncall_timeout = \"50ms\"\n";

    #[test]
    fn a_tenant_with_its_own_plugin_keeps_the_platform_limits_but_not_the_default_routing() {
        let default = spec(DEFAULT);
        for own in ["path = \"own.wasm\"", "builtin = \"route-by-aggregate\""] {
            let tenant = spec(&format!("{own}\nmax_outputs_per_row = 3\n"));
            let resolved = tenant.inherit(Some(&default));
            assert_eq!(resolved.source(), tenant.source(), "{own}");
            assert_eq!(resolved.config, None, "{own}: not the default's config");
            assert!(resolved.config_pairs().is_empty(), "{own}");
            assert_eq!(resolved.limits.allowed_topics, None, "{own}: any topic");
            assert_eq!(resolved.limits.memory_mb, Some(64), "{own}: platform limit");
            assert_eq!(
                resolved.limits.call_timeout,
                Some(Duration::from_millis(50))
            );
            assert_eq!(
                resolved.limits.max_outputs_per_row,
                Some(3),
                "{own}: its own limit"
            );
        }
        // Its own config and allow-list are its own.
        let tenant =
            spec("path = \"own.wasm\"\nconfig = { x = 1 }\nallowed_topics = [\"own.*\"]\n");
        let resolved = tenant.inherit(Some(&default));
        assert_eq!(resolved.config_pairs(), vec![("x".into(), "1".into())]);
        assert_eq!(
            resolved.limits.allowed_topics,
            Some(vec!["own.*".to_owned()])
        );
    }

    #[test]
    fn a_tenant_without_its_own_plugin_runs_the_default_with_overrides() {
        let default = spec(DEFAULT);
        let resolved = spec("memory_mb = 16\n").inherit(Some(&default));
        assert_eq!(resolved.source(), default.source());
        assert_eq!(
            resolved.config_pairs(),
            vec![("topic_prefix".into(), "d.".into())]
        );
        assert_eq!(resolved.limits.allowed_topics, Some(vec!["d.*".to_owned()]));
        assert_eq!(resolved.limits.memory_mb, Some(16));
        assert_eq!(
            resolved.limits.call_timeout,
            Some(Duration::from_millis(50))
        );
        // `config` and `allowed_topics` replace the default's as a whole.
        let resolved =
            spec("config = { other = \"o\" }\nallowed_topics = [\"t\"]\n").inherit(Some(&default));
        assert_eq!(resolved.config_pairs(), vec![("other".into(), "o".into())]);
        assert_eq!(resolved.limits.allowed_topics, Some(vec!["t".to_owned()]));
        // Without [plugins.default] an entry is what it says.
        let alone = spec("path = \"own.wasm\"\n");
        assert_eq!(alone.inherit(None).source(), alone.source());
    }

    #[test]
    fn a_pin_goes_with_the_path_it_pins() {
        let hex = "3f".repeat(32);
        let default = spec(&format!("path = \"d.wasm\"\nsha256 = \"sha256:{hex}\"\n"));
        // Running the default plugin: its pin too.
        let follows = spec("memory_mb = 16\n").inherit(Some(&default));
        assert_eq!(follows.pin().unwrap().as_str(), format!("sha256:{hex}"));
        // Its own file: its own pin, or none.
        let own = spec("path = \"own.wasm\"\n").inherit(Some(&default));
        assert_eq!(own.pin(), None);
        assert!(default.problems("plugins.default", true).is_empty());
    }

    #[test]
    fn pins_without_a_file_or_malformed_are_problems_at_their_key() {
        let hex = "ab".repeat(32);
        let keys = |toml: &str| -> Vec<String> {
            spec(toml)
                .problems("tenants.acme", false)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let p = keys(&format!("sha256 = \"{hex}\"\n"));
        assert!(
            p[0].starts_with("tenants.acme.sha256: pins the component `path` names"),
            "{p:?}"
        );
        let p = keys(&format!(
            "builtin = \"route-by-aggregate\"\nsha256 = \"{hex}\"\n"
        ));
        assert!(p[0].contains("a builtin has none"), "{p:?}");
        let p = keys("path = \"a.wasm\"\nsha256 = \"sha1:abc\"\n");
        assert!(p[0].contains("64 hexadecimal digits"), "{p:?}");
        let p = keys("path = \"oci://router:1\"\n");
        assert!(
            p[0].starts_with("tenants.acme.path: `oci://router:1` names no registry"),
            "{p:?}"
        );
    }

    #[test]
    fn a_sections_own_trusted_keys_go_with_its_path_and_are_checked() {
        let key = "RWSXbzj3Sn2MjGwbwAN4UYQ5yBfHQ1Ceev5EklGh0X4eYQFklU+3mWZk";
        let problems = |toml: &str| -> Vec<String> {
            spec(toml)
                .problems("tenants.acme", false)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert!(problems(&format!("path = \"a.wasm\"\ntrusted_keys = [\"{key}\"]\n")).is_empty());
        let p = problems(&format!(
            "path = \"a.wasm\"\ntrusted_keys = [\"{key}\", \"x\"]\n"
        ));
        assert!(
            p[0].starts_with("tenants.acme.trusted_keys[1]: not a minisign public key"),
            "{p:?}"
        );
        let p = problems("path = \"a.wasm\"\ntrusted_keys = []\n");
        assert!(
            p[0].starts_with("tenants.acme.trusted_keys: is empty"),
            "an empty list would turn signatures off: {p:?}"
        );
        let p = problems(&format!("trusted_keys = [\"{key}\"]\n"));
        assert!(p[0].contains("set `path` here too"), "{p:?}");
        // Like the pin, the keys go with the plugin.
        let default = spec(&format!("path = \"d.wasm\"\ntrusted_keys = [\"{key}\"]\n"));
        let follows = spec("memory_mb = 16\n").inherit(Some(&default));
        assert_eq!(follows.trusted_keys, Some(vec![key.to_owned()]));
        let own = spec("path = \"own.wasm\"\n").inherit(Some(&default));
        assert_eq!(own.trusted_keys, None);
    }

    #[test]
    fn trusted_keys_and_registries_are_checked() {
        let settings: PluginsSettings = toml::from_str(
            "trusted_keys = [\"RWSXbzj3Sn2MjGwbwAN4UYQ5yBfHQ1Ceev5EklGh0X4eYQFklU+3mWZk\", \"nope\"]\n\
             [registries.\"reg.example.com\"]\nusername = \"ci\"\n",
        )
        .unwrap();
        let problems: Vec<String> = settings
            .problems()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("plugins.trusted_keys[1]: not a minisign public key"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("plugins.registries.\"reg.example.com\""),
            "{problems:?}"
        );
    }

    #[test]
    fn instance_counts_are_bounded_by_what_one_process_pools() {
        let problems = |max: usize| -> Vec<String> {
            PluginsSettings {
                max_unconfigured_instances: max,
                ..PluginsSettings::default()
            }
            .problems()
            .iter()
            .map(Problem::to_string)
            .collect()
        };
        assert!(problems(MAX_UNCONFIGURED_INSTANCES).is_empty());
        let too_many = problems(MAX_UNCONFIGURED_INSTANCES + 1);
        assert_eq!(too_many.len(), 1, "{too_many:?}");
        assert!(
            too_many[0].starts_with("plugins.max_unconfigured_instances: must be at most 16384"),
            "{too_many:?}"
        );
        assert_eq!(problems(0).len(), 1);
    }

    #[test]
    fn the_reference_lists_every_plugins_key_as_declared() {
        let reference = include_str!("../../../docs/configuration.md");
        if let Some(block) = undocumented(reference, &PluginsSpec::docs()) {
            panic!("docs/configuration.md's [plugins] table must hold these rows:\n{block}");
        }
    }

    #[test]
    fn the_reference_lists_every_plugin_key_as_declared() {
        let reference = include_str!("../../../docs/configuration.md");
        let docs = [LimitsSpec::docs(), FormatsSpec::docs()].concat();
        if let Some(block) = undocumented(reference, &docs) {
            panic!(
                "docs/configuration.md's [plugins.default] table must hold these rows, as \
                 declared (plugin/limits.rs, encoding/settings.rs):\n{block}"
            );
        }
    }

    fn warned(tenant: &str, default: &str) -> Vec<String> {
        spec(tenant)
            .inheritance_warnings("tenants.acme", Some(&spec(default)))
            .iter()
            .map(Problem::to_string)
            .collect()
    }

    #[test]
    fn surprising_inheritance_is_warned_about_and_silenced_by_saying_it() {
        let w = warned("path = \"own.wasm\"\n", DEFAULT);
        assert_eq!(w.len(), 2, "{w:#?}");
        assert!(
            w[0].starts_with("tenants.acme.config: ")
                && w[0].contains("`topic_prefix`")
                && w[0].contains("config = {}"),
            "{w:#?}"
        );
        assert!(
            w[1].starts_with("tenants.acme.allowed_topics: ")
                && w[1].contains("d.*")
                && w[1].contains("any topic"),
            "{w:#?}"
        );
        assert!(
            w.iter().all(|m| !m.contains("  ")),
            "one line of text each: {w:#?}"
        );
        // Said explicitly: nothing to warn about.
        let w = warned(
            "path = \"own.wasm\"\nconfig = {}\nallowed_topics = [\"*\"]\n",
            DEFAULT,
        );
        assert!(w.is_empty(), "{w:#?}");
        // The default plugin with a config that drops some of the default's keys.
        let w = warned(
            "config = { a = 1 }\n",
            "path = \"d.wasm\"\nconfig = { a = 2, topic_prefix = \"d.\", secret = \"s\" }\n",
        );
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].starts_with("tenants.acme.config: replaces")
                && w[0].contains("keys secret, topic_prefix")
                && !w[0].contains("\"s\""),
            "names keys, never values: {w:#?}"
        );
        // Overriding every key, or nothing, is plain.
        assert!(warned("config = { topic_prefix = \"a.\" }\n", DEFAULT).is_empty());
        assert!(warned("memory_mb = 8\n", DEFAULT).is_empty());
        // A default without config or allow-list leaves nothing to miss.
        assert!(warned("path = \"own.wasm\"\n", "path = \"d.wasm\"\n").is_empty());
        assert!(
            spec("path = \"own.wasm\"\n")
                .inheritance_warnings("tenants.acme", None)
                .is_empty()
        );
    }
}
