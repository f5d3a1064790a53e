//! The `sluice.toml` a test or benchmark runs its relay with: typed for what the harness
//! varies, with raw TOML lines where a test adds something unusual. Tests edit the rendered
//! text (`replace("[kafka]\n", …)`), so its layout is part of the contract: see
//! `relay_config_keeps_its_layout` below.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::env::{database_url, reference_plugin};

/// Which plugin routes a table's rows.
#[derive(Debug, Clone)]
pub enum Plugin {
    /// A `.wasm` component (absolute path).
    Wasm(PathBuf),
    /// A router compiled into the host (`builtin = "…"`).
    Builtin(&'static str),
}

/// A `[tenants.<name>]` entry.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The tenant, as `[tenants.<name>]` names it.
    pub name: String,
    /// Absolute path of the `.wasm` component.
    pub path: PathBuf,
    /// `config = { … }` pairs.
    pub config: Vec<(String, String)>,
}

/// A relay configuration; unset keys keep Sluice's defaults.
#[derive(Debug, Clone, Default)]
pub struct RelayConfig {
    /// `[database] url`.
    pub database_url: String,
    /// `[database] table`.
    pub table: String,
    /// Raw lines at the end of `[database]`.
    pub database_extra: Option<String>,
    /// `[kafka] "bootstrap.servers"`; empty with no `kafka_extra`: no `[kafka]` section (a
    /// relay whose tenants publish to other brokers then has no Kafka producer).
    pub kafka: String,
    /// Raw lines at the end of `[kafka]`.
    pub kafka_extra: Option<String>,
    /// `[relay]` keys with their values as TOML, e.g. `("notify_channel", "\"x\"")`.
    pub relay: Vec<(String, String)>,
    /// Raw lines at the end of `[relay]`.
    pub relay_extra: Option<String>,
    /// `[plugins] cache_dir`.
    pub cache_dir: Option<PathBuf>,
    /// Raw lines in `[plugins]` (e.g. `trusted_keys = […]`).
    pub plugins_extra: Option<String>,
    /// `[plugins.default]`, with `config = { topic_prefix = … }`.
    pub default_plugin: Option<(Plugin, String)>,
    /// Raw lines at the end of `[plugins.default]` (e.g. `value_format = "avro"`).
    pub default_plugin_extra: Option<String>,
    /// One `[tenants.<name>]` entry each.
    pub tenants: Vec<Tenant>,
    /// `[telemetry] listen` (metrics on).
    pub telemetry: Option<String>,
    /// Raw sections at the end.
    pub extra: Option<String>,
}

impl RelayConfig {
    /// The TOML text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; the results are ignored.
        let _ = writeln!(
            out,
            "\n[database]\nurl = {}\ntable = {}",
            toml_string(&self.database_url),
            toml_string(&self.table)
        );
        push_raw(&mut out, self.database_extra.as_deref());
        let _ = writeln!(out, "\n[relay]");
        for (key, value) in &self.relay {
            let _ = writeln!(out, "{key} = {value}");
        }
        push_raw(&mut out, self.relay_extra.as_deref());
        if !self.kafka.is_empty() || self.kafka_extra.is_some() {
            let _ = writeln!(
                out,
                "\n[kafka]\n\"bootstrap.servers\" = {}",
                toml_string(&self.kafka)
            );
            push_raw(&mut out, self.kafka_extra.as_deref());
        }
        out.push('\n');
        if let Some(listen) = &self.telemetry {
            let _ = writeln!(out, "[telemetry]\nlisten = {}\n", toml_string(listen));
        }
        if self.cache_dir.is_some() || self.plugins_extra.is_some() {
            out.push_str("[plugins]\n");
            if let Some(dir) = &self.cache_dir {
                let _ = writeln!(out, "cache_dir = {}", toml_string(&dir.to_string_lossy()));
            }
            push_raw(&mut out, self.plugins_extra.as_deref());
            out.push('\n');
        }
        if let Some((plugin, prefix)) = &self.default_plugin {
            let source = match plugin {
                Plugin::Wasm(path) => format!("path = {}", toml_string(&path.to_string_lossy())),
                Plugin::Builtin(name) => format!("builtin = {}", toml_string(name)),
            };
            let _ = writeln!(
                out,
                "[plugins.default]\n{source}\nconfig = {{ topic_prefix = {} }}",
                toml_string(prefix)
            );
            push_raw(&mut out, self.default_plugin_extra.as_deref());
            out.push('\n');
        }
        for tenant in &self.tenants {
            let config: Vec<String> = tenant
                .config
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(v)))
                .collect();
            let _ = writeln!(
                out,
                "[tenants.{}]\npath = {}\nconfig = {{ {} }}\n",
                toml_string(&tenant.name),
                toml_string(&tenant.path.to_string_lossy()),
                config.join(", ")
            );
        }
        push_raw(&mut out, self.extra.as_deref());
        out
    }

    /// The tests' usual relay: `table` in the tests' PostgreSQL database, polled every 100 ms,
    /// the reference plugin as default writing to `<topic_prefix><aggregate type>`.
    pub fn for_tests(table: &str, bootstrap: &str, topic_prefix: &str) -> Self {
        Self {
            database_url: database_url(),
            table: table.to_owned(),
            kafka: bootstrap.to_owned(),
            relay: vec![("poll_interval".to_owned(), toml_string("100ms"))],
            default_plugin: Some((Plugin::Wasm(reference_plugin()), topic_prefix.to_owned())),
            ..Self::default()
        }
    }
}

/// `raw` and a line end, when there is one.
fn push_raw(out: &mut String, raw: Option<&str>) {
    if let Some(raw) = raw {
        out.push_str(raw);
        out.push('\n');
    }
}

/// A relay config for `table` with the reference plugin as default; `relay_extra` goes into
/// `[relay]`, `extra` (more sections) at the end.
pub fn relay_config(
    table: &str,
    bootstrap: &str,
    topic_prefix: &str,
    relay_extra: &str,
    extra: &str,
) -> String {
    RelayConfig {
        relay_extra: Some(relay_extra.to_owned()),
        extra: Some(extra.to_owned()),
        ..RelayConfig::for_tests(table, bootstrap, topic_prefix)
    }
    .render()
}

/// `config` (made by [`relay_config`]) connecting to `url` instead of the tests' database URL.
pub fn with_database_url(config: &str, url: &str) -> String {
    let line = format!("url = \"{}\"", database_url());
    assert!(config.contains(&line), "not a relay_config:\n{config}");
    config.replacen(&line, &format!("url = \"{url}\""), 1)
}

/// `s` as a TOML basic string.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(toml_string("x\u{1}"), r#""x\u0001""#);
    }

    #[test]
    fn a_full_config_renders() {
        let config = RelayConfig {
            database_url: "postgres://h/db".into(),
            table: "t".into(),
            kafka: "k:9092".into(),
            relay: vec![("notify_channel".into(), toml_string("ch"))],
            cache_dir: Some(PathBuf::from("/tmp/c")),
            default_plugin: Some((Plugin::Builtin("route-by-aggregate"), "p.".into())),
            tenants: vec![Tenant {
                name: "spinner".into(),
                path: PathBuf::from("/x.wasm"),
                config: vec![("mode".into(), "loop".into())],
            }],
            telemetry: Some("127.0.0.1:19464".into()),
            ..RelayConfig::default()
        };
        let text = config.render();
        for expected in [
            "[database]\nurl = \"postgres://h/db\"\ntable = \"t\"\n",
            "[relay]\nnotify_channel = \"ch\"\n",
            "[telemetry]\nlisten = \"127.0.0.1:19464\"\n",
            "\"bootstrap.servers\" = \"k:9092\"",
            "[plugins]\ncache_dir = \"/tmp/c\"",
            "[plugins.default]\nbuiltin = \"route-by-aggregate\"\nconfig = { topic_prefix = \"p.\" }",
            "[tenants.\"spinner\"]\npath = \"/x.wasm\"\nconfig = { \"mode\" = \"loop\" }",
        ] {
            assert!(text.contains(expected), "{expected:?} not in\n{text}");
        }
    }

    #[test]
    fn a_relay_without_kafka_has_no_kafka_section() {
        let config = RelayConfig {
            database_url: "postgres://h/db".into(),
            table: "t".into(),
            extra: Some("[nats]\nurl = \"nats://n:4222\"".into()),
            ..RelayConfig::default()
        };
        let text = config.render();
        assert!(!text.contains("[kafka]"), "{text}");
        assert!(text.contains("\n[nats]\nurl = "), "{text}");
    }

    /// The text tests edit with `replace`, as it was written by hand before.
    #[test]
    fn relay_config_keeps_its_layout() {
        let db = database_url();
        let plugin = reference_plugin().display().to_string();
        let expected = format!(
            r#"
[database]
url = "{db}"
table = "t"

[relay]
poll_interval = "100ms"
batch_size = 5

[kafka]
"bootstrap.servers" = "k:1"

[plugins.default]
path = "{plugin}"
config = {{ topic_prefix = "p." }}

[x]
"#
        );
        assert_eq!(
            relay_config("t", "k:1", "p.", "batch_size = 5", "[x]"),
            expected
        );
    }
}
