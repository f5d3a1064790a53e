//! The `sluice` binary as a child process: one-shot commands (`migrate`, `config check`, …)
//! run to completion, and `sluice run` started with a config file in a temporary directory,
//! its stderr in a log file there, stopped with SIGTERM (or killed, as a crash).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::env::sluice_bin;
use crate::wait::wait_until;

/// Longest wait for the relay to exit after SIGTERM (its own shutdown_timeout is 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of the relay's log quoted in errors.
const LOG_TAIL_LINES: usize = 20;

/// Runs `sluice` with `args` to completion.
pub fn sluice(args: &[&str]) -> Output {
    sluice_with_env(args, &[])
}

/// Runs `sluice` with `args` and extra environment variables to completion.
pub fn sluice_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(sluice_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", sluice_bin().display()))
}

/// Runs `sluice` with `args` followed by `--config FILE`, where FILE holds `config`.
pub fn sluice_with_config(args: &[&str], config: &str) -> Output {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).expect("write config");
    let path = path.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--config", path.as_str()]);
    sluice(&all)
}

/// Runs `sluice migrate` (binary `sluice`) for `table` in the database at `url`, optionally
/// installing the NOTIFY trigger on `notify_channel`.
pub async fn migrate(
    sluice: &Path,
    url: &str,
    table: &str,
    notify_channel: Option<&str>,
) -> anyhow::Result<()> {
    let mut command = tokio::process::Command::new(sluice);
    command
        .arg("migrate")
        .arg("--database-url")
        .arg(url)
        .arg("--table")
        .arg(table)
        .env("RUST_LOG", "warn")
        // It would override --database-url.
        .env_remove("SLUICE_DATABASE_URL");
    if let Some(channel) = notify_channel {
        command
            .arg("--notify-trigger")
            .arg("--notify-channel")
            .arg(channel);
    }
    let out = command
        .output()
        .await
        .with_context(|| format!("cannot run {} migrate", sluice.display()))?;
    if !out.status.success() {
        bail!(
            "`sluice migrate --table {table}{}` failed ({}): {}",
            notify_channel
                .map(|c| format!(" --notify-trigger --notify-channel {c}"))
                .unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// How [`RelayProcess::launch`] starts `sluice run`.
pub struct RelayLaunch<'a> {
    /// The binary; default [`sluice_bin`].
    pub bin: PathBuf,
    /// `RUST_LOG`; default `info,sluice=debug`.
    pub rust_log: &'a str,
    /// More environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// Environment variables not passed on (they would override the file).
    pub env_remove: &'a [&'a str],
}

impl Default for RelayLaunch<'_> {
    fn default() -> Self {
        Self {
            bin: sluice_bin(),
            rust_log: "info,sluice=debug",
            env: &[],
            env_remove: &[],
        }
    }
}

/// A `sluice run` process with its config file. Dropping it kills the process (SIGKILL).
pub struct RelayProcess {
    child: Child,
    /// Holds the config and log file.
    _dir: tempfile::TempDir,
    log_path: PathBuf,
}

/// Finished relay: exit status and what it logged.
pub struct RelayExit {
    /// Whether it exited with status 0.
    pub success: bool,
    /// The exit status (`None`: killed by a signal, or no status could be read).
    pub code: Option<i32>,
    /// Everything it logged.
    pub log: String,
}

impl RelayExit {
    /// The `rows_sent=N` of the final "relay stopped" line.
    pub fn rows_sent(&self) -> Option<u64> {
        let line = self
            .log
            .lines()
            .rev()
            .find(|l| l.contains("relay stopped"))?;
        let rest = line.split("rows_sent=").nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }
}

impl RelayProcess {
    /// Starts `sluice run` with `config` (TOML text) written to a temporary file.
    pub fn start(config: &str) -> anyhow::Result<Self> {
        Self::launch(config, &RelayLaunch::default())
    }

    /// [`RelayProcess::start`] as `launch` says.
    pub fn launch(config: &str, launch: &RelayLaunch<'_>) -> anyhow::Result<Self> {
        let dir =
            tempfile::tempdir().context("cannot create a temporary directory for the relay")?;
        let config_path = dir.path().join("sluice.toml");
        std::fs::write(&config_path, config)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let log_path = dir.path().join("stderr.log");
        let log = File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut command = Command::new(&launch.bin);
        command
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .env("RUST_LOG", launch.rust_log)
            .envs(launch.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for name in launch.env_remove {
            command.env_remove(name);
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {} run", launch.bin.display()))?;
        Ok(Self {
            child,
            _dir: dir,
            log_path,
        })
    }

    /// Waits up to `timeout` for the "relay started" line. Its signal handlers are in place
    /// from then on: a SIGTERM sent earlier kills the relay instead of stopping it.
    pub async fn wait_started(&self, timeout: Duration) -> bool {
        wait_until(timeout, || async { self.log().contains("relay started") }).await
    }

    /// Everything logged so far (empty if the log cannot be read).
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log())
    }

    /// Sends `signal` (`HUP`, `TERM`, …) to the process.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(&pid)
            .status()
            .with_context(|| format!("cannot run kill -{signal}"))?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed ({status})");
        }
        Ok(())
    }

    /// Sends SIGHUP: the relay re-reads its config's secrets (and reloads plugins).
    pub fn hangup(&self) {
        let _ = self.signal("HUP");
    }

    /// The process id (for `/proc` or signals a test sends itself).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory of the process so far (`VmHWM` of `/proc/<pid>/status`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Fails, quoting the log, if the relay has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!(
                "the relay exited early ({status}); its log ends:\n{}",
                self.log_tail()
            ),
            Err(e) => Err(e).context("cannot check on the relay process"),
        }
    }

    /// Sleeps `duration`, checking every 100 ms that the relay still runs.
    pub async fn sleep(&mut self, duration: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + duration;
        loop {
            self.ensure_running()?;
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            tokio::time::sleep((until - now).min(Duration::from_millis(100))).await;
        }
    }

    /// Waits (asynchronously) up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().context("cannot wait for the relay")? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "the relay did not exit within {timeout:?}; its log ends:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the process with SIGKILL (a crash: no shutdown, no flush) and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (up to 60 s, then kills it) for the process to exit.
    pub fn stop(mut self) -> RelayExit {
        let _ = self.signal("TERM");
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
            }
        };
        RelayExit {
            success: status.is_some_and(|s| s.success()),
            code: status.and_then(|s| s.code()),
            log: self.log(),
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The last [`LOG_TAIL_LINES`] lines of `log`.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(LOG_TAIL_LINES);
    if lines.is_empty() {
        "(nothing logged)".to_owned()
    } else {
        lines[from..].join("\n")
    }
}
