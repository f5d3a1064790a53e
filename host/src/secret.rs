//! Secrets by reference, and keeping them out of everything Sluice prints.
//!
//! Any string in `sluice.toml` may be, or contain, `${env:NAME}` (an environment variable) or
//! `${file:PATH}` (a file's contents, one trailing newline removed; a relative path is relative
//! to the config file's directory); `$${` is a literal `${`. [`resolve`] replaces them in the
//! parsed TOML tree before the configuration is deserialised and validated, so every key gets
//! them and `config check` checks the real values.
//!
//! What counts as a secret ([`Resolved::secrets`]): every `${file:}` value, every value of a
//! secret-like key (see [`is_secret_key`]) whether written out or referenced, and the password
//! of any URL. Those are [`register`]ed, and [`scrub`] replaces them with `[redacted]` in log
//! lines ([`ScrubbingWriter`]), panic messages ([`install_panic_hook`]) and command output.
//! Errors about a reference name the key and the variable or path, never a value.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use crate::problem::Problem;

/// What a secret is replaced with wherever Sluice prints text.
pub const REDACTED: &str = "[redacted]";
/// Secrets shorter than this are not scrubbed from free text: replacing every occurrence of
/// two or three characters would garble logs without protecting anything (such a secret can
/// be guessed). They are still never printed as a value of their key.
pub const MIN_SCRUBBED_LEN: usize = 4;

/// Words that make a key's value a secret even when written out in the file (checked against
/// the key's last part, lower-cased): `sasl.password`, `ssl.key.password`, `api_key`,
/// `bearer_token`, `sasl.oauthbearer.client.secret`, `ssl.key.pem`, …
const SECRET_KEY_WORDS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "credential",
    "api_key",
    "apikey",
    "api-key",
    "private_key",
    "private-key",
    "ssl.key.pem",
    "sasl.jaas.config",
    "sasl.oauthbearer.config",
];

/// What [`resolve`] found: the unresolvable references, and the values that are secrets.
#[derive(Debug, Default)]
pub struct Resolved {
    /// Each reference that could not be resolved, at its key (`kafka."sasl.password"`,
    /// `tenants.acme.config.key`): the message names the variable or the path, never a value.
    pub errors: Vec<Problem>,
    /// Values to keep out of printed text (see [`register`]).
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

/// Whether a key's value is a secret even when written out in the file.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEY_WORDS.iter().any(|word| key.contains(word))
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

/// Where the password of a `scheme://user:password@host…` URL is, as a byte range: from the
/// userinfo's first `:` to the URL's last `@`. A password written without percent-encoding may
/// hold `@`, `/`, `?` or `#`, which makes the URL ambiguous; this reading hides the most.
pub fn url_password_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let at = url[start..].rfind('@')? + start;
    let colon = url[start..at].find(':')? + start;
    Some(colon + 1..at)
}

/// The passwords a URL may hold, as written in it: the userinfo's password read both the
/// widest way ([`url_password_range`]) and the strict way (up to the last `@` before the
/// path, query or fragment), and the values of secret-like query parameters
/// (`?password=…`, `sslpassword=…`).
pub fn url_passwords(url: &str) -> Vec<&str> {
    let mut found = Vec::new();
    if let Some(range) = url_password_range(url) {
        found.push(&url[range]);
    }
    if let Some(start) = url.find("://").map(|i| i + 3) {
        let end = url[start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |i| start + i);
        if let Some(at) = url[start..end].rfind('@').map(|i| start + i)
            && let Some(colon) = url[start..at].find(':').map(|i| start + i)
        {
            found.push(&url[colon + 1..at]);
        }
    }
    found.extend(url_query_secrets(url).into_iter().map(|r| &url[r]));
    found.retain(|p| !p.is_empty());
    found.dedup();
    found
}

/// Where the values of secret-like query parameters of a URL are.
fn url_query_secrets(url: &str) -> Vec<std::ops::Range<usize>> {
    let Some(query_start) = url.find('?').map(|i| i + 1) else {
        return Vec::new();
    };
    let query_end = url[query_start..]
        .find('#')
        .map_or(url.len(), |i| query_start + i);
    let mut ranges = Vec::new();
    let mut at = query_start;
    for pair in url[query_start..query_end].split('&') {
        if let Some((key, value)) = pair.split_once('=')
            && is_secret_key(key)
        {
            let value_start = at + key.len() + 1;
            ranges.push(value_start..value_start + value.len());
        }
        at += pair.len() + 1;
    }
    ranges
}

/// A URL with its password and secret-like query parameters shown as `***`, for messages.
pub fn redact_url(url: &str) -> String {
    let mut ranges = url_query_secrets(url);
    ranges.extend(url_password_range(url));
    ranges.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(url.len());
    let mut done = 0;
    for range in ranges {
        if range.start < done {
            // Inside the password already hidden (a query written into it, unencoded).
            continue;
        }
        out.push_str(&url[done..range.start]);
        out.push_str("***");
        done = range.end;
    }
    out.push_str(&url[done..]);
    out
}

/// The password of a URL, as written in it (the widest reading, see [`url_password_range`]).
pub fn url_password(url: &str) -> Option<&str> {
    url_password_range(url)
        .map(|r| &url[r])
        .filter(|p| !p.is_empty())
}

/// The secrets every output is scrubbed of, in every form they can appear in.
static REGISTRY: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Adds `secrets` to what [`scrub`] removes (also their JSON-, debug- and percent-decoded
/// forms). Secrets stay registered for the life of the process: a rotated-out password is
/// still a password.
pub fn register<I, S>(secrets: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    for secret in secrets {
        let secret = secret.as_ref();
        for form in forms(secret) {
            if form.chars().count() >= MIN_SCRUBBED_LEN && !registry.contains(&form) {
                registry.push(form);
            }
        }
    }
    // Longest first, so a secret that contains another is replaced whole.
    registry.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// The ways a secret can be written: as is, escaped in a JSON string or a Rust debug string,
/// and percent-decoded (a URL password written encoded).
fn forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_owned()];
    if let Ok(json) = serde_json::to_string(secret) {
        forms.push(json[1..json.len() - 1].to_owned());
    }
    let debug = format!("{secret:?}");
    forms.push(debug[1..debug.len() - 1].to_owned());
    if let Ok(decoded) = percent_encoding::percent_decode_str(secret).decode_utf8() {
        forms.push(decoded.into_owned());
    }
    forms.sort();
    forms.dedup();
    forms
}

/// `text` with every registered secret replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
    let mut text = Cow::Borrowed(text);
    for secret in registry.iter() {
        if text.contains(secret.as_str()) {
            text = Cow::Owned(text.replace(secret.as_str(), REDACTED));
        }
    }
    text
}

/// A writer that scrubs what passes through it of registered secrets: log lines, whoever
/// wrote them (Sluice, librdkafka's log and error callbacks, a plugin's `log`). The log
/// formatter writes one whole event per `write`, so a secret is never split across calls.
pub struct ScrubbingWriter<W>(pub W);

impl<W: io::Write> io::Write for ScrubbingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(scrub(text).as_bytes())?,
            Err(_) => self
                .0
                .write_all(scrub(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Prints panics as the default hook does, scrubbed of registered secrets (a panic message
/// may quote any value).
pub fn install_panic_hook() {
    panic_hook_to(|text| eprintln!("{text}"));
}

/// Installs a panic hook that hands the scrubbed report to `write`.
fn panic_hook_to(write: impl Fn(&str) + Send + Sync + 'static) {
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let backtrace = std::backtrace::Backtrace::capture();
        let text = match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => {
                format!("thread '{name}' {info}\nstack backtrace:\n{backtrace}")
            }
            _ => format!(
                "thread '{name}' {info}\nnote: run with `RUST_BACKTRACE=1` environment \
                 variable to display a backtrace"
            ),
        };
        write(&scrub(&text));
    }));
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;

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
        assert!(is_secret_key("sasl.password"));
        assert!(is_secret_key("ssl.key.password"));
        assert!(is_secret_key("sasl.oauthbearer.client.secret"));
        assert!(is_secret_key("API_KEY"));
        assert!(!is_secret_key("ssl.key.location"));
        assert!(!is_secret_key("bootstrap.servers"));
    }

    #[test]
    fn url_passwords_are_found_however_they_are_written() {
        assert_eq!(
            url_passwords("postgres://app:s3cret@db:5432/app"),
            ["s3cret"]
        );
        // Not percent-encoded: '#', '?', '@', '/' in the password.
        for password in ["CANARY#frag", "CANARY?q=1", "CANARY@pw/x:y"] {
            let url = format!("postgres://root:{password}@127.0.0.1:5432/test");
            assert!(url_passwords(&url).contains(&password), "{url}");
            assert_eq!(redact_url(&url), "postgres://root:***@127.0.0.1:5432/test");
        }
        // An '@' in the query: both readings are kept, so the real password is among them.
        assert!(url_passwords("mysql://root:p@ss@h/db?x=a@b").contains(&"p@ss"));
        let url = "postgres://app@db/app?sslmode=require&password=Query-Pw-1&sslpassword=Key-Pw-2";
        assert_eq!(url_passwords(url), ["Query-Pw-1", "Key-Pw-2"]);
        assert_eq!(
            redact_url(url),
            "postgres://app@db/app?sslmode=require&password=***&sslpassword=***"
        );
        assert!(url_passwords("postgres://app@db/app").is_empty());
        assert!(url_passwords("sqlite:///var/app.db").is_empty());
        assert_eq!(url_password("sqlite:///var/app.db"), None);
    }

    #[test]
    fn panic_messages_are_scrubbed() {
        static REPORTED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
        register(["Panic-Secret-9"]);
        panic_hook_to(|text| REPORTED.lock().unwrap().push_str(text));
        let caught = std::panic::catch_unwind(|| panic!("bad value Panic-Secret-9 in key"));
        let _ = std::panic::take_hook();
        assert!(caught.is_err());
        let reported = REPORTED.lock().unwrap().clone();
        assert!(
            reported.contains("bad value [redacted] in key")
                && !reported.contains("Panic-Secret-9"),
            "{reported}"
        );
    }

    #[test]
    fn scrubbing_removes_every_form_of_a_registered_secret() {
        register(["Sc\"rub-Me-7", "ab", "p%40ss-Word-8"]);
        let scrubbed = scrub(r#"a Sc"rub-Me-7 b Sc\"rub-Me-7 c p%40ss-Word-8 d p@ss-Word-8 ab"#);
        assert_eq!(
            scrubbed, "a [redacted] b [redacted] c [redacted] d [redacted] ab",
            "short secrets are not scrubbed from free text"
        );
        let mut out = Vec::new();
        ScrubbingWriter(&mut out)
            .write_all(b"{\"fields\":{\"message\":\"Sc\\\"rub-Me-7\"}}\n")
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"fields\":{\"message\":\"[redacted]\"}}\n"
        );
    }
}
