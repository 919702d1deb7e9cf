//! Labels on upstreams (`country=de`, `type=datacenter`): what kind of exit a member is, so a
//! request can ask for one kind ([`Filter`]).
//!
//! Keys and values are 1 to 64 characters of `a-z 0-9 _ . -`. Values are compared
//! case-insensitively, so both are kept lower-case: `country=DE` and `country=de` are one label.

use std::fmt;
use std::sync::Arc;

/// Longest label key or value.
pub const MAX_LABEL_LEN: usize = 64;

/// Why a label could not be read. Messages name the part that is wrong, never a whole line (a
/// list line may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label key `{0}` is invalid: expected 1 to 64 characters of a-z 0-9 _ . -")]
    Key(String),
    #[error(
        "label `{key}` has invalid value `{value}`: expected 1 to 64 characters of a-z 0-9 _ . -"
    )]
    Value { key: String, value: String },
    #[error("label `{0}` is given twice")]
    Repeated(String),
    #[error("`{0}` is not a label: expected key=value")]
    Pair(String),
}

/// Whether `s` is a label key or value as written (upper-case letters allowed: they are folded).
fn is_label_text(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A label key or value in its one spelling, or `None` when it breaks the grammar. Shown in
/// messages only as far as it is label text (so never a password's odd characters).
pub fn fold(s: &str) -> Option<String> {
    is_label_text(s).then(|| s.to_ascii_lowercase())
}

/// A text shown in an error: itself when it is label text (cut to 64 characters), else a
/// placeholder, so that a word holding a password is never echoed.
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(MAX_LABEL_LEN).collect();
    let plain = |c: char| c.is_ascii_alphanumeric() || "_.-=|".contains(c);
    if !cut.is_empty() && cut.chars().all(plain) {
        cut
    } else {
        String::from("<not shown>")
    }
}

/// One upstream's labels, sorted by key, each key once.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Arc<[(String, String)]>);

impl Labels {
    /// Labels from `(key, value)` pairs as written; each is checked and folded.
    pub fn new<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, LabelError> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (k, v) in pairs {
            let key = fold(k).ok_or_else(|| LabelError::Key(shown(k)))?;
            let value = fold(v).ok_or_else(|| LabelError::Value {
                key: key.clone(),
                value: shown(v),
            })?;
            if out.iter().any(|(k, _)| *k == key) {
                return Err(LabelError::Repeated(key));
            }
            out.push((key, value));
        }
        out.sort();
        Ok(Labels(out.into()))
    }

    /// Reads `key=value` words (a list line's words after its URL).
    pub fn from_words<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<Self, LabelError> {
        let mut pairs = Vec::new();
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| LabelError::Pair(shown(w)))?;
            pairs.push((k, v));
        }
        Labels::new(pairs)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// `key=value` words separated by spaces: a list line's form.
impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{self}}}")
    }
}

/// What a request asks of its exit: for each key, the values it accepts (any one of them). A
/// member matches when it has every key with one of its values.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Filter(Vec<(String, Vec<String>)>);

impl Filter {
    /// A filter from folded pairs, each key once; values sorted and deduplicated so that two
    /// spellings of one filter are one filter (`us|ca` and `ca|us`).
    pub fn new(pairs: Vec<(String, Vec<String>)>) -> Self {
        let mut pairs: Vec<(String, Vec<String>)> = pairs
            .into_iter()
            .map(|(k, mut vs)| {
                vs.sort();
                vs.dedup();
                (k, vs)
            })
            .collect();
        pairs.sort();
        Filter(pairs)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn pairs(&self) -> &[(String, Vec<String>)] {
        &self.0
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|(k, vs)| {
            labels
                .get(k)
                .is_some_and(|v| vs.iter().any(|want| want == v))
        })
    }
}

/// The filter's one spelling, `country=ca|us,type=mobile`: names it in messages and store keys.
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, vs)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={}", vs.join("|"))?;
        }
        Ok(())
    }
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Filter({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_folded_sorted_and_checked() {
        let l = Labels::new([("Type", "DataCenter"), ("country", "DE")]).unwrap();
        assert_eq!(l.to_string(), "country=de type=datacenter");
        assert_eq!(l.get("type"), Some("datacenter"));
        assert_eq!(l.get("city"), None);
        for (k, v) in [
            ("", "x"),
            ("a b", "x"),
            ("k", ""),
            ("k", "a|b"),
            ("k", "ü"),
            ("k", &"x".repeat(65)),
            (&"k".repeat(65), "x"),
        ] {
            assert!(Labels::new([(k, v)]).is_err(), "{k}={v}");
        }
        assert_eq!(
            Labels::new([("k", "a"), ("K", "b")]),
            Err(LabelError::Repeated("k".into()))
        );
        assert!(Labels::new([("k", &"x".repeat(64) as &str)]).is_ok());
    }

    #[test]
    fn words_are_key_value_pairs() {
        let l = Labels::from_words(["country=us", "asn=7922"]).unwrap();
        assert_eq!(l.to_string(), "asn=7922 country=us");
        assert!(matches!(
            Labels::from_words(["country"]),
            Err(LabelError::Pair(_))
        ));
        let e = Labels::from_words(["pass:secret@x=1"])
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn a_filter_matches_every_key_with_any_of_its_values() {
        let f = Filter::new(vec![
            ("type".into(), vec!["mobile".into()]),
            (
                "country".into(),
                vec!["us".into(), "ca".into(), "us".into()],
            ),
        ]);
        assert_eq!(f.to_string(), "country=ca|us,type=mobile");
        let us_mobile = Labels::new([("country", "us"), ("type", "mobile")]).unwrap();
        let ca_mobile = Labels::new([("country", "ca"), ("type", "mobile"), ("x", "y")]).unwrap();
        let de_mobile = Labels::new([("country", "de"), ("type", "mobile")]).unwrap();
        let us = Labels::new([("country", "us")]).unwrap();
        assert!(f.matches(&us_mobile) && f.matches(&ca_mobile));
        assert!(!f.matches(&de_mobile) && !f.matches(&us));
        assert!(Filter::default().matches(&Labels::default()));
    }
}
