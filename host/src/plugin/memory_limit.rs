//! The memory limit of the container (or systemd unit) Sluice runs in, read from its cgroup:
//! cgroup v2's `memory.max`, else v1's `memory.limit_in_bytes`, the tightest one along the
//! process's cgroup path. The instance budgets' defaults are sized inside it
//! ([`crate::plugin::budgets`]), so the kernel's OOM killer does not stop the relay before
//! Sluice's own eviction of idle plugin instances starts.
//!
//! Where the files are is injectable ([`Cgroups::under`]): the tests build a fake tree.

use std::path::{Path, PathBuf};

/// A limit at or above this is no limit: cgroup v1 writes "unlimited" as the largest page
/// multiple of `i64::MAX` (9223372036854771712), and no machine has an exbibyte.
const NO_LIMIT_FROM: u64 = 1 << 60;

/// A memory limit that applies to this process, and the file it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// The cgroup file that says so (`/sys/fs/cgroup/memory.max`, …).
    pub file: PathBuf,
}

impl MemoryLimit {
    /// The limit in whole MiB.
    pub fn mib(&self) -> u64 {
        self.bytes / (1024 * 1024)
    }
}

/// Where the cgroup file systems and `/proc/self/cgroup` are: `/` on a real system.
#[derive(Debug, Clone)]
pub struct Cgroups {
    root: PathBuf,
}

impl Cgroups {
    /// This machine's: `/sys/fs/cgroup` and `/proc/self/cgroup`.
    pub fn system() -> Self {
        Self::under(Path::new("/"))
    }

    /// A tree laid out like `/` below `root` (`root/sys/fs/cgroup/…`,
    /// `root/proc/self/cgroup`).
    pub fn under(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// The tightest memory limit on this process, or `None` when there is none (no cgroup
    /// file says one, every one says `max`, or the files cannot be read).
    ///
    /// cgroup v2 first (`memory.max`), then v1 (`memory/memory.limit_in_bytes`). Each is
    /// looked up in the process's own cgroup (from `/proc/self/cgroup`) and every ancestor up
    /// to the mount's root, since a parent's limit binds its children: under systemd the
    /// unit's cgroup is a subdirectory, and in a container with its own cgroup namespace (or
    /// with its cgroup mounted at the root, as Docker does on v1) the root file is the
    /// container's own.
    pub fn memory_limit(&self) -> Option<MemoryLimit> {
        let own = std::fs::read_to_string(self.root.join("proc/self/cgroup")).unwrap_or_default();
        let unified = self.root.join("sys/fs/cgroup");
        if let Some(found) = tightest(&unified, v2_path(&own), "memory.max") {
            return found;
        }
        tightest(
            &unified.join("memory"),
            v1_path(&own),
            "memory.limit_in_bytes",
        )
        .flatten()
    }
}

/// The process's cgroup v2 path (`0::/system.slice/sluice.service`), `/` when not listed.
fn v2_path(own: &str) -> &str {
    own.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .unwrap_or("/")
}

/// The process's cgroup v1 path of the memory controller (`4:memory:/docker/…`).
fn v1_path(own: &str) -> &str {
    own.lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some(path)
        })
        .unwrap_or("/")
}

/// The tightest limit in `file` of the cgroup `path` below `mount` and of its ancestors:
/// `None` when no such file exists (this cgroup version is not there), `Some(None)` when they
/// exist and none limits.
fn tightest(mount: &Path, path: &str, file: &str) -> Option<Option<MemoryLimit>> {
    let mut dir = mount.join(path.trim_start_matches('/'));
    let mut seen = false;
    let mut best: Option<MemoryLimit> = None;
    loop {
        let candidate = dir.join(file);
        if let Ok(text) = std::fs::read_to_string(&candidate) {
            seen = true;
            if let Some(bytes) = parse_limit(&text)
                && best.as_ref().is_none_or(|b| bytes < b.bytes)
            {
                best = Some(MemoryLimit {
                    bytes,
                    file: candidate,
                });
            }
        }
        if dir == mount || !dir.pop() || !dir.starts_with(mount) {
            break;
        }
    }
    seen.then_some(best)
}

/// A limit file's value: bytes, or `None` for `max` and values that mean no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < NO_LIMIT_FROM).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    fn write(root: &Path, file: &str, text: &str) {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn cgroup_v2_memory_max_is_the_limit() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // A container with its own cgroup namespace: its cgroup is the root.
        write(r, "proc/self/cgroup", "0::/\n");
        write(r, "sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n");
        write(r, "sys/fs/cgroup/memory.max", "1073741824\n");
        let limit = Cgroups::under(r).memory_limit().unwrap();
        assert_eq!(limit.bytes, GIB);
        assert_eq!(limit.mib(), 1024);
        assert_eq!(limit.file, r.join("sys/fs/cgroup/memory.max"));
    }

    #[test]
    fn cgroup_v2_takes_the_tightest_limit_along_the_process_path() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // A systemd unit: MemoryMax= on the unit, a tighter one on its slice.
        write(r, "proc/self/cgroup", "0::/system.slice/sluice.service\n");
        write(
            r,
            "sys/fs/cgroup/system.slice/sluice.service/memory.max",
            "4294967296\n",
        );
        write(r, "sys/fs/cgroup/system.slice/memory.max", "2147483648\n");
        write(r, "sys/fs/cgroup/other.slice/memory.max", "1048576\n");
        let limit = Cgroups::under(r).memory_limit().unwrap();
        assert_eq!(limit.bytes, 2 * GIB);
        assert_eq!(limit.file, r.join("sys/fs/cgroup/system.slice/memory.max"));
    }

    #[test]
    fn cgroup_v1_is_the_fallback() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // Docker on v1: the container's own memory cgroup is mounted at the root, so the path
        // /proc/self/cgroup names is not below it.
        write(
            r,
            "proc/self/cgroup",
            "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "536870912\n",
        );
        let limit = Cgroups::under(r).memory_limit().unwrap();
        assert_eq!(limit.bytes, GIB / 2);
        assert_eq!(
            limit.file,
            r.join("sys/fs/cgroup/memory/memory.limit_in_bytes")
        );
    }

    #[test]
    fn max_a_huge_value_or_no_file_is_no_limit() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        assert_eq!(Cgroups::under(r).memory_limit(), None, "no cgroup files");
        write(r, "sys/fs/cgroup/memory.max", "max\n");
        assert_eq!(Cgroups::under(r).memory_limit(), None, "v2 max");
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // v1's "unlimited", as this very machine's root cgroup says it.
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(r, "proc/self/cgroup", "4:memory:/\n");
        assert_eq!(Cgroups::under(r).memory_limit(), None, "v1 unlimited");
    }

    #[test]
    fn a_v2_max_is_not_overridden_by_a_v1_tree() {
        // Hybrid hosts mount v2 at /sys/fs/cgroup/unified without the memory controller: the
        // v1 memory tree decides there. Where v2 has memory files, they decide.
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "sys/fs/cgroup/memory.max", "max\n");
        write(r, "sys/fs/cgroup/memory/memory.limit_in_bytes", "1048576\n");
        assert_eq!(Cgroups::under(r).memory_limit(), None);
    }
}
