//! `sluice plugin new`: writes a plugin project from the templates in `plugins/templates/`,
//! embedded in the binary so an installed `sluice` needs no source checkout.
//!
//! A project gets the language's template files (with `{{name}}` and `{{name_snake}}`
//! replaced), the sample rows and their expected output (`plugins/templates/common/`, the same
//! in every language), the contract (`wit/sluice.wit`), a copy of the language's SDK, and for
//! Python and JavaScript the pinned toolchain installer their `build.sh` sources.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A plugin language `sluice plugin new` has a template for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Language {
    Rust,
    Python,
    Js,
}

impl Language {
    pub(crate) const ALL: [Language; 3] = [Language::Rust, Language::Python, Language::Js];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Rust => "rust",
            Self::Python => "python",
            Self::Js => "js",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Language {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown language {s:?}: use rust, python or js"))
    }
}

/// Why a project could not be created.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScaffoldError {
    #[error(
        "plugin name {0:?}: use lowercase letters, digits and '-', starting with a letter \
         (it becomes a crate, module and file name)"
    )]
    BadName(String),
    #[error("{0} already exists; choose another --dir or remove it")]
    Exists(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One file of a project: where it goes, its text (placeholders not yet replaced), and
/// whether it is a script to run.
pub(crate) struct TemplateFile {
    pub path: &'static str,
    pub text: &'static str,
    pub executable: bool,
}

/// `path` in the project ← `source` in the Sluice repository, embedded at build time.
macro_rules! embed {
    ($path:literal <- $source:literal) => {
        embed!($path <- $source, false)
    };
    ($path:literal <- $source:literal, $executable:literal) => {
        TemplateFile {
            path: $path,
            text: include_str!(concat!("../../../../../", $source)),
            executable: $executable,
        }
    };
}

const COMMON: &[TemplateFile] = &[
    embed!("rows.jsonl" <- "plugins/templates/common/rows.jsonl"),
    embed!("expected.jsonl" <- "plugins/templates/common/expected.jsonl"),
    embed!("wit/sluice.wit" <- "wit/sluice.wit"),
];

const RUST: &[TemplateFile] = &[
    embed!("Cargo.toml" <- "plugins/templates/rust/Cargo.toml"),
    embed!("README.md" <- "plugins/templates/rust/README.md"),
    embed!("build.sh" <- "plugins/templates/rust/build.sh", true),
    embed!("src/lib.rs" <- "plugins/templates/rust/src/lib.rs"),
    embed!("vendor/sluice-plugin-sdk/Cargo.toml" <- "plugins/templates/rust/vendor/sluice-plugin-sdk/Cargo.toml"),
    // The SDK's bindings path `../../wit` then points at the project's own wit/.
    embed!("vendor/sluice-plugin-sdk/src/lib.rs" <- "plugins/sdk/src/lib.rs"),
];

const PYTHON: &[TemplateFile] = &[
    embed!("README.md" <- "plugins/templates/python/README.md"),
    embed!("app.py" <- "plugins/templates/python/app.py"),
    embed!("build.sh" <- "plugins/templates/python/build.sh", true),
    embed!("sluice_plugin/__init__.py" <- "plugins/sdk-python/sluice_plugin/__init__.py"),
    embed!("toolchain.sh" <- "scripts/plugin-toolchains.sh"),
];

const JS: &[TemplateFile] = &[
    embed!("README.md" <- "plugins/templates/js/README.md"),
    embed!("plugin.js" <- "plugins/templates/js/plugin.js"),
    embed!("build.sh" <- "plugins/templates/js/build.sh", true),
    embed!("sluice-plugin.js" <- "plugins/sdk-js/sluice-plugin.js"),
    embed!("toolchain.sh" <- "scripts/plugin-toolchains.sh"),
];

/// Every file of a `lang` project, placeholders not yet replaced.
pub(crate) fn files(lang: Language) -> impl Iterator<Item = &'static TemplateFile> {
    let own = match lang {
        Language::Rust => RUST,
        Language::Python => PYTHON,
        Language::Js => JS,
    };
    own.iter().chain(COMMON)
}

/// Whether `name` can name a plugin: lowercase letters, digits and '-', starting with a
/// letter (a valid crate name and a readable file name).
pub(crate) fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// `text` with `{{name}}` and `{{name_snake}}` (`-` turned into `_`) filled in.
pub(crate) fn fill(text: &str, name: &str) -> String {
    text.replace("{{name_snake}}", &name.replace('-', "_"))
        .replace("{{name}}", name)
}

/// Writes a new `lang` project for plugin `name` into `dest`, which must not exist yet.
/// Returns the files written, relative to `dest`.
pub(crate) fn create(
    name: &str,
    lang: Language,
    dest: &Path,
) -> Result<Vec<&'static str>, ScaffoldError> {
    if !valid_name(name) {
        return Err(ScaffoldError::BadName(name.to_owned()));
    }
    if dest.exists() {
        return Err(ScaffoldError::Exists(dest.to_owned()));
    }
    let mut written = Vec::new();
    for file in files(lang) {
        let path = dest.join(file.path);
        write_file(&path, &fill(file.text, name), file.executable)
            .map_err(|source| ScaffoldError::Write { path, source })?;
        written.push(file.path);
    }
    Ok(written)
}

fn write_file(path: &Path, text: &str, executable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    if executable {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// Every file under `plugins/templates/<lang>/`, relative to it.
    fn template_dir_files(lang: Language) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, base, out);
                } else {
                    let rel = path.strip_prefix(base).unwrap();
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        let base = repo().join("plugins/templates").join(lang.as_str());
        let mut out = Vec::new();
        walk(&base, &base, &mut out);
        out
    }

    #[test]
    fn every_template_file_is_embedded_with_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        for lang in Language::ALL {
            let embedded: Vec<&TemplateFile> = files(lang).collect();
            for rel in template_dir_files(lang) {
                let file = embedded
                    .iter()
                    .find(|f| f.path == rel)
                    .unwrap_or_else(|| panic!("{lang}: {rel} is not embedded in scaffold.rs"));
                let source = repo()
                    .join("plugins/templates")
                    .join(lang.as_str())
                    .join(&rel);
                assert_eq!(
                    file.text,
                    std::fs::read_to_string(&source).unwrap(),
                    "{rel}"
                );
                let mode = std::fs::metadata(&source).unwrap().permissions().mode();
                assert_eq!(file.executable, mode & 0o111 != 0, "{lang}: {rel} mode");
            }
        }
    }

    #[test]
    fn a_project_has_its_placeholders_filled_and_scripts_executable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for lang in Language::ALL {
            let dest = dir.path().join(lang.as_str());
            let written = create("my-router", lang, &dest).unwrap();
            assert!(written.contains(&"build.sh") && written.contains(&"expected.jsonl"));
            for rel in &written {
                let text = std::fs::read_to_string(dest.join(rel)).unwrap();
                assert!(
                    !text.contains("{{name"),
                    "{lang}: {rel} keeps a placeholder"
                );
            }
            let build = std::fs::read_to_string(dest.join("build.sh")).unwrap();
            assert!(build.contains("my-router.wasm"), "{build}");
            let mode = std::fs::metadata(dest.join("build.sh"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o111, 0o111);
        }
        let rust_build = std::fs::read_to_string(dir.path().join("rust/build.sh")).unwrap();
        assert!(
            rust_build.contains("release/my_router.wasm"),
            "{rust_build}"
        );
    }

    #[test]
    fn bad_names_and_existing_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "My-Router", "1router", "a_b", "a/b", "a b"] {
            assert!(
                matches!(
                    create(bad, Language::Rust, &dir.path().join("x")),
                    Err(ScaffoldError::BadName(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            create("ok", Language::Js, dir.path()),
            Err(ScaffoldError::Exists(_))
        ));
        assert_eq!("python".parse::<Language>(), Ok(Language::Python));
        assert!("go".parse::<Language>().is_err());
    }
}
