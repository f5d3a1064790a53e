//! A real OCI registry for the plugin supply-chain tests: Debian's `docker-registry` (the CNCF
//! Distribution registry) on a free loopback port with its storage in a temporary directory,
//! pushed to with the ORAS project's Python client (`tests/oci/push.py`), so what Sluice
//! pulls was written by code that is not Sluice's. The storage is on disk, so a test can
//! corrupt or cut a blob the way a compromised or broken registry would serve it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::broker::try_free_port;
use crate::env::repo_root;

/// A running `docker-registry serve`; killed on drop.
pub struct OciRegistry {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    credentials: Option<(String, String)>,
}

impl OciRegistry {
    /// Starts an anonymous registry.
    pub fn start() -> anyhow::Result<Self> {
        Self::launch(None)
    }

    /// Starts a registry that requires HTTP basic authentication (an htpasswd file).
    pub fn start_with_basic_auth(user: &str, password: &str) -> anyhow::Result<Self> {
        Self::launch(Some((user.to_owned(), password.to_owned())))
    }

    fn launch(credentials: Option<(String, String)>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = try_free_port()?;
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: sluice-tests\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = &credentials {
            let htpasswd = dir.path().join("htpasswd");
            let line = python_output(&[
                "-c",
                "import bcrypt, sys; print(sys.argv[1] + ':' + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(5)).decode())",
                user,
                password,
            ])?;
            std::fs::write(&htpasswd, line)?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: sluice-tests\n    path: {}\n",
                htpasswd.display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), config)?;
        let mut registry = Self {
            child: None,
            dir,
            port,
            credentials,
        };
        registry.restart()?;
        Ok(registry)
    }

    /// Starts the registry process again (after [`OciRegistry::stop`]), on the same port and
    /// storage.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.path().join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context(
                "cannot run docker-registry (Debian package docker-registry; scripts/test \
                 installs it)",
            )?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "docker-registry did not listen on {}: {}",
            self.port,
            self.log()
        )
    }

    /// Stops the registry process (its storage stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `127.0.0.1:<port>`, as `oci://` references and `[plugins.registries]` name it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the registry logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Pushes `files` (path and media type each) as one artifact to `target`
    /// (`repository:tag`) with oras; returns the manifest's digest. Each file is pushed
    /// under its own file name.
    pub fn push(&self, target: &str, files: &[(&Path, &str)]) -> anyhow::Result<String> {
        let staging = tempfile::tempdir()?;
        let mut args: Vec<String> = vec![
            repo_root().join("tests/oci/push.py").display().to_string(),
            self.host(),
            target.to_owned(),
        ];
        for (path, media_type) in files {
            let name = path.file_name().context("file without a name")?;
            let staged = staging.path().join(name);
            std::fs::copy(path, &staged)
                .with_context(|| format!("cannot stage {}", path.display()))?;
            args.push(format!("{}:{media_type}", staged.display()));
        }
        if let Some((user, password)) = &self.credentials {
            args.extend([
                "--username".into(),
                user.clone(),
                "--password".into(),
                password.clone(),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let digest = python_output(&args)?;
        let digest = digest.trim();
        if !digest.starts_with("sha256:") {
            bail!("oras push printed no manifest digest: {digest:?}");
        }
        Ok(digest.to_owned())
    }

    /// Pulls `target` (`repository:tag`) with oras into `outdir`: each layer's media type and
    /// bytes, in the manifest's order.
    pub fn pull(&self, target: &str, outdir: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let script = repo_root().join("tests/oci/pull.py").display().to_string();
        let out = outdir.display().to_string();
        let listing = python_output(&[&script, &self.host(), target, &out])?;
        let mut layers = Vec::new();
        for line in listing.lines().filter(|l| !l.starts_with("config ")) {
            let (media_type, path) = line.split_once(' ').context("unexpected oras output")?;
            layers.push((media_type.to_owned(), std::fs::read(path)?));
        }
        Ok(layers)
    }

    /// The file the registry serves blob `digest` from (`sha256:…`): rewrite it to make the
    /// registry serve other bytes under that digest.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The Python with `oras` and `bcrypt` (`SLUICE_ORAS_PYTHON`, set by scripts/test).
fn python() -> String {
    std::env::var("SLUICE_ORAS_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn python_output(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(python())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run Python for oras (set SLUICE_ORAS_PYTHON; scripts/test does)")?;
    if !output.status.success() {
        bail!(
            "{} failed ({}): {}{}\n(SLUICE_ORAS_PYTHON must name a Python with oras and bcrypt: \
             `. scripts/plugin-toolchains.sh; ensure_oras_python`)",
            python(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
