//! A Tansu broker of the benchmark's own: started fresh (in-memory storage) on a free port for
//! one measurement and killed after it. An in-memory broker that has been running for a while
//! is slower than a fresh one (it keeps every message it was sent), which moved drains by 40 %
//! between runs against the shared broker; a fresh broker per measurement removes that.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a fresh broker may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running broker; dropping it kills the process.
pub struct OwnBroker {
    child: Child,
    bootstrap: String,
}

impl OwnBroker {
    /// Starts `tansu broker` on a free port of 127.0.0.1 and waits until it accepts
    /// connections.
    pub fn start() -> anyhow::Result<Self> {
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let bin = tansu_bin();
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start {} (install it with scripts/services.sh, or set TANSU_BIN)",
                    bin.display()
                )
            })?;
        let mut broker = Self {
            child,
            bootstrap: format!("127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while TcpStream::connect(&broker.bootstrap).is_err() {
            if let Some(status) = broker.child.try_wait().context("cannot check on tansu")? {
                bail!("tansu exited at start-up ({status})");
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "tansu did not listen on {} within {START_TIMEOUT:?}",
                    broker.bootstrap
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(broker)
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `$TANSU_BIN`, else where `scripts/services.sh` installs it, else `tansu` on the `PATH`.
fn tansu_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("TANSU_BIN") {
        return PathBuf::from(bin);
    }
    let installed = std::env::var_os("HOME")
        .map(|home| {
            PathBuf::from(home).join(".local/share/sluice/tansu-0.6.0-dynostore-libsql/bin/tansu")
        })
        .filter(|p| p.is_file());
    installed.unwrap_or_else(|| PathBuf::from("tansu"))
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener
        .local_addr()
        .context("cannot find a free port")?
        .port())
}
