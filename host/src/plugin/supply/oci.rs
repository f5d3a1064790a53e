//! Plugins pulled from an OCI registry: `path = "oci://host[:port]/repo/name:tag"` or
//! `…@sha256:<manifest digest>`, in the layout `wkg oci push` and `oras push` write for Wasm
//! components (one `application/wasm` layer), optionally with a minisign signature as a second
//! layer. Every blob is checked against its digest and size before it is used, and cached by
//! digest under `<plugins cache>/oci/`, with the digest each reference last resolved to: a
//! registry that does not answer does not stop a start (or a reload) that has the plugin
//! cached, but a registry that serves wrong bytes is refused, never papered over by the cache.
//! The cache shares `cache_max_mb` with the compiled code ([`crate::plugin::cache_budget`]);
//! the files of a plugin that is loaded are held, so its fallback survives pruning.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};

use crate::plugin::cache_budget::{self, CacheHold};
use crate::plugin::supply::pin::sha256_digest;
use crate::problem::Problem;
use crate::secret::Secret;
use crate::text::{MAX_LOGGED, bounded, error_chain};

/// What `path` starts with for a plugin in an OCI registry.
pub const OCI_SCHEME: &str = "oci://";
/// The component's layer (wkg, oras with `file.wasm:application/wasm`).
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The config blob `wkg oci push` gives a component.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// A minisign signature of the component's bytes, pushed as a second layer.
pub const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.sluice.plugin.signature.minisign";
/// Largest component accepted from a registry: Python and JavaScript components are 20–40 MB.
const MAX_COMPONENT_BYTES: u64 = 256 * 1024 * 1024;
/// Largest signature accepted (a minisign signature is ~300 bytes).
const MAX_SIGNATURE_BYTES: u64 = 16 * 1024;

/// `[plugins.registries."<host[:port]>"]`: how to reach one registry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciRegistrySettings {
    /// Basic authentication (with `password`; a token service the registry names is asked
    /// for a bearer token with them, as docker and oras do).
    #[serde(default)]
    pub username: Option<String>,
    /// Usually `${file:…}`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Talk plain HTTP instead of HTTPS (a registry on loopback or inside a cluster).
    #[serde(default)]
    pub plain_http: bool,
    /// PEM file of a CA that signs the registry's certificate (besides the system's); a
    /// relative path is relative to the config file, as every path in it.
    #[serde(default)]
    pub ca_location: Option<PathBuf>,
    /// Per request, e.g. `"30s"` (default 60 s).
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
}

impl OciRegistrySettings {
    /// Problems with this registry's entry, at `key`.
    pub fn problems(&self, key: &str) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.username.is_some() != self.password.is_some() {
            problems.push(Problem::new(
                key,
                "basic authentication needs both username and password",
            ));
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            problems.push(Problem::new(
                format!("{key}.timeout"),
                "must be greater than 0",
            ));
        }
        // Checked here, not first when a plugin is pulled from the registry: a new tenant's
        // plugin may be the first to use it, long after `config check` passed.
        if let Some(ca) = &self.ca_location
            && let Err(problem) = ca_problem(ca, &format!("{key}.ca_location"))
        {
            problems.push(problem);
        }
        problems
    }
}

/// Whether `ca` is a readable PEM certificate, as the pull will need it.
fn ca_problem(ca: &Path, key: &str) -> Result<(), Problem> {
    let pem = std::fs::read(ca)
        .map_err(|e| Problem::caused(key, format!("cannot read {}", ca.display()), e))?;
    // Not the TLS library's reason: its text (`PEM routines:get_name:no start line`) says no
    // more than this, and changes with its version.
    reqwest::Certificate::from_pem(&pem).map_err(|_| {
        Problem::new(
            key,
            format!(
                "{} is not a PEM certificate (-----BEGIN CERTIFICATE----- …)",
                ca.display()
            ),
        )
    })?;
    Ok(())
}

/// An `oci://` location, parsed.
#[derive(Debug, Clone)]
pub struct OciLocation {
    reference: Reference,
}

impl OciLocation {
    /// `None` when `location` is not an `oci://` reference; otherwise the reference or why it
    /// is not one.
    pub fn parse(location: &str) -> Option<Result<Self, String>> {
        let rest = location.strip_prefix(OCI_SCHEME)?;
        Some(Self::parse_reference(rest))
    }

    fn parse_reference(rest: &str) -> Result<Self, String> {
        let host = rest.split('/').next().unwrap_or_default();
        // Without a host Reference would pick Docker Hub; a plugin names its registry.
        if !rest.contains('/') || host.is_empty() {
            return Err(format!(
                "`{OCI_SCHEME}{rest}` names no registry: write oci://host[:port]/repository:tag \
                 or oci://host[:port]/repository@sha256:<digest>"
            ));
        }
        let reference: Reference = rest
            .parse()
            .map_err(|e| format!("`{OCI_SCHEME}{rest}` is not an OCI reference: {e}"))?;
        if reference.tag().is_none() && reference.digest().is_none() {
            return Err(format!(
                "`{OCI_SCHEME}{rest}` names neither a tag nor a digest: add :tag or @sha256:…"
            ));
        }
        Ok(Self { reference })
    }

    /// The registry's `host[:port]`, as `[plugins.registries]` is keyed.
    pub fn registry(&self) -> &str {
        self.reference.registry()
    }

    /// As written, with the scheme.
    pub fn text(&self) -> String {
        format!("{OCI_SCHEME}{}", self.reference.whole())
    }
}

/// A component pulled (or taken from the cache) with what identifies it.
#[derive(Debug)]
pub struct Pulled {
    /// The component's bytes, checked against the manifest's digest and size.
    pub component: Vec<u8>,
    /// The signature layer's text, when the manifest has one.
    pub signature: Option<String>,
    /// The manifest's digest: what a tag resolved to.
    pub manifest_digest: String,
    /// Whether the registry did not answer and the cached copy was used.
    pub from_cache: bool,
    /// The cache files it is kept in (component, signature, tag), held while it is loaded.
    pub(crate) holds: Vec<CacheHold>,
}

/// What a push wrote: the digests of the manifest and of the component's layer.
#[derive(Debug)]
pub struct Pushed {
    /// `sha256:…` of the manifest (what `oci://…@sha256:…` pins).
    pub manifest: String,
    /// `sha256:…` of the component's bytes (what a `sha256` pin says).
    pub component: String,
}

/// Why a pull or push failed: `outage` when the registry did not answer (or answered 5xx), so a
/// cached copy may stand in; otherwise the registry answered, and what it answered is refused.
#[derive(Debug)]
pub struct OciError {
    /// What went wrong, naming the blob or manifest.
    pub message: String,
    /// Whether the registry did not answer (a cached copy may stand in).
    pub outage: bool,
}

impl OciError {
    fn refused(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            outage: false,
        }
    }
}

/// What a reference resolved to when it was last pulled (`<cache>/oci/refs/<sha256 of ref>`).
#[derive(Debug, Serialize, Deserialize)]
struct CachedRef {
    reference: String,
    manifest: String,
    component: String,
    signature: Option<String>,
}

/// Pulls plugins from (and pushes them to) the registries `[plugins.registries]` configures
/// (any other one anonymously over HTTPS).
#[derive(Debug, Default)]
pub struct OciRegistries {
    registries: BTreeMap<String, OciRegistrySettings>,
    /// `<plugins cache>/oci`; `None`: no cache (the compile cache is off).
    cache: Option<PathBuf>,
    /// The bound of the whole plugins cache directory (`cache_max_mb`, shared with compiled
    /// code).
    max_bytes: u64,
}

/// `cache_max_mb`'s default, for a supply nobody gave the configured one.
pub(crate) const DEFAULT_CACHE_MAX_BYTES: u64 = 1024 * 1024 * 1024;

impl OciRegistries {
    /// Pulls with `registries`' settings, caching under `<cache_dir>/oci` (none without).
    pub fn new(
        registries: BTreeMap<String, OciRegistrySettings>,
        cache_dir: Option<&Path>,
    ) -> Self {
        Self {
            registries,
            cache: cache_dir.map(|dir| dir.join("oci")),
            max_bytes: DEFAULT_CACHE_MAX_BYTES,
        }
    }

    /// Keeps the cache directory (everything under it) within `max_bytes`.
    pub fn bounded(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Resolves `location` and fetches its component (and signature), from the registry, or
    /// from the cache when the registry does not answer.
    pub fn pull(&self, location: &OciLocation) -> Result<Pulled, OciError> {
        match self.pull_remote(location) {
            Ok(mut pulled) => {
                match self.store(location, &pulled) {
                    Ok(holds) => pulled.holds = holds,
                    Err(e) => tracing::warn!(plugin = %location.text(), error = %e,
                        "cannot cache the pulled plugin; a start while the registry is down will fail"),
                }
                Ok(pulled)
            }
            Err(e) if e.outage => match self.cached(location) {
                Some(pulled) => {
                    tracing::warn!(plugin = %location.text(), error = %e.message,
                        manifest = %pulled.manifest_digest,
                        "registry did not answer; using the cached copy it last resolved to");
                    Ok(pulled)
                }
                None => Err(OciError {
                    message: format!("{} (and no cached copy)", e.message),
                    outage: true,
                }),
            },
            Err(e) => Err(e),
        }
    }

    fn pull_remote(&self, location: &OciLocation) -> Result<Pulled, OciError> {
        let settings = self.settings(location);
        let reference = location.reference.clone();
        on_own_runtime(async move { pull_async(&settings, &reference).await })
    }

    /// Pushes `component` (and its minisign `signature`) to `location` as `wkg oci push`
    /// lays a component out (one `application/wasm` layer, a `application/vnd.wasm.config.v0+json`
    /// config), the signature as a second layer.
    pub fn push(
        &self,
        location: &OciLocation,
        component: Vec<u8>,
        signature: Option<String>,
    ) -> Result<Pushed, OciError> {
        let settings = self.settings(location);
        let reference = location.reference.clone();
        on_own_runtime(async move { push_async(&settings, &reference, component, signature).await })
    }

    fn settings(&self, location: &OciLocation) -> OciRegistrySettings {
        self.registries
            .get(location.registry())
            .cloned()
            .unwrap_or_default()
    }

    fn ref_file(&self, location: &OciLocation) -> Option<PathBuf> {
        let name = sha256_digest(location.text().as_bytes()).replace(':', "-");
        Some(self.cache.as_ref()?.join("refs").join(name))
    }

    fn blob_file(&self, digest: &str) -> Option<PathBuf> {
        Some(
            self.cache
                .as_ref()?
                .join("blobs")
                .join(digest.replace(':', "-")),
        )
    }

    /// Writes the pulled files into the cache, holds them (taken before writing, so a
    /// concurrent prune keeps them) and prunes the directory to its bound.
    fn store(&self, location: &OciLocation, pulled: &Pulled) -> std::io::Result<Vec<CacheHold>> {
        let (Some(cache), Some(ref_file), Some(component_file)) = (
            self.cache.as_ref(),
            self.ref_file(location),
            self.blob_file(&sha256_digest(&pulled.component)),
        ) else {
            return Ok(Vec::new());
        };
        let mut holds = vec![CacheHold::new(&ref_file), CacheHold::new(&component_file)];
        write_atomically(&component_file, &pulled.component)?;
        let signature = match &pulled.signature {
            Some(text) => {
                let digest = sha256_digest(text.as_bytes());
                if let Some(file) = self.blob_file(&digest) {
                    holds.push(CacheHold::new(&file));
                    write_atomically(&file, text.as_bytes())?;
                }
                Some(digest)
            }
            None => None,
        };
        let entry = CachedRef {
            reference: location.text(),
            manifest: pulled.manifest_digest.clone(),
            component: sha256_digest(&pulled.component),
            signature,
        };
        let json = serde_json::to_vec_pretty(&entry).map_err(std::io::Error::other)?;
        write_atomically(&ref_file, &json)?;
        if let Some(dir) = cache.parent() {
            cache_budget::prune_logged(dir, self.max_bytes, &[]);
        }
        Ok(holds)
    }

    /// The cached copy of what `location` last resolved to, its bytes checked again.
    fn cached(&self, location: &OciLocation) -> Option<Pulled> {
        // Each file held before it is read: a concurrent prune keeps it.
        let ref_file = self.ref_file(location)?;
        let mut holds = vec![CacheHold::new(&ref_file)];
        let entry: CachedRef = serde_json::from_slice(&std::fs::read(&ref_file).ok()?).ok()?;
        let component_file = self.blob_file(&entry.component)?;
        holds.push(CacheHold::new(&component_file));
        let component = std::fs::read(&component_file).ok()?;
        if sha256_digest(&component) != entry.component {
            return None;
        }
        let signature = match &entry.signature {
            Some(digest) => {
                let file = self.blob_file(digest)?;
                holds.push(CacheHold::new(&file));
                let bytes = std::fs::read(&file).ok()?;
                (sha256_digest(&bytes) == *digest).then_some(())?;
                cache_budget::touch(&file);
                Some(String::from_utf8(bytes).ok()?)
            }
            None => None,
        };
        // Used now: the least recently used go first when the cache is pruned.
        cache_budget::touch(&ref_file);
        cache_budget::touch(&component_file);
        Some(Pulled {
            component,
            signature,
            manifest_digest: entry.manifest,
            from_cache: true,
            holds,
        })
    }
}

/// Runs `work` to completion on a thread and runtime of its own: the loaders run on blocking
/// threads, inside and outside a Tokio runtime.
fn on_own_runtime<T, F>(work: F) -> Result<T, OciError>
where
    T: Send,
    F: std::future::Future<Output = Result<T, OciError>> + Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| OciError::refused(format!("cannot start a runtime: {e}")))?;
                runtime.block_on(work)
            })
            .join()
            .unwrap_or_else(|_| Err(OciError::refused("the registry client panicked")))
    })
}

fn auth(settings: &OciRegistrySettings) -> RegistryAuth {
    match (&settings.username, &settings.password) {
        // The one place the password leaves its `Secret`: the client sends it.
        (Some(user), Some(password)) => {
            RegistryAuth::Basic(user.clone(), password.expose().to_owned())
        }
        _ => RegistryAuth::Anonymous,
    }
}

async fn push_async(
    settings: &OciRegistrySettings,
    reference: &Reference,
    component: Vec<u8>,
    signature: Option<String>,
) -> Result<Pushed, OciError> {
    let client = client(settings, reference.registry())?;
    let auth = auth(settings);
    let component_digest = sha256_digest(&component);
    let mut layers = vec![ImageLayer::new(
        component,
        WASM_LAYER_MEDIA_TYPE.to_owned(),
        None,
    )];
    if let Some(text) = signature {
        layers.push(ImageLayer::new(
            text.into_bytes(),
            SIGNATURE_MEDIA_TYPE.to_owned(),
            None,
        ));
    }
    let config = serde_json::json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [component_digest],
    });
    let config = Config::new(
        config.to_string().into_bytes(),
        WASM_CONFIG_MEDIA_TYPE.to_owned(),
        None,
    );
    client
        .push(reference, &layers, config, &auth, None)
        .await
        .map_err(|e| from_client("cannot push", e))?;
    let manifest = client
        .fetch_manifest_digest(reference, &auth)
        .await
        .map_err(|e| from_client("pushed, but cannot read the manifest digest back", e))?;
    Ok(Pushed {
        manifest,
        component: component_digest,
    })
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Unique per process and thread: two threads may pull the same blob at once.
    let tmp = path.with_extension(format!(
        "tmp{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn client(settings: &OciRegistrySettings, registry: &str) -> Result<Client, OciError> {
    let mut extra_root_certificates = Vec::new();
    if let Some(ca) = &settings.ca_location {
        let data = std::fs::read(ca).map_err(|e| {
            OciError::refused(format!(
                "cannot read [plugins.registries.\"{registry}\"] ca_location {}: {e}",
                ca.display()
            ))
        })?;
        extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    let timeout = settings.timeout.unwrap_or(Duration::from_secs(60));
    Ok(Client::new(ClientConfig {
        protocol: match settings.plain_http {
            true => ClientProtocol::Http,
            false => ClientProtocol::Https,
        },
        extra_root_certificates,
        connect_timeout: Some(timeout.min(Duration::from_secs(10))),
        read_timeout: Some(timeout),
        ..ClientConfig::default()
    }))
}

fn from_client(what: &str, e: OciDistributionError) -> OciError {
    let outage = match &e {
        OciDistributionError::RequestError(_) | OciDistributionError::IoError(_) => true,
        OciDistributionError::ServerError { code, .. } => *code >= 500,
        _ => false,
    };
    OciError {
        // With its causes: reqwest's message alone says "error sending request", not why
        // (connection refused, certificate verify failed).
        message: bounded(&format!("{what}: {}", error_chain(&e)), MAX_LOGGED).into_owned(),
        outage,
    }
}

async fn pull_async(
    settings: &OciRegistrySettings,
    reference: &Reference,
) -> Result<Pulled, OciError> {
    let client = client(settings, reference.registry())?;
    let auth = auth(settings);
    // oci-client checks the manifest against a `@sha256:` reference and the registry's
    // Docker-Content-Digest header.
    let (manifest, manifest_digest) = client
        .pull_image_manifest(reference, &auth)
        .await
        .map_err(|e| from_client("cannot read the manifest", e))?;
    let layer = |media_type: &str| -> Result<Option<&OciDescriptor>, OciError> {
        let mut found = manifest
            .layers
            .iter()
            .filter(|l| l.media_type == media_type);
        let first = found.next();
        if found.next().is_some() {
            return Err(OciError::refused(format!(
                "manifest {manifest_digest} has more than one {media_type} layer"
            )));
        }
        Ok(first)
    };
    let Some(wasm) = layer(WASM_LAYER_MEDIA_TYPE)? else {
        let types: Vec<&str> = manifest
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect();
        return Err(OciError::refused(format!(
            "manifest {manifest_digest} has no {WASM_LAYER_MEDIA_TYPE} layer (its layers: {}): \
             push the component with `wkg oci push` or `oras push … plugin.wasm:{WASM_LAYER_MEDIA_TYPE}`",
            if types.is_empty() {
                "none".into()
            } else {
                types.join(", ")
            }
        )));
    };
    let component = blob(&client, reference, wasm, MAX_COMPONENT_BYTES).await?;
    let signature = match layer(SIGNATURE_MEDIA_TYPE)? {
        Some(sig) => {
            let bytes = blob(&client, reference, sig, MAX_SIGNATURE_BYTES).await?;
            Some(String::from_utf8(bytes).map_err(|_| {
                OciError::refused(format!("signature layer {} is not text", sig.digest))
            })?)
        }
        None => None,
    };
    Ok(Pulled {
        component,
        signature,
        manifest_digest,
        from_cache: false,
        holds: Vec::new(),
    })
}

/// Downloads one blob, refusing one larger than `max` or than its descriptor says, shorter
/// than it says (a cut download), or whose bytes do not hash to its digest.
async fn blob(
    client: &Client,
    reference: &Reference,
    layer: &OciDescriptor,
    max: u64,
) -> Result<Vec<u8>, OciError> {
    let digest = &layer.digest;
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > max {
        return Err(OciError::refused(format!(
            "blob {digest} is {size} bytes, more than the {max} accepted"
        )));
    }
    if !digest.starts_with("sha256:") {
        return Err(OciError::refused(format!(
            "blob {} is not named by a sha256 digest",
            bounded(digest, 100)
        )));
    }
    let mut stream = client
        .pull_blob_stream(reference, layer)
        .await
        .map_err(|e| from_client(&format!("cannot download blob {digest}"), e))?
        .stream;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // oci-client's stream checks the digest at its end: then the bytes are wrong (or
            // cut short), not the registry unreachable.
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<DigestError>()) => break,
            Err(e) => {
                return Err(OciError {
                    message: format!(
                        "download of blob {digest} broke off after {} bytes: {}",
                        bytes.len(),
                        error_chain(&e)
                    ),
                    outage: true,
                });
            }
        };
        if (bytes.len() + chunk.len()) as u64 > size {
            return Err(OciError::refused(format!(
                "blob {digest} is longer than the {size} bytes its manifest says"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    if (bytes.len() as u64) < size {
        return Err(OciError::refused(format!(
            "blob {digest} is truncated: {} of the {size} bytes its manifest says",
            bytes.len()
        )));
    }
    let found = sha256_digest(&bytes);
    if found != *digest {
        return Err(OciError::refused(format!(
            "blob {digest} does not match its digest: the registry served bytes whose digest is {found}"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_registry_and_a_tag_or_digest() {
        let loc = OciLocation::parse("oci://127.0.0.1:5000/acme/router:1.2")
            .unwrap()
            .unwrap();
        assert_eq!(loc.registry(), "127.0.0.1:5000");
        assert_eq!(loc.text(), "oci://127.0.0.1:5000/acme/router:1.2");
        let digest = format!("sha256:{}", "a".repeat(64));
        let pinned = OciLocation::parse(&format!("oci://reg.example.com/acme/router@{digest}"))
            .unwrap()
            .unwrap();
        assert_eq!(pinned.reference.digest(), Some(digest.as_str()));
        assert!(OciLocation::parse("/srv/plugins/router.wasm").is_none());
        for bad in [
            "oci://router:1.2",
            "oci:///acme/router:1",
            "oci://reg.example.com/Acme/ro uter:1",
        ] {
            let err = OciLocation::parse(bad).unwrap().unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn registry_entries_need_both_credentials() {
        let half = OciRegistrySettings {
            username: Some("ci".into()),
            ..OciRegistrySettings::default()
        };
        let problems = half.problems("plugins.registries.\"reg:5000\"");
        assert_eq!(problems.len(), 1);
    }

    #[test]
    fn the_cache_serves_only_bytes_that_still_match() {
        let dir = tempfile::tempdir().unwrap();
        let puller = OciRegistries::new(BTreeMap::new(), Some(dir.path()));
        let loc = OciLocation::parse("oci://127.0.0.1:1/acme/router:1")
            .unwrap()
            .unwrap();
        assert!(puller.cached(&loc).is_none());
        let pulled = Pulled {
            component: b"component".to_vec(),
            signature: Some("sig".into()),
            manifest_digest: "sha256:m".into(),
            from_cache: false,
            holds: Vec::new(),
        };
        puller.store(&loc, &pulled).unwrap();
        let cached = puller.cached(&loc).unwrap();
        assert_eq!(cached.component, b"component");
        assert_eq!(cached.signature.as_deref(), Some("sig"));
        assert!(cached.from_cache);
        // A cached blob that changed on disk is not used.
        let file = puller.blob_file(&sha256_digest(b"component")).unwrap();
        std::fs::write(&file, b"c0mponent").unwrap();
        assert!(puller.cached(&loc).is_none());
    }

    #[test]
    fn a_registry_that_does_not_answer_falls_back_to_nothing_without_a_cache() {
        let puller = OciRegistries::new(
            BTreeMap::from([(
                "127.0.0.1:1".to_owned(),
                OciRegistrySettings {
                    plain_http: true,
                    ..OciRegistrySettings::default()
                },
            )]),
            None,
        );
        let loc = OciLocation::parse("oci://127.0.0.1:1/acme/router:1")
            .unwrap()
            .unwrap();
        let err = puller.pull(&loc).unwrap_err();
        assert!(err.outage, "{err:?}");
        assert!(err.message.contains("no cached copy"), "{}", err.message);
    }
}
