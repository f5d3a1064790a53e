//! The TLS files of a broker section: `ca_location`, `certificate_location` and
//! `key_location`. NATS, RabbitMQ and Redis take the same three keys with the same rules, so
//! they are checked (and read) here once; each section only says how its URL turns TLS on.
//! (The keys stay written out in each section's settings: serde's `flatten` does not work
//! with `deny_unknown_fields`.)

use std::path::{Path, PathBuf};

use crate::problem::Problem;

/// One section's three TLS file keys, as configured.
#[derive(Debug, Clone, Copy)]
pub(super) struct TlsFiles<'a> {
    /// The section the keys are in (`nats`, `rabbitmq`, `redis`): problems name
    /// `<section>.<key>`.
    section: &'static str,
    ca: Option<&'a Path>,
    certificate: Option<&'a Path>,
    key: Option<&'a Path>,
}

/// The files' contents, read once they passed [`TlsFiles::problems`].
#[derive(Debug, Default)]
pub(super) struct TlsPem {
    /// The CA certificates that sign the server's certificate.
    pub(super) ca: Option<Vec<u8>>,
    /// The client certificate and its private key, for servers that check clients.
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// What a file under a key must hold.
#[derive(Debug, Clone, Copy)]
enum Holds {
    Certificates,
    PrivateKey,
}

impl<'a> TlsFiles<'a> {
    /// The keys of `section`.
    pub(super) fn new(
        section: &'static str,
        ca: &'a Option<PathBuf>,
        certificate: &'a Option<PathBuf>,
        key: &'a Option<PathBuf>,
    ) -> Self {
        Self {
            section,
            ca: ca.as_deref(),
            certificate: certificate.as_deref(),
            key: key.as_deref(),
        }
    }

    /// Whether any of the three is set.
    pub(super) fn any(&self) -> bool {
        self.given().next().is_some()
    }

    /// The keys that are set, with their files and what they must hold.
    fn given(&self) -> impl Iterator<Item = (&'static str, &'a Path, Holds)> {
        [
            ("ca_location", self.ca, Holds::Certificates),
            (
                "certificate_location",
                self.certificate,
                Holds::Certificates,
            ),
            ("key_location", self.key, Holds::PrivateKey),
        ]
        .into_iter()
        .filter_map(|(key, path, holds)| path.map(|p| (key, p, holds)))
    }

    /// Files that cannot be read or do not hold PEM of their kind, a certificate without its
    /// key (or a key without its certificate), each at its key; with `plain_url`, each file
    /// given while the section's URL connects without TLS, saying how to turn TLS on.
    pub(super) fn problems(&self, plain_url: Option<&str>) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (key, path, holds) in self.given() {
            if let Err(problem) = self.read_one(key, path, holds) {
                problems.push(problem);
            }
            if let Some(hint) = plain_url {
                problems.push(Problem::new(self.key(key), hint));
            }
        }
        match (self.certificate, self.key) {
            (Some(_), None) => problems.push(Problem::new(
                self.key("key_location"),
                "certificate_location needs the private key that goes with it",
            )),
            (None, Some(_)) => problems.push(Problem::new(
                self.key("certificate_location"),
                "key_location needs the certificate that goes with it",
            )),
            _ => {}
        }
        problems
    }

    /// The files' contents; `Err` names the first key that is wrong and why.
    pub(super) fn read(&self) -> Result<TlsPem, String> {
        if let Some(problem) = self.problems(None).into_iter().next() {
            return Err(problem.to_string());
        }
        let mut pem = TlsPem::default();
        let mut certificate = None;
        let mut key = None;
        for (name, path, holds) in self.given() {
            let text = self
                .read_one(name, path, holds)
                .map_err(|p| p.to_string())?;
            match name {
                "ca_location" => pem.ca = Some(text),
                "certificate_location" => certificate = Some(text),
                _ => key = Some(text),
            }
        }
        pem.client = certificate.zip(key);
        Ok(pem)
    }

    /// `<section>.<key>`.
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.section)
    }

    /// The file under `key`, if it can be read and holds a PEM block of its kind.
    fn read_one(&self, key: &str, path: &Path, holds: Holds) -> Result<Vec<u8>, Problem> {
        let at = self.key(key);
        let bytes = std::fs::read(path)
            .map_err(|e| Problem::caused(&at, format!("cannot read {}", path.display()), e))?;
        let text = String::from_utf8_lossy(&bytes);
        let found = match holds {
            Holds::Certificates => {
                text.contains("-----BEGIN CERTIFICATE-----")
                    || text.contains("-----BEGIN TRUSTED CERTIFICATE-----")
            }
            Holds::PrivateKey => text
                .lines()
                .any(|line| line.starts_with("-----BEGIN ") && line.ends_with("PRIVATE KEY-----")),
        };
        if !found {
            let wanted = match holds {
                Holds::Certificates => "PEM certificate (-----BEGIN CERTIFICATE-----)",
                Holds::PrivateKey => "PEM private key (-----BEGIN PRIVATE KEY-----)",
            };
            return Err(Problem::new(
                at,
                format!("{} holds no {wanted}", path.display()),
            ));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    fn keys(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn readable_pem_files_of_their_kind_pass_and_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = (
            Some(dir.path().join("ca.pem")),
            Some(dir.path().join("client.pem")),
            Some(dir.path().join("client.key")),
        );
        std::fs::write(ca.as_ref().unwrap(), CERT).unwrap();
        std::fs::write(cert.as_ref().unwrap(), CERT).unwrap();
        std::fs::write(key.as_ref().unwrap(), KEY).unwrap();
        let files = TlsFiles::new("redis", &ca, &cert, &key);
        assert!(files.any());
        assert!(
            files.problems(None).is_empty(),
            "{:?}",
            files.problems(None)
        );
        let pem = files.read().unwrap();
        assert_eq!(pem.ca.as_deref(), Some(CERT.as_bytes()));
        let (c, k) = pem.client.unwrap();
        assert_eq!(
            (c.as_slice(), k.as_slice()),
            (CERT.as_bytes(), KEY.as_bytes())
        );
    }

    #[test]
    fn each_wrong_file_is_named_at_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let key_as_cert = Some(dir.path().join("key-as-cert.pem"));
        std::fs::write(key_as_cert.as_ref().unwrap(), KEY).unwrap();
        let missing = Some(dir.path().join("missing.pem"));
        let files = TlsFiles::new("nats", &missing, &key_as_cert, &None);
        let problems = files.problems(None);
        assert_eq!(
            keys(&problems),
            [
                "nats.ca_location",
                "nats.certificate_location",
                "nats.key_location"
            ]
        );
        assert!(
            problems[0].to_string().contains("cannot read"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].to_string().contains("holds no PEM certificate"),
            "{}",
            problems[1]
        );
        assert!(files.read().unwrap_err().starts_with("nats.ca_location"));
    }

    #[test]
    fn a_key_without_its_certificate_and_files_on_a_plain_url_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let key = Some(dir.path().join("client.key"));
        std::fs::write(key.as_ref().unwrap(), KEY).unwrap();
        let files = TlsFiles::new("rabbitmq", &None, &None, &key);
        let problems = files.problems(Some("is only used with TLS: make the url amqps://"));
        assert_eq!(
            keys(&problems),
            ["rabbitmq.key_location", "rabbitmq.certificate_location"]
        );
        assert!(
            problems[0].to_string().contains("amqps://"),
            "{}",
            problems[0]
        );
        assert!(!TlsFiles::new("rabbitmq", &None, &None, &None).any());
    }
}
