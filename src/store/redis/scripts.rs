//! The Lua scripts of `lua/`, one per atomic decision, how a call of one is written, and their
//! replies.
//!
//! Each is run by a [`Call`]: EVALSHA, and after a `NOSCRIPT` (Redis restarted, or `SCRIPT FLUSH`)
//! a `SCRIPT LOAD` and the EVALSHA again, transparently. On a cluster the load goes to every node.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(super) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("../../../lua/", $file))));
    };
}

script!(ACQUIRE, "acquire.lua");
script!(RELEASE, "release.lua");
script!(REPORT, "report.lua");
script!(SET_MEMBER, "set_member.lua");
script!(CONFIGURE, "configure.lua");
script!(UNBIND, "unbind.lua");
script!(END_SESSION, "end_session.lua");
script!(RECORD, "record.lua");
script!(STATUS, "status.lua");
script!(LOCK_ACQUIRE, "lock_acquire.lua");
script!(LOCK_EXTEND, "lock_extend.lua");
script!(LOCK_RELEASE, "lock_release.lua");
script!(LISTED_PUT, "listed_put.lua");

/// One EVALSHA of a script, written straight into the command it sends.
///
/// `redis::ScriptInvocation` keeps every key and argument in its own `Vec` and copies them all
/// into a command at each call: a release batch is some seventy arguments, so that was an
/// allocation, a copy and a free per argument on every request's share of the batch. A `Cmd`
/// keeps its arguments in one buffer. EVALSHA wants the key count before the keys, so a call is
/// made with it, and keys come before arguments.
pub(super) struct Call {
    script: &'static Script,
    cmd: Cmd,
    keys_left: usize,
}

impl Call {
    pub fn new(script: &'static Script, keys: usize) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        Call {
            script,
            cmd,
            keys_left: keys,
        }
    }

    /// Adds `KEYS[i]`; every key comes before the first argument.
    pub fn key(&mut self, key: &str) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than announced");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    /// Adds `ARGV[i]`.
    pub fn arg(&mut self, arg: impl redis::ToSingleRedisArg) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// Runs the script, loading it first when Redis does not know it.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            r => r,
        }
    }
}

/// What `acquire.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AcquireReply {
    Granted {
        upstream: String,
        bound_now: bool,
    },
    /// Every candidate at its cap; the earliest lease deadline (ms), when there is a lease.
    AtCapacity {
        earliest_deadline_ms: Option<u64>,
    },
    Unavailable(String),
    NoCandidates,
    /// The pool's state is missing: Redis lost its data.
    Unconfigured,
    /// The label filter's subset is missing: ask again with its members.
    NoSubset,
}

impl AcquireReply {
    pub fn parse(reply: Vec<String>) -> Result<Self, String> {
        let mut it = reply.into_iter();
        let kind = it.next().unwrap_or_default();
        let mut next = || {
            it.next()
                .ok_or_else(|| format!("acquire: short `{kind}` reply"))
        };
        Ok(match kind.as_str() {
            "granted" => {
                let upstream = next()?;
                let bound_now = next()? == "1";
                AcquireReply::Granted {
                    upstream,
                    bound_now,
                }
            }
            "cap" => AcquireReply::AtCapacity {
                earliest_deadline_ms: next()?
                    .parse::<f64>()
                    .ok()
                    .filter(|ms| *ms >= 0.0)
                    .map(|ms| ms as u64),
            },
            "unavailable" => AcquireReply::Unavailable(next()?),
            "none" => AcquireReply::NoCandidates,
            "unconfigured" => AcquireReply::Unconfigured,
            "nosubset" => AcquireReply::NoSubset,
            other => return Err(format!("acquire: unexpected reply `{other}`")),
        })
    }

    /// One reply of the `many` mode: the same reply as one string, the upstream last (an id may
    /// hold spaces): `granted <0|1> <upstream>`, `cap <ms>`, `none`, `unconfigured`.
    pub fn parse_line(line: &str) -> Result<Self, String> {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "granted" => {
                let (bound, upstream) = rest
                    .split_once(' ')
                    .ok_or_else(|| "acquire: short `granted` reply".to_string())?;
                Ok(AcquireReply::Granted {
                    upstream: upstream.to_string(),
                    bound_now: bound == "1",
                })
            }
            _ if rest.is_empty() => Self::parse(vec![kind.to_string()]),
            _ => Self::parse(vec![kind.to_string(), rest.to_string()]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_mode_lines_parse_like_lists() {
        assert_eq!(
            AcquireReply::parse_line("granted 0 http://u 1").unwrap(),
            AcquireReply::Granted {
                upstream: "http://u 1".into(),
                bound_now: false
            }
        );
        assert_eq!(
            AcquireReply::parse_line("cap 1700000000123").unwrap(),
            AcquireReply::AtCapacity {
                earliest_deadline_ms: Some(1_700_000_000_123)
            }
        );
        assert_eq!(
            AcquireReply::parse_line("cap -1").unwrap(),
            AcquireReply::AtCapacity {
                earliest_deadline_ms: None
            }
        );
        assert_eq!(
            AcquireReply::parse_line("none").unwrap(),
            AcquireReply::NoCandidates
        );
        assert_eq!(
            AcquireReply::parse_line("unconfigured").unwrap(),
            AcquireReply::Unconfigured
        );
        assert!(AcquireReply::parse_line("granted 1").is_err());
        assert!(AcquireReply::parse_line("cap").is_err());
        assert!(AcquireReply::parse_line("what").is_err());
    }

    #[test]
    fn acquire_replies_parse() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            AcquireReply::parse(v(&["granted", "u1", "1"])).unwrap(),
            AcquireReply::Granted {
                upstream: "u1".into(),
                bound_now: true
            }
        );
        assert_eq!(
            AcquireReply::parse(v(&["cap", "1700000000123"])).unwrap(),
            AcquireReply::AtCapacity {
                earliest_deadline_ms: Some(1_700_000_000_123)
            }
        );
        assert_eq!(
            AcquireReply::parse(v(&["cap", "-1"])).unwrap(),
            AcquireReply::AtCapacity {
                earliest_deadline_ms: None
            }
        );
        assert!(AcquireReply::parse(v(&["granted"])).is_err());
        assert!(AcquireReply::parse(v(&["what"])).is_err());
        // Every script compiles into a distinct hash.
        let hashes: std::collections::HashSet<&str> = [
            &ACQUIRE,
            &RELEASE,
            &SET_MEMBER,
            &CONFIGURE,
            &UNBIND,
            &END_SESSION,
            &RECORD,
            &STATUS,
            &LOCK_ACQUIRE,
            &LOCK_EXTEND,
            &LOCK_RELEASE,
            &LISTED_PUT,
        ]
        .iter()
        .map(|s| s.get_hash())
        .collect();
        assert_eq!(hashes.len(), 12);
    }

    /// The session count is written by four scripts: they must agree on its seconds, and the two
    /// that sweep it on how.
    #[test]
    fn session_count_scripts_agree() {
        let acquire = include_str!("../../../lua/acquire.lua");
        let status = include_str!("../../../lua/status.lua");
        let sweep = |text: &str| -> String {
            let from = text.find("local BUCKET_MS = ").expect("BUCKET_MS");
            let to = text[from..]
                .find("  return now_b\nend\n")
                .expect("sweep_counts")
                + from;
            text[from..to].to_string()
        };
        assert_eq!(sweep(acquire), sweep(status));
        let bucket = sweep(acquire)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        for (name, text) in [
            ("unbind.lua", include_str!("../../../lua/unbind.lua")),
            (
                "end_session.lua",
                include_str!("../../../lua/end_session.lua"),
            ),
        ] {
            assert!(text.contains(&format!("\n{bucket}\n")), "{name}: {bucket}");
        }
    }
}
