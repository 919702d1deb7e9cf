//! The layer rule, checked: a module imports only from layers below its own, and within a layer
//! without cycles.
//!
//! The layers are the table in `docs/architecture.md` (its single source). The import graph is
//! read from `src/`: every `crate::…` path outside comments and test code, `use crate::{…}`
//! groups included, and `super::…` paths resolved from the file's place. A path belongs to the
//! longest table entry that prefixes it (`upstream::connect` before `upstream`), so a module and
//! one of its children may sit in different layers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One row of the layer table: its rank (0 = bottom), its name and its modules.
struct Layer {
    rank: usize,
    name: String,
}

/// Reads the table under the heading `## Layers` of docs/architecture.md: rows
/// `| rank | name | `module`, `module` |`.
fn layers(doc: &str) -> BTreeMap<String, Layer> {
    let section = doc
        .split("\n## Layers")
        .nth(1)
        .expect("docs/architecture.md has a `## Layers` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.trim_start().starts_with('|')) {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let Some(rank) = cells.first().and_then(|c| c.parse::<usize>().ok()) else {
            continue;
        };
        assert!(
            cells.len() >= 3,
            "a layer row needs rank, name and modules: {line}"
        );
        for module in cells[2].split(',') {
            let module = module.trim().trim_matches('`').trim();
            if module.is_empty() {
                continue;
            }
            let previous = out.insert(
                module.to_string(),
                Layer {
                    rank,
                    name: cells[1].to_string(),
                },
            );
            assert!(previous.is_none(), "`{module}` is listed twice");
        }
    }
    assert!(!out.is_empty(), "the layer table has no rows");
    out
}

/// Every source file of the library with its module path (`pool::select` for
/// src/pool/select.rs, `pool` for src/pool/mod.rs). Test-only files (`tests.rs`, `tests/`) and
/// the binary's `main.rs` are left out, and so is `lib.rs`, which only declares the modules.
fn sources(root: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "tests") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap();
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["main"] || parts == ["lib"] || parts.last().is_some_and(|p| p == "tests") {
                continue;
            }
            out.push((path, parts));
        }
    }
    out.sort();
    out
}

/// The text with comments, string and char literals blanked and `#[cfg(test)]` items cut.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            // Raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('a', '\n', '\''), not a lifetime.
            i += if b[i + 1] == b'\\' { 2 } else { 1 };
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    cut_test_items(&out)
}

/// Removes every item that follows `#[cfg(test)]`: up to its matching closing brace, or its `;`.
fn cut_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads a path after `crate::` (or `super::`) at `s`: its segments, and for a `{…}` group every
/// path inside it, each prefixed.
fn read_paths(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut segs = prefix;
    let mut i = 0;
    let b = s.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    out.push(segs.clone());
                    return i + 1;
                }
                i += read_paths(&s[i..], segs.clone(), out);
            }
        }
        let start = i;
        while i < b.len() && is_ident(b[i] as char) {
            i += 1;
        }
        if i == start {
            out.push(segs);
            return i;
        }
        let seg = &s[start..i];
        if seg != "self" {
            segs.push(seg.to_string());
        }
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(segs);
            return i;
        }
    }
}

/// Every module path the code of module `me` names through `crate::` or `super::`.
fn references(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && is_ident(code[..at].chars().next_back().unwrap_or(' ')) {
            continue;
        }
        read_paths(&code[at + "crate::".len()..], Vec::new(), &mut out);
    }
    for (at, _) in code.match_indices("super::") {
        if at > 0 {
            let before = code[..at].chars().next_back().unwrap_or(' ');
            if is_ident(before) || before == ':' {
                continue;
            }
        }
        // `super` is the parent of the module path (for src/p/mod.rs, module `p`, the crate).
        let mut base: Vec<String> = me.to_vec();
        let mut s = &code[at..];
        while let Some(rest) = s.strip_prefix("super::") {
            base.pop();
            s = rest;
        }
        read_paths(s, base, &mut out);
    }
    out
}

/// Paths that start with the name of a child module the file declares (`mod lease;` then
/// `pub use lease::Lease`): references from a module to its children, written without `self::`.
fn child_references(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut children = Vec::new();
    for (at, _) in code.match_indices("mod ") {
        if at > 0 && is_ident(code[..at].chars().next_back().unwrap_or(' ')) {
            continue;
        }
        let rest = &code[at + 4..];
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if !name.is_empty() && rest[name.len()..].trim_start().starts_with(';') {
            children.push(name);
        }
    }
    let mut out = Vec::new();
    for child in children {
        let needle = format!("{child}::");
        for (at, _) in code.match_indices(&needle) {
            if at > 0 {
                let before = code[..at].chars().next_back().unwrap_or(' ');
                if is_ident(before) || before == ':' {
                    continue;
                }
            }
            let mut base = me.to_vec();
            base.push(child.clone());
            read_paths(&code[at + needle.len()..], base, &mut out);
        }
    }
    out
}

/// The table entry a module path belongs to: its longest prefix that the table lists.
fn unit_of(path: &[String], table: &BTreeMap<String, Layer>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|p| table.contains_key(p))
}

/// The import graph between table entries, each edge with a file that makes it.
fn graph(root: &Path, table: &BTreeMap<String, Layer>) -> BTreeMap<(String, String), PathBuf> {
    let mut edges = BTreeMap::new();
    let mut unlisted = BTreeSet::new();
    for (file, module) in sources(root) {
        let Some(from) = unit_of(&module, table) else {
            unlisted.insert(module.join("::"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let code = code_only(&text);
        let mut paths = references(&code, &module);
        paths.extend(child_references(&code, &module));
        for path in paths {
            if path.is_empty() {
                continue;
            }
            let Some(to) = unit_of(&path, table) else {
                unlisted.insert(path[0].clone());
                continue;
            };
            if to != from {
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| file.clone());
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "modules missing from the layer table in docs/architecture.md: {unlisted:?}"
    );
    edges
}

/// Strongly connected groups of more than one entry (Tarjan, iteratively small enough here).
fn cycles(edges: &BTreeMap<(String, String), PathBuf>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    // Reachability by depth-first search from every node: fine for a few dozen entries.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for m in next.get(n).into_iter().flatten() {
                if seen.insert(m.to_string()) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<String>> = next.keys().map(|n| (*n, reach(n))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for n in next.keys() {
        if placed.contains(*n) || !reaches[n].contains(*n) {
            continue;
        }
        let group: Vec<String> = reaches[n]
            .iter()
            .filter(|m| reaches[m.as_str()].contains(*n))
            .cloned()
            .collect();
        placed.extend(group.iter().cloned());
        groups.push(group);
    }
    groups
}

#[test]
fn modules_import_only_from_lower_layers_and_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let table = layers(&doc);
    let edges = graph(&root.join("src"), &table);
    let mut problems = Vec::new();
    for ((from, to), file) in &edges {
        let (a, b) = (&table[from], &table[to]);
        if b.rank > a.rank {
            problems.push(format!(
                "{from} (layer {} {}) imports {to} (layer {} {}), in {}",
                a.rank,
                a.name,
                b.rank,
                b.name,
                file.strip_prefix(root).unwrap_or(file).display()
            ));
        }
    }
    for group in cycles(&edges) {
        // The edges that close the cycle: those that do not run down a layer.
        let in_group: Vec<String> = edges
            .iter()
            .filter(|((a, b), _)| {
                group.contains(a) && group.contains(b) && table[b].rank >= table[a].rank
            })
            .map(|((a, b), f)| {
                format!(
                    "{a} -> {b} ({})",
                    f.strip_prefix(root).unwrap_or(f).display()
                )
            })
            .collect();
        problems.push(format!("import cycle {group:?}: {}", in_group.join(", ")));
    }
    // Every listed entry is a module that exists.
    let modules: BTreeSet<String> = sources(&root.join("src"))
        .into_iter()
        .map(|(_, m)| m.join("::"))
        .collect();
    for entry in table.keys() {
        if !modules.contains(entry) {
            problems.push(format!(
                "the table lists `{entry}`, which is no module of src/"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} layer problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_reader_sees_groups_nested_paths_and_skips_comments_and_tests() {
    let code = code_only(
        "use crate::{a::{b, c::D}, e};\n// crate::x\nlet s = \"crate::y\";\n\
         fn f() { crate::g::h(); }\n#[cfg(test)]\nmod tests { use crate::z; }\n",
    );
    let refs = references(&code, &["m".to_string()]);
    let joined: BTreeSet<String> = refs.iter().map(|p| p.join("::")).collect();
    for want in ["a::b", "a::c::D", "e", "g::h"] {
        assert!(joined.contains(want), "{want} missing from {joined:?}");
    }
    for never in ["x", "y", "z"] {
        assert!(!joined.iter().any(|p| p.starts_with(never)), "{never} read");
    }
    let sup = references(&code_only("use super::x::Y;"), &["p".into(), "q".into()]);
    assert_eq!(sup[0], vec!["p", "x", "Y"]);
    let sup = references(&code_only("use super::x;"), &["p".into()]);
    assert_eq!(sup[0], vec!["x"]);
}
