//! Issue 31: no module of a library crate imports, directly or through others, a
//! module that imports it back.
//!
//! Plain text scanning, no parser: for every library crate under `crates/` (its
//! `src/lib.rs` and the module files reached from it through `mod name;`, leaving
//! out `#[cfg(test)]` modules and every inline `mod tests { .. }`), the references
//! `use crate::a::b`, `crate::a::f(..)`, `super::..` (also inside `use` trees) are
//! edges from the file-level module they are in (`src/foo.rs` or `src/foo/mod.rs`
//! is `foo`, `src/foo/bar.rs` is `foo::bar`, `src/lib.rs` is `crate`) to the
//! deepest module file their path names (`crate::foo::bar::Item` is `foo::bar`
//! when that file exists, else `foo`). Comments and string literals are not
//! read. Not edges: `self::`, bare paths to a module's own children, and a
//! re-export (`pub use`) from a module of one of its own descendants, the facade
//! pattern (`pub mod prelude { pub use crate::a::X; }` in `lib.rs`).
//!
//! Every set of modules that reach each other (a strongly connected component
//! of two or more) is a problem, unless [`KNOWN_CYCLES`] lists it (or a larger
//! set containing it); an entry of [`KNOWN_CYCLES`] that no longer matches any
//! circle is a problem too, so that the list only shrinks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Circles that exist today, by crate and the modules in them: the guard lets
/// them (or any part of them) be, and fails on any other.
///
/// issue 31: to break.
const KNOWN_CYCLES: &[(&str, &[&str])] = &[];

/// The guard's problems: every circle of modules in a library crate under
/// `crates/` that [`KNOWN_CYCLES`] does not list, and every entry of it that is
/// gone.
pub(crate) fn module_cycle_problems() -> Result<Vec<String>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?;
    problems_in(&root.join("crates"), KNOWN_CYCLES)
}

/// A circle of one crate: its modules, and one shortest cycle through the first.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Circle {
    members: BTreeSet<String>,
    cycle: Vec<String>,
}

impl Circle {
    fn describe(&self, krate: &str) -> String {
        let mut path = self.cycle.clone();
        path.push(self.cycle[0].clone());
        let mut line = format!(
            "crate {krate}: modules {} import each other in a circle",
            path.join(" -> ")
        );
        let others: Vec<&str> = self
            .members
            .iter()
            .filter(|m| !self.cycle.contains(m))
            .map(String::as_str)
            .collect();
        if !others.is_empty() {
            line.push_str(&format!(" (also in it: {})", others.join(", ")));
        }
        line
    }
}

fn problems_in(crates_dir: &Path, known: &[(&str, &[&str])]) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let mut matched = vec![false; known.len()];
    for (krate, src) in library_crates(crates_dir)? {
        for circle in circles(&module_graph(&src)?) {
            let allowed = known.iter().enumerate().find(|(_, (k, members))| {
                *k == krate && circle.members.iter().all(|m| members.contains(&m.as_str()))
            });
            match allowed {
                Some((i, _)) => matched[i] = true,
                None => problems.push(circle.describe(&krate)),
            }
        }
    }
    for ((krate, members), seen) in known.iter().zip(matched) {
        if !seen {
            problems.push(format!(
                "crate {krate}: KNOWN_CYCLES lists the circle of modules {}, which no longer exists as such: update the list in xtask/src/module_cycles.rs",
                members.join(", ")
            ));
        }
    }
    Ok(problems)
}

/// Every `crates/*` with a `src/lib.rs`: the package's name and its `src`.
fn library_crates(crates_dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries = std::fs::read_dir(crates_dir)
        .map_err(|e| format!("reading {}: {e}", crates_dir.display()))?;
    let mut crates = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        if !dir.join("src/lib.rs").is_file() {
            continue;
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        let name = package_name(&manifest)
            .or_else(|| entry.file_name().into_string().ok())
            .unwrap_or_default();
        crates.push((name, dir.join("src")));
    }
    crates.sort();
    Ok(crates)
}

/// `name = "..."` of the `[package]` section.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if key.trim() == "name" {
                return Some(value.trim().trim_matches('"').to_owned());
            }
        }
    }
    None
}

/// A module's name as the problems print it: `crate` for the root, else `a::b`.
fn display(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

/// The crate's modules (by name, see [`display`]) and which others each imports.
fn module_graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    // The module files, breadth first from lib.rs.
    let mut scanned: BTreeMap<Vec<String>, Scan> = BTreeMap::new();
    let mut queue = VecDeque::from([(Vec::<String>::new(), src.join("lib.rs"))]);
    while let Some((path, file)) = queue.pop_front() {
        if scanned.contains_key(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let scan = scan(&tokens(&text));
        let is_dir_owner = path.is_empty() || file.file_name().is_some_and(|n| n == "mod.rs");
        let dir = if is_dir_owner {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        for child in &scan.children {
            let (last, inline) = child.split_last().expect("a child has a name");
            let base = inline.iter().fold(dir.clone(), |d, s| d.join(s));
            let flat = base.join(format!("{last}.rs"));
            let nested = base.join(last).join("mod.rs");
            let child_file = if flat.is_file() { flat } else { nested };
            if child_file.is_file() {
                let mut child_path = path.clone();
                child_path.extend(child.iter().cloned());
                queue.push_back((child_path, child_file));
            }
        }
        scanned.insert(path, scan);
    }
    let modules: BTreeSet<Vec<String>> = scanned.keys().cloned().collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, scan) in &scanned {
        let edges = graph.entry(display(path)).or_default();
        for reference in &scan.references {
            if let Some(target) = resolve(path, reference, &modules) {
                edges.insert(display(&target));
            }
        }
    }
    Ok(graph)
}

/// The module file a reference from module `from` depends on, if it counts.
fn resolve(
    from: &[String],
    reference: &Reference,
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let segments = &reference.segments;
    let mut full: Vec<String> = match segments.first()?.as_str() {
        "crate" => segments[1..].to_vec(),
        "super" => {
            let mut base: Vec<String> = from.to_vec();
            base.extend(reference.inline.iter().cloned());
            let supers = segments.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop()?;
            }
            base.extend(segments[supers..].iter().cloned());
            base
        }
        _ => return None,
    };
    if full.last().is_some_and(|s| s == "self") {
        full.pop();
    }
    let mut target = Vec::new();
    for segment in full {
        target.push(segment);
        if !modules.contains(&target) {
            target.pop();
            break;
        }
    }
    let counts = target != from && !(reference.re_export && target.starts_with(from));
    counts.then_some(target)
}

/// Each set of two or more modules that reach each other, with a shortest cycle
/// from its first module, in a stable order.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Circle> {
    let reach = |start: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start.to_owned()];
        while let Some(n) = stack.pop() {
            for next in graph.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|n| (n, reach(n))).collect();
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut found = Vec::new();
    for (node, from_node) in &reaches {
        if done.contains(*node) {
            continue;
        }
        let members: BTreeSet<String> = from_node
            .iter()
            .filter(|m| reaches.get(m).is_some_and(|r| r.contains(*node)))
            .cloned()
            .chain(std::iter::once((*node).clone()))
            .collect();
        done.extend(members.iter().cloned());
        if members.len() < 2 {
            continue;
        }
        // Shortest way from `node` back to itself inside the circle.
        let mut previous: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = VecDeque::from([(*node).clone()]);
        'search: while let Some(n) = queue.pop_front() {
            for next in graph.get(&n).into_iter().flatten() {
                if !members.contains(next) {
                    continue;
                }
                if next == *node {
                    previous.insert(String::new(), n.clone());
                    break 'search;
                }
                if !previous.contains_key(next) {
                    previous.insert(next.clone(), n.clone());
                    queue.push_back(next.clone());
                }
            }
        }
        let mut cycle = Vec::new();
        let mut at = previous.get("").cloned();
        while let Some(n) = at {
            if n == **node {
                break;
            }
            at = previous.get(&n).cloned();
            cycle.push(n);
        }
        cycle.push((*node).clone());
        cycle.reverse();
        found.push(Circle { members, cycle });
    }
    found
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// The tokens of Rust source that matter here: comments, string, char and number
/// literals and lifetimes are dropped.
fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    // The end of a quoted string whose opening `"` is at `start`.
    let skip_string = |mut i: usize| -> usize {
        i += 1;
        while i < c.len() && c[i] != '"' {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(i);
        } else if ch == '\'' {
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1; // a lifetime or label: its name is an identifier
            }
        } else if ch == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let hashes = c[i..].iter().take_while(|h| **h == '#').count();
            let quote = c.get(i + hashes) == Some(&'"');
            if matches!(word.as_str(), "r" | "br" | "cr") && quote {
                // A raw string: up to `"` and as many `#`.
                i += hashes + 1;
                while i < c.len() {
                    if c[i] == '"' && c[i + 1..].iter().take_while(|h| **h == '#').count() >= hashes
                    {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
            } else if matches!(word.as_str(), "b" | "c") && hashes == 0 && quote {
                i = skip_string(i);
            } else if word == "r" && hashes == 1 {
                i += 1; // a raw identifier follows
            } else {
                out.push(Token::Ident(word));
            }
        } else {
            if !ch.is_whitespace() {
                out.push(Token::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// A `crate::`/`super::` path found in a module file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    /// The inline (non-test) modules it is inside, outermost first.
    inline: Vec<String>,
    segments: Vec<String>,
    /// Part of a `pub use` (any visibility).
    re_export: bool,
}

/// What a module file declares and refers to.
#[derive(Debug, Default)]
struct Scan {
    /// `mod name;` (not `#[cfg(test)]`), with the inline modules it is inside.
    children: Vec<Vec<String>>,
    references: Vec<Reference>,
}

fn ident(tokens: &[Token], i: usize) -> Option<&str> {
    match tokens.get(i) {
        Some(Token::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The index after the bracket that closes the one at `i`.
fn skip_group(tokens: &[Token], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < tokens.len() {
        match tokens[i] {
            Token::Punct('{' | '[' | '(') => depth += 1,
            Token::Punct('}' | ']' | ')') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

fn scan(tokens: &[Token]) -> Scan {
    let mut scan = Scan::default();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut cfg_test = false;
    let mut i = 0;
    let inline_names =
        |inline: &[(String, usize)]| inline.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('#') => {
                let open = if tokens.get(i + 1) == Some(&Token::Punct('!')) {
                    i + 2
                } else {
                    i + 1
                };
                if tokens.get(open) != Some(&Token::Punct('[')) {
                    i += 1;
                    continue;
                }
                let end = skip_group(tokens, open);
                let is_cfg_test = end == open + 6
                    && ident(tokens, open + 1) == Some("cfg")
                    && tokens[open + 2] == Token::Punct('(')
                    && ident(tokens, open + 3) == Some("test")
                    && tokens[open + 4] == Token::Punct(')');
                cfg_test |= is_cfg_test;
                i = end;
            }
            Token::Punct('{') => {
                depth += 1;
                cfg_test = false;
                i += 1;
            }
            Token::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                cfg_test = false;
                i += 1;
            }
            Token::Punct(';') => {
                cfg_test = false;
                i += 1;
            }
            Token::Ident(word) if word == "mod" && ident(tokens, i + 1).is_some() => {
                let name = ident(tokens, i + 1).unwrap_or_default().to_owned();
                match tokens.get(i + 2) {
                    Some(Token::Punct('{')) if cfg_test || name == "tests" => {
                        i = skip_group(tokens, i + 2);
                    }
                    Some(Token::Punct('{')) => {
                        inline.push((name, depth));
                        depth += 1;
                        i += 3;
                    }
                    Some(Token::Punct(';')) => {
                        if !cfg_test {
                            let mut child = inline_names(&inline);
                            child.push(name);
                            scan.children.push(child);
                        }
                        i += 3;
                    }
                    _ => i += 2,
                }
                cfg_test = false;
            }
            Token::Ident(word) if word == "use" => {
                let re_export = is_pub_before(tokens, i);
                let mut paths = Vec::new();
                let mut j = i + 1;
                if tokens.get(j) == Some(&Token::PathSep) {
                    j += 1;
                }
                use_tree(tokens, &mut j, Vec::new(), &mut paths);
                for segments in paths {
                    scan.references.push(Reference {
                        inline: inline_names(&inline),
                        segments,
                        re_export,
                    });
                }
                i = j;
            }
            Token::Ident(word)
                if (word == "crate" || word == "super")
                    && tokens.get(i + 1) == Some(&Token::PathSep)
                    && i.checked_sub(1).map(|p| &tokens[p]) != Some(&Token::Punct('$'))
                    && i.checked_sub(1).and_then(|p| ident(tokens, p)) != Some("in") =>
            {
                let mut segments = vec![word.clone()];
                let mut j = i + 1;
                while tokens.get(j) == Some(&Token::PathSep) {
                    let Some(next) = ident(tokens, j + 1) else {
                        break;
                    };
                    segments.push(next.to_owned());
                    j += 2;
                }
                scan.references.push(Reference {
                    inline: inline_names(&inline),
                    segments,
                    re_export: false,
                });
                i = j;
            }
            _ => i += 1,
        }
    }
    scan
}

/// Whether the `use` at `i` has a visibility (`pub`, `pub(crate)`, ...).
fn is_pub_before(tokens: &[Token], i: usize) -> bool {
    let Some(mut p) = i.checked_sub(1) else {
        return false;
    };
    if tokens[p] == Token::Punct(')') {
        while p > 0 && tokens[p] != Token::Punct('(') {
            p -= 1;
        }
        let Some(before) = p.checked_sub(1) else {
            return false;
        };
        p = before;
    }
    ident(tokens, p) == Some("pub")
}

/// The paths of the `use` tree at `*i` (after `prefix`); leaves `*i` after it.
fn use_tree(tokens: &[Token], i: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    loop {
        match tokens.get(*i) {
            Some(Token::Punct('{')) => {
                *i += 1;
                while *i < tokens.len() {
                    match tokens[*i] {
                        Token::Punct('}') => {
                            *i += 1;
                            return;
                        }
                        Token::Punct(',') => *i += 1,
                        _ => {
                            let before = *i;
                            use_tree(tokens, i, prefix.clone(), out);
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
                return;
            }
            Some(Token::Punct('*')) => {
                *i += 1;
                out.push(prefix);
                return;
            }
            Some(Token::Ident(segment)) => {
                prefix.push(segment.clone());
                *i += 1;
                if tokens.get(*i) == Some(&Token::PathSep) {
                    *i += 1;
                    continue;
                }
                if ident(tokens, *i) == Some("as") {
                    *i += 2;
                }
                out.push(prefix);
                return;
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory with `files` (path, text) under it.
    fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("xtask-module-cycles-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let file = dir.join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
            std::fs::write(file, text).expect("write");
        }
        dir
    }

    const MANIFEST: &str =
        "[package]\nname = \"demo\"\nversion = \"0.1.0\"\n\n[dependencies]\nname = \"not-this\"\n";

    #[test]
    fn circles_are_reported_naming_their_modules() {
        let dir = tree(
            "circles",
            &[
                ("demo/Cargo.toml", MANIFEST),
                (
                    "demo/src/lib.rs",
                    "//! `crate::a` in a comment is no edge.\nmod a;\nmod b;\nmod c;\nmod d;\nmod e;\nmod f;\npub use a::A;\n",
                ),
                (
                    "demo/src/a.rs",
                    "use crate::b::B;\npub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::f::F;\n}\n",
                ),
                (
                    "demo/src/b.rs",
                    "use crate::{a::A, f};\npub struct B;\nfn g() { let _ = \"crate::e::E\"; }\n",
                ),
                (
                    "demo/src/c.rs",
                    "pub struct C;\nfn g() -> crate::d::D { crate::d::inner::make() }\n",
                ),
                (
                    "demo/src/d/mod.rs",
                    "pub(crate) mod inner;\npub struct D;\n",
                ),
                (
                    "demo/src/d/inner.rs",
                    "use super::super::e::E;\npub fn make() -> super::D { super::D }\n",
                ),
                ("demo/src/e.rs", "pub struct E;\nfn g(_: crate::c::C) {}\n"),
                ("demo/src/f.rs", "pub struct F;\nfn g(_: crate::a::A) {}\n"),
                ("lib-less/Cargo.toml", "[package]\nname = \"bin\"\n"),
                ("lib-less/src/main.rs", "mod x;\n"),
            ],
        );
        let problems = problems_in(&dir, &[]).expect("scanned");
        assert_eq!(
            problems,
            [
                "crate demo: modules a -> b -> a import each other in a circle (also in it: f)",
                "crate demo: modules c -> d::inner -> e -> c import each other in a circle",
            ]
        );
        // Known, they pass; one that is gone is a problem.
        let known: &[(&str, &[&str])] = &[
            ("demo", &["a", "b", "f"]),
            ("demo", &["c", "d::inner", "e"]),
            ("demo", &["d", "a"]),
        ];
        assert_eq!(
            problems_in(&dir, known).expect("scanned"),
            [
                "crate demo: KNOWN_CYCLES lists the circle of modules d, a, which no longer exists as such: update the list in xtask/src/module_cycles.rs"
            ]
        );
        // A circle larger than the one known fails.
        let smaller: &[(&str, &[&str])] =
            &[("demo", &["a", "b"]), ("demo", &["c", "d::inner", "e"])];
        assert_eq!(
            problems_in(&dir, smaller).expect("scanned"),
            [
                "crate demo: modules a -> b -> a import each other in a circle (also in it: f)",
                "crate demo: KNOWN_CYCLES lists the circle of modules a, b, which no longer exists as such: update the list in xtask/src/module_cycles.rs",
            ]
        );
        std::fs::remove_dir_all(dir).expect("cleaned up");
    }

    #[test]
    fn a_tree_without_circles_passes() {
        // Each reference that must not count would close a circle if it did.
        let dir = tree(
            "acyclic",
            &[
                ("demo/Cargo.toml", MANIFEST),
                (
                    "demo/src/lib.rs",
                    "mod model;\nmod routes;\nmod ui;\npub use routes::router;\npub mod prelude {\n    pub use crate::ui::Page;\n}\n#[cfg(test)]\nmod fake;\n",
                ),
                ("demo/src/model.rs", "pub struct Item;\n"),
                (
                    "demo/src/routes.rs",
                    "use crate::model::{self, Item};\nuse crate::ui::render::html;\npub fn router() { crate::fake::x(); }\n",
                ),
                ("demo/src/fake.rs", "use crate::routes::router;\n"),
                (
                    "demo/src/ui/mod.rs",
                    "mod pages;\npub(crate) mod render;\nmod session;\npub struct Page;\nfn route() { pages::page(); self::session::login(); crate::router(); }\n#[cfg(test)]\nmod tests {\n    use crate::ui::session::*;\n}\n",
                ),
                (
                    "demo/src/ui/render.rs",
                    "use super::Page;\npub fn html(_: Page) -> &'static str { \"super::pages::x\" }\n",
                ),
                (
                    "demo/src/ui/pages.rs",
                    "use super::render::html;\nuse super::session::Session;\nuse crate::routes;\npub fn page() -> char { '{' }\n",
                ),
                (
                    "demo/src/ui/session.rs",
                    "use super::{render, Page};\npub struct Session;\npub fn login() { r#\"a \" crate::ui::pages\"#; }\n",
                ),
            ],
        );
        assert_eq!(
            problems_in(&dir, &[]).expect("scanned"),
            Vec::<String>::new()
        );
        std::fs::remove_dir_all(dir).expect("cleaned up");
    }

    #[test]
    fn references_are_read_from_use_trees_and_paths() {
        let scan = scan(&tokens(
            "pub(crate) use crate::{a::{self, X as Y}, b::*};\nuse std::fmt;\nfn f() { $crate::no(); super::s::g::<u8>(); }\npub(in crate::z) struct Z;\n",
        ));
        let segments: Vec<String> = scan
            .references
            .iter()
            .map(|r| format!("{} {}", r.re_export, r.segments.join("::")))
            .collect();
        assert_eq!(
            segments,
            [
                "true crate::a::self",
                "true crate::a::X",
                "true crate::b",
                "false std::fmt",
                "false super::s::g",
            ]
        );
    }
}
