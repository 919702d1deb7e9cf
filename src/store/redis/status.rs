//! `/status` figures: `status.lua`'s snapshot of the live part, the per-member hashes read a
//! thousand fields a call (HSCAN/ZSCAN), and what this instance has not sent yet.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::scripts::{self, Call};
use super::{Fault, Inner, broken, held, locked, now_ms, stats};
use crate::outcome::Outcome;
use crate::store::{PoolSpec, PoolStatus, Store, StoreError, member_status};

impl Inner {
    pub(super) async fn status(self: &Arc<Self>, pool: &str) -> Result<PoolStatus, StoreError> {
        let p = self.pool(pool)?;
        if self.is_degraded() {
            return self.fallback.status(pool).await;
        }
        let k = &p.keys;
        let mut inv = Call::new(&scripts::STATUS, 5);
        inv.key(&k.leases)
            .key(&k.lease_up)
            .key(&k.session_count)
            .key(&k.instances)
            .key(&k.held)
            .arg(now_ms())
            .arg(&self.instance);
        let read = async {
            let (sessions, live, reports) = self.eval::<LiveReply>(&inv, self.timeout).await?;
            let state = self.scan("HSCAN", &k.state).await?;
            let members = self.scan("ZSCAN", &k.members).await?;
            let stats = self.scan("HSCAN", &k.stats).await?;
            Ok::<_, Fault>((sessions, state, members, live, stats, reports))
        };
        match read.await {
            Ok(reply) => Ok(status_from(
                &p.spec.load(),
                reply,
                &locked(&p.stats),
                &locked(&p.held),
            )),
            Err(Fault::Down(why)) => {
                self.degrade(&why);
                self.fallback.status(pool).await
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }
}

/// `status.lua`'s reply: live sessions, the upstream of each listed lease, and other instances'
/// reports of unlisted leases.
type LiveReply = (u64, Vec<String>, Vec<String>);

/// Fields asked for per HSCAN/ZSCAN call: each call holds Redis a fraction of a millisecond.
const SCAN_COUNT: usize = 1000;
/// Calls one scan may take (a hundred million fields): a cursor that never comes back to 0 is a
/// broken server, not a big pool.
const SCAN_CALLS_MAX: usize = 100_000;

impl Inner {
    /// A hash's or sorted set's field/value pairs, flat, read `SCAN_COUNT` at a time. A field
    /// changed while the scan runs may be seen twice (the caller keeps one) or in either state.
    async fn scan(&self, verb: &str, key: &str) -> Result<Vec<String>, Fault> {
        let mut out = Vec::new();
        let mut cursor = 0u64;
        for _ in 0..SCAN_CALLS_MAX {
            let mut cmd = redis::cmd(verb);
            cmd.arg(key).arg(cursor).arg("COUNT").arg(SCAN_COUNT);
            let (next, items): (u64, Vec<String>) = self.query(&cmd).await?;
            out.extend(items);
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
        Err(Fault::Broken(format!("{verb} did not finish")))
    }
}

/// The snapshot: live sessions, states, scores, the upstream of each listed lease, statistics,
/// and other instances' reports of unlisted leases.
type StatusReply = (
    u64,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
);

/// Assembles `/status` figures from `status.lua`'s snapshot, in the configured member order, with
/// what this instance has not sent yet: statistics and its own unlisted leases.
fn status_from(
    spec: &PoolSpec,
    (sessions_live, state, members, live, stats, reports): StatusReply,
    unsent: &stats::Pending,
    held: &held::Held,
) -> PoolStatus {
    let pairs = |flat: Vec<String>| -> Vec<(String, String)> {
        let mut it = flat.into_iter();
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        out
    };
    let scores: HashMap<String, f64> = pairs(members)
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect();
    // The saved score (field 4 of `e|k|c|s|r`) of members not eligible.
    let saved: HashMap<String, f64> = pairs(state)
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.split('|').nth(3)?.parse().ok()?)))
        .collect();
    let mut live_by: HashMap<String, u64> = HashMap::new();
    for up in live {
        *live_by.entry(up).or_default() += 1;
    }
    for lines in &reports {
        held::add_lines(lines, &mut live_by);
    }
    let mut counters: HashMap<String, HashMap<String, u64>> = HashMap::new();
    for (field, v) in pairs(stats) {
        if let (Some((up, name)), Ok(n)) = (field.rsplit_once('\n'), v.parse::<u64>()) {
            counters
                .entry(up.to_string())
                .or_default()
                .insert(name.to_string(), n);
        }
    }
    unsent.add_to(&mut counters);
    let members = spec
        .members
        .iter()
        .map(|id| {
            let c = counters.get(id.as_str());
            let get = |name: &str| c.and_then(|c| c.get(name)).copied().unwrap_or(0);
            let mut outcomes = [0u64; Outcome::ALL.len()];
            for o in Outcome::ALL {
                outcomes[o.index()] = get(o.key());
            }
            let allocations = scores
                .get(id.as_str())
                .or_else(|| saved.get(id.as_str()))
                .copied()
                .unwrap_or(0.0) as u64;
            member_status(
                id,
                live_by.get(id.as_str()).copied().unwrap_or(0) + held.of(id.as_str()),
                allocations,
                &outcomes,
                Duration::from_micros(get("latency_us")),
                get("latency_n"),
            )
        })
        .collect();
    PoolStatus {
        sessions_live,
        members,
    }
}
