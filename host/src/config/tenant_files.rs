//! `[plugins] tenants_dir`: one file per tenant, `acme.toml` holding the keys of
//! `[tenants.acme]` at its top level, so a platform adds, replaces and removes tenants as
//! files (a Kubernetes ConfigMap or Secret mounted as a directory, a config-management tool).
//!
//! Read leniently: a file that cannot be read or parsed is a problem of that tenant alone
//! (named by the file), never of the others, so one bad file neither stops a start-up check
//! from listing the rest nor a live reload from applying the others' changes. What is read:
//! `*.toml` entries, following symlinks (Kubernetes mounts each key as a symlink through
//! `..data`); hidden entries (`..data`, `..2026_12_06…`, an editor's `.acme.toml.swp`) and
//! other names (`acme.toml~`, `4913`) are not tenants. Only regular files are read, and only
//! up to [`MAX_TENANT_FILE_BYTES`]: a FIFO or `/dev/zero` behind a name must not hang or fill
//! the relay.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{one_line, resolve_path};
use crate::plugin::PluginSpec;
use crate::problem::Problem;
use crate::secret;

/// Largest tenant file read: a tenant's section is a few hundred bytes.
pub const MAX_TENANT_FILE_BYTES: u64 = 1024 * 1024;

/// The tenants of a `tenants_dir`, as read.
#[derive(Debug, Clone, Default)]
pub struct TenantFiles {
    /// Each tenant whose file parsed, with its paths resolved from the file's directory.
    pub tenants: BTreeMap<String, PluginSpec>,
    /// Every tenant named by a file (parsed or not) → the file, as shown in messages
    /// (`tenants.d/acme.toml`: the directory as written, then the file name).
    pub files: BTreeMap<String, PathBuf>,
    /// What is wrong with a file (keyed by the file as shown), by tenant.
    pub problems: BTreeMap<String, Vec<Problem>>,
    /// A problem of the directory itself (it cannot be listed): no tenant is known then.
    pub unreadable: Option<Problem>,
}

/// The tenant a directory entry's name stands for, if it is a tenant file's name.
pub fn tenant_of(file_name: &str) -> Option<&str> {
    if file_name.starts_with('.') {
        return None;
    }
    file_name
        .strip_suffix(".toml")
        .filter(|name| !name.is_empty())
}

impl TenantFiles {
    /// Reads `dir` (resolved), naming files as `shown` (the directory as written) + name.
    pub fn read(dir: &Path, shown: &Path) -> Self {
        let mut out = Self::default();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                out.unreadable = Some(Problem::caused(
                    "plugins.tenants_dir",
                    format!("cannot list {}", shown.display()),
                    e,
                ));
                return out;
            }
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(tenant_of) else {
                continue;
            };
            let display = shown.join(&file_name);
            out.files.insert(name.to_owned(), display.clone());
            match read_one(&entry.path(), &display) {
                Ok(spec) => {
                    out.tenants.insert(name.to_owned(), spec);
                }
                Err(problems) => {
                    out.problems.insert(name.to_owned(), problems);
                }
            }
        }
        out
    }
}

/// One tenant file: its spec with paths resolved, or its problems (at least one).
fn read_one(path: &Path, shown: &Path) -> Result<PluginSpec, Vec<Problem>> {
    let key = shown.display().to_string();
    let problem = |message: String| vec![Problem::new(key.clone(), message)];
    // Following symlinks, as reading does: a loop or a dangling link is named here.
    let meta = std::fs::metadata(path)
        .map_err(|e| vec![Problem::caused(key.clone(), "cannot read", e)])?;
    if !meta.is_file() {
        return Err(problem(
            "not a regular file (a tenant file must be a file or a symlink to one)".into(),
        ));
    }
    if meta.len() > MAX_TENANT_FILE_BYTES {
        return Err(problem(format!(
            "{} bytes: larger than the {MAX_TENANT_FILE_BYTES} bytes a tenant file may have",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TENANT_FILE_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| vec![Problem::caused(key.clone(), "cannot read", e)])?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tree: toml::Value = toml::from_str(&text).map_err(|e| problem(one_line(e, &text)))?;
    let resolved = secret::resolve(&mut tree, &secret::Environment::new(dir));
    secret::register(&resolved.secrets);
    if !resolved.errors.is_empty() {
        return Err(resolved
            .errors
            .into_iter()
            .map(|p| Problem {
                key: format!("{key}: {}", p.key),
                ..p
            })
            .collect());
    }
    let mut spec: PluginSpec = match tree.try_into() {
        Ok(spec) => spec,
        Err(e) => {
            let message = toml::from_str::<PluginSpec>(&text).err().map_or_else(
                || e.to_string().trim_end().replace('\n', " "),
                |e| one_line(e, &text),
            );
            return Err(problem(message));
        }
    };
    // Relative paths in a tenant file are relative to that file, as in sluice.toml.
    spec.resolve_schema_paths(dir);
    if let Some(p) = &mut spec.path {
        resolve_path(p, dir);
    }
    Ok(spec)
}

/// `key` (a problem's, e.g. `tenants.acme.memory_mb`) as it reads for a tenant defined by
/// `file`: `tenants.d/acme.toml: memory_mb`.
pub(super) fn in_file(key: &str, tenant: &str, file: &Path) -> Option<String> {
    let rest = key.strip_prefix("tenants.")?.strip_prefix(tenant)?;
    let shown = file.display();
    if rest.is_empty() {
        Some(shown.to_string())
    } else {
        rest.strip_prefix('.').map(|sub| format!("{shown}: {sub}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn names_that_are_not_tenant_files_are_ignored() {
        assert_eq!(tenant_of("acme.toml"), Some("acme"));
        assert_eq!(tenant_of("acme.corp.toml"), Some("acme.corp"));
        for name in [
            "..data",
            "..2026_12_06_10_00_00.123",
            ".acme.toml.swp",
            ".#acme.toml",
            "acme.toml~",
            "#acme.toml#",
            "4913",
            ".toml",
            "README",
        ] {
            assert_eq!(tenant_of(name), None, "{name}");
        }
    }

    #[test]
    fn reads_each_file_as_its_tenant_and_names_the_bad_ones() {
        let d = dir();
        std::fs::write(
            d.path().join("acme.toml"),
            "path = \"p/acme.wasm\"\n[config]\nk = \"v\"\n",
        )
        .unwrap();
        std::fs::write(d.path().join("broken.toml"), "path = \n").unwrap();
        std::fs::write(d.path().join("typo.toml"), "pth = \"x.wasm\"\n").unwrap();
        std::fs::write(d.path().join(".acme.toml.swp"), "\0\0binary").unwrap();
        std::os::unix::fs::symlink("loop2.toml", d.path().join("loop1.toml")).unwrap();
        std::os::unix::fs::symlink("loop1.toml", d.path().join("loop2.toml")).unwrap();
        std::fs::create_dir(d.path().join("dir.toml")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.path().join("zero.toml")).unwrap();
        let files = TenantFiles::read(d.path(), Path::new("tenants.d"));
        assert!(files.unreadable.is_none());
        let acme = &files.tenants["acme"];
        assert_eq!(
            acme.path.as_deref(),
            Some(d.path().join("p/acme.wasm").as_path())
        );
        assert_eq!(
            files.files.keys().collect::<Vec<_>>(),
            ["acme", "broken", "dir", "loop1", "loop2", "typo", "zero"]
        );
        let shown = |t: &str| -> String {
            files.problems[t]
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        assert!(
            shown("broken").starts_with("tenants.d/broken.toml: "),
            "{}",
            shown("broken")
        );
        assert!(shown("broken").contains("line 1"), "{}", shown("broken"));
        assert!(
            shown("typo").contains("unknown field `pth`"),
            "{}",
            shown("typo")
        );
        assert!(
            shown("loop1").starts_with("tenants.d/loop1.toml: cannot read"),
            "{}",
            shown("loop1")
        );
        assert!(
            shown("dir").contains("not a regular file"),
            "{}",
            shown("dir")
        );
        assert!(
            shown("zero").contains("not a regular file"),
            "{}",
            shown("zero")
        );
        assert_eq!(files.tenants.len(), 1);
    }

    #[test]
    fn ten_thousand_files_are_ten_thousand_tenants() {
        let d = dir();
        for n in 0..10_000 {
            std::fs::write(
                d.path().join(format!("t{n}.toml")),
                format!(
                    "builtin = \"route-by-aggregate\"\nconfig = {{ topic_prefix = \"t{n}.\" }}\n"
                ),
            )
            .unwrap();
        }
        let files = TenantFiles::read(d.path(), Path::new("t.d"));
        assert_eq!(files.tenants.len(), 10_000);
        assert!(files.problems.is_empty());
        assert_eq!(
            files.tenants["t9999"].config.as_ref().unwrap()["topic_prefix"].as_str(),
            Some("t9999.")
        );
    }

    #[test]
    fn a_missing_directory_is_one_problem_and_no_tenant() {
        let d = dir();
        let files = TenantFiles::read(&d.path().join("nope"), Path::new("nope"));
        let problem = files.unreadable.expect("a problem");
        assert_eq!(problem.key, "plugins.tenants_dir");
        assert!(files.files.is_empty());
    }

    #[test]
    fn oversized_files_are_refused_unread() {
        let d = dir();
        let big = "# x\n".repeat((MAX_TENANT_FILE_BYTES as usize / 4) + 1);
        std::fs::write(d.path().join("big.toml"), big).unwrap();
        let files = TenantFiles::read(d.path(), Path::new("t"));
        assert!(files.problems["big"][0].message.contains("larger than"));
    }

    #[test]
    fn problem_keys_move_into_the_file() {
        let file = Path::new("tenants.d/acme.toml");
        assert_eq!(
            in_file("tenants.acme.memory_mb", "acme", file).as_deref(),
            Some("tenants.d/acme.toml: memory_mb")
        );
        assert_eq!(
            in_file("tenants.acme", "acme", file).as_deref(),
            Some("tenants.d/acme.toml")
        );
        assert_eq!(in_file("tenants.acmex.memory_mb", "acme", file), None);
        assert_eq!(in_file("relay.batch_size", "acme", file), None);
    }
}
