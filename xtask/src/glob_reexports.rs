//! Issue 48: no glob re-export (`pub use some_crate::*;`) at the root of a crate
//! users depend on. A glob makes every internal of the other crate a public name
//! of this one (the facade once listed 199 items, `DispatchMachine` and
//! `saturating_elapsed` among them), and a name added there silently joins this
//! crate's API. A glob inside a module (`pub mod prelude { pub use ..::*; }`) is
//! that module's business and passes.
//!
//! Plain text scanning: in `src/lib.rs`, outside comments and string literals, a
//! `pub use` statement at brace depth 0 whose path contains `*`.

use std::path::Path;

/// The crates users depend on, by directory under `crates/`.
pub(crate) const USER_CRATES: &[&str] = &[
    "outbox",
    "outbox-app",
    "outbox-admin",
    "outbox-adapters-memory",
    "outbox-adapters-postgres",
    "outbox-adapters-rabbitmq",
    "outbox-adapters-redis",
    "outbox-testkit",
];

/// The guard's problems: one per glob re-export at the root of a crate of
/// [`USER_CRATES`].
pub(crate) fn glob_reexport_problems() -> Result<Vec<String>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?;
    let mut problems = Vec::new();
    for krate in USER_CRATES {
        let path = root.join("crates").join(krate).join("src/lib.rs");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        for (line, statement) in root_globs(&text) {
            problems.push(format!(
                "crates/{krate}/src/lib.rs:{line}: `{statement}` re-exports every public item of another crate at the root; name what users need (issue 48)"
            ));
        }
    }
    Ok(problems)
}

/// The glob `pub use` statements at brace depth 0 of `source`, with the line
/// each starts on.
fn root_globs(source: &str) -> Vec<(usize, String)> {
    let code = strip_comments_and_strings(source);
    let mut found = Vec::new();
    let mut depth = 0_i32;
    let mut statement: Option<(usize, String)> = None;
    for (i, line) in code.lines().enumerate() {
        for (j, c) in line.char_indices() {
            if let Some((_, text)) = &mut statement {
                text.push(c);
                if c == ';' {
                    let (at, text) = statement.take().unwrap_or_default();
                    if text.contains('*') {
                        found.push((at, text.split_whitespace().collect::<Vec<_>>().join(" ")));
                    }
                }
                continue;
            }
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                'p' if depth == 0 && line[j..].starts_with("pub use ") => {
                    statement = Some((i + 1, "p".to_owned()));
                }
                _ => {}
            }
        }
        if let Some((_, text)) = &mut statement {
            text.push(' ');
        }
    }
    found
}

/// `source` with comments and the contents of string literals blanked out, line
/// breaks kept.
fn strip_comments_and_strings(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                    }
                    if last == '*' && d == '/' {
                        break;
                    }
                    last = d;
                }
            }
            '"' => {
                out.push('"');
                let mut escaped = false;
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                    }
                    if !escaped && d == '"' {
                        break;
                    }
                    escaped = !escaped && d == '\\';
                }
                out.push('"');
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::root_globs;

    #[test]
    fn a_root_glob_is_found_with_its_line() {
        let src = "//! Docs.\n\npub use outbox_core::*;\npub use outbox_ports as ports;\n";
        assert_eq!(root_globs(src), [(3, "pub use outbox_core::*;".to_owned())]);
    }

    #[test]
    fn a_glob_in_a_multi_line_group_is_found() {
        let src = "pub use a::{\n    B,\n    c::*,\n};\n";
        assert_eq!(root_globs(src).len(), 1);
        assert_eq!(root_globs(src)[0].0, 1);
    }

    #[test]
    fn globs_in_modules_comments_and_strings_pass() {
        let src = "pub mod prelude {\n    pub use outbox_ports::prelude::*;\n}\n// pub use a::*;\n/* pub use b::*; */\nconst S: &str = \"pub use c::*;\";\npub use d::{E, F};\n";
        assert!(root_globs(src).is_empty(), "{:?}", root_globs(src));
    }
}
