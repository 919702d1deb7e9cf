//! An upstream list as text: one URL a line, `#` comment lines, blank lines, and a trailing
//! comment after whitespace. A pure function, so files and fetched lists parse the same way.

use std::collections::HashSet;

use crate::upstream::{Labels, Upstream, UpstreamId};

/// Entries past this are ignored (with a warning): a runaway list must not eat the gateway.
pub const MAX_ENTRIES: usize = 100_000;

/// What a list holds.
#[derive(Debug, Default)]
pub struct Listed {
    /// Well-formed entries, in list order, each id once.
    pub upstreams: Vec<Upstream>,
    /// One message per skipped line: where it is and why, never its text (it may hold a
    /// password).
    pub skipped: Vec<String>,
}

/// Parses `text`; `origin` names the list in messages (a path, or a URL without credentials).
pub fn parse(text: &str, origin: &str) -> Listed {
    let mut out = Listed::default();
    let mut seen: HashSet<UpstreamId> = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        // A line is a URL (whose own `#` names its id), then optionally `key=value` labels, then
        // optionally a comment (a word starting with `#`); a line starting with `#` is a comment.
        let mut words = line.split_whitespace();
        let Some(url) = words.next() else {
            continue;
        };
        if url.starts_with('#') {
            continue;
        }
        let lineno = i + 1;
        if out.upstreams.len() >= MAX_ENTRIES {
            out.skipped.push(format!(
                "{origin} line {lineno} and after: more than {MAX_ENTRIES} entries; the rest is ignored"
            ));
            break;
        }
        let labelled = Upstream::parse(url)
            .map_err(|e| e.to_string())
            .and_then(|mut u| {
                u.labels = Labels::from_words(words.take_while(|w| !w.starts_with('#')))
                    .map_err(|e| e.to_string())?;
                Ok(u)
            });
        match labelled {
            Ok(u) if seen.contains(&u.id) => out.skipped.push(format!(
                "{origin} line {lineno}: `{}` is listed twice (give one a distinct #id)",
                u.id
            )),
            Ok(u) => {
                seen.insert(u.id.clone());
                out.upstreams.push(u);
            }
            Err(e) => out.skipped.push(format!("{origin} line {lineno}: {e}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_comments_duplicates_and_bad_entries() {
        let text = "# my proxies\n\
                    http://u:secret@10.0.0.1:3128   # eu\n\
                    \n\
                    socks5://10.0.0.2:1080#s2\n\
                    bogus-line-with-secret\n\
                    http://10.0.0.1:3128\n\
                    ftp://10.0.0.3:21\n\
                    \t https://10.0.0.4:443 \n";
        let l = parse(text, "ups.txt");
        let ids: Vec<&str> = l.upstreams.iter().map(|u| u.id.as_str()).collect();
        assert_eq!(ids, ["http://10.0.0.1:3128", "s2", "https://10.0.0.4:443"]);
        assert_eq!(l.skipped.len(), 3, "{:?}", l.skipped);
        assert!(
            l.skipped[0].starts_with("ups.txt line 5:"),
            "{:?}",
            l.skipped
        );
        assert!(l.skipped[1].starts_with("ups.txt line 6:") && l.skipped[1].contains("twice"));
        assert!(l.skipped[2].starts_with("ups.txt line 7:") && l.skipped[2].contains("ftp"));
        for m in &l.skipped {
            assert!(!m.contains("secret"), "{m}");
        }
    }

    #[test]
    fn labels_follow_the_url_and_a_comment_ends_them() {
        let text = "http://10.0.0.2:3128#de1 country=DE type=datacenter # berlin\n\
                    http://u:secret@10.0.0.3:3128 country=us\n\
                    http://10.0.0.4:3128 country\n\
                    http://10.0.0.5:3128 country=u|s\n\
                    http://10.0.0.6:3128 #note country=xx\n";
        let l = parse(text, "ups.txt");
        let got: Vec<String> = l
            .upstreams
            .iter()
            .map(|u| format!("{} {}", u.id, u.labels))
            .collect();
        assert_eq!(
            got,
            [
                "de1 country=de type=datacenter",
                "http://10.0.0.3:3128 country=us",
                "http://10.0.0.6:3128 ",
            ]
        );
        assert_eq!(l.skipped.len(), 2, "{:?}", l.skipped);
        assert!(
            l.skipped[0].starts_with("ups.txt line 3:"),
            "{:?}",
            l.skipped
        );
        assert!(
            l.skipped[1].starts_with("ups.txt line 4:"),
            "{:?}",
            l.skipped
        );
        // A labelled line reads back as itself: other instances get the labels too.
        let again = parse(&l.upstreams[0].to_list_line(), "shared");
        assert_eq!(again.upstreams, l.upstreams[..1]);
    }

    #[test]
    fn empty_and_comment_only_lists_hold_nothing() {
        for text in ["", "\n\n", "# a\n   # b\n"] {
            let l = parse(text, "x");
            assert!(l.upstreams.is_empty() && l.skipped.is_empty());
        }
    }

    #[test]
    fn a_runaway_list_is_cut_with_one_warning() {
        let text: String = (0..MAX_ENTRIES + 10)
            .map(|i| {
                format!(
                    "http://10.{}.{}.{}:3128\n",
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                )
            })
            .collect();
        let l = parse(&text, "big");
        assert_eq!(l.upstreams.len(), MAX_ENTRIES);
        assert_eq!(l.skipped.len(), 1);
    }
}
