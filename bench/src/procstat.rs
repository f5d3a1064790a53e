//! CPU time and peak memory of a process (all its threads), read from Linux's `/proc`.

use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// Clock ticks per second when `getconf CLK_TCK` cannot be asked: USER_HZ is 100 on every
/// mainstream Linux architecture.
const FALLBACK_CLK_TCK: u64 = 100;

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    /// VmHWM: the peak resident set size so far, in KiB.
    pub peak_rss_kib: u64,
}

impl ProcSample {
    pub fn peak_rss_mib(&self) -> f64 {
        self.peak_rss_kib as f64 / 1024.0
    }
}

/// Reads `/proc/<pid>/stat` and `/proc/<pid>/status`.
pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let stat_path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&stat_path)
        .with_context(|| format!("cannot read {stat_path} (has the process exited?)"))?;
    let status_path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&status_path)
        .with_context(|| format!("cannot read {status_path} (has the process exited?)"))?;
    Ok(ProcSample {
        cpu_ticks: cpu_ticks(&stat).with_context(|| format!("unexpected {stat_path}"))?,
        peak_rss_kib: peak_rss_kib(&status).with_context(|| format!("unexpected {status_path}"))?,
    })
}

/// CPU seconds of `ticks` clock ticks.
pub fn cpu_seconds(ticks: u64) -> f64 {
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
