//! Loading a plugin file: compile the component, link it against the world, and keep the
//! resulting [`Pre`] (one per file, of the contract version it was built against) from which every tenant instance is created.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use wasmtime::component::Component;

use crate::encoding::settings::{DeclaredSchema, DeclaredSchemas, Format};
use crate::plugin::supply::{Fetched, Signer};
use crate::plugin::wasm::bindings::types as wit;
use crate::plugin::wasm::cache::{CacheHold, CompileCache};
use crate::plugin::wasm::contract::Pre;
use crate::plugin::wasm::engine::PluginEngine;
use crate::plugin::wasm::imports::{self, Refused};
use crate::plugin::{ComponentError, PluginError};
use crate::text::{MAX_LOGGED, bounded};

/// What every contract export's name starts with (`<package>/<interface>@<version>`).
const CONTRACT_PACKAGE: &str = "sluice:plugin/";

/// A compiled, linked plugin file. Cheap to instantiate many times.
pub(crate) struct LoadedPlugin {
    path: PathBuf,
    engine: Arc<PluginEngine>,
    pre: Pre,
    /// `sha256:` and the hex SHA-256 of the file as loaded (metrics, `/status`).
    digest: String,
    /// The file, or the OCI reference and the manifest digest it resolved to.
    source: String,
    /// The trusted key that signed the bytes (`None` without `[plugins] trusted_keys`).
    signer: Option<Signer>,
    /// The contract interface the component exports, with its version
    /// (`sluice:plugin/transformer@0.3.0`): the WIT it was built against.
    contract: String,
    /// The version the plugin reports in `info()`, asked once by its first instance.
    version: OnceLock<String>,
    /// The record schemas it declares in `info()` (contract 0.2.0), shared with the message
    /// formats of the tenants that run it.
    declared: DeclaredSchemas,
    /// The cache files it came from (compiled code; an OCI plugin's blobs and tag), kept from
    /// pruning while it is loaded.
    _holds: Vec<CacheHold>,
}

impl LoadedPlugin {
    /// Reads the file `path` (no signature or pin checks) and loads it as
    /// [`LoadedPlugin::load_fetched`] does.
    #[cfg(test)]
    pub(crate) fn load_cached(
        engine: &Arc<PluginEngine>,
        path: &Path,
        cache: Option<&CompileCache>,
    ) -> Result<Self, PluginError> {
        let fetched = crate::plugin::supply::PluginSupply::default().fetch(path)?;
        Self::load_fetched(engine, path, fetched, cache)
    }

    /// Compiles and links the bytes fetched from `path` (a file or an `oci://` location),
    /// reusing (and filling) the compile cache: compiled code is stored per content hash and
    /// engine compatibility hash, so unchanged plugins start without recompiling (large
    /// Python/JS components take seconds to compile). Imports the sandbox lacks are refused
    /// before compiling.
    pub(crate) fn load_fetched(
        engine: &Arc<PluginEngine>,
        path: &Path,
        fetched: Fetched,
        cache: Option<&CompileCache>,
    ) -> Result<Self, PluginError> {
        // wasmtime's errors quote names from inside the file (imports, exports): escape and
        // cut them like any other text a plugin author controls.
        let bad = |message: String| {
            PluginError::bad_plugin(path, bounded(&message, MAX_LOGGED).into_owned())
        };
        let refused = |what: &str, e: wasmtime::Error| {
            let message = bounded(&format!("{what}: {e:#}"), MAX_LOGGED).into_owned();
            bad_because(path, message, Box::new(ComponentError(e)))
        };
        let Fetched {
            bytes,
            digest,
            source,
            signer,
            mut holds,
        } = fetched;
        if wasmparser_is_core_module(&bytes) {
            return Err(bad(
                "this is a core WebAssembly module, not a component; build it for \
                 wasm32-wasip2 (or run `wasm-tools component new`)"
                    .into(),
            ));
        }
        // Cheap (no compilation): refuse imports the sandbox lacks before a compile that can
        // take seconds.
        imports::check(&bytes).map_err(|refused| {
            let message = refused.to_string();
            match refused {
                Refused::Unreadable(e) => bad_because(
                    path,
                    bounded(&message, MAX_LOGGED).into_owned(),
                    Box::new(e),
                ),
                Refused::Imports(_) => bad(message),
            }
        })?;
        let component = match cache {
            Some(cache) => {
                let (component, hold) = compile_cached(engine, &bytes, path, cache)?;
                holds.push(hold);
                component
            }
            None => {
                Component::new(engine.engine(), &bytes).map_err(|e| refused(NOT_A_COMPONENT, e))?
            }
        };
        let instance_pre = engine
            .linker()
            .instantiate_pre(&component)
            .map_err(|e| refused("imports do not match the sluice:plugin world", e))?;
        let contract = component
            .component_type()
            .exports(engine.engine())
            .map(|(name, _)| name)
            .find(|name| name.starts_with(CONTRACT_PACKAGE))
            .unwrap_or(CONTRACT_PACKAGE)
            .to_owned();
        let pre = Pre::new(instance_pre, &contract).map_err(|(what, e)| refused(&what, e))?;
        Ok(Self {
            path: path.to_owned(),
            engine: Arc::clone(engine),
            pre,
            digest,
            source,
            signer,
            contract,
            version: OnceLock::new(),
            declared: DeclaredSchemas::default(),
            _holds: holds,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file's content hash as loaded: changes with every reload of a new build.
    pub(crate) fn digest(&self) -> &str {
        &self.digest
    }

    /// The file, or the OCI reference with the manifest digest it resolved to.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The trusted key that signed it.
    pub(crate) fn signer(&self) -> Option<&Signer> {
        self.signer.as_ref()
    }

    /// The contract interface it exports, versioned (`sluice:plugin/transformer@0.3.0`).
    pub(crate) fn contract(&self) -> &str {
        &self.contract
    }

    /// The version from the plugin's `info()` (empty when `info()` failed); `None` until an
    /// instance was created.
    pub(crate) fn version(&self) -> Option<&str> {
        self.version.get().map(String::as_str)
    }

    /// The record schemas the plugin declares (empty until an instance asked `info()`).
    pub(crate) fn declared_schemas(&self) -> &DeclaredSchemas {
        &self.declared
    }

    /// Records the schemas the first instance declared; later calls change nothing.
    pub(crate) fn set_declared_schemas(&self, schemas: &[wit::RecordSchema]) {
        let declared = schemas
            .iter()
            .map(|s| DeclaredSchema {
                record: s.record_name.clone(),
                format: match s.format {
                    wit::SchemaFormat::Avro => Format::Avro,
                    wit::SchemaFormat::Protobuf => Format::Protobuf,
                    wit::SchemaFormat::JsonSchema => Format::JsonSchema,
                },
                schema: Arc::from(s.schema.as_str()),
            })
            .collect();
        let _ = self.declared.set(declared);
    }

    /// Records the version the first instance reported; later calls change nothing.
    pub(crate) fn set_version(&self, version: String) {
        let _ = self.version.set(version);
    }

    pub(crate) fn engine(&self) -> &Arc<PluginEngine> {
        &self.engine
    }

    pub(crate) fn pre(&self) -> &Pre {
        &self.pre
    }
}

/// What a file wasmtime cannot compile is called.
const NOT_A_COMPONENT: &str = "not a valid WebAssembly component";

/// A [`PluginError::BadPlugin`] whose message quotes `source`, kept as its cause.
fn bad_because(
    path: &Path,
    message: String,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> PluginError {
    PluginError::BadPlugin {
        path: path.to_owned(),
        message,
        source: Some(source),
    }
}

fn compile_cached(
    engine: &PluginEngine,
    bytes: &[u8],
    path: &Path,
    cache: &CompileCache,
) -> Result<(Component, CacheHold), PluginError> {
    let entry = cache.entry(engine, bytes);
    // Taken before the entry is read or written: a prune by another thread meanwhile keeps it.
    let hold = CacheHold::new(&entry);
    if entry.exists() {
        // SAFETY: the cache directory is Sluice's own (see docs/plugins.md: it must not be
        // writable by anyone who may not run code as Sluice); entries are written only by
        // `Component::serialize` (CompileCache::save), and the file name pins the engine
        // compatibility.
        match unsafe { Component::deserialize_file(engine.engine(), &entry) } {
            Ok(component) => {
                CompileCache::touch(&entry);
                tracing::info!(plugin = %path.display(), cache = %entry.display(), "loaded precompiled plugin from cache");
                return Ok((component, hold));
            }
            Err(e) => {
                tracing::warn!(cache = %entry.display(), error = %e, "ignoring unusable compile cache entry")
            }
        }
    }
    let component = Component::new(engine.engine(), bytes).map_err(|e| {
        let message = format!("{NOT_A_COMPONENT}: {e:#}");
        bad_because(path, message, Box::new(ComponentError(e)))
    })?;
    match cache.save(&component, &entry) {
        Ok(_) => {
            tracing::info!(plugin = %path.display(), cache = %entry.display(), "compiled plugin and cached it")
        }
        Err(e) => {
            tracing::warn!(cache = %cache.dir.display(), error = %e, "cannot write or prune compile cache")
        }
    }
    Ok((component, hold))
}

/// A core module starts with the magic and version 1; a component has layer 1 in the version
/// field. Checked up front to give a precise error for the most common mistake.
fn wasmparser_is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[0..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::wasm::engine::MIN_POOLED_INSTANCES;

    /// The compiled entries in `dir`: (total bytes, count, whether a temporary file is left).
    fn cache_contents(dir: &Path) -> (u64, usize, bool) {
        let mut total = 0;
        let mut count = 0;
        let mut temp = false;
        for item in std::fs::read_dir(dir).unwrap() {
            let item = item.unwrap();
            let name = item.file_name().to_string_lossy().into_owned();
            temp |= name.contains(".tmp");
            if name.ends_with(".cwasm") {
                total += item.metadata().unwrap().len();
                count += 1;
            }
        }
        (total, count, temp)
    }

    #[test]
    fn many_distinct_components_compiled_at_once_keep_the_cache_within_its_bound_and_the_running_ones()
     {
        // 50 small distinct components: each compiles to its own entry.
        let component = |i: usize| {
            wat::parse_str(format!(
                "(component (core module (func (export \"f{i:03}\") (result i32) i32.const {i})))"
            ))
            .unwrap()
        };
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sizing = CompileCache {
            dir: dir.path().join("sizing"),
            max_bytes: 1 << 30,
        };
        compile_cached(&engine, &component(999), Path::new("x.wasm"), &sizing).unwrap();
        let (entry, _, _) = cache_contents(&sizing.dir);
        // Room for about eight entries.
        let cache = CompileCache {
            dir: dir.path().join("cache"),
            max_bytes: entry * 8 + entry / 2,
        };
        // Three plugins are running (their loaded code holds its entry); 47 more are
        // compiled by four threads at once.
        let running: Vec<(Component, CacheHold)> = (0..3)
            .map(|i| compile_cached(&engine, &component(i), Path::new("x.wasm"), &cache).unwrap())
            .collect();
        let running_entries: Vec<PathBuf> = (0..3)
            .map(|i| cache.entry(&engine, &component(i)))
            .collect();
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (engine, cache) = (&engine, &cache);
                scope.spawn(move || {
                    for i in (3 + thread..50).step_by(4) {
                        let bytes = component(i);
                        compile_cached(engine, &bytes, Path::new("x.wasm"), cache).unwrap();
                    }
                });
            }
        });
        let (total, count, temp) = cache_contents(&cache.dir);
        assert!(
            total <= cache.max_bytes,
            "{total} bytes in {count} entries, bound {}",
            cache.max_bytes
        );
        assert!(
            count >= 3 && !temp,
            "{count} entries, temporary files left: {temp}"
        );
        for entry in &running_entries {
            assert!(entry.exists(), "a running plugin's entry was pruned");
        }
        // Start-up with a lowered bound: only what runs stays, even over the bound.
        let lowered = CompileCache {
            max_bytes: entry,
            ..cache.clone()
        };
        lowered.prune_now();
        let (_, count, _) = cache_contents(&cache.dir);
        assert_eq!(count, 3);
        assert!(running_entries.iter().all(|e| e.exists()));
        drop(running);
        lowered.prune_now();
        let (total, _, _) = cache_contents(&cache.dir);
        assert!(total <= entry, "released, they go too: {total}");
    }

    #[test]
    fn a_component_importing_wasi_http_is_refused_before_it_is_compiled_or_cached() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("http.wasm");
        let component =
            wat::parse_str(r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#)
                .unwrap();
        std::fs::write(&file, component).unwrap();
        let cache = CompileCache {
            dir: dir.path().join("cache"),
            max_bytes: 1 << 30,
        };
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        let Err(err) = LoadedPlugin::load_cached(&engine, &file, Some(&cache)) else {
            panic!("a wasi:http import was accepted");
        };
        let text = err.to_string();
        assert!(
            text.contains("http.wasm") && text.contains("`wasi:http/outgoing-handler@0.2.0`"),
            "{text}"
        );
        assert!(!cache.dir.exists(), "nothing was compiled into the cache");
    }

    #[test]
    fn a_file_that_cannot_be_read_or_compiled_keeps_the_cause_as_the_source() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let engine = PluginEngine::new(MIN_POOLED_INSTANCES).unwrap();
        let missing = dir.path().join("missing.wasm");
        let Err(err) = LoadedPlugin::load_cached(&engine, &missing, None) else {
            panic!("a missing file loaded");
        };
        assert!(
            err.to_string()
                .starts_with(&format!("plugin {}: cannot read file: ", missing.display()))
        );
        let io = err
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );

        let garbage = dir.path().join("garbage.wasm");
        std::fs::write(&garbage, b"this is not wasm").unwrap();
        let Err(err) = LoadedPlugin::load_cached(&engine, &garbage, None) else {
            panic!("garbage loaded");
        };
        let cause = err
            .source()
            .and_then(|s| s.downcast_ref::<ComponentError>());
        let cause = cause.unwrap_or_else(|| panic!("no wasmtime cause: {err:?}"));
        assert!(err.to_string().contains(&cause.to_string()), "{err}");
    }
}
