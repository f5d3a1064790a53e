//! Loading a plugin file: compile the component, link it against the world, and keep the
//! resulting [`PluginPre`] (one per file) from which every tenant instance is created.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::Component;

use super::PluginError;
use super::bindings::PluginPre;
use super::engine::PluginEngine;
use super::host_api::HostState;

/// A compiled, linked plugin file. Cheap to instantiate many times.
pub struct LoadedPlugin {
    path: PathBuf,
    engine: Arc<PluginEngine>,
    pre: PluginPre<HostState>,
}

impl LoadedPlugin {
    /// Compiles and links `path`. Fails with the file name and the reason when it is not a
    /// component, imports something the host does not provide, or lacks the
    /// `sluice:plugin/transformer` exports.
    pub fn load(engine: &Arc<PluginEngine>, path: &Path) -> Result<Self, PluginError> {
        let bad = |message: String| PluginError::BadPlugin {
            path: path.to_owned(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read file: {e}")))?;
        if wasmparser_is_core_module(&bytes) {
            return Err(bad(
                "this is a core WebAssembly module, not a component; build it for \
                 wasm32-wasip2 (or run `wasm-tools component new`)"
                    .into(),
            ));
        }
        let component = Component::new(engine.engine(), &bytes)
            .map_err(|e| bad(format!("not a valid WebAssembly component: {e:#}")))?;
        let instance_pre = engine.linker().instantiate_pre(&component).map_err(|e| {
            bad(format!(
                "imports do not match the sluice:plugin world: {e:#}"
            ))
        })?;
        let pre = PluginPre::new(instance_pre).map_err(|e| {
            bad(format!(
                "does not export sluice:plugin/transformer@0.1.0 as the world requires: {e:#}"
            ))
        })?;
        Ok(Self {
            path: path.to_owned(),
            engine: Arc::clone(engine),
            pre,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn engine(&self) -> &Arc<PluginEngine> {
        &self.engine
    }

    pub(crate) fn pre(&self) -> &PluginPre<HostState> {
        &self.pre
    }
}

/// A core module starts with the magic and version 1; a component has layer 1 in the version
/// field. Checked up front to give a precise error for the most common mistake.
fn wasmparser_is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[0..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}
