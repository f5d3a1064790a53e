//! The two instance memory budgets, `[plugins] configured_instances_memory_mb` and
//! `unconfigured_instances_memory_mb`: as written, or — when left out — Sluice's defaults
//! (2 GiB and 512 MiB) made to fit inside the container's memory limit
//! ([`crate::plugin::memory_limit`]) with room left for the relay itself. A Kubernetes pod
//! limited to 1 GiB would otherwise be OOM-killed by a Python-heavy tenant set long before
//! the budgets make Sluice drop idle instances.

use crate::plugin::memory_limit::{Cgroups, MemoryLimit};
use crate::plugin::settings::PluginsSettings;
use crate::problem::Problem;

/// `configured_instances_memory_mb` without a limit: ~150 instances of the Python reference
/// plugin (13.2 MiB of linear memory each), ~1,800 of the Rust one.
pub const DEFAULT_CONFIGURED_MB: usize = 2048;
/// `unconfigured_instances_memory_mb` without a limit: a quarter of the configured budget.
pub const DEFAULT_UNCONFIGURED_MB: usize = 512;
/// The least the relay keeps for itself under a limit: its own ~30–100 MiB (measured,
/// docs/benchmarks.md), the compiled code of its plugins mapped from the cache (~35 MB per
/// Python or JavaScript plugin), librdkafka's queue and the batches in flight.
pub const RELAY_HEADROOM_MIN_MB: u64 = 256;
/// The relay keeps a quarter of a larger limit (never less than [`RELAY_HEADROOM_MIN_MB`],
/// never more than half): its queues and batches grow with the load a bigger pod takes.
const RELAY_HEADROOM_SHARE: u64 = 4;

/// Where a budget's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetOrigin {
    /// Written in `[plugins]`.
    Written,
    /// Sluice's default: no memory limit, or one large enough for it.
    Default,
    /// Less than the default, to fit the memory limit.
    FitToLimit,
}

impl BudgetOrigin {
    fn as_str(self) -> &'static str {
        match self {
            Self::Written => "as written",
            Self::Default => "default",
            Self::FitToLimit => "sized to the memory limit",
        }
    }
}

/// The budgets a router runs with, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceBudgets {
    /// Linear memory (MiB) of the instances of tenants with their own entry.
    pub configured_mb: usize,
    /// Where `configured_mb` came from.
    pub configured_origin: BudgetOrigin,
    /// Linear memory (MiB) of the instances of tenants without an entry.
    pub unconfigured_mb: usize,
    /// Where `unconfigured_mb` came from.
    pub unconfigured_origin: BudgetOrigin,
    /// The memory limit this process runs under, if any.
    pub limit: Option<MemoryLimit>,
}

impl InstanceBudgets {
    /// The budgets for `settings` under this process's cgroup memory limit.
    pub fn of_this_process(settings: &PluginsSettings) -> Self {
        Self::resolve(settings, Cgroups::system().memory_limit())
    }

    /// The budgets for `settings` under `limit`: a written budget is kept as it is (see
    /// [`InstanceBudgets::warnings`]); one left out is its default, lowered where the limit
    /// leaves plugins less ([`plugin_share_mb`]): four fifths of that share for configured
    /// tenants, one fifth for the others (the defaults' own proportion).
    pub fn resolve(settings: &PluginsSettings, limit: Option<MemoryLimit>) -> Self {
        let share = limit.as_ref().map(|l| plugin_share_mb(l.mib()));
        let fit = |written: Option<usize>, default: usize, fifths: u64| match (written, share) {
            (Some(mb), _) => (mb, BudgetOrigin::Written),
            (None, Some(share)) => {
                let room = usize::try_from(share * fifths / 5).unwrap_or(usize::MAX);
                match room < default {
                    true => (room.max(1), BudgetOrigin::FitToLimit),
                    false => (default, BudgetOrigin::Default),
                }
            }
            (None, None) => (default, BudgetOrigin::Default),
        };
        let (configured_mb, configured_origin) = fit(
            settings.configured_instances_memory_mb,
            DEFAULT_CONFIGURED_MB,
            4,
        );
        let (unconfigured_mb, unconfigured_origin) = fit(
            settings.unconfigured_instances_memory_mb,
            DEFAULT_UNCONFIGURED_MB,
            1,
        );
        Self {
            configured_mb,
            configured_origin,
            unconfigured_mb,
            unconfigured_origin,
            limit,
        }
    }

    /// `configured_mb` in bytes.
    pub fn configured_bytes(&self) -> usize {
        self.configured_mb.saturating_mul(1024 * 1024)
    }

    /// `unconfigured_mb` in bytes.
    pub fn unconfigured_bytes(&self) -> usize {
        self.unconfigured_mb.saturating_mul(1024 * 1024)
    }

    /// Logs the budgets chosen and why (at start), and [`InstanceBudgets::warnings`].
    pub fn log(&self) {
        let limit_mb = self.limit.as_ref().map(MemoryLimit::mib);
        let limit_file = self.limit.as_ref().map(|l| l.file.display().to_string());
        tracing::info!(
            configured_instances_memory_mb = self.configured_mb,
            configured = self.configured_origin.as_str(),
            unconfigured_instances_memory_mb = self.unconfigured_mb,
            unconfigured = self.unconfigured_origin.as_str(),
            memory_limit_mb = limit_mb,
            memory_limit_file = limit_file,
            plugin_share_mb = limit_mb.map(plugin_share_mb),
            "plugin instance memory budgets"
        );
        for warning in self.warnings() {
            tracing::warn!(key = %warning.key, "{}", warning.message);
        }
    }

    /// Written budgets that, with the other budget, pass what the memory limit leaves
    /// plugins: the kernel would kill the relay before Sluice drops idle instances. Warnings
    /// for `config check`, not problems: the limit is the machine's, not the file's.
    pub fn warnings(&self) -> Vec<Problem> {
        let Some(limit) = &self.limit else {
            return Vec::new();
        };
        let share = plugin_share_mb(limit.mib());
        let total = self.configured_mb as u64 + self.unconfigured_mb as u64;
        if total <= share {
            return Vec::new();
        }
        let written = [
            (
                "configured_instances_memory_mb",
                self.configured_origin,
                self.configured_mb,
                "unconfigured_instances_memory_mb",
                self.unconfigured_mb,
            ),
            (
                "unconfigured_instances_memory_mb",
                self.unconfigured_origin,
                self.unconfigured_mb,
                "configured_instances_memory_mb",
                self.configured_mb,
            ),
        ];
        written
            .into_iter()
            .filter(|(_, origin, ..)| *origin == BudgetOrigin::Written)
            .map(|(key, _, mb, other, other_mb)| {
                Problem::new(
                    format!("plugins.{key}"),
                    format!(
                        "{mb} MiB, with {other} ({other_mb} MiB), is more than the {share} MiB \
                         the memory limit of {} MiB ({}) leaves plugins after {} MiB for the \
                         relay itself: plugin instances can get the relay killed for memory \
                         before Sluice drops idle ones (lower it, or leave it out to size it \
                         from the limit)",
                        limit.mib(),
                        limit.file.display(),
                        limit.mib() - share,
                    ),
                )
            })
            .collect()
    }
}

/// What a memory limit of `limit_mb` leaves the two budgets together: the limit less the
/// relay's headroom (a quarter of it, at least [`RELAY_HEADROOM_MIN_MB`], at most half).
pub fn plugin_share_mb(limit_mb: u64) -> u64 {
    let headroom = (limit_mb / RELAY_HEADROOM_SHARE)
        .max(RELAY_HEADROOM_MIN_MB)
        .min(limit_mb / 2);
    limit_mb - headroom
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn limit(mib: u64) -> Option<MemoryLimit> {
        Some(MemoryLimit {
            bytes: mib * 1024 * 1024,
            file: PathBuf::from("/sys/fs/cgroup/memory.max"),
        })
    }

    fn settings(toml: &str) -> PluginsSettings {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn without_a_limit_the_defaults_apply() {
        let b = InstanceBudgets::resolve(&settings(""), None);
        assert_eq!((b.configured_mb, b.unconfigured_mb), (2048, 512));
        assert_eq!(b.configured_origin, BudgetOrigin::Default);
        assert!(b.warnings().is_empty());
        // A limit with room for both: the defaults too.
        let b = InstanceBudgets::resolve(&settings(""), limit(8192));
        assert_eq!((b.configured_mb, b.unconfigured_mb), (2048, 512));
        assert_eq!(b.unconfigured_origin, BudgetOrigin::Default);
    }

    #[test]
    fn under_a_limit_the_defaults_shrink_to_fit_with_headroom_for_the_relay() {
        // deploy/kubernetes/deployment.yaml's 1 GiB: 256 MiB for the relay, 768 for plugins.
        let b = InstanceBudgets::resolve(&settings(""), limit(1024));
        assert_eq!((b.configured_mb, b.unconfigured_mb), (614, 153));
        assert_eq!(b.configured_origin, BudgetOrigin::FitToLimit);
        assert!(b.configured_mb + b.unconfigured_mb <= 1024 - 256);
        // 2 GiB: a quarter for the relay.
        let b = InstanceBudgets::resolve(&settings(""), limit(2048));
        assert_eq!((b.configured_mb, b.unconfigured_mb), (1228, 307));
        // A tiny limit still leaves half to the relay, and each budget at least 1 MiB.
        let b = InstanceBudgets::resolve(&settings(""), limit(300));
        assert_eq!((b.configured_mb, b.unconfigured_mb), (120, 30));
        let b = InstanceBudgets::resolve(&settings(""), limit(1));
        assert_eq!((b.configured_mb, b.unconfigured_mb), (1, 1));
    }

    #[test]
    fn written_budgets_are_kept_and_warned_about_when_they_pass_the_limit() {
        let written = settings("configured_instances_memory_mb = 2048\n");
        let b = InstanceBudgets::resolve(&written, limit(1024));
        assert_eq!(b.configured_mb, 2048, "as written");
        assert_eq!(b.configured_origin, BudgetOrigin::Written);
        assert_eq!(b.unconfigured_mb, 153, "the other one still fits the limit");
        let warnings: Vec<String> = b.warnings().iter().map(ToString::to_string).collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(
                "plugins.configured_instances_memory_mb: 2048 MiB, with \
                 unconfigured_instances_memory_mb (153 MiB), is more than the 768 MiB the \
                 memory limit of 1024 MiB (/sys/fs/cgroup/memory.max) leaves plugins after \
                 256 MiB for the relay itself"
            ),
            "{warnings:?}"
        );
        // Both written and too much: each named.
        let both = settings(
            "configured_instances_memory_mb = 700\nunconfigured_instances_memory_mb = 200\n",
        );
        let keys: Vec<String> = InstanceBudgets::resolve(&both, limit(1024))
            .warnings()
            .into_iter()
            .map(|p| p.key)
            .collect();
        assert_eq!(
            keys,
            [
                "plugins.configured_instances_memory_mb",
                "plugins.unconfigured_instances_memory_mb"
            ]
        );
        // Within the share, or without a limit: nothing to say.
        let fits = settings("configured_instances_memory_mb = 600\n");
        assert!(
            InstanceBudgets::resolve(&fits, limit(1024))
                .warnings()
                .is_empty()
        );
        assert!(
            InstanceBudgets::resolve(&written, None)
                .warnings()
                .is_empty()
        );
    }

    #[test]
    fn the_budgets_follow_a_fake_cgroup_tree() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("sys/fs/cgroup/memory.max");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "1073741824\n").unwrap();
        let b = InstanceBudgets::resolve(&settings(""), Cgroups::under(root.path()).memory_limit());
        assert_eq!((b.configured_mb, b.unconfigured_mb), (614, 153));
        assert_eq!(
            b.limit.as_ref().map(|l| l.file.as_path()),
            Some(file.as_path())
        );
    }
}
