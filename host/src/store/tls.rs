//! TLS to PostgreSQL and MySQL/MariaDB as the URL asks for it (`sslmode`, `sslrootcert`, …;
//! `ssl-mode`, `ssl-ca`, …; see docs/security.md): the certificate files it names are checked
//! readable before connecting, and a TLS failure's message gets a hint saying what to change.
//! The driver reports a missing file as a bare "No such file or directory", and a certificate
//! that does not verify in OpenSSL's words only.

use super::StoreError;
use crate::secret::redact_url as redact;

/// URL parameters naming a file the driver reads before the TLS handshake (both drivers'
/// spellings).
const FILE_PARAMETERS: &[&str] = &[
    "sslrootcert",
    "ssl-root-cert",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
];

/// Checks that every certificate or key file `url` names can be read; the error names the
/// parameter and the path.
pub(super) fn check_files(url: &str) -> Result<(), StoreError> {
    for (key, path) in query_pairs(url) {
        if !FILE_PARAMETERS.contains(&key.as_str()) {
            continue;
        }
        if let Err(e) = std::fs::File::open(&path) {
            return Err(StoreError::Url {
                url: redact(url),
                message: format!("{key}={path}: cannot read the file: {e}"),
            });
        }
    }
    Ok(())
}

/// What to change when connecting failed in TLS: empty for other errors.
pub(super) fn hint(error: &sqlx::Error) -> &'static str {
    let sqlx::Error::Tls(tls) = error else {
        return "";
    };
    let text = tls.to_string();
    if text.contains("server does not support TLS") {
        " (the URL requires TLS, and the server does not offer it: configure TLS on the \
         server, or lower sslmode / ssl-mode; see docs/security.md)"
    } else if text.contains("mismatch") {
        " (the server's certificate does not name the host in the URL: connect by a name or \
         address the certificate lists, or use sslmode=verify-ca / ssl-mode=VERIFY_CA to \
         check only who signed it; see docs/security.md)"
    } else if text.contains("certificate verify failed") {
        " (the server's certificate did not verify: give the certificate of the CA that \
         signed it as sslrootcert= (PostgreSQL) or ssl-ca= (MySQL/MariaDB); see \
         docs/security.md)"
    } else {
        ""
    }
}

/// The query's `key=value` pairs, percent-decoded (as the drivers read them).
fn query_pairs(url: &str) -> Vec<(String, String)> {
    let Some((_, query)) = url.split_once('?') else {
        return Vec::new();
    };
    let query = query.split('#').next().unwrap_or_default();
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_certificate_file_is_named_with_its_parameter() {
        let url = "postgres://app:pw@db/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem";
        let e = check_files(url).expect_err("missing file").to_string();
        assert!(e.contains("sslrootcert=/nonexistent/ca.pem"), "{e}");
        assert!(e.contains("cannot read the file"), "{e}");
        assert!(!e.contains("pw"), "the password: {e}");
        let e = check_files("mysql://root@db/test?ssl-mode=VERIFY_CA&ssl-ca=%2Fno%2Fca.pem")
            .expect_err("missing file")
            .to_string();
        assert!(e.contains("ssl-ca=/no/ca.pem"), "{e}");
    }

    #[test]
    fn readable_files_and_other_parameters_pass() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").expect("write");
        let url = format!(
            "postgres://db/app?sslmode=verify-full&sslrootcert={}&application_name=x",
            ca.display()
        );
        assert!(check_files(&url).is_ok());
        assert!(check_files("postgres://db/app").is_ok());
        assert!(check_files("sqlite:///tmp/app.db?mode=rwc").is_ok());
    }

    #[test]
    fn tls_failures_get_a_hint_and_others_none() {
        let tls = |m: &str| sqlx::Error::Tls(m.to_owned().into());
        assert!(hint(&tls("server does not support TLS")).contains("does not offer it"));
        assert!(
            hint(&tls("certificate verify failed: (hostname mismatch)"))
                .contains("does not name the host")
        );
        assert!(
            hint(&tls(
                "certificate verify failed: (unable to get local issuer certificate)"
            ))
            .contains("sslrootcert=")
        );
        assert_eq!(hint(&sqlx::Error::PoolTimedOut), "");
    }

    #[test]
    fn percent_escapes_are_decoded() {
        let pairs = query_pairs("postgres://h/db?sslrootcert=%2Fetc%2Fca%20x.pem&k=a+b%zz#x");
        assert_eq!(
            pairs,
            [
                ("sslrootcert".to_owned(), "/etc/ca x.pem".to_owned()),
                ("k".to_owned(), "a b%zz".to_owned())
            ]
        );
    }
}
