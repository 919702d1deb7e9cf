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

#[cfg(test)]
mod tests {
    use super::super::tests::problems;

    #[test]
    fn unknown_keys_name_the_line() {
        let p = problems("[pools.default]\nupstreams = [\"direct://\"]\nmax_conns = 3\n");
        assert!(
            p[0].contains("line 3") && p[0].contains("max_conns"),
            "{p:?}"
        );
    }

    /// Type, unknown-key and missing-key errors name the full dotted key and the line, at any
    /// depth, and keep toml's message (with the expected keys) as their tail.
    #[test]
    fn type_errors_name_their_full_key_at_any_depth() {
        let cases: &[(&str, &str)] = &[
            (
                "[server]\nmax_connections = \"lots\"\n",
                "server.max_connections (line 2): invalid type: string \"lots\", expected u32",
            ),
            (
                "[store]\ntimeout = 5\n",
                "store.timeout (line 2): invalid type: integer `5`, expected a string",
            ),
            (
                "[captcha]\nmarkers = \"x\"\n",
                "captcha.markers (line 2): invalid type: string \"x\", expected a sequence",
            ),
            (
                "[policy]\nconnect_ports = [443, \"80\"]\n",
                "policy.connect_ports[1] (line 2): invalid type: string \"80\", expected u16",
            ),
            (
                "[pools.default]\nupstreams = [\"direct://\"]\nretries = \"many\"\n",
                "pools.default.retries (line 3): invalid type: string \"many\", expected u32",
            ),
            (
                "pools = { default = { upstreams = [\"direct://\"], retries = \"many\" } }\n",
                "pools.default.retries (line 1): invalid type: string \"many\", expected u32",
            ),
            (
                "[pools.default.health]\nwindow = -1\n",
                "pools.default.health.window (line 2): invalid value: integer `-1`, expected usize",
            ),
            (
                "[pools.default.probe]\ninterval = 30\n",
                "pools.default.probe.interval (line 2): invalid type: integer `30`, expected a string",
            ),
            (
                "[auth.users.alice]\nrate_limit = \"fast\"\n",
                "auth.users.alice.rate_limit (line 2): invalid type: string \"fast\", expected f64",
            ),
            (
                "[auth.users.\"j.doe\"]\nrate_limit_burst = 1.5\n",
                "auth.users.\"j.doe\".rate_limit_burst (line 2): invalid type: floating point `1.5`, expected u32",
            ),
            (
                "[auth.users.'say \"hi\"']\npools = \"default\"\n",
                "auth.users.\"say \\\"hi\\\"\".pools (line 2): invalid type: string \"default\", expected a sequence",
            ),
            (
                "[pools.default.health]\nwindoww = 3\n",
                "pools.default.health.windoww (line 2): unknown field `windoww`, expected one of `window`, ",
            ),
            (
                "[pools.default.probe]\ntargets = [\"http://a.example/\", { url = \"http://b.example/\", expect_status = \"204\" }]\n",
                "pools.default.probe.targets[1].expect_status (line 2): invalid type: string \"204\", expected u16",
            ),
            (
                "[pools.default.probe]\ntargets = [{ url = \"http://a.example/\", expect_stauts = 204 }]\n",
                "pools.default.probe.targets[0].expect_stauts (line 2): unknown field `expect_stauts`, expected one of `url`, ",
            ),
            (
                "[pools.default.probe]\ntargets = [{ expect_status = 204 }]\n",
                "pools.default.probe.targets[0] (line 2): missing field `url`",
            ),
            (
                "[pools.default.probe]\ntargets = [204]\n",
                "pools.default.probe.targets[0] (line 2): invalid type: integer `204`, expected a URL or a table",
            ),
            (
                "[serverr]\n",
                "serverr (line 1): unknown field `serverr`, expected one of `server`, ",
            ),
        ];
        for (text, want) in cases {
            let p = problems(text);
            assert_eq!(p.len(), 1, "{text}: {p:?}");
            assert!(
                p[0].starts_with(want),
                "{text}:\n got {}\nwant {want}",
                p[0]
            );
        }
        // A syntax error has no key: the line alone, as before.
        let p = problems("[pools.default]\nupstreams = [\"direct://\"\n");
        assert!(p[0].starts_with("line "), "{p:?}");
    }
}
