//! One size bound for everything Sluice keeps under the plugins cache directory: compiled
//! components (`<dir>/*.cwasm`, `wasm/cache.rs`) and pulled OCI plugins
//! (`<dir>/oci/blobs/*` and the tags they resolved to, `<dir>/oci/refs/*`,
//! `supply/oci.rs`) share `[plugins] cache_max_mb`; neither has a share of its
//! own, so a relay with many OCI plugins and few rebuilds spends it on blobs and the other way
//! round.
//!
//! Pruned least recently used first (the file's modification time, renewed whenever it is
//! used) after every write and once at start-up, until the rest fit. Never pruned: a file a
//! plugin loaded in this process still needs ([`CacheHold`]: its compiled code, and for an OCI
//! plugin its component, signature and tag) — removing those would turn the next restart into
//! a recompile, and a registry outage at that restart into a quarantine. When the held files
//! alone pass the bound the directory stays over it, and that is logged. Files in the
//! directory that are none of these (a temporary file being written, anything else) are
//! neither counted nor touched — except what an interrupted write left behind (a temporary
//! file of ours not written to for [`LEFTOVER_AFTER`]: a relay OOM-killed or stopped mid-compile
//! would otherwise leave a 35 MB file per restart, never pruned).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

/// Suffix of compiled components.
pub(crate) const COMPILED_SUFFIX: &str = ".cwasm";
/// What the OCI cache's files live under, below the cache directory.
const OCI_DIRS: [&str; 2] = ["oci/blobs", "oci/refs"];
/// What a file being written has in its name (`write` + rename): not an entry yet.
const TEMP_MARK: &str = ".tmp";
/// A temporary file of ours not modified for this long is the leftover of a write that was
/// cut off (writing one takes seconds at most; a Python plugin's compile ~20 s before it).
const LEFTOVER_AFTER: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// Files loaded plugins of this process hold, with how many holds each.
fn held() -> &'static Mutex<HashMap<PathBuf, usize>> {
    static HELD: OnceLock<Mutex<HashMap<PathBuf, usize>>> = OnceLock::new();
    HELD.get_or_init(Mutex::default)
}

fn held_lock() -> std::sync::MutexGuard<'static, HashMap<PathBuf, usize>> {
    // The map stays consistent across a panic (one insert or remove at a time).
    held()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A cache file a loaded plugin needs: not pruned while any hold on it lives.
#[derive(Debug)]
pub(crate) struct CacheHold {
    path: PathBuf,
}

impl CacheHold {
    /// Holds `path` (it need not exist yet: a hold taken before writing protects the write).
    pub(crate) fn new(path: &Path) -> Self {
        *held_lock().entry(path.to_owned()).or_insert(0) += 1;
        Self {
            path: path.to_owned(),
        }
    }
}

impl Drop for CacheHold {
    fn drop(&mut self) {
        let mut held = held_lock();
        if let Some(count) = held.get_mut(&self.path) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.path);
            }
        }
    }
}

/// Marks `file` as used now (its modification time orders the pruning).
pub(crate) fn touch(file: &Path) {
    let touched = std::fs::File::options()
        .write(true)
        .open(file)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(cache = %file.display(), error = %e, "cannot mark cache entry as used");
    }
}

/// What one pruning removed, and how many bytes of entries are left.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pruned {
    pub entries: usize,
    pub bytes: u64,
    /// Bytes left in the directory's entries afterwards.
    pub left: u64,
}

/// One cache file and what orders it.
struct Entry {
    used: SystemTime,
    len: u64,
    path: PathBuf,
}

/// The cache's entries: compiled components and OCI files (see the module's comment).
fn entries(dir: &Path) -> std::io::Result<Vec<Entry>> {
    let mut found = Vec::new();
    let mut scan = |from: PathBuf, wanted: &dyn Fn(&str) -> bool| -> std::io::Result<()> {
        let listing = match std::fs::read_dir(&from) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for item in listing {
            let path = item?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if !name.is_some_and(|n| wanted(&n) && !n.contains(TEMP_MARK)) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue; // removed by another process meanwhile
            };
            if !meta.is_file() {
                continue;
            }
            found.push(Entry {
                used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                len: meta.len(),
                path,
            });
        }
        Ok(())
    };
    scan(dir.to_path_buf(), &|n| n.ends_with(COMPILED_SUFFIX))?;
    for sub in OCI_DIRS {
        scan(dir.join(sub), &|_| true)?;
    }
    Ok(found)
}

/// Whether `name` is a temporary file our writes make: `<entry>.tmp<pid>-ThreadId(<n>)`
/// (`wasm/cache.rs`, `supply/oci.rs`).
fn is_our_temporary(name: &str) -> bool {
    name.split_once(TEMP_MARK).is_some_and(|(_, rest)| {
        rest.starts_with(|c: char| c.is_ascii_digit()) && rest.contains("-ThreadId(")
    })
}

/// Removes the temporary files under `dir` that interrupted writes left (see
/// [`LEFTOVER_AFTER`]), counting them into `pruned`.
fn remove_leftovers(dir: &Path, pruned: &mut Pruned) {
    let now = SystemTime::now();
    let dirs = std::iter::once(dir.to_path_buf()).chain(OCI_DIRS.iter().map(|d| dir.join(d)));
    for from in dirs {
        let Ok(listing) = std::fs::read_dir(&from) else {
            continue;
        };
        for item in listing.flatten() {
            let path = item.path();
            let ours = path
                .file_name()
                .is_some_and(|n| is_our_temporary(&n.to_string_lossy()));
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let idle = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            if !ours || !meta.is_file() || idle < LEFTOVER_AFTER {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                tracing::info!(cache = %path.display(), bytes = meta.len(),
                    "removed what an interrupted write left in the plugin cache");
                pruned.entries += 1;
                pruned.bytes += meta.len();
            }
        }
    }
}

/// Removes the least recently used entries under `dir` until they fit `max_bytes`; never
/// `keep` (what was just written or loaded) nor a held file. An entry another process still
/// has mapped stays readable to it (Unix unlink semantics). Leftovers of interrupted writes
/// go first, whatever the bound.
pub(crate) fn prune(dir: &Path, max_bytes: u64, keep: &[&Path]) -> std::io::Result<Pruned> {
    let mut pruned = Pruned::default();
    remove_leftovers(dir, &mut pruned);
    let mut entries = entries(dir)?;
    let mut total: u64 = entries.iter().map(|e| e.len).sum();
    entries.sort_by_key(|e| e.used);
    let mut held_bytes = 0;
    for entry in entries {
        if total <= max_bytes {
            break;
        }
        if keep.contains(&entry.path.as_path()) || held_lock().contains_key(&entry.path) {
            held_bytes += entry.len;
            continue;
        }
        match std::fs::remove_file(&entry.path) {
            Ok(()) => {
                tracing::info!(cache = %entry.path.display(), bytes = entry.len,
                    "removed least recently used plugin cache entry (plugins.cache_max_mb)");
                pruned.entries += 1;
                pruned.bytes += entry.len;
                total -= entry.len;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => total -= entry.len,
            Err(e) => return Err(e),
        }
    }
    pruned.left = total;
    if total > max_bytes {
        tracing::warn!(cache = %dir.display(), bytes = total, max_bytes, held_bytes,
            "plugin cache stays over plugins.cache_max_mb: the plugins running now need the rest");
    }
    Ok(pruned)
}

/// [`prune`], logging a failure instead of returning it: a cache that cannot be pruned must
/// not stop a plugin from loading.
pub(crate) fn prune_logged(dir: &Path, max_bytes: u64, keep: &[&Path]) {
    if let Err(e) = prune(dir, max_bytes, keep) {
        tracing::warn!(cache = %dir.display(), error = %e, "cannot prune the plugin cache");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn file(path: &Path, len: usize, age_secs: u64) -> PathBuf {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![0u8; len]).unwrap();
        let when = SystemTime::now() - Duration::from_secs(age_secs);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(when)
            .unwrap();
        path.to_owned()
    }

    #[test]
    fn compiled_code_and_oci_blobs_share_one_bound_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let old_blob = file(&d.join("oci/blobs/sha256-a"), 1_000, 500);
        let old_code = file(&d.join("a.cwasm"), 1_000, 400);
        let young_blob = file(&d.join("oci/blobs/sha256-b"), 1_000, 300);
        let young_ref = file(&d.join("oci/refs/sha256-r"), 100, 200);
        let young_code = file(&d.join("b.cwasm"), 1_000, 100);
        let writing = file(&d.join("c.tmp123"), 50_000, 600);
        let other = file(&d.join("notes.txt"), 50_000, 600);
        let pruned = prune(d, 2_200, &[]).unwrap();
        assert_eq!(pruned.entries, 2);
        assert_eq!(pruned.left, 2_100);
        assert!(!old_blob.exists() && !old_code.exists());
        for kept in [&young_blob, &young_ref, &young_code, &writing, &other] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    #[test]
    fn held_files_stay_even_when_they_alone_pass_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let held_code = file(&d.join("held.cwasm"), 1_000, 900);
        let held_blob = file(&d.join("oci/blobs/sha256-held"), 1_000, 800);
        let free = file(&d.join("free.cwasm"), 1_000, 100);
        let holds = [CacheHold::new(&held_code), CacheHold::new(&held_blob)];
        let pruned = prune(d, 500, &[]).unwrap();
        assert_eq!(pruned.entries, 1);
        assert!(held_code.exists() && held_blob.exists() && !free.exists());
        assert_eq!(pruned.left, 2_000, "over the bound: what runs needs it");
        // Released, they go.
        drop(holds);
        prune(d, 500, &[]).unwrap();
        assert!(!held_code.exists() && !held_blob.exists());
    }

    #[test]
    fn what_an_interrupted_write_left_is_removed_once_it_is_old() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let hour = 60 * 60;
        // A compile and a pull cut off an hour and more ago (a relay OOM-killed mid-write).
        let old_code = file(&d.join("ab-cd.tmp4711-ThreadId(7)"), 5_000, hour + 60);
        let old_blob = file(
            &d.join("oci/blobs/sha256-ef.tmp4711-ThreadId(9)"),
            5_000,
            2 * hour,
        );
        // Being written now (by this or another relay), and files that are not ours.
        let writing = file(&d.join("ab-ef.tmp4712-ThreadId(2)"), 5_000, 10);
        let notes = file(&d.join("notes.tmp"), 5_000, 3 * hour);
        let other = file(&d.join("report.tmpfile"), 5_000, 3 * hour);
        let entry = file(&d.join("ab-cd.cwasm"), 1_000, 3 * hour);
        let pruned = prune(d, 1 << 30, &[]).unwrap();
        assert_eq!((pruned.entries, pruned.bytes), (2, 10_000));
        assert!(!old_code.exists() && !old_blob.exists());
        for kept in [&writing, &notes, &other, &entry] {
            assert!(kept.exists(), "{}", kept.display());
        }
        assert_eq!(pruned.left, 1_000, "within the bound: no entry removed");
    }

    #[test]
    fn a_file_held_twice_stays_until_both_holds_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let code = file(&dir.path().join("x.cwasm"), 10, 100);
        let first = CacheHold::new(&code);
        let second = CacheHold::new(&code);
        drop(first);
        prune(dir.path(), 0, &[]).unwrap();
        assert!(code.exists());
        drop(second);
        prune(dir.path(), 0, &[]).unwrap();
        assert!(!code.exists());
    }
}
