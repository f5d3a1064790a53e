//! A `sluice run` child process: started with a config file in a temporary directory, its
//! stderr in a log file there, measured through `/proc`, stopped with SIGTERM.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::procstat::{self, ProcSample};
use crate::relay_config::RelayConfig;

/// Longest wait for the relay to exit after SIGTERM (its own shutdown_timeout is 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of the relay's log quoted in errors.
const LOG_TAIL_LINES: usize = 20;

/// A running relay. Dropping it kills the process (SIGKILL) if it still runs.
pub struct RelayProcess {
    child: Child,
    /// Holds the config and log file.
    _dir: tempfile::TempDir,
    log_path: PathBuf,
}

/// What a stopped relay left behind.
pub struct Stopped {
    /// The `/proc` reading taken right before SIGTERM.
    pub last: ProcSample,
    pub log: String,
}

impl RelayProcess {
    /// Starts `sluice run --config <config>` with `RUST_LOG=<rust_log>`.
    pub fn start(sluice: &Path, config: &RelayConfig, rust_log: &str) -> anyhow::Result<Self> {
        let dir =
            tempfile::tempdir().context("cannot create a temporary directory for the relay")?;
        let config_path = dir.path().join("sluice.toml");
        std::fs::write(&config_path, config.render())
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let log_path = dir.path().join("sluice.log");
        let log = File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let child = Command::new(sluice)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .env("RUST_LOG", rust_log)
            // Both would override the file: the database URL (idle uses its own database) and
            // the compile cache (startup uses a fresh one).
            .env_remove("SLUICE_DATABASE_URL")
            .env_remove("SLUICE_PLUGIN_CACHE_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {} run", sluice.display()))?;
        Ok(Self {
            child,
            _dir: dir,
            log_path,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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

    /// The relay's CPU time and peak RSS so far.
    pub fn sample(&self) -> anyhow::Result<ProcSample> {
        procstat::sample(self.pid()).context("cannot measure the relay process")
    }

    /// Takes a last `/proc` reading, sends SIGTERM and waits for the exit. A non-zero exit is
    /// reported on stderr, not returned: the measurement is already taken.
    pub async fn stop(mut self) -> anyhow::Result<Stopped> {
        self.ensure_running()?;
        let last = self.sample()?;
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("cannot run kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM {pid} failed ({status})");
        }
        let status = self.wait(STOP_TIMEOUT).await?;
        let log = self.log();
        if !status.success() {
            eprintln!(
                "warning: the relay exited with {status} after SIGTERM; its log ends:\n{}",
                tail(&log)
            );
        }
        Ok(Stopped { last, log })
    }

    async fn wait(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().context("cannot wait for the relay")? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "the relay did not exit within {timeout:?} of SIGTERM; its log ends:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
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
