//! The configuration reference, `docs/configuration.md`, against the keys the config file really
//! accepts.
//!
//! The accepted keys come from the config structs themselves, not from a list kept by hand: every
//! table of the file rejects unknown keys, and serde's refusal names the keys it expected
//! ("unknown field `zz_probe`, expected one of `a`, `b`, ..."). So a section is asked by feeding
//! it the key `zz_probe`, and each accepted key is asked in turn whether it is itself a table (a
//! nested section) or a map of tables (`[pools.<name>]`, `[auth.users.<name>]`). New sections are
//! found that way without touching this file.
//!
//! The reference lists a section as a heading naming it in backticks (`` ### `[pools.<name>]` ``,
//! or `### Top level` for the keys outside any table) followed by a table whose first column is
//! the key in backticks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use poolgate::config::Config;

const REFERENCE: &str = "docs/configuration.md";
const PROBE_KEY: &str = "zz_probe";
/// Stands for any name in a map of tables: a pool's, a user's.
const ANY_NAME: &str = "<name>";
/// Sections nest no deeper than `[pools.<name>.health]`; a little room for more.
const MAX_DEPTH: usize = 6;

/// A section of the config file as the reference writes it: `""` for the top level,
/// `server`, `pools.<name>.health`.
type Section = String;

/// What loading `text` says, or `None` when it loads.
fn load_error(text: &str) -> Option<String> {
    Config::parse(text, "probe.toml", None)
        .err()
        .map(|e| e.problems.join("\n"))
}

/// The TOML that puts `body` inside the section at `path` (`<name>` becomes a concrete name).
fn inside(path: &[String], body: &str) -> String {
    if path.is_empty() {
        return body.to_string();
    }
    let header: Vec<&str> = path
        .iter()
        .map(|s| if s == ANY_NAME { "zz_name" } else { s.as_str() })
        .collect();
    format!("[{}]\n{body}", header.join("."))
}

/// The keys serde says it expected, read from its unknown-field message about `field`:
/// "expected one of `a`, `b`", "expected `a` or `b`", "expected `a`", or "there are no fields".
/// The message may carry anything before it (a line number, a key path) and after it (context on
/// the next lines). `None` when the message is not about `field` being unknown.
fn expected_fields(message: &str, field: &str) -> Option<BTreeSet<String>> {
    let marker = format!("unknown field `{field}`");
    let rest = &message[message.find(&marker)? + marker.len()..];
    let rest = rest.lines().next().unwrap_or("");
    if rest.contains("there are no fields") {
        return Some(BTreeSet::new());
    }
    let list = &rest[rest.find("expected")? + "expected".len()..];
    let list = list.trim_start().trim_start_matches("one of").trim_start();
    let mut keys = BTreeSet::new();
    let mut parts = list.split('`');
    // Between backticks: a key; outside them: only separators (", ", " or ") may come before
    // the next key, anything else ends the list.
    let mut separator = parts.next().unwrap_or("");
    while let Some(key) = parts.next() {
        if !matches!(separator.trim(), "" | "," | "or" | ", or") {
            break;
        }
        keys.insert(key.to_string());
        match parts.next() {
            Some(next) => separator = next,
            None => break,
        }
    }
    Some(keys)
}

/// The keys the section at `path` accepts, from the loader's refusal of `zz_probe` there.
fn accepted_keys(path: &[String]) -> BTreeSet<String> {
    let text = inside(path, &format!("{PROBE_KEY} = 1\n"));
    let error = load_error(&text).unwrap_or_else(|| {
        panic!("the config loader accepted the unknown key `{PROBE_KEY}` in:\n{text}")
    });
    expected_fields(&error, PROBE_KEY).unwrap_or_else(|| {
        panic!(
            "no \"unknown field `{PROBE_KEY}`\" refusal for:\n{text}\nthe loader said:\n{error}\n\
             (the test reads the accepted keys from serde's \"expected one of\" list)"
        )
    })
}

/// Whether `key` of the section at `path` is itself a table that rejects unknown keys.
fn is_table(path: &[String], key: &str) -> bool {
    let text = inside(path, &format!("{key} = {{ {PROBE_KEY} = 1 }}\n"));
    load_error(&text).is_some_and(|e| expected_fields(&e, PROBE_KEY).is_some())
}

/// Whether `key` of the section at `path` is a map of named tables that reject unknown keys.
fn is_map_of_tables(path: &[String], key: &str) -> bool {
    let text = inside(
        path,
        &format!("{key} = {{ zz_name = {{ {PROBE_KEY} = 1 }} }}\n"),
    );
    load_error(&text).is_some_and(|e| expected_fields(&e, PROBE_KEY).is_some())
}

fn section_name(path: &[String]) -> Section {
    path.join(".")
}

/// Every section of the config file and the keys it accepts, found from the top level down.
fn accepted_sections() -> BTreeMap<Section, BTreeSet<String>> {
    let mut sections = BTreeMap::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        assert!(
            path.len() <= MAX_DEPTH,
            "config sections nest too deep: {path:?}"
        );
        let keys = accepted_keys(&path);
        for key in &keys {
            let mut sub = path.clone();
            sub.push(key.clone());
            if is_table(&path, key) {
                todo.push(sub);
            } else if is_map_of_tables(&path, key) {
                sub.push(ANY_NAME.to_string());
                todo.push(sub);
            }
        }
        let previous = sections.insert(section_name(&path), keys);
        assert!(previous.is_none(), "section {path:?} found twice");
    }
    sections
}

/// How the reference names a section in its messages and headings.
fn shown(section: &str) -> String {
    if section.is_empty() {
        "Top level".to_string()
    } else {
        format!("`[{section}]`")
    }
}

/// The sections and keys the reference lists. A heading `### Top level` or one holding
/// `` `[section]` `` starts a section; rows `| `key` | ...` below it, up to the next heading,
/// are its keys. Headings of any other form end the section before them; fenced code blocks
/// (TOML examples, whose comments start with `#`) are skipped.
fn documented_sections(doc: &str) -> Result<BTreeMap<Section, BTreeSet<String>>, Vec<String>> {
    let mut sections: BTreeMap<Section, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut current: Option<Section> = None;
    let mut in_code = false;
    for (n, line) in doc.lines().enumerate() {
        let n = n + 1;
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if line.starts_with('#') {
            let title = line.trim_start_matches('#').trim();
            current = if title == "Top level" {
                Some(String::new())
            } else {
                title
                    .strip_prefix("`[")
                    .and_then(|t| t.split_once("]`"))
                    .map(|(name, _)| name.to_string())
            };
            if let Some(section) = &current {
                if sections.insert(section.clone(), BTreeSet::new()).is_some() {
                    problems.push(format!(
                        "{REFERENCE} line {n}: section {} listed twice",
                        shown(section)
                    ));
                }
            }
            continue;
        }
        let Some(section) = &current else { continue };
        let Some(row) = line.trim().strip_prefix("| `") else {
            continue;
        };
        let Some((key, _)) = row.split_once('`') else {
            problems.push(format!("{REFERENCE} line {n}: unreadable key in `{line}`"));
            continue;
        };
        let keys = sections.entry(section.clone()).or_default();
        if !keys.insert(key.to_string()) {
            problems.push(format!(
                "{REFERENCE} line {n}: key `{key}` listed twice in {}",
                shown(section)
            ));
        }
    }
    if problems.is_empty() {
        Ok(sections)
    } else {
        Err(problems)
    }
}

/// What differs between the accepted and the documented keys, one line per key or section.
fn differences(
    accepted: &BTreeMap<Section, BTreeSet<String>>,
    documented: &BTreeMap<Section, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (section, keys) in accepted {
        let Some(listed) = documented.get(section) else {
            problems.push(format!(
                "{REFERENCE} has no section {} (a heading naming it, then a table of its keys: {})",
                shown(section),
                keys.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        for key in keys.difference(listed) {
            problems.push(format!(
                "{REFERENCE}: {} does not list `{key}`, which the config file accepts",
                shown(section)
            ));
        }
        for key in listed.difference(keys) {
            problems.push(format!(
                "{REFERENCE}: {} lists `{key}`, which the config file rejects",
                shown(section)
            ));
        }
    }
    for section in documented.keys() {
        if !accepted.contains_key(section) {
            problems.push(format!(
                "{REFERENCE} documents section {}, which the config file does not have",
                shown(section)
            ));
        }
    }
    problems
}

#[test]
fn configuration_reference_lists_exactly_the_accepted_keys() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let documented = documented_sections(&doc).unwrap_or_else(|p| panic!("{}", p.join("\n")));
    let accepted = accepted_sections();
    // The walk itself must have found the sections everyone knows of, or it proves nothing.
    for known in [
        "",
        "server",
        "store",
        "pools.<name>",
        "pools.<name>.health",
        "auth.users.<name>",
    ] {
        assert!(
            accepted.contains_key(known),
            "the walk over the config structs missed {}; found {:?}",
            shown(known),
            accepted.keys().collect::<Vec<_>>()
        );
    }
    let problems = differences(&accepted, &documented);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn serde_expected_lists_are_read_in_every_form() {
    let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        expected_fields(
            "line 2: unknown field `zz_probe`, expected one of `listen`, `admin_listen`, `workers`",
            "zz_probe"
        ),
        Some(set(&["listen", "admin_listen", "workers"]))
    );
    assert_eq!(
        expected_fields(
            "pools.default.zz_probe: unknown field `zz_probe`, expected `ca_file` or `system_roots`",
            "zz_probe"
        ),
        Some(set(&["ca_file", "system_roots"]))
    );
    assert_eq!(
        expected_fields("unknown field `zz_probe`, expected `url`", "zz_probe"),
        Some(set(&["url"]))
    );
    assert_eq!(
        expected_fields("unknown field `zz_probe`, there are no fields", "zz_probe"),
        Some(set(&[]))
    );
    assert_eq!(
        expected_fields(
            "line 3: unknown field `zz_probe`, expected one of `a`, `b`\n  | [server]\n  | `c`",
            "zz_probe"
        ),
        Some(set(&["a", "b"]))
    );
    assert_eq!(
        expected_fields("invalid type: integer `1`, expected a string", "zz_probe"),
        None
    );
}

#[test]
fn reference_headings_and_rows_are_read() {
    let doc = "# Configuration\n\n### Top level\n\n| key | type |\n|---|---|\n| `server` | table |\n\n\
               ### `[pools.<name>.health]` (passive health)\n\n| key |\n|---|\n| `window` | 20 |\n\n\
               ```toml\n# a comment, not a heading\n```\n| `max_targets` | 1000 |\n\n\
               ## Upstream URLs\n\n| `not_a_key` | prose table |\n";
    let sections = documented_sections(doc).unwrap();
    assert_eq!(sections.len(), 2);
    assert!(sections[""].contains("server"));
    assert!(sections["pools.<name>.health"].contains("window"));
    assert!(sections["pools.<name>.health"].contains("max_targets"));
    let twice = "### `[server]`\n| `listen` |\n| `listen` |\n";
    assert!(documented_sections(twice).is_err());
}
