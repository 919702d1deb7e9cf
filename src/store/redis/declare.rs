//! Declaring a pool in Redis: in one `configure.lua` call for a pool of up to [`CHUNK`] members,
//! in a run of short calls for a larger one.
//!
//! Redis runs one script at a time, so a declaration of 100,000 members in one call held every
//! other instance's acquires for 0.5–1.5 s, past the store timeout: each reload of a large pool
//! put the whole fleet into degraded mode. In stages no call does more than [`CHUNK`] members'
//! work (about 15 ms). A declaration whose digest Redis already holds (an instance starting with
//! the pool the others declared, a reload that left the pool alone) costs one short call.

use std::time::{Duration, Instant};

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest};

use super::scripts::{self, Call};
use super::{CONFIGURE_TIMEOUT, Fault, Inner, PoolLocal, millis, now_ms};
use crate::store::PoolSpec;

/// Members per call: as `CHUNK` in `configure.lua`.
pub(super) const CHUNK: usize = 1000;
/// How long a staged declaration keeps its claim without a call; another instance's waits at
/// most this long for an abandoned one.
const HOLD: Duration = Duration::from_secs(10);
/// Bound of a whole staged declaration, waits for another instance's included.
const DEADLINE: Duration = Duration::from_secs(120);
/// Longest pause between asks while another instance's declaration is under way.
const BUSY_POLL: Duration = Duration::from_millis(200);

/// What `configure.lua` records of a declaration: the strategy and the members in order, so
/// that declaring the same again is recognised without reading the pool.
pub(super) fn digest(spec: &PoolSpec) -> String {
    let mut h = Blake2b::<U16>::new();
    h.update(spec.strategy.as_str().as_bytes());
    for m in &spec.members {
        // Length-prefixed: no member list is the concatenation of another.
        h.update((m.as_str().len() as u64).to_le_bytes());
        h.update(m.as_str().as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A staged call's answer.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Go on (with the cursor or rank to continue from, when there is one).
    More(Option<String>),
    /// The declaration is already in Redis (declared before, or finished by a joined caller).
    Done,
    /// Another instance's declaration is under way; it may hold its claim this long.
    Busy(Duration),
    /// This declaration lost its claim (taken over after it lapsed, or Redis lost its data).
    Superseded,
}

impl Step {
    fn parse(reply: Vec<String>) -> Result<Step, Fault> {
        let mut it = reply.into_iter();
        let kind = it.next().unwrap_or_default();
        let rest = it.next();
        match kind.as_str() {
            "go" | "ok" | "more" => Ok(Step::More(rest)),
            "done" => Ok(Step::Done),
            "busy" => Ok(Step::Busy(Duration::from_millis(
                rest.and_then(|ms| ms.parse().ok()).unwrap_or(0),
            ))),
            "superseded" => Ok(Step::Superseded),
            other => Err(Fault::Broken(format!(
                "configure: unexpected reply `{other}`"
            ))),
        }
    }
}

/// How a staged run ended.
enum Staged {
    Declared {
        fresh: bool,
    },
    Done,
    /// Start again from `begin`.
    Again,
}

impl Inner {
    /// Declares the pool in Redis; true when Redis had no state for it (new, or lost).
    pub(super) async fn configure_remote(&self, p: &PoolLocal) -> Result<bool, Fault> {
        let spec = p.spec.load();
        let digest = digest(&spec);
        if spec.members.len() <= CHUNK {
            let mut call = Self::declare_call(p, "all");
            call.arg(spec.strategy.as_str()).arg(digest.as_str());
            for id in &spec.members {
                call.arg(id.as_str());
            }
            match self.eval::<i64>(&call, CONFIGURE_TIMEOUT).await? {
                1 => return Ok(true),
                0 => return Ok(false),
                // Redis holds more members than one call should sweep: in stages.
                _ => {}
            }
        }
        let started = Instant::now();
        loop {
            if started.elapsed() > DEADLINE {
                return Err(Fault::Down(format!(
                    "declaring pool `{}` did not finish within {}s",
                    spec.name,
                    DEADLINE.as_secs()
                )));
            }
            match self.declare_staged(p, &spec, &digest).await? {
                Staged::Declared { fresh } => return Ok(fresh),
                Staged::Done => return Ok(false),
                Staged::Again => {}
            }
        }
    }

    /// One staged run: begin, stage, sweep, apply, finish.
    async fn declare_staged(
        &self,
        p: &PoolLocal,
        spec: &PoolSpec,
        digest: &str,
    ) -> Result<Staged, Fault> {
        let mut begin = Self::declare_call(p, "begin");
        begin
            .arg(spec.strategy.as_str())
            .arg(digest)
            .arg(now_ms())
            .arg(millis(HOLD))
            .arg(spec.members.len());
        let fresh = match self.declare_step(&begin).await? {
            Step::More(fresh) => fresh.as_deref() == Some("1"),
            Step::Done => return Ok(Staged::Done),
            Step::Busy(left) => {
                tokio::time::sleep(left.clamp(Duration::from_millis(10), BUSY_POLL)).await;
                return Ok(Staged::Again);
            }
            Step::Superseded => return Ok(Staged::Again),
        };
        for (i, chunk) in spec.members.chunks(CHUNK).enumerate() {
            let mut stage = Self::continue_call(p, "stage", digest);
            stage.arg(i * CHUNK);
            for id in chunk {
                stage.arg(id.as_str());
            }
            if let Some(end) = self.ended(&stage).await? {
                return Ok(end);
            }
        }
        let mut cursor = "0".to_string();
        loop {
            let mut sweep = Self::continue_call(p, "sweep", digest);
            sweep.arg(cursor.as_str());
            match self.declare_step(&sweep).await? {
                Step::More(Some(next)) if next != "0" => cursor = next,
                Step::More(_) => break,
                other => return Ok(interrupted(other)),
            }
        }
        let mut rank = 0usize;
        loop {
            let mut apply = Self::continue_call(p, "apply", digest);
            apply.arg(rank);
            match self.declare_step(&apply).await? {
                Step::More(Some(next)) => {
                    rank = next
                        .parse()
                        .map_err(|_| Fault::Broken(format!("configure: bad rank `{next}`")))?;
                }
                Step::More(None) => break,
                other => return Ok(interrupted(other)),
            }
        }
        let finish = Self::continue_call(p, "finish", digest);
        if let Some(end) = self.ended(&finish).await? {
            return Ok(end);
        }
        Ok(Staged::Declared { fresh })
    }

    /// `configure.lua` with the pool's keys and `mode`.
    fn declare_call(p: &PoolLocal, mode: &str) -> Call {
        let mut call = Call::new(&scripts::CONFIGURE, 11);
        for key in p.keys.configure() {
            call.key(key);
        }
        call.arg(mode);
        call
    }

    /// A call that continues the declaration of `digest`.
    fn continue_call(p: &PoolLocal, mode: &str, digest: &str) -> Call {
        let mut call = Self::declare_call(p, mode);
        call.arg(digest).arg(now_ms()).arg(millis(HOLD));
        call
    }

    async fn declare_step(&self, call: &Call) -> Result<Step, Fault> {
        Step::parse(self.eval(call, CONFIGURE_TIMEOUT).await?)
    }

    /// Runs a call whose only good answer is "ok": how the run ended otherwise.
    async fn ended(&self, call: &Call) -> Result<Option<Staged>, Fault> {
        Ok(match self.declare_step(call).await? {
            Step::More(_) => None,
            other => Some(interrupted(other)),
        })
    }
}

/// How a staged run ends on an answer other than "go on".
fn interrupted(step: Step) -> Staged {
    match step {
        Step::Done => Staged::Done,
        _ => Staged::Again,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Strategy;
    use crate::upstream::UpstreamId;

    fn spec(strategy: Strategy, members: &[&str]) -> PoolSpec {
        PoolSpec {
            name: "p".into(),
            members: members.iter().map(|m| UpstreamId::new(*m)).collect(),
            strategy,
            max_concurrency: None,
            lease_ttl: Duration::from_secs(60),
            shards: 1,
        }
    }

    #[test]
    fn the_digest_changes_with_the_strategy_the_members_and_their_order_only() {
        let d = |s, m: &[&str]| digest(&spec(s, m));
        let base = d(Strategy::LeastUsed, &["http://a", "http://b"]);
        assert_eq!(base.len(), 32);
        assert_eq!(base, d(Strategy::LeastUsed, &["http://a", "http://b"]));
        assert_ne!(base, d(Strategy::RoundRobin, &["http://a", "http://b"]));
        assert_ne!(base, d(Strategy::LeastUsed, &["http://b", "http://a"]));
        assert_ne!(base, d(Strategy::LeastUsed, &["http://a"]));
        // Where one member ends and the next begins is part of it.
        assert_ne!(
            d(Strategy::LeastUsed, &["http://ab", "http://c"]),
            d(Strategy::LeastUsed, &["http://a", "bhttp://c"])
        );
        // The cap and the lease TTL are not in Redis's state, so not in the digest.
        let capped = PoolSpec {
            max_concurrency: Some(3),
            lease_ttl: Duration::from_secs(5),
            shards: 1,
            ..spec(Strategy::LeastUsed, &["http://a", "http://b"])
        };
        assert_eq!(base, digest(&capped));
    }

    #[test]
    fn staged_replies_are_read_and_an_unknown_one_is_an_error() {
        let r = |w: &[&str]| Step::parse(w.iter().map(|s| s.to_string()).collect());
        assert_eq!(r(&["go", "1"]).ok(), Some(Step::More(Some("1".into()))));
        assert_eq!(r(&["ok"]).ok(), Some(Step::More(None)));
        assert_eq!(r(&["more", "17"]).ok(), Some(Step::More(Some("17".into()))));
        assert_eq!(r(&["done"]).ok(), Some(Step::Done));
        assert_eq!(
            r(&["busy", "250"]).ok(),
            Some(Step::Busy(Duration::from_millis(250)))
        );
        assert_eq!(r(&["superseded"]).ok(), Some(Step::Superseded));
        assert!(matches!(r(&["what"]), Err(Fault::Broken(_))));
        assert!(matches!(r(&[]), Err(Fault::Broken(_))));
    }
}
