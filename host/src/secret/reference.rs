//! `${env:NAME}` and `${file:PATH}` references in `sluice.toml`: [`resolve`] replaces them in
//! the parsed TOML tree before the configuration is deserialised and validated, and collects
//! the values that are secrets ([`Resolved::secrets`]) for [`super::register`]. Errors about a
//! reference name the key and the variable or path, never a value.

use std::io;
use std::path::{Path, PathBuf};

use super::key::is_secret_key;
use super::url::url_passwords;
use crate::problem::Problem;

/// What [`resolve`] found: the unresolvable references, and the values that are secrets.
#[derive(Debug, Default)]
pub struct Resolved {
    /// Each reference that could not be resolved, at its key (`kafka."sasl.password"`,
    /// `tenants.acme.config.key`): the message names the variable or the path, never a value.
    pub errors: Vec<Problem>,
    /// Values to keep out of printed text (see [`super::register`]).
    pub secrets: Vec<String>,
}

/// Where references are read from: the environment and the file system, relative to `base`.
/// A trait so tests can resolve against a fixed environment.
pub trait Sources {
    /// Variable `name`: `None` when unset, `Err` saying why when unusable.
    fn env(&self, name: &str) -> Option<Result<String, String>>;
    /// The contents of the file at `path` (already joined to [`Sources::base`]).
    fn file(&self, path: &Path) -> Result<String, io::Error>;
    /// Directory relative `${file:…}` paths start from.
    fn base(&self) -> &Path;
}

/// The process environment and the real file system.
pub struct Environment {
    base: PathBuf,
}

impl Environment {
    /// References of a config file in `base` (its directory).
    pub fn new(base: &Path) -> Self {
        Self {
            base: base.to_owned(),
        }
    }
}

impl Sources for Environment {
    fn env(&self, name: &str) -> Option<Result<String, String>> {
        match std::env::var(name) {
            Ok(v) => Some(Ok(v)),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => Some(Err("is not valid UTF-8".into())),
        }
    }

    fn file(&self, path: &Path) -> Result<String, io::Error> {
        use std::io::Read;
        let mut bytes = Vec::new();
        // `take`: a device (`/dev/zero`) or a file much larger than any secret must not fill
        // the memory.
        std::fs::File::open(path)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(io::Error::other(format!(
                "larger than {} KiB, which no secret is",
                MAX_FILE_BYTES / 1024
            )));
        }
        String::from_utf8(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not valid UTF-8 text"))
    }

    fn base(&self) -> &Path {
        &self.base
    }
}

/// The most a `${file:…}` reference reads: certificates and keys are a few KiB.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Resolves every reference in every string of `tree` in place. A string with an unresolvable
/// reference is left with that reference removed (so the rest of the file still deserialises)
/// and reported in [`Resolved::errors`].
pub fn resolve(tree: &mut toml::Value, sources: &dyn Sources) -> Resolved {
    let mut resolved = Resolved::default();
    walk(tree, &mut Vec::new(), sources, &mut resolved);
    resolved
}

fn walk(
    value: &mut toml::Value,
    path: &mut Vec<Segment>,
    sources: &dyn Sources,
    out: &mut Resolved,
) {
    match value {
        toml::Value::String(s) => {
            let secret_key = path
                .iter()
                .rev()
                .find_map(|segment| match segment {
                    Segment::Key(k) => Some(is_secret_key(k)),
                    Segment::Index(_) => None,
                })
                .unwrap_or(false);
            match expand(s, sources) {
                Ok(expanded) => {
                    if secret_key {
                        out.secrets.push(expanded.text.clone());
                    }
                    out.secrets.extend(expanded.from_files);
                    out.secrets
                        .extend(url_passwords(&expanded.text).into_iter().map(str::to_owned));
                    *s = expanded.text;
                }
                Err(Failed { why, partial }) => {
                    out.errors.push(why.at(key_name(path)));
                    *s = partial;
                }
            }
        }
        toml::Value::Table(table) => {
            for (k, v) in table.iter_mut() {
                path.push(Segment::Key(k.clone()));
                walk(v, path, sources, out);
                path.pop();
            }
        }
        toml::Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                path.push(Segment::Index(i));
                walk(v, path, sources, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// One step of a key path: a table key or an array index.
enum Segment {
    Key(String),
    Index(usize),
}

/// A key path as config errors write it: bare keys joined by dots, other keys quoted
/// (`kafka."sasl.password"`), array items as `[i]`.
fn key_name(path: &[Segment]) -> String {
    let mut name = String::new();
    for segment in path {
        match segment {
            Segment::Key(k) => {
                if !name.is_empty() {
                    name.push('.');
                }
                let bare = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare {
                    name.push_str(k);
                } else {
                    name.push_str(&format!("{k:?}"));
                }
            }
            Segment::Index(i) => name.push_str(&format!("[{i}]")),
        }
    }
    name
}

/// A string with its references resolved, and the parts that came from files.
struct Expanded {
    text: String,
    from_files: Vec<String>,
}

/// The first unresolvable reference of a string, and the string without it.
struct Failed {
    why: Why,
    partial: String,
}

/// Why a reference did not resolve, and the file error underneath if there is one.
struct Why {
    message: String,
    cause: Option<io::Error>,
}

impl From<String> for Why {
    fn from(message: String) -> Self {
        Self {
            message,
            cause: None,
        }
    }
}

impl Why {
    /// The problem of the reference at `key`.
    fn at(self, key: String) -> Problem {
        match self.cause {
            Some(cause) => Problem::caused(key, self.message, cause),
            None => Problem::new(key, self.message),
        }
    }
}

/// Replaces `$${` by `${` and each `${kind:arg}` by its value.
fn expand(s: &str, sources: &dyn Sources) -> Result<Expanded, Failed> {
    let mut text = String::with_capacity(s.len());
    let mut from_files = Vec::new();
    let mut first_error: Option<Why> = None;
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        text.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$${") {
            text.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let Some(end) = after.find('}') else {
                first_error.get_or_insert_with(|| {
                    "a `${` without its closing `}` (write `$${` for a literal `${`)"
                        .to_owned()
                        .into()
                });
                rest = "";
                break;
            };
            match lookup(&after[..end], sources) {
                Ok((value, file)) => {
                    if file {
                        from_files.push(value.clone());
                    }
                    text.push_str(&value);
                }
                Err(why) => {
                    first_error.get_or_insert(why);
                }
            }
            rest = &after[end + 1..];
        } else {
            text.push('$');
            rest = &tail[1..];
        }
    }
    text.push_str(rest);
    match first_error {
        None => Ok(Expanded { text, from_files }),
        Some(why) => Err(Failed { why, partial: text }),
    }
}

/// The value of one reference (`env:NAME` or `file:PATH`), and whether it came from a file.
fn lookup(reference: &str, sources: &dyn Sources) -> Result<(String, bool), Why> {
    let Some((kind, arg)) = reference.split_once(':') else {
        return Err(Why::from(format!(
            "`${{{reference}}}` is not a reference: write `${{env:{reference}}}` for an \
             environment variable, `${{file:PATH}}` for a file, or `$${{` for a literal `${{`"
        )));
    };
    match kind.trim() {
        "env" => {
            let name = arg.trim();
            if name.is_empty() {
                return Err("`${env:}` names no environment variable".to_owned().into());
            }
            match sources.env(name) {
                Some(Ok(value)) => Ok((value, false)),
                Some(Err(why)) => Err(format!("environment variable {name} {why}").into()),
                None => Err(format!("environment variable {name} is not set").into()),
            }
        }
        "file" => {
            let arg = arg.trim();
            if arg.is_empty() {
                return Err("`${file:}` names no file".to_owned().into());
            }
            let path = sources.base().join(arg);
            match sources.file(&path) {
                Ok(mut contents) => {
                    if contents.ends_with('\n') {
                        contents.pop();
                        if contents.ends_with('\r') {
                            contents.pop();
                        }
                    }
                    Ok((contents, true))
                }
                Err(e) => Err(Why {
                    message: format!("cannot read file {}", path.display()),
                    cause: Some(e),
                }),
            }
        }
        other => Err(format!(
            "unknown reference kind `{other}` in `${{{other}:…}}`: Sluice resolves \
             `${{env:NAME}}` and `${{file:PATH}}` (write `$${{` for a literal `${{`)"
        )
        .into()),
    }
}
#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Fixed {
        env: HashMap<&'static str, &'static str>,
        files: HashMap<PathBuf, &'static str>,
        base: PathBuf,
    }

    impl Sources for Fixed {
        fn env(&self, name: &str) -> Option<Result<String, String>> {
            self.env.get(name).map(|v| Ok((*v).to_owned()))
        }
        fn file(&self, path: &Path) -> Result<String, io::Error> {
            self.files
                .get(path)
                .map(|v| (*v).to_owned())
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn base(&self) -> &Path {
            &self.base
        }
    }

    fn sources() -> Fixed {
        Fixed {
            env: HashMap::from([("PGPASS", "pg-Pass-1"), ("BROKERS", "k1:9092")]),
            files: HashMap::from([
                (PathBuf::from("/run/secrets/kafka"), "kafka-Pass-2\n"),
                (PathBuf::from("/etc/sluice/api-key"), "tenant-Key-3"),
            ]),
            base: PathBuf::from("/etc/sluice"),
        }
    }

    fn resolve_text(text: &str) -> (toml::Value, Resolved) {
        let mut tree: toml::Value = toml::from_str(text).unwrap();
        let resolved = resolve(&mut tree, &sources());
        (tree, resolved)
    }

    #[test]
    fn references_are_replaced_anywhere_in_any_string() {
        let (tree, resolved) = resolve_text(
            r#"
            [database]
            url = "postgres://app:${env:PGPASS}@db/app"
            [kafka]
            "bootstrap.servers" = "${env:BROKERS}"
            "sasl.password" = "${file:/run/secrets/kafka}"
            [tenants.acme.config]
            api_key = "${file:api-key}"
            note = "costs $${env:X} and $5"
            "#,
        );
        assert!(resolved.errors.is_empty(), "{:?}", resolved.errors);
        assert_eq!(
            tree["database"]["url"].as_str(),
            Some("postgres://app:pg-Pass-1@db/app")
        );
        assert_eq!(tree["kafka"]["bootstrap.servers"].as_str(), Some("k1:9092"));
        assert_eq!(
            tree["kafka"]["sasl.password"].as_str(),
            Some("kafka-Pass-2"),
            "one trailing newline removed"
        );
        assert_eq!(
            tree["tenants"]["acme"]["config"]["api_key"].as_str(),
            Some("tenant-Key-3"),
            "relative to the config file's directory"
        );
        assert_eq!(
            tree["tenants"]["acme"]["config"]["note"].as_str(),
            Some("costs ${env:X} and $5")
        );
        for secret in ["pg-Pass-1", "kafka-Pass-2", "tenant-Key-3"] {
            assert!(resolved.secrets.iter().any(|s| s == secret), "{secret}");
        }
        assert!(
            !resolved.secrets.iter().any(|s| s == "k1:9092"),
            "an environment value at a key that is not secret-like is not a secret"
        );
    }

    #[test]
    fn unresolvable_references_name_key_and_variable_or_path_never_a_value() {
        let (tree, resolved) = resolve_text(
            r#"
            [kafka]
            "sasl.password" = "${env:MISSING}"
            "ssl.key.password" = "${file:/nope/key-pw}"
            "sasl.username" = "${vault:kv/app}"
            "client.id" = "a-${env:PGPASS}-${oops"
            [database]
            url = "${PGPASS}"
            "#,
        );
        let by_key: HashMap<&str, String> = resolved
            .errors
            .iter()
            .map(|e| (e.key.as_str(), e.reason()))
            .collect();
        assert!(
            by_key[r#"kafka."sasl.password""#].contains("environment variable MISSING is not set")
        );
        assert!(by_key[r#"kafka."ssl.key.password""#].contains("/nope/key-pw"));
        // The file system's error is kept as the problem's source.
        let unreadable = resolved
            .errors
            .iter()
            .find(|e| e.key == r#"kafka."ssl.key.password""#)
            .and_then(std::error::Error::source);
        assert!(
            unreadable.is_some_and(|e| e.is::<io::Error>()),
            "{unreadable:?}"
        );
        assert!(by_key[r#"kafka."sasl.username""#].contains("unknown reference kind `vault`"));
        assert!(by_key[r#"kafka."client.id""#].contains("without its closing"));
        assert!(
            by_key["database.url"].contains("${env:PGPASS}"),
            "{}",
            by_key["database.url"]
        );
        assert_eq!(resolved.errors.len(), 5);
        for e in &resolved.errors {
            assert!(!e.to_string().contains("pg-Pass-1"), "{e:?}");
        }
        assert_eq!(
            tree["kafka"]["client.id"].as_str(),
            Some("a-pg-Pass-1-"),
            "the rest of the string is kept so the file still deserialises"
        );
    }

    #[test]
    fn a_file_reference_reads_a_bounded_amount_of_text() {
        let dir = tempfile::tempdir().unwrap();
        let sources = Environment::new(dir.path());
        let mut tree: toml::Value = toml::from_str(
            "a = \"${file:/dev/zero}\"\nb = \"${file:binary}\"\nc = \"${file:crlf}\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("binary"), [0xff, 0xfe, 0x00]).unwrap();
        std::fs::write(dir.path().join("crlf"), "Crlf-Secret-1\r\n").unwrap();
        let resolved = resolve(&mut tree, &sources);
        let messages: Vec<String> = resolved.errors.iter().map(|e| e.reason()).collect();
        assert!(
            messages[0].contains("/dev/zero: larger than 1024 KiB"),
            "{messages:?}"
        );
        assert!(messages[1].contains("not valid UTF-8"), "{messages:?}");
        assert_eq!(messages.len(), 2);
        assert_eq!(tree["c"].as_str(), Some("Crlf-Secret-1"));
    }

    #[test]
    fn secret_keys_url_passwords_and_file_values_are_secrets() {
        let (_, resolved) = resolve_text(
            r#"
            [kafka]
            "sasl.password" = "written-Out-4"
            "ssl.ca.location" = "${file:/run/secrets/kafka}"
            [telemetry]
            bearer_token = "tok-Literal-5"
            [plugins.default.config]
            webhook = "https://u:hook-Pw-6@example.test/x"
            "#,
        );
        for secret in [
            "written-Out-4",
            "kafka-Pass-2",
            "tok-Literal-5",
            "hook-Pw-6",
        ] {
            assert!(resolved.secrets.iter().any(|s| s == secret), "{secret}");
        }
    }
}
