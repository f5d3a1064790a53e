//! A Tansu broker of the caller's own: started on a port of 127.0.0.1 (in-memory storage unless
//! told otherwise) and killed on drop, so a test may stop or stall it without disturbing others,
//! and a benchmark measures against a fresh broker (an in-memory broker that has run for a while
//! is slower: it keeps every message it was sent).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a fresh broker may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A free TCP port on 127.0.0.1.
pub fn try_free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener
        .local_addr()
        .context("cannot find a free port")?
        .port())
}

/// [`try_free_port`] for tests: panics when there is none.
pub fn free_port() -> u16 {
    try_free_port().expect("free port")
}

/// `$TANSU_BIN`, else where `scripts/services.sh` installs it, else `tansu` on the `PATH`.
pub fn tansu_bin() -> PathBuf {
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

/// A running broker; dropping it kills the process.
pub struct OwnTansu {
    child: Child,
    port: u16,
}

/// How [`OwnTansu::launch`] starts a broker.
pub struct TansuLaunch<'a> {
    /// Where it listens (127.0.0.1).
    pub port: u16,
    /// The port it tells clients to connect to (127.0.0.1), when something (a TLS proxy)
    /// stands in front of it; default: `port`.
    pub advertised_port: Option<u16>,
    /// `--storage-engine`; `sqlite://NAME` is a file NAME in `dir`.
    pub storage: &'a str,
    /// More arguments, e.g. `--authentication`.
    pub extra_args: &'a [&'a str],
    /// Its working directory, where it also writes its log (`tansu.log`); default: none, log
    /// discarded.
    pub dir: Option<&'a Path>,
}

impl Default for TansuLaunch<'_> {
    fn default() -> Self {
        Self {
            port: 0,
            advertised_port: None,
            storage: "memory://tansu/",
            extra_args: &[],
            dir: None,
        }
    }
}

impl OwnTansu {
    /// An in-memory broker on `port` (not waited for: clients retry until it listens).
    pub fn start(port: u16) -> Self {
        Self::launch(&TansuLaunch {
            port,
            ..TansuLaunch::default()
        })
    }

    /// Starts a broker as `launch` says (see [`TansuLaunch`]); panics when it cannot.
    pub fn launch(launch: &TansuLaunch<'_>) -> Self {
        Self::try_launch(launch).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Starts a broker as `launch` says (see [`TansuLaunch`]).
    pub fn try_launch(launch: &TansuLaunch<'_>) -> anyhow::Result<Self> {
        let url = format!("tcp://127.0.0.1:{}", launch.port);
        let advertised = format!(
            "tcp://127.0.0.1:{}",
            launch.advertised_port.unwrap_or(launch.port)
        );
        let bin = tansu_bin();
        let mut command = Command::new(&bin);
        command
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args(["--storage-engine", launch.storage])
            .args(launch.extra_args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(dir) = launch.dir {
            command.current_dir(dir);
            if let Ok(log) = std::fs::File::create(dir.join("tansu.log")) {
                command.stderr(log);
            }
        }
        let child = command.spawn().with_context(|| {
            format!(
                "cannot start {} (install it with scripts/services.sh, or set TANSU_BIN)",
                bin.display()
            )
        })?;
        Ok(Self {
            child,
            port: launch.port,
        })
    }

    /// An in-memory broker on a free port, once it accepts connections.
    pub fn fresh() -> anyhow::Result<Self> {
        let mut broker = Self::try_launch(&TansuLaunch {
            port: try_free_port()?,
            ..TansuLaunch::default()
        })?;
        let started = Instant::now();
        while TcpStream::connect(broker.bootstrap()).is_err() {
            if let Some(status) = broker.child.try_wait().context("cannot check on tansu")? {
                bail!("tansu exited at start-up ({status})");
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "tansu did not listen on {} within {START_TIMEOUT:?}",
                    broker.bootstrap()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(broker)
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the broker: SIGSTOP stalls it like an outage
    /// while keeping what it stored.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

impl Drop for OwnTansu {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
