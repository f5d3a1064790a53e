//! The compile cache: compiled components on disk, one file per plugin content and engine,
//! so an unchanged plugin starts without compiling (a Python or JavaScript runtime takes
//! seconds to compile and ~35 MB on disk). Bounded in size together with the OCI plugins cached
//! in the same directory ([`crate::plugin::cache_budget`]): the least recently used entries
//! are removed once the directory passes its bound, so the rebuilds of big runtimes that hot
//! reload brings, or many distinct plugins, do not fill the disk.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use crate::plugin::cache_budget::{self, COMPILED_SUFFIX};
pub(crate) use crate::plugin::cache_budget::{CacheHold, Pruned};
use crate::plugin::wasm::engine::PluginEngine;

/// A compile cache directory and its size bound (shared with the OCI cache under it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompileCache {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

impl CompileCache {
    /// The entry of `bytes` for this engine: content hash + engine compatibility hash.
    pub(crate) fn entry(&self, engine: &PluginEngine, bytes: &[u8]) -> PathBuf {
        let content = Sha256::digest(bytes);
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine
            .engine()
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        let hex: String = content.iter().map(|b| format!("{b:02x}")).collect();
        self.dir
            .join(format!("{hex}-{:016x}{COMPILED_SUFFIX}", hasher.finish()))
    }

    /// Marks `entry` as used now (its modification time orders the pruning).
    pub(crate) fn touch(entry: &Path) {
        cache_budget::touch(entry);
    }

    /// Writes `component` as `entry` atomically (temp file + rename, so a concurrent start
    /// never reads half a file), then prunes the directory, keeping `entry`.
    pub(crate) fn save(&self, component: &Component, entry: &Path) -> std::io::Result<Pruned> {
        let bytes = component
            .serialize()
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        std::fs::create_dir_all(&self.dir)?;
        // Unique per process and thread: two threads of one process may compile the same
        // component at once (a start-up and a reload), and must not write one temp file.
        let tmp = entry.with_extension(format!(
            "tmp{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, entry)?;
        self.prune(entry)
    }

    /// Removes the least recently used entries (compiled or pulled) until the directory fits
    /// `max_bytes`; never `keep` nor a file a loaded plugin holds.
    pub(crate) fn prune(&self, keep: &Path) -> std::io::Result<Pruned> {
        cache_budget::prune(&self.dir, self.max_bytes, &[keep])
    }

    /// Prunes the directory to its bound, logging a failure: at start-up, once every plugin
    /// is loaded (and holds its files), so a lowered `cache_max_mb` applies without a compile.
    pub(crate) fn prune_now(&self) {
        cache_budget::prune_logged(&self.dir, self.max_bytes, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn entry(dir: &Path, name: &str, len: usize, age_secs: u64) -> PathBuf {
        let path = dir.join(format!("{name}{COMPILED_SUFFIX}"));
        std::fs::write(&path, vec![0u8; len]).unwrap();
        let when = SystemTime::now() - Duration::from_secs(age_secs);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(when)
            .unwrap();
        path
    }

    #[test]
    fn the_least_recently_used_entries_go_first_and_the_kept_one_stays() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache {
            dir: dir.path().to_path_buf(),
            max_bytes: 2_500,
        };
        let oldest = entry(dir.path(), "a", 1_000, 400);
        let kept = entry(dir.path(), "b", 1_000, 300);
        let middle = entry(dir.path(), "c", 1_000, 200);
        let newest = entry(dir.path(), "d", 1_000, 100);
        std::fs::write(dir.path().join("notes.txt"), vec![0u8; 10_000]).unwrap();
        let pruned = cache.prune(&kept).unwrap();
        assert_eq!(
            pruned,
            Pruned {
                entries: 2,
                bytes: 2_000,
                left: 2_000,
            }
        );
        assert!(!oldest.exists() && !middle.exists());
        assert!(kept.exists() && newest.exists());
        assert!(
            dir.path().join("notes.txt").exists(),
            "only cache entries are pruned"
        );
    }

    #[test]
    fn a_touched_entry_counts_as_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache {
            dir: dir.path().to_path_buf(),
            max_bytes: 1_100,
        };
        let old = entry(dir.path(), "old", 1_000, 400);
        let young = entry(dir.path(), "young", 1_000, 100);
        CompileCache::touch(&old);
        let fresh = entry(dir.path(), "fresh", 10, 0);
        cache.prune(&fresh).unwrap();
        assert!(old.exists() && !young.exists());
    }

    #[test]
    fn a_cache_within_its_bound_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache {
            dir: dir.path().to_path_buf(),
            max_bytes: 1 << 30,
        };
        let a = entry(dir.path(), "a", 1_000, 400);
        assert_eq!(cache.prune(&a).unwrap().entries, 0);
    }
}
