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
    /// The cache files they were kept in (an OCI plugin's), held while they are loaded.
    pub(crate) holds: Vec<crate::plugin::cache_budget::CacheHold>,
}

/// Fetches and verifies plugins for the router, `plugin check` and `plugin test`.
#[derive(Debug, Default)]
pub struct PluginSupply {
    /// `[plugins] trusted_keys`: with any, every plugin must be signed.
    trusted: TrustedKeys,
    /// Those and the keys of sections with their own `trusted_keys` (empty when there are
    /// none): a signature by any of them is verified here; whether its signer may sign for a
    /// tenant is that tenant's check (see `plugin/keys.rs`).
    known: TrustedKeys,
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
            known: TrustedKeys::default(),
            oci: OciRegistries::new(registries.clone(), cache_dir),
        })
    }

    /// Keeps the cache directory within `max_bytes` (`[plugins] cache_max_mb`, shared with
    /// the compile cache) when pulled plugins are written to it.
    pub fn with_cache_max_bytes(mut self, max_bytes: u64) -> Self {
        self.oci = self.oci.bounded(max_bytes);
        self
    }

    /// Also verifies signatures by `entries`, the keys of sections with their own
    /// `trusted_keys` (checked by config validation, as `[plugins] trusted_keys` is).
    pub fn with_scoped_keys(
        mut self,
        global: &[String],
        entries: &[String],
    ) -> Result<Self, PluginError> {
        if entries.is_empty() {
            return Ok(self);
        }
        let all: Vec<String> = global.iter().chain(entries).cloned().collect();
        self.known = TrustedKeys::parse(&all).map_err(|(at, message)| {
            crate::problem::Problem::new(format!("trusted_keys[{at}]"), message)
        })?;
        Ok(self)
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
        let mut holds = Vec::new();
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
                holds = pulled.holds;
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
                let signature = match self.trusted.is_empty() && self.known.is_empty() {
                    true => None,
                    false => read_signature(location)?,
                };
                (bytes, signature, location.display().to_string())
            }
        };
        let signer = self
            .verify(&bytes, signature.as_deref())
            .map_err(|reason| refused(location, reason))?;
        Ok(Fetched {
            digest: sha256_digest(&bytes),
            bytes,
            source,
            signer,
            holds,
        })
    }
}

impl PluginSupply {
    /// The signer of `bytes`. With only `[plugins] trusted_keys`, they decide (an unsigned
    /// plugin or another key is refused here, for every tenant). With sections' own keys too,
    /// a signature by any configured key is verified (wrong bytes are refused here), and an
    /// unsigned plugin passes unless global keys are set: each tenant's scope then decides.
    fn verify(&self, bytes: &[u8], signature: Option<&str>) -> Result<Option<Signer>, String> {
        if self.known.is_empty() {
            return self.trusted.verify(bytes, signature);
        }
        match signature {
            None if self.trusted.is_empty() => Ok(None),
            None => self.trusted.verify(bytes, None),
            Some(text) => self
                .known
                .identify(bytes, text, "no trusted_keys lists")
                .map(Some),
        }
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
