//! Plugin signatures: minisign (Ed25519) signatures of the exact bytes Sluice loads, checked
//! against `[plugins] trusted_keys`.
//!
//! Why minisign: a signature is a small detached text file next to the component
//! (`plugin.wasm.minisig`, minisign's own default name), made by a tool Debian, Homebrew and
//! most distributions package (`minisign -S -m plugin.wasm`) or by `rsign2`; public keys are one
//! base64 line that fits in `sluice.toml`; and it signs the file's bytes as they are, so
//! what is verified is exactly what is compiled (signatures embedded in the component, as
//! wasmsign2 does it, cover the component minus the signature section instead).

use base64::Engine as _;
use minisign_verify::{PublicKey, Signature};

/// A key's minisign key id as minisign prints it (uppercase hex, without leading zeros).
fn key_id(base64_line: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64_line.trim())
        .ok()?;
    let id: [u8; 8] = bytes.get(2..10)?.try_into().ok()?;
    Some(format!("{:X}", u64::from_le_bytes(id)))
}

/// The base64 line of a minisign key or signature file: the first line that is not a comment.
fn payload_line(text: &str) -> Option<&str> {
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.contains("comment:"))
}

/// Who signed a plugin: a trusted key's id, and the signature's trusted comment (signed too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The key id, as minisign prints it.
    pub key_id: String,
    /// The signature's trusted comment (minisign writes a timestamp and the file name).
    pub trusted_comment: String,
}

impl std::fmt::Display for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "minisign:{}", self.key_id)
    }
}

/// `[plugins] trusted_keys`: with none, signatures are not checked.
#[derive(Default)]
pub struct TrustedKeys {
    keys: Vec<(String, PublicKey)>,
}

impl std::fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("TrustedKeys").field("keys", &ids).finish()
    }
}

impl TrustedKeys {
    /// Parses each entry: a minisign public key's base64 line (`RW…`), or a whole `.pub`
    /// file's text. The error names the entry by its position.
    pub fn parse(entries: &[String]) -> Result<Self, (usize, String)> {
        let mut keys = Vec::with_capacity(entries.len());
        for (at, entry) in entries.iter().enumerate() {
            let parsed = match entry.lines().filter(|l| !l.trim().is_empty()).count() {
                0 => Err("is empty".to_owned()),
                1 => PublicKey::from_base64(entry.trim()).map_err(|e| e.to_string()),
                _ => PublicKey::decode(entry).map_err(|e| e.to_string()),
            }
            .and_then(|key| {
                let id = payload_line(entry)
                    .and_then(key_id)
                    .ok_or_else(|| "has no key id".to_owned())?;
                Ok((id, key))
            })
            .map_err(|e| {
                (
                    at,
                    format!(
                        "not a minisign public key ({e}): give the base64 line of the key's .pub \
                         file (it starts with RW), or the whole file"
                    ),
                )
            })?;
            keys.push(parsed);
        }
        Ok(Self { keys })
    }

    /// Whether signatures are required.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The trusted keys' ids.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(id, _)| id.as_str())
    }

    /// Checks `signature` (a `.minisig` file's text) of `bytes`. With no trusted keys,
    /// `Ok(None)`: nothing is checked. Otherwise the signer, or why the bytes are refused.
    pub fn verify(&self, bytes: &[u8], signature: Option<&str>) -> Result<Option<Signer>, String> {
        if self.keys.is_empty() {
            return Ok(None);
        }
        let Some(text) = signature else {
            return Err(
                "not signed, and [plugins] trusted_keys requires a signature by one of \
                 its keys"
                    .into(),
            );
        };
        self.identify(bytes, text, "is not in [plugins] trusted_keys")
            .map(Some)
    }

    /// Checks `signature` of `bytes` against whichever of these keys made it: the signer, or
    /// why the bytes are refused (`untrusted` says what a key none of these is: e.g. `is not
    /// in [plugins] trusted_keys`).
    pub fn identify(&self, bytes: &[u8], text: &str, untrusted: &str) -> Result<Signer, String> {
        let signature = Signature::decode(text)
            .map_err(|e| format!("its signature is not a minisign signature ({e})"))?;
        let signed_by = payload_line(text)
            .and_then(key_id)
            .unwrap_or_else(|| "?".into());
        let Some((id, key)) = self.keys.iter().find(|(id, _)| *id == signed_by) else {
            return Err(format!(
                "signed by key {signed_by}, which {untrusted} ({})",
                self.ids().collect::<Vec<_>>().join(", ")
            ));
        };
        key.verify(bytes, &signature, false).map_err(|e| {
            format!(
                "the signature by key {id} does not match these bytes ({e}): the file changed \
                 after it was signed, or the signature is of another file"
            )
        })?;
        Ok(Signer {
            key_id: id.clone(),
            trusted_comment: signature.trusted_comment().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A key pair Debian's minisign 0.11 generated once for these tests (`minisign -G -W`), and
    // its signature of `BYTES` (`minisign -S -m`); the e2e tests generate their own keys for
    // every run.
    const PUBLIC: &str = "RWSXbzj3Sn2MjGwbwAN4UYQ5yBfHQ1Ceev5EklGh0X4eYQFklU+3mWZk";
    const BYTES: &[u8] = b"sluice plugin bytes";
    const SIGNATURE: &str = "untrusted comment: signature from minisign secret key
RUSXbzj3Sn2MjMrt7SaV561hemS3hMRAld6vGS5upSF9CqfrdP4bpSl8yJsWUwVAtcNMWv26mTaITlfk4bkEhrm/rkjKv4v6lAU=
trusted comment: signed for the unit tests
VXrIPtBAYylywOMEFaw2g465Ry4jlgBE8t+aW+XjdtdU1aLybQfT8aueL5J634tXMR9ZV0AEAueNAsQgwClgCw==
";
    // The example key of minisign's README: trusted here, but not the one that signed.
    const OTHER: &str = "RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3";

    #[test]
    fn key_ids_are_read_as_minisign_prints_them() {
        assert_eq!(key_id(PUBLIC).as_deref(), Some("8C8C7D4AF7386F97"));
        let keys = TrustedKeys::parse(&[PUBLIC.into()]).unwrap();
        assert_eq!(keys.ids().collect::<Vec<_>>(), ["8C8C7D4AF7386F97"]);
        let file = format!("untrusted comment: minisign public key 8C8C7D4AF7386F97\n{PUBLIC}\n");
        assert!(TrustedKeys::parse(&[file]).is_ok());
    }

    #[test]
    fn a_signature_by_a_trusted_key_names_its_signer() {
        let keys = TrustedKeys::parse(&[OTHER.into(), PUBLIC.into()]).unwrap();
        let signer = keys.verify(BYTES, Some(SIGNATURE)).unwrap().unwrap();
        assert_eq!(signer.to_string(), "minisign:8C8C7D4AF7386F97");
        assert_eq!(signer.trusted_comment, "signed for the unit tests");
    }

    #[test]
    fn other_bytes_and_untrusted_keys_are_refused_with_the_reason() {
        let keys = TrustedKeys::parse(&[PUBLIC.into()]).unwrap();
        let err = keys
            .verify(b"sluice plugin bytes!", Some(SIGNATURE))
            .unwrap_err();
        assert!(err.contains("does not match these bytes"), "{err}");
        let untrusted = TrustedKeys::parse(&[OTHER.into()]).unwrap();
        let err = untrusted.verify(BYTES, Some(SIGNATURE)).unwrap_err();
        assert!(
            err.contains("signed by key 8C8C7D4AF7386F97, which is not in"),
            "{err}"
        );
        // The trusted comment is signed too: editing it breaks the signature.
        let edited = SIGNATURE.replace("for the unit tests", "by the platform team");
        assert!(keys.verify(BYTES, Some(&edited)).is_err());
    }

    #[test]
    fn bad_keys_are_named_by_position() {
        let (at, message) =
            TrustedKeys::parse(&[PUBLIC.into(), "ssh-ed25519 AAAA".into()]).unwrap_err();
        assert_eq!(at, 1);
        assert!(message.contains("not a minisign public key"), "{message}");
        assert!(TrustedKeys::parse(&[String::new()]).is_err());
    }

    #[test]
    fn without_keys_nothing_is_checked_and_with_keys_a_signature_is_required() {
        assert_eq!(TrustedKeys::default().verify(b"x", None), Ok(None));
        let keys = TrustedKeys::parse(&[PUBLIC.into()]).unwrap();
        let err = keys.verify(b"x", None).unwrap_err();
        assert!(err.contains("not signed"), "{err}");
        let err = keys.verify(b"x", Some("garbage")).unwrap_err();
        assert!(err.contains("not a minisign signature"), "{err}");
    }
}
