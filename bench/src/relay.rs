//! The benchmark's `sluice run`: the test kit's relay process, started with a scenario's
//! [`RelayConfig`], measured through `/proc` and stopped after a last measurement.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use sluice_testkit::RelayLaunch;
use sluice_testkit::config::RelayConfig;
pub(crate) use sluice_testkit::relay::RelayProcess;

use crate::procstat::{self, ProcSample};

/// Longest wait for the relay to exit after SIGTERM (its own shutdown_timeout is 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// What a stopped relay left behind.
pub(crate) struct Stopped {
    /// The `/proc` reading taken right before SIGTERM.
    pub last: ProcSample,
    pub log: String,
}

/// Starts `sluice run --config <config>` with `RUST_LOG=<rust_log>`.
pub(crate) fn start(
    sluice: &Path,
    config: &RelayConfig,
    rust_log: &str,
) -> anyhow::Result<RelayProcess> {
    RelayProcess::launch(
        &config.render(),
        &RelayLaunch {
            bin: sluice.to_path_buf(),
            rust_log,
            // Both would override the file: the database URL (idle uses its own database) and
            // the compile cache (startup uses a fresh one).
            env_remove: &["SLUICE_DATABASE_URL", "SLUICE_PLUGIN_CACHE_DIR"],
            ..RelayLaunch::default()
        },
    )
}

/// Measuring a relay from the outside.
pub(crate) trait Measured {
    /// The relay's CPU time and peak RSS so far.
    fn sample(&self) -> anyhow::Result<ProcSample>;
    /// Takes a last `/proc` reading, sends SIGTERM and waits for the exit. A non-zero exit is
    /// reported on stderr, not returned: the measurement is already taken.
    async fn stop_measured(self) -> anyhow::Result<Stopped>;
}

impl Measured for RelayProcess {
    fn sample(&self) -> anyhow::Result<ProcSample> {
        procstat::sample(self.pid()).context("cannot measure the relay process")
    }

    async fn stop_measured(mut self) -> anyhow::Result<Stopped> {
        self.ensure_running()?;
        let last = self.sample()?;
        self.signal("TERM")?;
        let status = self
            .wait_exit(STOP_TIMEOUT)
            .await
            .context("after SIGTERM")?;
        let log = self.log();
        if !status.success() {
            eprintln!(
                "warning: the relay exited with {status} after SIGTERM; its log ends:\n{}",
                self.log_tail()
            );
        }
        Ok(Stopped { last, log })
    }
}
