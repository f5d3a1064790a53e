//! The docs and the shipped files say what the code does: every TOML snippet of README.md
//! and docs/*.md is read by the config parser, and the places where docs repeat a file of
//! the repository (the probes of the Kubernetes manifests, the Python SDK's `message`, the
//! Debian package's contents, the user its `postinst` makes) are compared with it.
//!
//! A TOML block's info string says what it is:
//! - ` ```toml ` — a `sluice.toml`, whole or some of its sections (a minimal `[database]` is
//!   added when it has none): it must parse (no unknown key, no wrong type) and check, except
//!   for files it names that are not on this machine (`${file:…}`, `${env:…}`, `*.location`);
//! - ` ```toml fragment ` — sections of a `sluice.toml` that lean on others not shown (a
//!   tenant without the `[plugins.default]` it runs): it must parse;
//! - ` ```toml tenant-file ` — a tenant file of `[plugins] tenants_dir` (the keys of
//!   `[tenants.<name>]`): it must parse as one;
//! - ` ```toml cargo ` — not Sluice's (a plugin's `Cargo.toml`): it must be TOML.

use std::path::{Path, PathBuf};

use sluice::config::Config;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ is in the repository")
        .to_path_buf()
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo().join(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// README.md and docs/*.md, by their path in the repository.
fn documents() -> Vec<(String, String)> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    names.sort();
    names.insert(0, "README.md".into());
    names
        .into_iter()
        .map(|n| {
            let text = read(&n);
            (n, text)
        })
        .collect()
}

/// A fenced block: its line in the document, info string after the language, body.
struct Block {
    line: usize,
    info: String,
    body: String,
}

/// The fenced blocks of `text` whose language is `lang`.
fn blocks(text: &str, lang: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        match &mut open {
            None => {
                if let Some(info) = line.strip_prefix("```")
                    && let Some(rest) = info.strip_prefix(lang)
                    && (rest.is_empty() || rest.starts_with(' '))
                {
                    open = Some(Block {
                        line: n + 1,
                        info: rest.trim().to_owned(),
                        body: String::new(),
                    });
                }
            }
            Some(block) => {
                if line.starts_with("```") {
                    found.extend(open.take());
                } else {
                    block.body.push_str(line);
                    block.body.push('\n');
                }
            }
        }
    }
    found
}

/// Problems a snippet may have on a machine that is not the one it was written for: files
/// and variables it names that are not here.
fn about_this_machine(problem: &str) -> bool {
    problem.contains("cannot read")
        || (problem.contains("environment variable") && problem.ends_with("is not set"))
}

#[test]
fn every_toml_snippet_of_the_docs_is_read_by_the_config_parser() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, text) in documents() {
        for block in blocks(&text, "toml") {
            let at = format!("{name}:{}", block.line);
            let tree: toml::Table = match toml::from_str(&block.body) {
                Ok(tree) => tree,
                Err(e) => {
                    failures.push(format!("{at}: not TOML: {e}"));
                    continue;
                }
            };
            let mut whole = match block.info.as_str() {
                "cargo" => continue,
                "tenant-file" => toml::Table::from_iter([(
                    "tenants".to_owned(),
                    toml::Value::Table(toml::Table::from_iter([(
                        "example".to_owned(),
                        toml::Value::Table(tree),
                    )])),
                )]),
                "" | "fragment" => tree,
                other => {
                    failures.push(format!(
                        "{at}: ```toml {other}: say fragment, tenant-file or cargo"
                    ));
                    continue;
                }
            };
            whole.entry("database").or_insert_with(|| {
                toml::Value::Table(toml::Table::from_iter([(
                    "url".to_owned(),
                    toml::Value::String("postgres://127.0.0.1:5432/app".into()),
                )]))
            });
            checked += 1;
            let file = repo().join("docs").join("snippet.toml");
            let config = match Config::parse(&toml::to_string(&whole).unwrap(), &file) {
                Ok(config) => config,
                Err(e) => {
                    failures.push(format!("{at}: {e}"));
                    continue;
                }
            };
            if block.info.is_empty() {
                for problem in config.problems() {
                    let problem = problem.to_string();
                    if !about_this_machine(&problem) {
                        failures.push(format!(
                            "{at}: {problem} (a fragment? say ```toml fragment)"
                        ));
                    }
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} snippets found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_probes_operations_md_shows_are_the_deployments() {
    let ops = read("docs/operations.md");
    let after = &ops[ops
        .find("For Kubernetes, as")
        .expect("the probes' paragraph")..];
    let shown = &blocks(after, "yaml")[0].body;
    let deployment = read("deploy/kubernetes/deployment.yaml");
    let lines: Vec<&str> = deployment.lines().map(str::trim).collect();
    let mut from = 0;
    for line in shown.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match lines[from..].iter().position(|l| *l == line) {
            Some(at) => from += at + 1,
            None => panic!(
                "docs/operations.md's probe snippet has `{line}`, which deploy/kubernetes/\
                 deployment.yaml does not have (in this order)"
            ),
        }
    }
    for probe in ["startupProbe:", "livenessProbe:", "readinessProbe:"] {
        assert!(shown.contains(probe), "operations.md lacks {probe}");
    }
}

/// The parameter names of `def NAME(` in Python `source`, in order (`*` left out).
fn python_parameters(source: &str, name: &str) -> Vec<String> {
    let start = source.find(&format!("def {name}(")).expect("the function") + name.len() + 5;
    // Split at the commas outside brackets, up to the parenthesis that closes the list.
    let (mut depth, mut parts, mut part) = (0, Vec::new(), String::new());
    for c in source[start..].chars() {
        match c {
            '(' | '[' => depth += 1,
            ')' if depth == 0 => break,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut part));
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    parts.push(part);
    parts
        .iter()
        .map(|p| p.split([':', '=']).next().unwrap().trim().to_owned())
        .filter(|p| !p.is_empty() && p != "*")
        .collect()
}

#[test]
fn plugin_languages_md_shows_the_python_sdk_as_it_is() {
    let sdk = read("plugins/sdk-python/sluice_plugin/__init__.py");
    let docs = read("docs/plugin-languages.md");
    let parameters = python_parameters(&sdk, "message");
    let row = docs
        .lines()
        .find(|l| l.starts_with("| `message("))
        .expect("the message row");
    let documented = python_parameters(
        &format!(
            "def {}",
            row.trim_start_matches("| `").split('`').next().unwrap()
        ),
        "message",
    );
    assert!(parameters.len() >= 7, "{parameters:?}");
    assert_eq!(documented, parameters, "docs/plugin-languages.md: {row}");
    for attribute in ["NAME", "VERSION", "CONFIG_SCHEMA", "SCHEMAS"] {
        assert!(
            sdk.contains(&format!("    {attribute}: ")),
            "the SDK's Plugin has no {attribute}"
        );
        assert!(
            docs.contains(&format!("    {attribute} = ")),
            "docs/plugin-languages.md's SDK example lacks {attribute}"
        );
    }
}

/// Whether `pattern` (a path with `*` in its last part, as cargo-deb's assets) matches `path`.
fn matches(pattern: &str, path: &str) -> bool {
    let (dir, name) = pattern.rsplit_once('/').unwrap_or(("", pattern));
    let (path_dir, path_name) = path.rsplit_once('/').unwrap_or(("", path));
    match name.split_once('*') {
        Some((head, tail)) => {
            dir == path_dir
                && path_name.starts_with(head)
                && path_name.ends_with(tail)
                && path_name.len() >= head.len() + tail.len()
        }
        None => pattern == path,
    }
}

#[test]
fn the_debian_package_ships_what_install_md_says() {
    let manifest: toml::Table = toml::from_str(&read("host/Cargo.toml")).unwrap();
    let assets: Vec<(String, String)> = manifest["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_array().unwrap();
            let source = a[0].as_str().unwrap();
            // Relative to host/; `target/release/…` is the build's.
            let source = source.strip_prefix("../").unwrap_or(source).to_owned();
            (source, a[1].as_str().unwrap().to_owned())
        })
        .collect();
    let shipped = |path: &str| assets.iter().any(|(source, _)| matches(source, path));
    let mut wanted: Vec<String> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| format!("examples/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    wanted.push("deploy/grafana/sluice-dashboard.json".into());
    wanted.push("deploy/prometheus/sluice-alerts.yml".into());
    for path in &wanted {
        assert!(
            shipped(path),
            "host/Cargo.toml's deb assets do not ship {path}"
        );
    }
    let installs = |dest: &str| assets.iter().any(|(_, d)| d.starts_with(dest));
    for dest in [
        "usr/share/man/man1/",
        "usr/share/bash-completion/completions/",
        "usr/share/zsh/vendor-completions/",
        "usr/share/fish/vendor_completions.d/",
    ] {
        assert!(installs(dest), "the .deb installs nothing into {dest}");
    }
    // docs/install.md says what the package's postinst does with the user.
    let postinst = read("deploy/debian/postinst");
    let install = read("docs/install.md");
    assert!(postinst.contains("--home /var/cache/sluice") && postinst.contains("nologin"));
    assert!(
        install.contains("no login shell; its home is `/var/cache/sluice`"),
        "docs/install.md must say the sluice user's home is its cache directory"
    );
}

#[test]
fn the_kubernetes_config_follows_the_hardening_checklist_for_kafka() {
    let config: toml::Table = toml::from_str(&read("deploy/kubernetes/sluice.toml")).unwrap();
    let kafka = config["kafka"].as_table().unwrap();
    let security = read("docs/security.md");
    assert!(security.contains("`security.protocol = \"SASL_SSL\"`, SCRAM-SHA-512"));
    assert_eq!(kafka["security.protocol"].as_str(), Some("SASL_SSL"));
    // The property's own name, as docs/security.md writes it (not librdkafka's alias).
    assert_eq!(kafka["sasl.mechanism"].as_str(), Some("SCRAM-SHA-512"));
    assert!(!kafka.contains_key("sasl.mechanisms"));
    assert!(
        kafka.contains_key("ssl.ca.location"),
        "the checklist asks for it"
    );
}

#[test]
fn readme_names_everything_deploy_holds() {
    let readme = read("README.md");
    let layout = &readme[readme.find("\ndeploy/ ").expect("deploy/ in the layout")..];
    let layout = &layout[..layout.find("\n```").unwrap()];
    for entry in std::fs::read_dir(repo().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            layout.contains(&format!("{name}/")),
            "README.md's repository layout does not name deploy/{name}/"
        );
    }
}
