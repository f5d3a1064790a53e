//! Content digests: what `sha256 = "…"` pins, and how a plugin's bytes are named in metrics,
//! `/status` and `sluice plugin check`.

use sha2::{Digest, Sha256};

/// `sha256:` and the lowercase hex SHA-256 of `bytes`: the form every digest takes in Sluice
/// (and in OCI registries).
pub fn sha256_digest(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for byte in Sha256::digest(bytes) {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// A `sha256` pin from `[plugins.default]` / `[tenants.<name>]`, normalised to
/// `sha256:<64 lowercase hex digits>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sha256Pin(String);

impl Sha256Pin {
    /// Accepts the 64 hex digits with or without the `sha256:` prefix (as `sluice plugin
    /// check`, `sha256sum` and registries print them), in either case.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let hex = trimmed.strip_prefix("sha256:").unwrap_or(trimmed);
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "must be 64 hexadecimal digits (optionally after `sha256:`), as \
                 `sluice plugin check` or `sha256sum` print them; got {:?}",
                crate::text::bounded(trimmed, 80)
            ));
        }
        Ok(Self(format!("sha256:{}", hex.to_ascii_lowercase())))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `digest` (as [`sha256_digest`] writes it) is the pinned one.
    pub fn matches(&self, digest: &str) -> bool {
        self.0 == digest
    }
}

impl std::fmt::Display for Sha256Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_the_sha256_of_the_bytes() {
        // `printf abc | sha256sum`
        assert_eq!(
            sha256_digest(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn pins_are_normalised_and_compared_exactly() {
        let hex = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        let bare = Sha256Pin::parse(hex).unwrap();
        let prefixed = Sha256Pin::parse(&format!("sha256:{}", hex.to_lowercase())).unwrap();
        assert_eq!(bare, prefixed);
        assert!(bare.matches(&sha256_digest(b"abc")));
        assert!(!bare.matches(&sha256_digest(b"abd")));
    }

    #[test]
    fn malformed_pins_say_what_is_expected() {
        for bad in [
            "",
            "sha256:",
            "abc",
            &"g".repeat(64),
            &"a".repeat(63),
            &"a".repeat(65),
        ] {
            let err = Sha256Pin::parse(bad).unwrap_err();
            assert!(err.contains("64 hexadecimal digits"), "{bad}: {err}");
        }
        assert!(Sha256Pin::parse(&format!("sha512:{}", "a".repeat(64))).is_err());
    }
}
