//! The layout of `host/src`, checked: no circle between files, no circle between top-level
//! modules, and no module importing from a layer above its own in the layer line of
//! `docs/architecture.md` ("Layers, top to bottom; nothing imports from a layer above it"),
//! which is read from the document itself so the two cannot drift apart.
//!
//! The sources are read as text, without the compiler: each file's crate-internal names
//! (`use crate::…` in every grouped form, `use super::…`, paths such as
//! `crate::encoding::MessageFormats` in code, `macro_rules!` macros of other files) are resolved
//! to the file that defines them, through `pub use` re-exports. Test-only code is left out:
//! `#[cfg(test)]` items, and the files of modules declared only under `#[cfg(test)]`. A name
//! that cannot be resolved is reported too, so the check cannot pass by not seeing an edge.
//!
//! A module's files may use what the module's own file (`mod.rs`, or `x.rs` beside `x/`)
//! defines — its trait, its error type — while that file names its parts: that is the
//! hierarchy, not a circle, so edges to an enclosing module's own file are left out. The binary
//! (`host/src/bin`) is the layer `bin`, above every module.
//!
//! `LAYOUT_EDGES=1 cargo test -p sluice --test layout -- --nocapture` prints every edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// What the check reads: every `.rs` file under `host/src` (keyed by its path below it, with
/// `/`), the crates the sources may name (so an unknown first segment is a problem, not an
/// external crate), and `docs/architecture.md`.
struct Sources {
    files: BTreeMap<String, String>,
    externs: BTreeSet<String>,
    architecture: String,
}

#[test]
fn layout_follows_docs_architecture() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = Sources::read(host);
    let report = check(&sources);
    assert!(
        report.is_empty(),
        "host/src does not have the layout docs/architecture.md describes \
         (host/tests/layout.rs checks it):\n\n{report}"
    );
}

impl Sources {
    fn read(host: &Path) -> Self {
        let mut files = BTreeMap::new();
        read_tree(&host.join("src"), "", &mut files);
        let manifest = fs::read_to_string(host.join("Cargo.toml")).expect("host/Cargo.toml");
        let architecture =
            fs::read_to_string(host.join("../docs/architecture.md")).expect("docs/architecture.md");
        Self {
            files,
            externs: dependencies(&manifest),
            architecture,
        }
    }
}

fn read_tree(dir: &Path, prefix: &str, files: &mut BTreeMap<String, String>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_dir() {
            read_tree(&path, &format!("{prefix}{name}/"), files);
        } else if name.ends_with(".rs") {
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            files.insert(format!("{prefix}{name}"), text);
        }
    }
}

/// The crate names of `[dependencies]` (as Rust spells them), and the standard library's.
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["std", "core", "alloc"].map(String::from).into();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if in_dependencies
            && !line.starts_with('#')
            && let Some((key, _)) = line.split_once('=')
        {
            let name = key.trim().split('.').next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.replace('-', "_"));
            }
        }
    }
    names
}

// ---------------------------------------------------------------------------------------------
// Tokens

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// Strings, characters, numbers, lifetimes: nothing a path is made of.
    Literal,
}

impl Tok {
    fn ident(&self) -> Option<&str> {
        match self {
            Tok::Ident(s) => Some(s),
            _ => None,
        }
    }

    fn is(&self, c: char) -> bool {
        *self == Tok::Punct(c)
    }

    fn is_ident(&self, s: &str) -> bool {
        self.ident() == Some(s)
    }
}

/// Rust source as tokens, without comments (doc comments included: an intra-doc link is not an
/// import).
fn tokenize(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let ident_start = |c: char| c == '_' || c.is_alphabetic();
    let ident_char = |c: char| c == '_' || c.is_alphanumeric();
    let mut toks = Vec::new();
    let mut i = 0;
    // Skips a quoted string whose opening `"` is at `i`, escapes honoured.
    let skip_string = |mut i: usize| {
        i += 1;
        while i < s.len() && s[i] != '"' {
            i += if s[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else if i >= s.len() {
                    break;
                } else {
                    i += 1;
                }
            }
        } else if ident_start(c) {
            let start = i;
            while ident_char(at(i)) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
            let mut hashes = 0;
            while raw_prefix && at(i + hashes) == '#' {
                hashes += 1;
            }
            if raw_prefix && at(i + hashes) == '"' {
                // A raw string: ends at `"` followed by as many `#`.
                i += hashes + 1;
                while i < s.len() && !(s[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                    i += 1;
                }
                i += 1 + hashes;
                toks.push(Tok::Literal);
            } else if word == "r" && hashes == 1 && ident_start(at(i + 1)) {
                // A raw identifier.
                i += 1;
                let start = i;
                while ident_char(at(i)) {
                    i += 1;
                }
                let name: String = s[start..i].iter().collect();
                toks.push(Tok::Ident(format!("r#{name}")));
            } else if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = skip_string(i);
                toks.push(Tok::Literal);
            } else if word == "b" && at(i) == '\'' {
                i += 1;
                while i < s.len() && s[i] != '\'' {
                    i += if s[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                toks.push(Tok::Literal);
            } else {
                toks.push(Tok::Ident(word));
            }
        } else if c == '"' {
            i = skip_string(i);
            toks.push(Tok::Literal);
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                i += 2;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or label.
                i += 1;
                while ident_char(at(i)) {
                    i += 1;
                }
            }
            toks.push(Tok::Literal);
        } else if c.is_ascii_digit() {
            while ident_char(at(i)) || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            toks.push(Tok::Literal);
        } else if c == ':' && at(i + 1) == ':' {
            toks.push(Tok::PathSep);
            i += 2;
        } else {
            toks.push(Tok::Punct(c));
            i += 1;
        }
    }
    toks
}

/// The tokens without test-only items: whatever follows `#[cfg(test)]` up to the end of that
/// item (`;` or its closing brace).
fn strip_test_code(toks: &[Tok]) -> Vec<Tok> {
    let cfg_test = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i..].starts_with(&cfg_test) {
            i += cfg_test.len();
            let mut depth = 0;
            while i < toks.len() {
                let t = &toks[i];
                i += 1;
                if t.is('(') || t.is('[') || t.is('{') {
                    depth += 1;
                } else if t.is(')') || t.is(']') {
                    depth -= 1;
                } else if t.is('}') {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                } else if t.is(';') && depth == 0 {
                    break;
                }
            }
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// One file

/// One name a `use` declaration binds (or a glob it brings in).
#[derive(Debug, Clone, PartialEq)]
struct Use {
    /// `pub`, `pub(crate)`, …: it may be a re-export.
    public: bool,
    /// Declared at the file's top level (not in a function body or an inline module).
    top_level: bool,
    /// How many inline `mod x { … }` it is declared in (for `super::`).
    inline_depth: usize,
    /// The path as written, `self` leaves already taken off.
    path: Vec<String>,
    /// The name it binds (`None` for a glob); `_` for `as _`.
    binding: Option<String>,
}

#[derive(Debug, Default)]
struct FileSyntax {
    /// Items defined at the top level (inline modules included: paths into them end here).
    items: BTreeSet<String>,
    /// `mod name;` at the top level.
    mods: Vec<String>,
    /// `macro_rules! name` at the top level.
    macros: BTreeSet<String>,
    /// A macro is invoked at the top level: it may define items this check cannot see.
    macro_items: bool,
    uses: Vec<Use>,
    /// Everything but `use` declarations, with the inline-module depth of each token.
    code: Vec<(Tok, usize)>,
}

const ITEM_KEYWORDS: [&str; 9] = [
    "fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod",
];

fn is_keyword(s: &str) -> bool {
    matches!(
        s,
        "fn" | "unsafe" | "extern" | "async" | "const" | "pub" | "impl" | "dyn" | "mut" | "_"
    )
}

fn parse_file(toks: &[Tok]) -> FileSyntax {
    let mut file = FileSyntax::default();
    let mut depth = 0usize;
    // Brace depths at which inline modules were opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut public = false;
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if t.is_ident("pub") {
            public = true;
            file.code.push((t.clone(), inline.len()));
            i += 1;
            if toks.get(i).is_some_and(|t| t.is('(')) {
                while i < toks.len() && !toks[i].is(')') {
                    file.code.push((toks[i].clone(), inline.len()));
                    i += 1;
                }
                i += 1;
            }
            continue;
        }
        if t.is_ident("use") {
            let top_level = depth == 0;
            let mut leaves = Vec::new();
            i += 1;
            parse_use_tree(toks, &mut i, Vec::new(), &mut leaves);
            while i < toks.len() && !toks[i].is(';') {
                i += 1;
            }
            i += 1;
            for (path, binding) in leaves {
                file.uses.push(Use {
                    public,
                    top_level,
                    inline_depth: inline.len(),
                    path,
                    binding,
                });
            }
            public = false;
            continue;
        }
        public = false;
        let next = toks.get(i + 1);
        if depth == 0 {
            if let (Some(kw), Some(name)) = (t.ident(), next.and_then(Tok::ident))
                && ITEM_KEYWORDS.contains(&kw)
                && !is_keyword(name)
            {
                file.items.insert(name.to_string());
                if kw == "mod" && toks.get(i + 2).is_some_and(|t| t.is(';')) {
                    file.items.remove(name);
                    file.mods.push(name.to_string());
                }
            }
            if t.is_ident("macro_rules") && next.is_some_and(|t| t.is('!')) {
                if let Some(name) = toks.get(i + 2).and_then(Tok::ident) {
                    file.macros.insert(name.to_string());
                    file.items.insert(name.to_string());
                }
            } else if t.ident().is_some()
                && next.is_some_and(|t| t.is('!'))
                && toks
                    .get(i + 2)
                    .is_some_and(|t| t.is('{') || t.is('(') || t.is('['))
            {
                file.macro_items = true;
            }
        }
        if t.is_ident("mod")
            && next.and_then(Tok::ident).is_some()
            && toks.get(i + 2).is_some_and(|t| t.is('{'))
        {
            inline.push(depth + 1);
        }
        if t.is('{') {
            depth += 1;
        } else if t.is('}') {
            if inline.last() == Some(&depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
        }
        file.code.push((t.clone(), inline.len()));
        i += 1;
    }
    file
}

/// One use tree (`a::b::{c, d::{e as f, self}, g::*}`) at `i`: its leaves as (path, binding).
fn parse_use_tree(
    toks: &[Tok],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    if toks.get(*i) == Some(&Tok::PathSep) {
        *i += 1;
    }
    loop {
        match toks.get(*i) {
            Some(Tok::Ident(s)) if s != "as" => {
                path.push(s.clone());
                *i += 1;
                if toks.get(*i) == Some(&Tok::PathSep) {
                    *i += 1;
                } else {
                    break;
                }
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push((path, None));
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                while let Some(t) = toks.get(*i) {
                    if t.is('}') {
                        *i += 1;
                        break;
                    }
                    if t.is(',') {
                        *i += 1;
                        continue;
                    }
                    let before = *i;
                    parse_use_tree(toks, i, path.clone(), out);
                    if *i == before {
                        *i += 1;
                    }
                }
                return;
            }
            _ => break,
        }
    }
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    let mut binding = path.last().cloned();
    if toks.get(*i).is_some_and(|t| t.is_ident("as")) {
        binding = toks.get(*i + 1).and_then(Tok::ident).map(String::from);
        *i += 2;
    }
    if !path.is_empty() {
        out.push((path, binding));
    }
}

// ---------------------------------------------------------------------------------------------
// The module tree

struct Module {
    file: String,
    parent: Option<usize>,
    root: usize,
    children: BTreeMap<String, usize>,
    syntax: FileSyntax,
}

struct Tree {
    modules: Vec<Module>,
    /// The library's root (`lib.rs`).
    lib: usize,
    problems: Vec<String>,
}

/// Where `mod name;` in `file` is: `name.rs` or `name/mod.rs` beside `file` (or in the
/// directory named after it).
fn child_files(file: &str, name: &str) -> [String; 2] {
    let dir = match file.rsplit_once('/') {
        Some((dir, base)) if ["mod.rs", "lib.rs", "main.rs"].contains(&base) => format!("{dir}/"),
        None if ["mod.rs", "lib.rs", "main.rs"].contains(&file) => String::new(),
        _ => format!("{}/", file.trim_end_matches(".rs")),
    };
    [format!("{dir}{name}.rs"), format!("{dir}{name}/mod.rs")]
}

/// The crate roots in `host/src`: the library and each binary.
fn crate_roots(files: &BTreeMap<String, String>) -> Vec<String> {
    let bins = files.keys().filter(|f| {
        let parts: Vec<&str> = f.split('/').collect();
        matches!(parts.as_slice(), ["bin", _] | ["bin", _, "main.rs"])
    });
    std::iter::once("lib.rs".to_string())
        .chain(bins.cloned())
        .collect()
}

impl Tree {
    fn build(files: &BTreeMap<String, String>) -> Self {
        let mut tree = Tree {
            modules: Vec::new(),
            lib: 0,
            problems: Vec::new(),
        };
        // Every file some `mod` reaches, test-only declarations included.
        let mut declared = BTreeSet::new();
        for root in crate_roots(files) {
            if !files.contains_key(&root) {
                tree.problems
                    .push(format!("host/src/{root}: crate root not found"));
                continue;
            }
            tree.add(files, &root, None, None);
            declared_files(files, &root, &mut declared);
        }
        // Files declared only under #[cfg(test)] are in `declared` but not in the tree: test
        // code, left out. A file in neither is in no crate at all.
        for file in files.keys().filter(|f| !declared.contains(*f)) {
            tree.problems.push(format!(
                "host/src/{file}: not declared by any `mod`, so not checked"
            ));
        }
        tree
    }

    fn add(
        &mut self,
        files: &BTreeMap<String, String>,
        file: &str,
        parent: Option<usize>,
        root: Option<usize>,
    ) -> usize {
        let toks = strip_test_code(&tokenize(&files[file]));
        let syntax = parse_file(&toks);
        let id = self.modules.len();
        let root = root.unwrap_or(id);
        let mods = syntax.mods.clone();
        self.modules.push(Module {
            file: file.to_string(),
            parent,
            root,
            children: BTreeMap::new(),
            syntax,
        });
        if file == "lib.rs" {
            self.lib = id;
        }
        for name in mods {
            match child_files(file, &name)
                .into_iter()
                .find(|f| files.contains_key(f))
            {
                Some(child) => {
                    let child = self.add(files, &child, Some(id), Some(root));
                    self.modules[id].children.insert(name, child);
                }
                None => self.problems.push(format!(
                    "host/src/{file}: `mod {name};` has no file (neither {})",
                    child_files(file, &name).join(" nor ")
                )),
            }
        }
        id
    }

    /// Whether module `outer` is an ancestor of module `inner`.
    fn encloses(&self, outer: usize, inner: usize) -> bool {
        let mut m = self.modules[inner].parent;
        while let Some(p) = m {
            if p == outer {
                return true;
            }
            m = self.modules[p].parent;
        }
        false
    }

    fn is_lib(&self, m: usize) -> bool {
        self.modules[m].root == self.lib
    }
}

/// The files `mod` declarations reach from `file`, test-only ones included.
fn declared_files(files: &BTreeMap<String, String>, file: &str, out: &mut BTreeSet<String>) {
    if !out.insert(file.to_string()) {
        return;
    }
    let syntax = parse_file(&tokenize(&files[file]));
    for name in &syntax.mods {
        if let Some(child) = child_files(file, name)
            .into_iter()
            .find(|f| files.contains_key(f))
        {
            declared_files(files, &child, out);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Resolving names

/// What a path names.
#[derive(Debug, Clone, PartialEq)]
enum Found {
    Module(usize),
    /// An item of `module`'s file (a path past it — an enum variant, an associated item, an
    /// inline module's item — ends there too).
    Item {
        module: usize,
        name: String,
    },
    /// A name made by a macro invoked at the top level of `module`'s file.
    MacroMade {
        module: usize,
        name: String,
    },
    /// Another crate's.
    External,
    Unresolved(String),
}

const FUEL: u32 = 64;

impl Tree {
    /// `segs` looked up in module `m`'s namespace. `local`: from `m`'s own file, whose uses
    /// inside functions count too.
    fn resolve_in(&self, m: usize, segs: &[String], local: bool, fuel: u32) -> Found {
        let Some((first, rest)) = segs.split_first() else {
            return Found::Module(m);
        };
        if fuel == 0 {
            return Found::Unresolved(segs.join("::"));
        }
        let module = &self.modules[m];
        let child = module.children.get(first).copied();
        if let Some(c) = child.filter(|_| !rest.is_empty()) {
            return self.resolve_in(c, rest, false, fuel - 1);
        }
        if module.syntax.items.contains(first) {
            return Found::Item {
                module: m,
                name: first.clone(),
            };
        }
        if let Some(c) = child {
            return Found::Module(c);
        }
        let visible = |u: &&Use| local || (u.top_level && u.inline_depth == 0);
        if let Some(u) = module
            .syntax
            .uses
            .iter()
            .filter(visible)
            .find(|u| u.binding.as_ref() == Some(first))
        {
            let mut path = u.path.clone();
            path.extend(rest.iter().cloned());
            return self.resolve_path(m, u.inline_depth, &path, fuel - 1);
        }
        for u in module
            .syntax
            .uses
            .iter()
            .filter(visible)
            .filter(|u| u.binding.is_none())
        {
            let mut path = u.path.clone();
            path.extend(segs.iter().cloned());
            match self.resolve_path(m, u.inline_depth, &path, fuel - 1) {
                Found::External | Found::Unresolved(_) => {}
                found => return found,
            }
        }
        if module.syntax.macro_items {
            return Found::MacroMade {
                module: m,
                name: first.clone(),
            };
        }
        Found::Unresolved(format!("{} in host/src/{}", segs.join("::"), module.file))
    }

    /// A path as written in module `m` (a use path, or a path in its code).
    fn resolve_path(&self, m: usize, inline_depth: usize, path: &[String], fuel: u32) -> Found {
        let Some(first) = path.first() else {
            return Found::Module(m);
        };
        match first.as_str() {
            "crate" => self.resolve_in(self.modules[m].root, &path[1..], false, fuel),
            "self" => self.resolve_in(m, &path[1..], true, fuel),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let mut target = m;
                for _ in 0..supers.saturating_sub(inline_depth) {
                    match self.modules[target].parent {
                        Some(parent) => target = parent,
                        None => return Found::Unresolved(path.join("::")),
                    }
                }
                self.resolve_in(target, &path[supers..], false, fuel)
            }
            "sluice" if !self.is_lib(m) => self.resolve_in(self.lib, &path[1..], false, fuel),
            _ if self.in_scope(m, first) => self.resolve_in(m, path, true, fuel),
            _ => Found::External,
        }
    }

    /// Whether `name` is a child module, an item or a binding of `m`'s file.
    fn in_scope(&self, m: usize, name: &str) -> bool {
        let module = &self.modules[m];
        module.children.contains_key(name)
            || module.syntax.items.contains(name)
            || module
                .syntax
                .uses
                .iter()
                .any(|u| u.binding.as_deref() == Some(name))
    }
}

// ---------------------------------------------------------------------------------------------
// Edges

/// file -> file -> the names that make the edge.
type Edges = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn file_edges(tree: &Tree, externs: &BTreeSet<String>, problems: &mut Vec<String>) -> Edges {
    let macros: BTreeMap<(usize, &String), usize> = tree
        .modules
        .iter()
        .enumerate()
        .flat_map(|(id, m)| m.syntax.macros.iter().map(move |name| ((m.root, name), id)))
        .collect();
    let mut edges = Edges::new();
    for (m, module) in tree.modules.iter().enumerate() {
        let mut add = |found: Found, edges: &mut Edges| {
            let (to, name) = match found {
                Found::Item { module, name } | Found::MacroMade { module, name } => (module, name),
                Found::Module(_) | Found::External => return,
                Found::Unresolved(what) => {
                    problems.push(format!("host/src/{}: cannot resolve {what}", module.file));
                    return;
                }
            };
            // A module's parts may build on what the module's own file defines (its trait, its
            // error type): that is the hierarchy, not a circle.
            if to != m && !tree.encloses(to, m) {
                edges
                    .entry(module.file.clone())
                    .or_default()
                    .entry(tree.modules[to].file.clone())
                    .or_default()
                    .insert(name);
            }
        };
        let code_idents: BTreeSet<&str> = module
            .syntax
            .code
            .iter()
            .filter_map(|(t, _)| t.ident())
            .collect();
        for u in &module.syntax.uses {
            if externs.contains(&u.path[0]) && !tree.in_scope(m, &u.path[0]) {
                continue;
            }
            let found = tree.resolve_path(m, u.inline_depth, &u.path, FUEL);
            match &u.binding {
                // A re-export is no dependency of its own: only a use in the file's code is.
                Some(b) if u.public && !code_idents.contains(b.as_str()) => {
                    if let Found::Unresolved(_) = found {
                        add(found, &mut edges);
                    }
                }
                Some(_) => add(found, &mut edges),
                None => {
                    if let Found::Module(g) = found {
                        for ident in &code_idents {
                            if let found @ Found::Item { .. } =
                                tree.resolve_in(g, &[ident.to_string()], false, FUEL)
                            {
                                add(found, &mut edges)
                            }
                        }
                    }
                }
            }
        }
        let code = &module.syntax.code;
        for (j, (t, inline_depth)) in code.iter().enumerate() {
            let Some(first) = t.ident() else { continue };
            if j > 0 && code[j - 1].0 == Tok::PathSep {
                continue;
            }
            if code.get(j + 1).is_some_and(|(t, _)| t.is('!')) {
                if let Some(&def) = macros.get(&(module.root, &first.to_string())) {
                    add(
                        Found::Item {
                            module: def,
                            name: format!("{first}!"),
                        },
                        &mut edges,
                    );
                }
                continue;
            }
            let roots = ["crate", "super", "self"];
            let starts_path = roots.contains(&first)
                || (first == "sluice" && !tree.is_lib(m))
                || module.children.contains_key(first)
                || module
                    .syntax
                    .uses
                    .iter()
                    .any(|u| u.binding.as_deref() == Some(first));
            if !starts_path {
                continue;
            }
            let mut path = vec![first.to_string()];
            let mut k = j + 1;
            while code.get(k).is_some_and(|(t, _)| *t == Tok::PathSep) {
                match code.get(k + 1).and_then(|(t, _)| t.ident()) {
                    Some(seg) => path.push(seg.to_string()),
                    None => break,
                }
                k += 2;
            }
            if path.len() >= 2 {
                add(tree.resolve_path(m, *inline_depth, &path, FUEL), &mut edges);
            }
        }
    }
    edges
}

/// The top-level module a file belongs to: `bin` for the binaries, `crate` for `lib.rs`.
fn top_module(file: &str) -> String {
    if file.starts_with("bin/") {
        "bin".into()
    } else if file == "lib.rs" {
        "crate".into()
    } else {
        let first = file.split('/').next().unwrap_or(file);
        first.trim_end_matches(".rs").to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Circles and layers

/// The strongly connected components of more than one node (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// A shortest circle among `members` (a strongly connected component of `edges`), first node
/// repeated at the end. When one edge made the component, every circle in it, this one too,
/// goes through that edge.
fn shortest_circle(edges: &BTreeMap<String, BTreeSet<String>>, members: &[String]) -> Vec<String> {
    let mut best: Vec<String> = Vec::new();
    for start in members {
        // Breadth first from `start` back to it, within the component.
        let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        'search: while let Some(node) = queue.pop_front() {
            for next in edges.get(node).into_iter().flatten() {
                if !members.contains(next) {
                    continue;
                }
                if next == start {
                    let mut path = vec![start.clone()];
                    let mut at = node;
                    while at != start {
                        path.push(at.clone());
                        at = came_from[at];
                    }
                    path.push(start.clone());
                    path.reverse();
                    if best.is_empty() || path.len() < best.len() {
                        best = path;
                    }
                    break 'search;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
    }
    best
}

/// The layer line of `docs/architecture.md`: the fenced line after "Layers, top to bottom",
/// top layer first.
fn layer_line(doc: &str) -> Result<Vec<Vec<String>>, String> {
    const INTRO: &str = "Layers, top to bottom";
    let start = doc
        .find(INTRO)
        .ok_or(format!("docs/architecture.md has no \"{INTRO}\""))?;
    let after = &doc[start..];
    let open = after
        .find("```")
        .ok_or("docs/architecture.md: no fenced block after the layers' sentence")?;
    let body = &after[open + 3..];
    let body = &body[body.find('\n').map_or(0, |n| n + 1)..];
    let body = &body[..body.find("```").unwrap_or(body.len())];
    let line = body
        .lines()
        .find(|l| l.contains("->"))
        .ok_or("docs/architecture.md: the layers' fenced block has no `a -> b` line")?;
    Ok(line
        .split("->")
        .map(|layer| layer.split(',').map(|m| m.trim().to_string()).collect())
        .collect())
}

fn render_edge(out: &mut String, edges: &Edges, from: &str, to: &str) {
    let names: Vec<&str> = edges[from][to].iter().map(String::as_str).collect();
    let _ = writeln!(
        out,
        "    host/src/{from} -> host/src/{to}: {}",
        names.join(", ")
    );
}

/// Everything wrong with the layout, as a reviewer would want to read it; empty if nothing is.
fn check(sources: &Sources) -> String {
    let tree = Tree::build(&sources.files);
    let mut problems = tree.problems.clone();
    let edges = file_edges(&tree, &sources.externs, &mut problems);
    if std::env::var_os("LAYOUT_EDGES").is_some() {
        // Every edge, for a look at the whole graph (`LAYOUT_EDGES=1 cargo test --test layout
        // -- --nocapture`).
        let mut all = String::new();
        for (from, tos) in &edges {
            for to in tos.keys() {
                render_edge(&mut all, &edges, from, to);
            }
        }
        eprint!("{all}");
    }
    let mut out = String::new();

    // Files.
    let graph: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .map(|(from, tos)| (from.clone(), tos.keys().cloned().collect()))
        .collect();
    for circle in circles(&graph) {
        let _ = writeln!(out, "circle between files {}:", circle.join(", "));
        let shortest = shortest_circle(&graph, &circle).join(" -> ");
        let _ = writeln!(out, "  shortest: {shortest}");
        for from in &circle {
            for to in graph[from].iter().filter(|to| circle.contains(to)) {
                render_edge(&mut out, &edges, from, to);
            }
        }
        out.push('\n');
    }

    // Top-level modules: each module edge with the file edges that make it.
    let mut module_edges: BTreeMap<(String, String), Vec<(String, String)>> = BTreeMap::new();
    for (from, tos) in &edges {
        for to in tos.keys() {
            let (a, b) = (top_module(from), top_module(to));
            if a != b {
                module_edges
                    .entry((a, b))
                    .or_default()
                    .push((from.clone(), to.clone()));
            }
        }
    }
    let mut module_graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in module_edges.keys() {
        module_graph.entry(a.clone()).or_default().insert(b.clone());
    }
    for circle in circles(&module_graph) {
        let _ = writeln!(out, "circle between modules {}:", circle.join(", "));
        let shortest = shortest_circle(&module_graph, &circle).join(" -> ");
        let _ = writeln!(out, "  shortest: {shortest}");
        for ((a, b), files) in &module_edges {
            if circle.contains(a) && circle.contains(b) {
                let _ = writeln!(out, "  {a} -> {b}:");
                for (from, to) in files {
                    render_edge(&mut out, &edges, from, to);
                }
            }
        }
        out.push('\n');
    }

    // Layers.
    match layer_line(&sources.architecture) {
        Err(e) => problems.push(e),
        Ok(layers) => {
            let layer_of: BTreeMap<&str, usize> = layers
                .iter()
                .enumerate()
                .flat_map(|(i, l)| l.iter().map(move |m| (m.as_str(), i)))
                .collect();
            let lib = &tree.modules[tree.lib];
            let mut modules: BTreeSet<String> = lib.children.keys().cloned().collect();
            modules.insert("bin".into());
            for m in &modules {
                if !layer_of.contains_key(m.as_str()) {
                    problems.push(format!(
                        "module `{m}` (host/src/lib.rs) is not in the layer line of \
                         docs/architecture.md, so its imports are not checked against it"
                    ));
                }
            }
            for m in layer_of.keys() {
                if !modules.contains(*m) {
                    problems.push(format!(
                        "the layer line of docs/architecture.md names `{m}`, which is no \
                         module of host/src/lib.rs"
                    ));
                }
            }
            for ((a, b), files) in &module_edges {
                let (Some(&la), Some(&lb)) = (layer_of.get(a.as_str()), layer_of.get(b.as_str()))
                else {
                    continue;
                };
                if lb < la {
                    let _ = writeln!(
                        out,
                        "{a} imports from {b}, a layer above it (docs/architecture.md):"
                    );
                    for (from, to) in files {
                        render_edge(&mut out, &edges, from, to);
                    }
                    out.push('\n');
                }
            }
        }
    }

    if !problems.is_empty() {
        problems.sort();
        problems.dedup();
        out.push_str("the layout check could not follow:\n");
        for p in problems {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The check checked: on a made-up crate, it must see what it is meant to see.

fn made_up(files: &[(&str, &str)], layers: &str) -> Sources {
    Sources {
        files: files
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect(),
        externs: ["std".to_string()].into(),
        architecture: format!(
            "Layers, top to bottom; nothing imports from a layer above it:\n\n```\n{layers}\n```\n"
        ),
    }
}

#[test]
fn grouped_uses_are_read_leaf_by_leaf() {
    let toks = tokenize("pub(crate) use crate::{a, b::{c, d as e, self}, f::*};");
    let file = parse_file(&toks);
    let leaves: Vec<(String, Option<String>)> = file
        .uses
        .iter()
        .map(|u| (u.path.join("::"), u.binding.clone()))
        .collect();
    let expected = [
        ("crate::a", Some("a")),
        ("crate::b::c", Some("c")),
        ("crate::b::d", Some("e")),
        ("crate::b", Some("b")),
        ("crate::f", None),
    ]
    .map(|(p, b)| (p.to_string(), b.map(String::from)));
    assert_eq!(leaves, expected);
    assert!(file.uses.iter().all(|u| u.public));
}

#[test]
fn test_code_and_comments_are_left_out() {
    let toks = strip_test_code(&tokenize(
        "// use crate::x::Y;\n/* crate::z::W */ fn f() -> &'static str { \"crate::a::B\" }\n\
         #[cfg(test)]\nmod tests {\n    use crate::q::R;\n}\n",
    ));
    let file = parse_file(&toks);
    assert!(file.uses.is_empty(), "{:?}", file.uses);
    assert!(!file.code.iter().any(|(t, _)| t.is_ident("crate")));
    assert_eq!(file.items, ["f".to_string()].into());
}

#[test]
fn a_circle_and_a_back_edge_are_reported_with_their_names() {
    let sources = made_up(
        &[
            (
                "lib.rs",
                "pub mod low;\npub mod high;\n#[cfg(test)]\nmod fake;\n",
            ),
            // A re-export: the edge goes to where the name is defined.
            ("high/mod.rs", "mod one;\nmod two;\npub use one::Thing;\n"),
            (
                "high/one.rs",
                "use super::two::{Other, helper};\npub struct Thing;\nfn f() { helper(); }\n",
            ),
            (
                "high/two.rs",
                "pub struct Other(crate::high::Thing);\npub fn helper() {}\n",
            ),
            ("low.rs", "pub fn g() -> crate::high::Thing { todo!() }\n"),
            ("fake.rs", "use crate::low::g;\n"),
        ],
        "high  ->  low",
    );
    let report = check(&sources);
    assert!(
        report.contains("circle between files high/one.rs, high/two.rs"),
        "{report}"
    );
    assert!(
        report.contains("host/src/high/one.rs -> host/src/high/two.rs: Other, helper"),
        "{report}"
    );
    assert!(
        report.contains("host/src/high/two.rs -> host/src/high/one.rs: Thing"),
        "{report}"
    );
    assert!(
        report.contains("low imports from high, a layer above it"),
        "{report}"
    );
    assert!(
        report.contains("host/src/low.rs -> host/src/high/one.rs: Thing"),
        "{report}"
    );
    assert!(!report.contains("fake.rs"), "{report}");
    assert!(!report.contains("circle between modules"), "{report}");
}

#[test]
fn a_module_circle_and_an_unknown_name_are_reported() {
    let sources = made_up(
        &[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            (
                "b.rs",
                "pub struct B(crate::a::A);\nuse crate::a::Missing;\n",
            ),
            ("c.rs", "use std::fmt;\n"),
        ],
        "a  ->  b",
    );
    let report = check(&sources);
    assert!(report.contains("circle between modules a, b:"), "{report}");
    assert!(report.contains("cannot resolve Missing"), "{report}");
    assert!(
        report.contains("module `c` (host/src/lib.rs) is not in the layer line"),
        "{report}"
    );
}
