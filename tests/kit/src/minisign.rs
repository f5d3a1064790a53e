//! Signing keys made by the test itself with Debian's `minisign` (the reference
//! implementation), for the plugin signature tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// A minisign key pair in a temporary directory, without a password.
pub struct SigningKey {
    dir: tempfile::TempDir,
}

impl SigningKey {
    /// Generates a new key pair (`minisign -G -W`).
    pub fn generate() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let key = Self { dir };
        run(Command::new("minisign")
            .args(["-G", "-W", "-p"])
            .arg(key.public_file())
            .arg("-s")
            .arg(key.secret_file()))?;
        Ok(key)
    }

    fn public_file(&self) -> PathBuf {
        self.dir.path().join("sluice.pub")
    }

    fn secret_file(&self) -> PathBuf {
        self.dir.path().join("sluice.key")
    }

    /// The public key's base64 line (`RW…`), as `trusted_keys` takes it.
    pub fn public(&self) -> String {
        let text = std::fs::read_to_string(self.public_file()).unwrap_or_default();
        text.lines()
            .find(|l| !l.starts_with("untrusted comment:") && !l.trim().is_empty())
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// The key id minisign prints (uppercase hex, without leading zeros).
    pub fn id(&self) -> String {
        let text = std::fs::read_to_string(self.public_file()).unwrap_or_default();
        text.lines()
            .next()
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_default()
            .to_owned()
    }

    /// Signs `file` into `file.minisig` (`minisign -S`), with `comment` as trusted comment.
    pub fn sign(&self, file: &Path, comment: &str) -> anyhow::Result<PathBuf> {
        run(Command::new("minisign")
            .args(["-S", "-W", "-s"])
            .arg(self.secret_file())
            .arg("-m")
            .arg(file)
            .args(["-t", comment]))?;
        let mut signature = file.as_os_str().to_owned();
        signature.push(".minisig");
        Ok(PathBuf::from(signature))
    }
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .output()
        .context("cannot run minisign (Debian package minisign; scripts/test installs it)")?;
    if !output.status.success() {
        bail!(
            "minisign failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
