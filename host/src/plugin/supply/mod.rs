//! Where a plugin's bytes come from and whether to trust them: a file or an OCI registry
//! ([`oci`]), its digest ([`pin`]) and its minisign signature ([`signature`]). What leaves
//! here is checked; the router compiles exactly those bytes, so nothing can change between
//! the check and the load.

pub mod oci;
pub mod pin;
pub mod signature;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::plugin::PluginError;
use crate::text::{MAX_LOGGED, bounded};
use oci::{OciLocation, OciRegistries, OciRegistrySettings};
pub use pin::{Sha256Pin, sha256_digest};
pub use signature::{Signer, TrustedKeys};

/// A plugin's bytes as fetched and verified.
#[derive(Debug)]
pub struct Fetched {
    /// The component, exactly as compiled.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    /// Where they came from: the file's path, or the OCI reference with the manifest digest
    /// it resolved to (`oci://host/repo:tag@sha256:…`).
    pub source: String,
    /// The trusted key that signed them; `None` when no keys are configured.
    pub signer: Option<Signer>,
}

/// Fetches and verifies plugins for the router, `plugin check` and `plugin test`.
#[derive(Debug, Default)]
pub struct PluginSupply {
    trusted: TrustedKeys,
    oci: OciRegistries,
}

impl PluginSupply {
    /// `trusted_keys` must have been checked by config validation (a bad key is an error here
    /// too); `cache_dir` is the compile cache's directory, under which pulled plugins are kept.
    pub fn new(
        trusted_keys: &[String],
        registries: &BTreeMap<String, OciRegistrySettings>,
        cache_dir: Option<&Path>,
    ) -> Result<Self, PluginError> {
        let trusted = TrustedKeys::parse(trusted_keys).map_err(|(at, message)| {
            crate::problem::Problem::new(format!("plugins.trusted_keys[{at}]"), message)
        })?;
        Ok(Self {
            trusted,
            oci: OciRegistries::new(registries.clone(), cache_dir),
        })
    }

    /// Pushes the component `file` (with `file.minisig` when there is one) to the `oci://`
    /// reference `to`; returns the digests of the manifest and of the bytes pushed.
    pub fn push(&self, file: &Path, to: &str) -> Result<oci::Pushed, PluginError> {
        let location = match OciLocation::parse(to) {
            Some(parsed) => parsed.map_err(|m| refused(Path::new(to), m))?,
            None => {
                return Err(refused(
                    Path::new(to),
                    format!("not an {} reference", oci::OCI_SCHEME),
                ));
            }
        };
        let component =
            std::fs::read(file).map_err(|e| refused(file, format!("cannot read file: {e}")))?;
        let signature = read_signature(file)?;
        self.oci
            .push(&location, component, signature)
            .map_err(|e| refused(Path::new(to), e.message))
    }

    /// Whether signatures are required.
    pub fn requires_signatures(&self) -> bool {
        !self.trusted.is_empty()
    }

    /// Reads `location` — a file, or an `oci://` reference written as a path — and checks its
    /// signature when trusted keys are configured. Errors name the location.
    pub fn fetch(&self, location: &Path) -> Result<Fetched, PluginError> {
        let text = location.to_string_lossy();
        let (bytes, signature, source) = match OciLocation::parse(&text) {
            Some(parsed) => {
                let parsed = parsed.map_err(|m| refused(location, m))?;
                let pulled = self
                    .oci
                    .pull(&parsed)
                    .map_err(|e| refused(location, e.message))?;
                let source = format!("{}@{}", parsed.text(), pulled.manifest_digest);
                if !pulled.from_cache {
                    tracing::info!(plugin = %parsed.text(), manifest = %pulled.manifest_digest,
                        component = %sha256_digest(&pulled.component), "pulled plugin");
                }
                (pulled.component, pulled.signature, source)
            }
            None => {
                let bytes = std::fs::read(location).map_err(|e| {
                    let message =
                        bounded(&format!("cannot read file: {e}"), MAX_LOGGED).into_owned();
                    PluginError::BadPlugin {
                        path: location.to_owned(),
                        message,
                        source: Some(Box::new(e)),
                    }
                })?;
                let signature = match self.trusted.is_empty() {
                    true => None,
                    false => read_signature(location)?,
                };
                (bytes, signature, location.display().to_string())
            }
        };
        let signer = self
            .trusted
            .verify(&bytes, signature.as_deref())
            .map_err(|reason| refused(location, reason))?;
        Ok(Fetched {
            digest: sha256_digest(&bytes),
            bytes,
            source,
            signer,
        })
    }
}

/// `<file>.minisig`, minisign's own name for a file's signature.
pub(crate) fn signature_file(location: &Path) -> PathBuf {
    let mut name = location.as_os_str().to_owned();
    name.push(".minisig");
    PathBuf::from(name)
}

fn read_signature(location: &Path) -> Result<Option<String>, PluginError> {
    let file = signature_file(location);
    match std::fs::read(&file) {
        Ok(bytes) if bytes.len() > 16 * 1024 => Err(refused(
            location,
            format!("{} is too large for a minisign signature", file.display()),
        )),
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| refused(location, format!("{} is not text", file.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refused(
            location,
            format!("cannot read its signature {}: {e}", file.display()),
        )),
    }
}

fn refused(location: &Path, message: String) -> PluginError {
    PluginError::bad_plugin(location, bounded(&message, MAX_LOGGED).into_owned())
}
