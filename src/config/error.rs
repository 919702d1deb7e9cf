//! How problems are reported: every one, each led by its dotted key.

use std::fmt;

/// Every problem found in a config file, each naming its key.
#[derive(Debug)]
pub struct ConfigError {
    pub source_name: String,
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config {}:", self.source_name)?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// A syntax, type or unknown-key error, led by the dotted key serde was reading when it failed
/// and the line, then toml's own message (which lists the expected keys of an unknown one).
pub(super) fn describe_toml_error(
    text: &str,
    e: &serde_path_to_error::Error<toml::de::Error>,
) -> String {
    let msg = e.inner().message().trim();
    let key = toml_key(e.path());
    let line = e.inner().span().map(|span| {
        text.bytes()
            .take(span.start)
            .filter(|&b| b == b'\n')
            .count()
            + 1
    });
    match (key.is_empty(), line) {
        (false, Some(line)) => format!("{key} (line {line}): {msg}"),
        (false, None) => format!("{key}: {msg}"),
        (true, Some(line)) => format!("line {line}: {msg}"),
        (true, None) => msg.to_string(),
    }
}

/// The path as a TOML dotted key, e.g. `auth.users."j.doe".pools[0]`: a part that is not a bare
/// key is quoted, so the key can be searched for in the file; empty for a syntax error.
fn toml_key(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path {
        let part = match segment {
            Segment::Seq { index } => {
                out.push_str(&format!("[{index}]"));
                continue;
            }
            Segment::Map { key } => Some(key),
            Segment::Enum { variant } => Some(variant),
            Segment::Unknown => None,
        };
        if !out.is_empty() {
            out.push('.');
        }
        match part {
            Some(part) => push_key_part(&mut out, part),
            None => out.push('?'),
        }
    }
    out
}

/// One part of a dotted key: bare when TOML allows it, else a quoted string.
fn push_key_part(out: &mut String, part: &str) {
    let bare = !part.is_empty()
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        out.push_str(part);
        return;
    }
    out.push('"');
    for c in part.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}
