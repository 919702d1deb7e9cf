//! Acquires: a session's or an excluding one in a call of its own, plain ones batched (see
//! `batch.rs`) or served from the stock (see `stock.rs`), and while the pool is full one probe
//! at a time (see [`Inner::acquire`]). Plain acquires within a label filter go the same way in
//! a lane of their subset's, once its members were sent.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::batch::Batcher;
use super::scripts::{self, AcquireReply, Call};
use super::stock::Stock;
use super::{
    ACQUIRE_BATCH, ACQUIRE_CALLS, FALLBACK_LEASE, Fault, Inner, PoolLocal, UNLISTED_LEASE, broken,
    locked, millis, now_ms, takes_unlisted_leases,
};
use crate::config::Strategy;
use crate::store::{Acquired, Grant, LeaseId, Store, StoreError, Want};
use crate::upstream::UpstreamId;

/// Subsets remembered as sent per pool; past this the memory starts over (each is sent once
/// more when next used).
const MAX_SUBSETS_SENT: usize = 4096;

/// What waits for an acquire call: a request's lease, or a refill of the stock.
#[derive(Debug, Clone, Copy)]
pub(super) enum AcquireItem {
    Lease(LeaseId),
    Refill,
}

/// Where plain acquires wait for their call and take grants taken ahead: one lane for the whole
/// pool, and one per label-filter subset in use (a call names one subset).
pub(super) struct Lane {
    /// The subset its acquires are within; `None`: the whole pool.
    subset: Option<Arc<str>>,
    acquires: Arc<Batcher<AcquireItem, AcquireReply>>,
    stock: Mutex<Stock>,
}

impl Lane {
    pub(super) fn new(subset: Option<&str>, calls: &TaskTracker) -> Lane {
        Lane {
            subset: subset.map(Arc::from),
            acquires: Arc::new(Batcher::new(ACQUIRE_BATCH, ACQUIRE_CALLS, calls.clone())),
            stock: Mutex::default(),
        }
    }

    /// Drops the grants taken ahead: the pool's members changed, or Redis may have.
    pub(super) fn clear_stock(&self) {
        locked(&self.stock).clear();
    }
}

type AcquireCall = std::pin::Pin<Box<dyn Future<Output = Result<Vec<AcquireReply>, Fault>> + Send>>;

/// What sends a batch of the plain acquires of pool `p` waiting in `lane`.
fn acquire_sender(
    inner: &Arc<Inner>,
    p: &Arc<PoolLocal>,
    lane: &Arc<Lane>,
) -> impl FnMut(Vec<AcquireItem>) -> AcquireCall + Send + 'static {
    let (inner, p, lane) = (inner.clone(), p.clone(), lane.clone());
    move |items| {
        let (inner, p, lane) = (inner.clone(), p.clone(), lane.clone());
        Box::pin(async move {
            let r = inner.acquire_many(&p, &lane, &items).await;
            if let Err(Fault::Down(why)) = &r {
                // Now, before this task sends the acquires that queued meanwhile: they go to the
                // local view at once instead of waiting out a second timeout.
                inner.degrade(why);
            }
            r
        })
    }
}

/// The `many` mode's reply lines as each item's answer (a refill's is a placeholder nobody
/// reads), and the upstreams of the grants taken for the stock, which follow them.
fn split_replies(
    items: &[AcquireItem],
    expected: usize,
    replies: Vec<String>,
) -> Result<(Vec<AcquireReply>, Vec<UpstreamId>), Fault> {
    if replies.len() != expected {
        return Err(Fault::Broken(format!(
            "acquire: {} replies for {expected} leases",
            replies.len()
        )));
    }
    let parse = |r: &str| AcquireReply::parse_line(r).map_err(Fault::Broken);
    let mut replies = replies.iter();
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        out.push(match i {
            // The count was checked above: a missing line cannot happen, and would not parse.
            AcquireItem::Lease(_) => parse(replies.next().map_or("", String::as_str))?,
            AcquireItem::Refill => AcquireReply::NoCandidates,
        });
    }
    let mut grants = Vec::new();
    for r in replies {
        if let AcquireReply::Granted { upstream, .. } = parse(r)? {
            grants.push(UpstreamId::new(upstream));
        }
    }
    Ok((out, grants))
}

/// The `tally` mode's reply (upstream, count pairs, or one word: `unconfigured`, `nosubset`) as each
/// item's answer and the stock's grants, as [`split_replies`] gives them. The grants are dealt
/// one member at a time in turn, so the requests that follow spread over the members as a
/// batch decided one by one would spread them; the waiting leases take the first ones. More
/// grants than the `asked` are a broken reply, not a reason to allocate without bound.
fn split_tally(
    items: &[AcquireItem],
    asked: usize,
    replies: Vec<String>,
) -> Result<(Vec<AcquireReply>, Vec<UpstreamId>), Fault> {
    let whole = match replies.as_slice() {
        [w] if w == "unconfigured" => Some(AcquireReply::Unconfigured),
        [w] if w == "nosubset" => Some(AcquireReply::NoSubset),
        _ => None,
    };
    if let Some(reply) = whole {
        let out = items
            .iter()
            .map(|i| match i {
                AcquireItem::Lease(_) => reply.clone(),
                AcquireItem::Refill => AcquireReply::NoCandidates,
            })
            .collect();
        return Ok((out, Vec::new()));
    }
    if replies.len() % 2 != 0 {
        return Err(Fault::Broken(format!(
            "acquire: a tally of {} items",
            replies.len()
        )));
    }
    let mut counts = Vec::with_capacity(replies.len() / 2);
    for pair in replies.chunks_exact(2) {
        let n: usize = pair[1]
            .parse()
            .map_err(|_| Fault::Broken(format!("acquire: a tally count `{}`", pair[1])))?;
        counts.push((pair[0].as_str(), n));
    }
    let total = counts
        .iter()
        .try_fold(0usize, |t, (_, n)| t.checked_add(*n));
    if total.is_none_or(|t| t > asked) {
        return Err(Fault::Broken(format!(
            "acquire: a tally of more than the {asked} grants asked for"
        )));
    }
    let mut dealt = Vec::with_capacity(asked);
    while counts.iter().any(|(_, n)| *n > 0) {
        for (up, n) in counts.iter_mut().filter(|(_, n)| *n > 0) {
            *n -= 1;
            dealt.push(*up);
        }
    }
    let mut dealt = dealt.into_iter();
    let out = items
        .iter()
        .map(|i| match i {
            AcquireItem::Lease(_) => match dealt.next() {
                Some(up) => AcquireReply::Granted {
                    upstream: up.to_string(),
                    bound_now: false,
                },
                None => AcquireReply::NoCandidates,
            },
            AcquireItem::Refill => AcquireReply::NoCandidates,
        })
        .collect();
    Ok((out, dealt.map(UpstreamId::new).collect()))
}

/// A random id for a lease Redis grants, marked unlisted when it is (see `held.rs`).
fn new_lease(unlisted: bool) -> LeaseId {
    let id = rand::random::<u64>() & !(FALLBACK_LEASE | UNLISTED_LEASE);
    LeaseId(if unlisted { id | UNLISTED_LEASE } else { id })
}

/// Adds a lease id as `acquire.lua` takes it: `-` asks for an unlisted lease.
fn lease_arg(inv: &mut Call, lease: LeaseId) {
    if lease.0 & UNLISTED_LEASE != 0 {
        inv.arg("-");
    } else {
        inv.arg(lease.0);
    }
}

fn strategy_arg(s: Strategy) -> &'static str {
    match s {
        Strategy::LeastUsed => "least-used",
        Strategy::Weighted => "weighted",
        Strategy::LeastConnections => "least-connections",
        Strategy::RoundRobin => "round-robin",
    }
}

impl Inner {
    /// [`Store::acquire`]. Plain requests waiting for capacity are woken all at once by every
    /// release (as with the memory store), and each would cost a round trip. So while the pool is
    /// known to be full, plain acquires (no session, nothing excluded) go to Redis one at a time,
    /// and one that arrived no later than the last answer "full" was asked takes that answer
    /// without asking again: nothing that frees capacity happened since (every such thing moves
    /// the epoch). A burst of waiters then costs about two round trips per release, not one per
    /// waiter.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        pool: &str,
        want: Want<'_>,
    ) -> Result<Acquired, StoreError> {
        let p = self.pool(pool)?;
        let plain = matches!(want, Want::Any { exclude, within: None } if exclude.is_empty());
        if !plain || !p.full.load(Ordering::SeqCst) || !self.hears_events(&p) {
            let r = self.acquire_remote(pool, &p, want).await;
            if plain {
                p.full
                    .store(matches!(r, Ok(Acquired::AtCapacity)), Ordering::SeqCst);
            }
            return r;
        }
        let arrival = p.epoch.load(Ordering::SeqCst);
        let mut last = p.probe.lock().await;
        if let Some((sent, true)) = *last {
            if sent >= arrival && self.hears_events(&p) {
                return Ok(Acquired::AtCapacity);
            }
        }
        let sent = p.epoch.load(Ordering::SeqCst);
        let r = self.acquire_remote(pool, &p, want).await;
        let full = matches!(r, Ok(Acquired::AtCapacity));
        *last = Some((sent, full));
        p.full.store(full, Ordering::SeqCst);
        r
    }

    /// Wakes the pool's waiting requests when the earliest lease expires: capacity held by a
    /// gateway that died comes back without anyone releasing it.
    fn schedule_wake(&self, p: &Arc<PoolLocal>, deadline_ms: u64) {
        let now = now_ms();
        {
            let mut at = locked(&p.wake_at);
            if at.is_some_and(|t| t <= deadline_ms && t > now) {
                return;
            }
            *at = Some(deadline_ms);
        }
        let delay = Duration::from_millis(deadline_ms.saturating_sub(now) + 1);
        let p = p.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return,
            }
            {
                let mut at = locked(&p.wake_at);
                if *at == Some(deadline_ms) {
                    *at = None;
                }
            }
            p.wake();
        });
    }

    /// `acquire.lua` with the keys and leading arguments all its modes share; `lease` is ARGV[2]
    /// (`None` for the many mode, which ignores it), `session` the session modes' key and
    /// `subset` a label filter's (the last keys, in that order).
    fn acquire_call(
        &self,
        p: &PoolLocal,
        lease: Option<LeaseId>,
        session: Option<&str>,
        subset: Option<&str>,
    ) -> Call {
        let spec = p.spec.load();
        let k = &p.keys;
        let extra = usize::from(session.is_some()) + usize::from(subset.is_some());
        let mut inv = Call::new(&scripts::ACQUIRE, 12 + extra);
        for key in k.acquire() {
            inv.key(key);
        }
        if let Some(key) = session {
            inv.key(&k.session(key));
        }
        if let Some(id) = subset {
            inv.key(&k.subset(id));
        }
        let now = now_ms();
        inv.arg(now);
        match lease {
            Some(lease) => lease_arg(&mut inv, lease),
            None => {
                inv.arg("-");
            }
        }
        inv.arg(now + millis(spec.lease_ttl).max(1))
            .arg(spec.max_concurrency.unwrap_or(0))
            .arg(strategy_arg(spec.strategy))
            .arg(&k.events);
        inv
    }

    /// One acquire in its own call: a session's, one that excludes upstreams, or one within a
    /// label filter. A filter's subset is sent with its members the first time this instance
    /// names it, and again if Redis answers that it is missing (it expired, or Redis lost its
    /// data); else by name only.
    async fn acquire_one(
        &self,
        p: &PoolLocal,
        lease: LeaseId,
        want: Want<'_>,
    ) -> Result<AcquireReply, Fault> {
        let (session, within) = match want {
            Want::Session { key, within, .. } => (Some(key), within),
            Want::Any { within, .. } => (None, within),
        };
        let mut send_members = within.is_some_and(|s| !locked(&p.within).contains_key(s.id));
        loop {
            let mut inv = self.acquire_call(p, Some(lease), session, within.map(|s| s.id));
            let members = match within {
                Some(s) if send_members => s.members,
                _ => &[],
            };
            match want {
                Want::Any { exclude, within } => {
                    inv.arg(if within.is_some() { "within" } else { "any" });
                    if within.is_some() {
                        inv.arg(exclude.len());
                    }
                    for id in exclude {
                        inv.arg(id.as_str());
                    }
                }
                Want::Session {
                    key,
                    ttl,
                    preferred,
                    rebind,
                    within,
                } => {
                    inv.arg(if within.is_some() {
                        "session-within"
                    } else {
                        "session"
                    })
                    .arg(millis(ttl))
                    .arg(u8::from(rebind))
                    .arg(key);
                    if within.is_some() {
                        inv.arg(preferred.len());
                    }
                    for id in preferred {
                        inv.arg(id.as_str());
                    }
                }
            }
            for id in members {
                inv.arg(id.as_str());
            }
            let reply: Vec<String> = self.eval(&inv, self.timeout).await?;
            let reply = AcquireReply::parse(reply).map_err(Fault::Broken)?;
            match (reply, within) {
                (AcquireReply::NoSubset, Some(_)) if !send_members => send_members = true,
                (AcquireReply::NoSubset, _) => {
                    return Err(Fault::Broken(
                        "acquire: the subset is missing after sending it".into(),
                    ));
                }
                (reply, Some(s)) => {
                    if send_members {
                        self.sent(p, s.id);
                    }
                    return Ok(reply);
                }
                (reply, None) => return Ok(reply),
            }
        }
    }

    /// The plain acquires of a lane, one per waiting lease id, in one call (`many` mode, or
    /// `many-within` in a subset's lane, whose members were sent); in a pool whose leases are
    /// unlisted the call also takes grants for the lane's stock when it is due (see `stock.rs`).
    /// A refill item's reply is a placeholder: nobody waits for it. When the subset has gone
    /// from Redis every reply is `NoSubset`, and each acquire asks again on its own with the
    /// members.
    async fn acquire_many(
        &self,
        p: &PoolLocal,
        lane: &Lane,
        items: &[AcquireItem],
    ) -> Result<Vec<AcquireReply>, Fault> {
        if self.is_degraded() {
            // These waited behind a call that found Redis gone (see `acquire_sender`). Each is
            // replayed as a quiet release, which ends nothing: it was never sent.
            if items.iter().any(|i| matches!(i, AcquireItem::Refill)) {
                locked(&lane.stock).refill_failed();
            }
            return Err(Fault::Down("the store is degraded".into()));
        }
        let waiting = items
            .iter()
            .filter(|i| matches!(i, AcquireItem::Lease(_)))
            .count();
        let refill = waiting < items.len();
        let spec = p.spec.load();
        let unlisted = takes_unlisted_leases(&spec);
        let (extra, generation) = if unlisted {
            let mut stock = locked(&lane.stock);
            stock.note_waiting(waiting);
            let extra = if refill || stock.start_refill() {
                stock.refill_size()
            } else {
                0
            };
            (extra, stock.generation())
        } else {
            (0, 0)
        };
        let stocking = refill || extra > 0;
        let mut inv = self.acquire_call(p, None, None, lane.subset.as_deref());
        // Unlisted leases by least-used or weighted are only counted: Redis tallies them (see
        // `acquire.lua`) instead of deciding each.
        let tally = unlisted
            && matches!(spec.strategy, Strategy::LeastUsed | Strategy::Weighted)
            && items.iter().all(|i| match i {
                AcquireItem::Lease(l) => l.0 & UNLISTED_LEASE != 0,
                AcquireItem::Refill => true,
            });
        inv.arg(match (tally, lane.subset.is_some()) {
            (true, false) => "tally",
            (true, true) => "tally-within",
            (false, false) => "many",
            (false, true) => "many-within",
        });
        if tally {
            inv.arg(waiting + extra);
        } else {
            for i in items {
                if let AcquireItem::Lease(l) = i {
                    lease_arg(&mut inv, *l);
                }
            }
            for _ in 0..extra {
                inv.arg("-");
            }
        }
        drop(spec);
        let replies: Result<Vec<String>, Fault> = self.eval(&inv, self.timeout).await;
        let split = replies.and_then(|r| {
            if tally {
                split_tally(items, waiting + extra, r)
            } else {
                split_replies(items, waiting + extra, r)
            }
        });
        match split {
            Ok((out, mut grants)) => {
                if stocking {
                    // A member this instance just took out of service may have been picked by a
                    // call Redis ran before the change.
                    let applied = locked(&p.applied);
                    grants.retain(|g| applied.get(g).is_none_or(|s| s.eligible));
                    drop(applied);
                    locked(&lane.stock).fill(grants, tokio::time::Instant::now(), generation);
                }
                Ok(out)
            }
            Err(f) => {
                if stocking {
                    locked(&lane.stock).refill_failed();
                }
                Err(f)
            }
        }
    }

    /// Subset `id`'s members reached Redis: later acquires within it name it only, and the
    /// plain ones wait in its lane.
    fn sent(&self, p: &PoolLocal, id: &str) {
        let mut lanes = locked(&p.within);
        if lanes.contains_key(id) {
            return;
        }
        if lanes.len() >= MAX_SUBSETS_SENT {
            // Calls under way keep their lane until they end; stocked grants are dropped.
            lanes.clear();
        }
        lanes.insert(id.to_string(), Arc::new(Lane::new(Some(id), &self.calls)));
    }

    /// A grant from the lane's stock, when it holds a fresh grant; posts a refill when half of
    /// it is used.
    fn from_stock(
        self: &Arc<Self>,
        pool: &str,
        p: &Arc<PoolLocal>,
        lane: &Arc<Lane>,
    ) -> Option<Grant> {
        let (got, refill) = {
            let mut stock = locked(&lane.stock);
            let got = stock.take(tokio::time::Instant::now());
            (got, stock.start_refill())
        };
        if refill {
            lane.acquires
                .post(AcquireItem::Refill, || acquire_sender(self, p, lane));
        }
        let upstream = got?;
        locked(&p.held).take(&upstream);
        self.recount(pool, p, &upstream);
        Some(Grant {
            upstream,
            lease: new_lease(true),
            bound_now: false,
        })
    }

    /// One acquire in Redis (or in the local view while degraded).
    async fn acquire_remote(
        self: &Arc<Self>,
        pool: &str,
        p: &Arc<PoolLocal>,
        want: Want<'_>,
    ) -> Result<Acquired, StoreError> {
        let inner = self;
        if inner.is_degraded() {
            return inner.fallback_acquire(pool, want).await;
        }
        let unlisted = takes_unlisted_leases(&p.spec.load());
        // Plain acquires wait in a lane: the pool's, or their subset's once its members were
        // sent (the first acquire within a subset sends them on its own).
        let lane = match want {
            Want::Any {
                exclude: [],
                within: None,
            } => Some(p.plain.clone()),
            Want::Any {
                exclude: [],
                within: Some(s),
            } => locked(&p.within).get(s.id).cloned(),
            _ => None,
        };
        if let Some(lane) = lane.as_ref().filter(|_| unlisted) {
            if let Some(grant) = inner.from_stock(pool, p, lane) {
                return Ok(Acquired::Granted(grant));
            }
        }
        let mut restored = false;

        loop {
            let lease = new_lease(unlisted);
            let answer = match &lane {
                Some(lane) => {
                    let batched = lane
                        .acquires
                        .send(AcquireItem::Lease(lease), || acquire_sender(inner, p, lane))
                        .await;
                    match (batched, want) {
                        (
                            Ok(AcquireReply::NoSubset),
                            Want::Any {
                                within: Some(s), ..
                            },
                        ) => {
                            // Gone from Redis (it expired, or Redis lost its data): nothing was
                            // granted, so the lease is asked for again, with the members.
                            locked(&p.within).remove(s.id);
                            inner.acquire_one(p, lease, want).await
                        }
                        (batched, _) => batched,
                    }
                }
                None => inner.acquire_one(p, lease, want).await,
            };
            let reply = match answer {
                Ok(reply) => reply,
                Err(Fault::Down(why)) => {
                    // The acquire may still run once Redis gets to it: cancel its lease then.
                    inner.replay_quietly(pool, [lease], &why);
                    return inner.fallback_acquire(pool, want).await;
                }
                Err(Fault::Broken(why)) => return Err(broken(why)),
            };
            return Ok(match reply {
                AcquireReply::Granted {
                    upstream,
                    bound_now,
                } => {
                    let upstream = UpstreamId::new(upstream);
                    if lease.0 & UNLISTED_LEASE != 0 {
                        locked(&p.held).take(&upstream);
                    } else {
                        p.live.take(&upstream);
                    }
                    // A call that Redis answered after another found it gone (see `degrade`).
                    inner.recount(pool, p, &upstream);
                    Acquired::Granted(Grant {
                        upstream,
                        lease,
                        bound_now,
                    })
                }
                AcquireReply::AtCapacity {
                    earliest_deadline_ms,
                } => {
                    if let Some(at) = earliest_deadline_ms {
                        inner.schedule_wake(p, at);
                    }
                    Acquired::AtCapacity
                }
                AcquireReply::Unavailable(upstream) => {
                    Acquired::SessionUnavailable(UpstreamId::new(upstream))
                }
                AcquireReply::NoCandidates => Acquired::NoCandidates,
                AcquireReply::Unconfigured if !restored => {
                    restored = true;
                    match inner.restore_pool(p).await {
                        Ok(()) => continue,
                        Err(Fault::Down(why)) => {
                            inner.degrade(&why);
                            return inner.fallback_acquire(pool, want).await;
                        }
                        Err(Fault::Broken(why)) => return Err(broken(why)),
                    }
                }
                AcquireReply::Unconfigured => {
                    return Err(broken("the pool's state is missing after declaring it"));
                }
                // Answered within acquire_one, which asks again with the members.
                AcquireReply::NoSubset => return Err(broken("a subset reply out of place")),
            });
        }
    }

    async fn fallback_acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        Ok(match self.fallback.acquire(pool, want).await? {
            Acquired::Granted(g) => Acquired::Granted(Grant {
                lease: LeaseId(g.lease.0 | FALLBACK_LEASE),
                ..g
            }),
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(upstream: &str) -> AcquireReply {
        AcquireReply::Granted {
            upstream: upstream.into(),
            bound_now: false,
        }
    }

    /// Each waiting lease gets its own line in order, a refill item gets a placeholder and no
    /// line, and the lines after the waiting ones are the stock's grants.
    #[test]
    fn replies_go_to_their_leases_and_the_rest_to_the_stock() {
        let items = [
            AcquireItem::Lease(LeaseId(1)),
            AcquireItem::Refill,
            AcquireItem::Lease(LeaseId(2)),
        ];
        let lines = [
            "granted 0 http://a",
            "granted 0 http://b",
            "granted 0 http://c",
            "none",
        ];
        let (out, grants) =
            split_replies(&items, 4, lines.iter().map(|l| l.to_string()).collect()).unwrap();
        assert_eq!(
            out,
            [
                granted("http://a"),
                AcquireReply::NoCandidates,
                granted("http://b")
            ]
        );
        assert_eq!(
            grants,
            [UpstreamId::new("http://c")],
            "a line without a grant is skipped"
        );
        let short = split_replies(&items, 4, vec!["granted 0 http://a".into()]);
        assert!(matches!(short, Err(Fault::Broken(_))));
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A tally's grants are dealt a member at a time in turn: the waiting leases take the first
    /// ones, in order, and the stock the rest.
    #[test]
    fn a_tally_is_dealt_in_turn_to_the_leases_and_then_the_stock() {
        let items = [
            AcquireItem::Lease(LeaseId(1)),
            AcquireItem::Refill,
            AcquireItem::Lease(LeaseId(2)),
        ];
        let reply = strings(&["http://a", "3", "http://b", "1", "http://c", "2"]);
        let (out, grants) = split_tally(&items, 6, reply).unwrap();
        assert_eq!(
            out,
            [
                granted("http://a"),
                AcquireReply::NoCandidates,
                granted("http://b")
            ]
        );
        let ids: Vec<&str> = grants.iter().map(UpstreamId::as_str).collect();
        assert_eq!(ids, ["http://c", "http://a", "http://c", "http://a"]);
    }

    #[test]
    fn a_short_tally_leaves_leases_without_a_grant_and_a_bad_one_is_broken() {
        let items = [
            AcquireItem::Lease(LeaseId(1)),
            AcquireItem::Lease(LeaseId(2)),
            AcquireItem::Refill,
        ];
        let (out, grants) = split_tally(&items, 4, strings(&["http://a", "1"])).unwrap();
        assert!(matches!(out[0], AcquireReply::Granted { .. }), "{out:?}");
        assert_eq!(out[1], AcquireReply::NoCandidates);
        assert!(grants.is_empty());
        let (out, grants) = split_tally(&items, 4, Vec::new()).unwrap();
        assert!(out.iter().all(|r| *r == AcquireReply::NoCandidates));
        assert!(grants.is_empty());
        let (out, _) = split_tally(&items, 4, strings(&["unconfigured"])).unwrap();
        assert_eq!(
            out[..2],
            [AcquireReply::Unconfigured, AcquireReply::Unconfigured]
        );
        let (out, _) = split_tally(&items, 4, strings(&["nosubset"])).unwrap();
        assert_eq!(out[..2], [AcquireReply::NoSubset, AcquireReply::NoSubset]);
        let lies = ["http://a", "3", "http://b", "18446744073709551615"];
        for bad in [
            &["http://a"][..],
            &["http://a", "x"],
            &["http://a", "-1"],
            &["http://a", "5"],
            &lies,
        ] {
            let r = split_tally(&items, 4, strings(bad));
            assert!(matches!(r, Err(Fault::Broken(_))), "{bad:?}: {r:?}");
        }
    }
}
