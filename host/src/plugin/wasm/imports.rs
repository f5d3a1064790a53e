//! What a component imports, checked against what the sandbox provides *before* compiling:
//! a big runtime (componentize-js's SpiderMonkey) takes 10–30 s to compile, and a component
//! that imports, say, `wasi:http` would only be refused after that, with a cache entry
//! written for nothing.

use std::fmt;

use wasmparser::{BinaryReaderError, Parser, Payload};

/// Interface packages the sandbox links: WASI p2 (with an empty context: no files, network,
/// environment; frozen clocks) and Sluice's host API.
const PROVIDED_PACKAGES: &[&str] = &[
    "wasi:io",
    "wasi:clocks",
    "wasi:random",
    "wasi:cli",
    "wasi:filesystem",
    "wasi:sockets",
    "sluice:plugin",
];

/// Why a component is refused before it is compiled.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The file does not parse as WebAssembly.
    Unreadable(BinaryReaderError),
    /// It imports what the sandbox does not provide (the text names it and how to avoid it).
    Imports(String),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable(e) => write!(f, "not a valid WebAssembly component: {e}"),
            Self::Imports(message) => f.write_str(message),
        }
    }
}

/// The top-level imports of a binary component (`package/interface@version`, as written).
fn imports(bytes: &[u8]) -> Result<Vec<String>, BinaryReaderError> {
    let mut names = Vec::new();
    // Nested modules and components import from their parent, not from the host.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import?;
                    names.push(import.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

/// The package (`wasi:http`) of an import name (`wasi:http/outgoing-handler@0.2.0`).
fn package(import: &str) -> &str {
    import.split(['/', '@']).next().unwrap_or(import)
}

/// Refuses a component importing anything the sandbox does not provide, naming the first
/// such import and how to build without it. Text (WAT) is left to the compiler.
pub(crate) fn check(bytes: &[u8]) -> Result<(), Refused> {
    if !bytes.starts_with(b"\0asm") {
        return Ok(());
    }
    let imports = imports(bytes).map_err(Refused::Unreadable)?;
    let missing: Vec<&String> = imports
        .iter()
        .filter(|name| !PROVIDED_PACKAGES.contains(&package(name)))
        .collect();
    let Some(first) = missing.first() else {
        return Ok(());
    };
    let hint = match package(first) {
        "wasi:http" => {
            " — componentize-js imports it unless built with `-d http fetch-event`; or build \
             with jco's QuickJS backend (componentize-qjs, as the Sluice JavaScript template \
             does)"
        }
        _ => " — build the plugin without it (a plugin gets no network, files or environment)",
    };
    let others = match missing.len() {
        1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    Err(Refused::Imports(format!(
        "imports `{first}`{others}, which the Sluice sandbox does not provide{hint}; \
         provided: {}",
        PROVIDED_PACKAGES.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(wat: &str) -> Vec<u8> {
        wat::parse_str(wat).unwrap()
    }

    #[test]
    fn a_wasi_http_import_is_named_with_the_fix() {
        let bytes = component(
            r#"(component
                 (import "wasi:io/streams@0.2.0" (instance))
                 (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#,
        );
        let err = check(&bytes).unwrap_err().to_string();
        assert!(
            err.starts_with("imports `wasi:http/outgoing-handler@0.2.0`"),
            "{err}"
        );
        assert!(err.contains("-d http fetch-event"), "{err}");
    }

    #[test]
    fn provided_imports_pass_and_nested_imports_do_not_count() {
        let bytes = component(
            r#"(component
                 (import "wasi:cli/stderr@0.2.0" (instance))
                 (import "sluice:plugin/host@0.1.0" (instance))
                 (component (import "anything:else/x" (instance))))"#,
        );
        assert!(check(&bytes).is_ok());
        assert_eq!(
            imports(&bytes).unwrap(),
            ["wasi:cli/stderr@0.2.0", "sluice:plugin/host@0.1.0"]
        );
    }

    #[test]
    fn several_unknown_imports_are_counted() {
        let bytes = component(
            r#"(component
                 (import "wasi:http/types@0.2.0" (instance))
                 (import "acme:secret/api" (instance)))"#,
        );
        let err = check(&bytes).unwrap_err().to_string();
        assert!(err.contains("(and 1 more)"), "{err}");
        let Err(Refused::Unreadable(_)) = check(b"\0asm\x0d\0\x01\0garbage") else {
            panic!("garbage parsed");
        };
    }
}
