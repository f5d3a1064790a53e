//! CPU time and peak memory of a process (all its threads), read from Linux's `/proc`.

use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// Clock ticks per second when `getconf CLK_TCK` cannot be asked: USER_HZ is 100 on every
/// mainstream Linux architecture.
const FALLBACK_CLK_TCK: u64 = 100;

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcSample {
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    /// VmHWM: the peak resident set size so far, in KiB.
    pub peak_rss_kib: u64,
    /// Memory mappings (VMAs: lines of `/proc/<pid>/maps`) now; the kernel refuses new ones
    /// past `vm.max_map_count` (65,530 by default).
    pub mappings: u64,
}

impl ProcSample {
    pub(crate) fn peak_rss_mib(&self) -> f64 {
        self.peak_rss_kib as f64 / 1024.0
    }
}

/// Reads `/proc/<pid>/stat`, `/proc/<pid>/status` and `/proc/<pid>/maps`.
pub(crate) fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let stat_path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&stat_path)
        .with_context(|| format!("cannot read {stat_path} (has the process exited?)"))?;
    let status_path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&status_path)
        .with_context(|| format!("cannot read {status_path} (has the process exited?)"))?;
    Ok(ProcSample {
        cpu_ticks: cpu_ticks(&stat).with_context(|| format!("unexpected {stat_path}"))?,
        peak_rss_kib: peak_rss_kib(&status).with_context(|| format!("unexpected {status_path}"))?,
        mappings: mappings(pid)?,
    })
}

/// Lines of `/proc/<pid>/maps`: one per mapping.
fn mappings(pid: u32) -> anyhow::Result<u64> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read(&maps_path)
        .with_context(|| format!("cannot read {maps_path} (has the process exited?)"))?;
    Ok(maps.iter().filter(|&&b| b == b'\n').count() as u64)
}

/// The servers whose CPU [`SystemSample`] records, by command name (`/proc/<pid>/stat`): the
/// database and each broker Sluice publishes to on this machine (RabbitMQ is its Erlang VM).
pub(crate) const SERVERS: [&str; 5] = [POSTGRES, TANSU, "nats-server", "beam.smp", "redis-server"];
pub(crate) const POSTGRES: &str = "postgres";
const TANSU: &str = "tansu";

/// CPU time of everything else that a drain keeps busy: the database server, the brokers, and
/// the machine as a whole (where the time goes when a target is missed).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemSample {
    /// Every process of each of [`SERVERS`] (server and backends), in clock ticks, in that
    /// order.
    server_ticks: [u64; SERVERS.len()],
    /// All CPUs: busy and total ticks from `/proc/stat`.
    pub machine_busy: u64,
    pub machine_total: u64,
}

impl SystemSample {
    pub(crate) fn now() -> Self {
        let (machine_busy, machine_total) = machine_ticks().unwrap_or((0, 0));
        Self {
            server_ticks: ticks_of_commands(),
            machine_busy,
            machine_total,
        }
    }

    /// (postgres CPU s, tansu CPU s, machine busy %) from `self` to `later`.
    pub(crate) fn until(&self, later: &Self) -> (f64, f64, f64) {
        let busy = later.machine_busy.saturating_sub(self.machine_busy) as f64;
        let total = later.machine_total.saturating_sub(self.machine_total) as f64;
        (
            self.server_seconds(later, POSTGRES),
            self.server_seconds(later, TANSU),
            if total > 0.0 {
                busy / total * 100.0
            } else {
                0.0
            },
        )
    }

    /// CPU seconds of `server` (one of [`SERVERS`]; 0 for another) from `self` to `later`.
    pub(crate) fn server_seconds(&self, later: &Self, server: &str) -> f64 {
        SERVERS.iter().position(|s| *s == server).map_or(0.0, |i| {
            cpu_seconds(later.server_ticks[i].saturating_sub(self.server_ticks[i]))
        })
    }
}

/// utime + stime of every process of each of [`SERVERS`], by command name, in one pass over
/// `/proc` (processes that exit between two samples drop out, so these are lower bounds).
fn ticks_of_commands() -> [u64; SERVERS.len()] {
    let mut ticks = [0; SERVERS.len()];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return ticks;
    };
    let stats = dir
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok());
    for stat in stats {
        let Some((name, _)) = stat
            .split_once('(')
            .and_then(|(_, rest)| rest.rsplit_once(')'))
        else {
            continue;
        };
        if let Some(i) = SERVERS.iter().position(|s| *s == name) {
            ticks[i] += cpu_ticks(&stat).unwrap_or(0);
        }
    }
    ticks
}

/// (busy, total) ticks of all CPUs from the first line of `/proc/stat`.
fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    let total: u64 = values.iter().take(8).sum();
    Ok((total.saturating_sub(idle), total))
}

/// CPU seconds of `ticks` clock ticks.
pub(crate) fn cpu_seconds(ticks: u64) -> f64 {
    ticks as f64 / clock_ticks_per_second() as f64
}

/// `getconf CLK_TCK`, asked once; [`FALLBACK_CLK_TCK`] if that fails.
fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .filter(|&ticks: &u64| ticks > 0)
            .unwrap_or(FALLBACK_CLK_TCK)
    })
}

/// utime (field 14) + stime (field 15) of a `/proc/<pid>/stat` line. The command name
/// (field 2) is in parentheses and may itself contain spaces and parentheses, so fields are
/// counted from the last `)`.
fn cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let Some(end_of_comm) = stat.rfind(')') else {
        bail!("no command name in {stat:?}");
    };
    // Fields after the command name start at field 3 (state).
    let fields: Vec<&str> = stat[end_of_comm + 1..].split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .with_context(|| format!("field {n} missing"))?
            .parse()
            .with_context(|| format!("field {n} is not a number"))
    };
    Ok(field(14)? + field(15)?)
}

/// `VmHWM:    12345 kB` of `/proc/<pid>/status`, in KiB.
fn peak_rss_kib(status: &str) -> anyhow::Result<u64> {
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM line")?;
    line.trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("cannot parse {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat =
            "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 9 0 1234 5 6";
        assert_eq!(cpu_ticks(stat).ok(), Some(175));
        assert!(cpu_ticks("garbage").is_err());
        assert!(cpu_ticks("1 (x) S 1 2").is_err());
    }

    #[test]
    fn peak_rss_is_read_from_vmhwm() {
        let status =
            "Name:\tsluice\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t 40000 kB\n";
        assert_eq!(peak_rss_kib(status).ok(), Some(51_200));
        assert!(peak_rss_kib("Name:\tx\n").is_err());
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample(std::process::id());
        assert!(s.is_ok_and(|s| s.peak_rss_kib > 0));
    }
}
