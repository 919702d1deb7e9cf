//! The health engine and the allocator together, driven by scripted outcomes on a paused clock:
//! the pool-level behaviour of DESIGN §2 "Health", deterministic and fast. (End-to-end checks with
//! real sockets are in tests/health_e2e.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use poolgate::config::{HealthConfig, Strategy};
use poolgate::health::state::State;
use poolgate::health::{self, Outcome, PoolHealth};
use poolgate::pool::Ring;
use poolgate::store::memory::MemoryStore;
use poolgate::store::{Acquired, PoolSpec, Store, Want};
use poolgate::upstream::UpstreamId;

/// Virtual time between two requests.
const STEP: Duration = Duration::from_millis(50);
const POOL: &str = "p";

struct Sim {
    store: MemoryStore,
    health: PoolHealth,
    members: Vec<UpstreamId>,
    placement: Ring,
    /// Requests each upstream received, in order.
    served: HashMap<UpstreamId, usize>,
    rebind: bool,
}

impl Sim {
    async fn new(n: usize, cfg: HealthConfig) -> Sim {
        let members: Vec<UpstreamId> = (0..n).map(|i| UpstreamId::new(format!("u{i}"))).collect();
        let store = MemoryStore::new();
        store
            .configure(PoolSpec {
                name: POOL.into(),
                members: members.clone(),
                strategy: Strategy::LeastUsed,
                max_concurrency: None,
                lease_ttl: Duration::from_secs(60),
                shards: 1,
            })
            .await
            .unwrap();
        Sim {
            health: PoolHealth::new(POOL, cfg, Strategy::LeastUsed, &members),
            placement: Ring::new(&members),
            store,
            members,
            served: HashMap::new(),
            rebind: false,
        }
    }

    fn id(&self, i: usize) -> UpstreamId {
        self.members[i].clone()
    }

    /// One client request as the gateway runs it: acquire, exchange (scripted), release with the
    /// outcome, apply health's decisions; a connect-class failure of a non-sticky request is retried
    /// on another upstream up to twice. Returns the upstreams used and the final outcome (`None`
    /// when the request failed before any exchange, e.g. session-upstream-unavailable).
    async fn request(
        &mut self,
        target: &str,
        session: Option<&str>,
        script: &mut dyn FnMut(&UpstreamId, &str, usize) -> Outcome,
    ) -> (Vec<UpstreamId>, Option<Outcome>) {
        tokio::time::advance(STEP).await;
        let changes = self.health.tick();
        health::apply(&self.store, POOL, changes).await;
        let mut tried = Vec::new();
        for _ in 0..3 {
            let preferred;
            let want = match session {
                None => Want::Any {
                    exclude: &tried,
                    within: None,
                },
                Some(key) => {
                    preferred = self.placement.preferred(key, 4, &tried);
                    Want::Session {
                        key,
                        ttl: Duration::from_secs(3600),
                        preferred: &preferred,
                        rebind: self.rebind,
                        within: None,
                    }
                }
            };
            let grant = match self.store.acquire(POOL, want).await.unwrap() {
                Acquired::Granted(g) => g,
                _ => return (tried, None),
            };
            let n = self.served.entry(grant.upstream.clone()).or_default();
            *n += 1;
            let outcome = script(&grant.upstream, target, *n);
            self.store
                .release(
                    POOL,
                    &grant.upstream,
                    grant.lease,
                    outcome,
                    Duration::from_millis(10),
                )
                .await
                .unwrap();
            let changes =
                self.health
                    .observe(&grant.upstream, target, outcome, Duration::from_millis(10));
            health::apply(&self.store, POOL, changes).await;
            tried.push(grant.upstream.clone());
            let retry = outcome == Outcome::ConnectError && (session.is_none() || grant.bound_now);
            if !retry {
                return (tried, Some(outcome));
            }
            if let Some(key) = session {
                self.store.unbind(POOL, key, &grant.upstream).await.unwrap();
            }
        }
        (tried, Some(Outcome::ConnectError))
    }

    fn state(&self, i: usize) -> State {
        self.health.state_of(&self.members[i]).unwrap()
    }

    fn out(&self) -> usize {
        (0..self.members.len())
            .filter(|i| matches!(self.state(*i), State::Quarantined | State::Dead))
            .count()
    }
}

fn no_jitter() -> HealthConfig {
    HealthConfig {
        cooldown_jitter: 0.0,
        ..HealthConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn dead_share_three_of_ten_failing_get_under_five_percent_after_warmup() {
    let mut sim = Sim::new(10, HealthConfig::default()).await;
    let bad: HashSet<UpstreamId> = (0..3).map(|i| sim.id(i)).collect();
    let mut script = |u: &UpstreamId, _: &str, _: usize| {
        if bad.contains(u) {
            Outcome::ConnectError
        } else {
            Outcome::Ok
        }
    };
    for _ in 0..200 {
        sim.request("a.example", None, &mut script).await;
    }
    let (mut to_bad, mut ok) = (0, 0);
    for _ in 0..2000 {
        let (used, outcome) = sim.request("a.example", None, &mut script).await;
        to_bad += used.iter().filter(|u| bad.contains(*u)).count();
        ok += usize::from(outcome == Some(Outcome::Ok));
    }
    eprintln!("dead share: {to_bad} of 2000 requests touched a failing upstream; {ok} succeeded");
    assert!(to_bad < 100, "{to_bad} attempts went to the failing three");
    assert!(ok > 1900, "client-visible success {ok}/2000");
}

#[tokio::test(start_paused = true)]
async fn one_error_in_fifty_is_noise() {
    let mut sim = Sim::new(3, HealthConfig::default()).await;
    let u0 = sim.id(0);
    let mut script = |u: &UpstreamId, _: &str, n: usize| {
        if *u == u0 && n == 25 {
            Outcome::Reset
        } else {
            Outcome::Ok
        }
    };
    for _ in 0..150 {
        sim.request("a.example", None, &mut script).await;
    }
    assert_eq!(sim.served[&sim.id(0)], 50);
    assert_eq!(sim.state(0), State::Healthy);
}

#[tokio::test(start_paused = true)]
async fn flapping_upstream_changes_state_a_bounded_number_of_times() {
    /// At most: healthy → degraded, and perhaps one quarantine → half-open → degraded cycle.
    const MAX_TRANSITIONS: usize = 4;
    let mut sim = Sim::new(4, no_jitter()).await;
    let u0 = sim.id(0);
    let mut script = |u: &UpstreamId, _: &str, n: usize| {
        if *u == u0 && n % 2 == 0 {
            Outcome::Timeout
        } else {
            Outcome::Ok
        }
    };
    let mut transitions = 0;
    let mut last = sim.state(0);
    for _ in 0..1000 {
        sim.request("a.example", None, &mut script).await;
        let now = sim.state(0);
        if now != last {
            transitions += 1;
            last = now;
        }
    }
    eprintln!("flapping: {transitions} transitions over 1000 requests, ends {last:?}");
    assert!(transitions <= MAX_TRANSITIONS, "{transitions} transitions");
    assert_eq!(last, State::Degraded);
}

#[tokio::test(start_paused = true)]
async fn cooldowns_double_within_the_jitter_band_under_the_cap_and_reset() {
    let cfg = HealthConfig {
        cooldown_base: Duration::from_secs(10),
        cooldown_max: Duration::from_secs(80),
        dead_after_cycles: 100,
        ..HealthConfig::default()
    };
    let mut sim = Sim::new(4, cfg.clone()).await;
    let u0 = sim.id(0);
    let failing = std::cell::Cell::new(true);
    let mut script = |u: &UpstreamId, _: &str, _: usize| {
        if *u == u0 && failing.get() {
            Outcome::ConnectError
        } else {
            Outcome::Ok
        }
    };
    // Each new quarantine's cool-down, read at the instant it starts.
    let cooldown_of_new_quarantine = |sim: &Sim, seen: &mut u64| -> Option<Duration> {
        let v = sim.health.view();
        let u = &v.upstreams[&sim.id(0)];
        if u.quarantines_total > *seen {
            *seen = u.quarantines_total;
            u.cooldown_remaining_ms.map(Duration::from_millis)
        } else {
            None
        }
    };
    let mut seen = 0;
    let mut lengths = Vec::new();
    for _ in 0..20_000 {
        sim.request("a.example", None, &mut script).await;
        lengths.extend(cooldown_of_new_quarantine(&sim, &mut seen));
        if lengths.len() == 6 {
            break;
        }
    }
    assert_eq!(lengths.len(), 6, "{lengths:?}");
    for (i, len) in lengths.iter().enumerate() {
        let nominal = (cfg.cooldown_base * 2u32.pow(i as u32)).min(cfg.cooldown_max);
        let lo = nominal.mul_f64(1.0 - cfg.cooldown_jitter);
        let hi = nominal
            .mul_f64(1.0 + cfg.cooldown_jitter)
            .min(cfg.cooldown_max);
        assert!(
            *len >= lo && *len <= hi,
            "quarantine {}: {len:?} not in [{lo:?}, {hi:?}]",
            i + 1
        );
    }
    eprintln!("cool-downs: {lengths:?}");

    // Recover, stay healthy past cooldown_reset_after, fail again: back to the base cool-down.
    failing.set(false);
    for _ in 0..20_000 {
        sim.request("a.example", None, &mut script).await;
        if sim.state(0) == State::Healthy {
            break;
        }
    }
    assert_eq!(sim.state(0), State::Healthy);
    tokio::time::advance(cfg.cooldown_reset_after).await;
    failing.set(true);
    for _ in 0..20_000 {
        sim.request("a.example", None, &mut script).await;
        if let Some(len) = cooldown_of_new_quarantine(&sim, &mut seen) {
            let lo = cfg.cooldown_base.mul_f64(1.0 - cfg.cooldown_jitter);
            let hi = cfg.cooldown_base.mul_f64(1.0 + cfg.cooldown_jitter);
            assert!(len >= lo && len <= hi, "after the reset: {len:?}");
            return;
        }
    }
    panic!("no second quarantine after the reset");
}

#[tokio::test(start_paused = true)]
async fn quarantine_cap_holds_when_five_of_eight_turn_bad() {
    let mut sim = Sim::new(8, no_jitter()).await;
    let bad: HashSet<UpstreamId> = (0..5).map(|i| sim.id(i)).collect();
    let mut script = |u: &UpstreamId, _: &str, _: usize| {
        if bad.contains(u) {
            Outcome::UpstreamError
        } else {
            Outcome::Ok
        }
    };
    let (mut max_out, mut ok) = (0, 0);
    for _ in 0..3000 {
        let (_, outcome) = sim.request("a.example", None, &mut script).await;
        ok += usize::from(outcome == Some(Outcome::Ok));
        max_out = max_out.max(sim.out());
    }
    let view = sim.health.view();
    eprintln!(
        "cap: at most {max_out} out at once (cap {}); {ok}/3000 ok",
        view.quarantine_cap
    );
    assert_eq!(view.quarantine_cap, 2);
    assert!(max_out <= 2, "{max_out} quarantined at once");
    let held = (0..5).filter(|i| sim.state(*i) == State::Degraded).count();
    assert!(
        held >= 3,
        "the rest are down-weighted, not removed ({held} degraded)"
    );
    assert!(ok > 1500, "traffic keeps flowing: {ok}/3000");
}

#[tokio::test(start_paused = true)]
async fn platform_tightening_is_a_target_incident_not_a_bad_pool() {
    let mut sim = Sim::new(10, HealthConfig::default()).await;
    let mut script = |_: &UpstreamId, target: &str, _: usize| {
        if target == "strict.example" {
            Outcome::Captcha
        } else {
            Outcome::Ok
        }
    };
    let mut other_ok = 0;
    for i in 0..2000 {
        let target = if i % 3 == 0 {
            "strict.example"
        } else {
            "easy.example"
        };
        let (_, outcome) = sim.request(target, None, &mut script).await;
        if target == "easy.example" {
            other_ok += usize::from(outcome == Some(Outcome::Ok));
        }
        assert_eq!(
            sim.out(),
            0,
            "request {i}: an upstream was quarantined for the target's fault"
        );
    }
    let view = sim.health.view();
    assert_eq!(view.target_incidents.len(), 1);
    assert_eq!(view.target_incidents[0].target, "strict.example");
    assert!(!view.global_incident);
    assert_eq!(other_ok, 2000 - 667, "other targets unaffected");
    assert!((0..10).all(|i| sim.state(i) == State::Healthy));
}

#[tokio::test(start_paused = true)]
async fn bad_ip_is_quarantined_within_ten_of_its_requests() {
    let mut sim = Sim::new(10, HealthConfig::default()).await;
    let u3 = sim.id(3);
    let mut script = |u: &UpstreamId, _: &str, _: usize| {
        if *u == u3 {
            Outcome::Captcha
        } else {
            Outcome::Ok
        }
    };
    let targets = ["a.example", "b.example", "c.example", "d.example"];
    let mut quarantined_after = None;
    for i in 0..500 {
        sim.request(targets[i % targets.len()], None, &mut script)
            .await;
        if sim.state(3) == State::Quarantined {
            quarantined_after = Some(sim.served[&sim.id(3)]);
            break;
        }
    }
    eprintln!("bad IP quarantined after {quarantined_after:?} of its requests");
    assert!(
        quarantined_after.is_some_and(|n| n <= 10),
        "{quarantined_after:?}"
    );
    assert!(sim.health.view().target_incidents.is_empty());
}

#[tokio::test(start_paused = true)]
async fn sessions_never_change_upstream_while_upstreams_degrade_and_recover() {
    let mut sim = Sim::new(10, no_jitter()).await;
    let flaky: Vec<UpstreamId> = (0..3).map(|i| sim.id(i)).collect();
    // The three fail through phases: bad for a while, then good, then bad again.
    let clock = std::cell::Cell::new(0usize);
    let mut script = |u: &UpstreamId, _: &str, _: usize| {
        let phase = (clock.get() / 2500) % 2;
        if flaky.contains(u) && phase == 0 && clock.get() % 3 != 0 {
            Outcome::Timeout
        } else {
            Outcome::Ok
        }
    };
    let mut bound: HashMap<String, UpstreamId> = HashMap::new();
    let mut moved = 0;
    let mut states_seen = HashSet::new();
    for i in 0..10_000 {
        clock.set(i);
        let key = format!("s{}", i % 1000);
        let (used, _) = sim.request("shop.example", Some(&key), &mut script).await;
        let Some(up) = used.last() else { continue };
        match bound.get(&key) {
            Some(b) if b != up => moved += 1,
            Some(_) => {}
            None => {
                bound.insert(key, up.clone());
            }
        }
        for j in 0..3 {
            states_seen.insert(sim.state(j));
        }
    }
    eprintln!("sticky: {moved} of 1000 sessions moved; flaky states seen {states_seen:?}");
    assert!(states_seen.contains(&State::Quarantined) || states_seen.contains(&State::Degraded));
    assert_eq!(moved, 0, "sessions changed upstream");
}

#[tokio::test(start_paused = true)]
async fn a_session_on_a_dead_upstream_fails_or_is_rebound_when_configured() {
    let cfg = HealthConfig {
        cooldown_base: Duration::from_secs(1),
        cooldown_max: Duration::from_secs(1),
        dead_after_cycles: 0,
        cooldown_jitter: 0.0,
        ..HealthConfig::default()
    };
    for rebind in [false, true] {
        let mut sim = Sim::new(4, cfg.clone()).await;
        sim.rebind = rebind;
        let key = "victim";
        let dead_now = std::cell::Cell::new(false);
        let (used, _) = sim
            .request("a.example", Some(key), &mut |_, _, _| Outcome::Ok)
            .await;
        let home = used[0].clone();
        let home_idx = sim.members.iter().position(|m| *m == home).unwrap();
        dead_now.set(true);
        // Non-sticky traffic kills `home` (cap and min_in_service allow one out of four).
        for _ in 0..400 {
            let h = home.clone();
            sim.request("a.example", None, &mut |u, _, _| {
                if *u == h {
                    Outcome::ConnectError
                } else {
                    Outcome::Ok
                }
            })
            .await;
            if sim.state(home_idx) == State::Dead {
                break;
            }
        }
        assert_eq!(sim.state(home_idx), State::Dead);
        let (used, outcome) = sim
            .request("a.example", Some(key), &mut |_, _, _| Outcome::Ok)
            .await;
        if rebind {
            assert_eq!(outcome, Some(Outcome::Ok));
            assert_ne!(used[0], home, "rebound to another upstream");
        } else {
            assert_eq!(
                outcome, None,
                "session-upstream-unavailable, not a silent move"
            );
            let got = sim
                .store
                .acquire(
                    POOL,
                    Want::Session {
                        key,
                        ttl: Duration::from_secs(60),
                        preferred: &[],
                        rebind: false,
                        within: None,
                    },
                )
                .await
                .unwrap();
            assert_eq!(got, Acquired::SessionUnavailable(home.clone()));
        }
    }
}

/// One of four upstreams meets a site that challenges everybody first (a sticky session sends
/// it there again and again, so it is quarantined for it), then the rest of the pool meets it too.
/// The incident, once recognised, gives back what the site's bans took: every upstream is in
/// service from then on, and traffic elsewhere is untouched.
#[tokio::test(start_paused = true)]
async fn a_site_wide_challenge_gives_back_the_first_upstream_it_took_out() {
    let mut sim = Sim::new(4, no_jitter()).await;
    let mut script = |_: &UpstreamId, target: &str, _: usize| {
        if target == "strict.example" {
            Outcome::Captcha
        } else {
            Outcome::Ok
        }
    };
    let in_service = |sim: &Sim| (0..4).all(|i| sim.state(i) == State::Healthy);
    // Ordinary traffic first, so every upstream has a record elsewhere.
    for _ in 0..20 {
        sim.request("easy.example", None, &mut script).await;
    }
    // The session's upstream meets the challenge alone, well past the ban threshold: with no
    // other evidence it is taken for a bad IP.
    let (first, _) = sim.request("strict.example", Some("s1"), &mut script).await;
    let first_index = (0..4).find(|i| sim.id(*i) == first[0]).unwrap();
    for i in 0..30 {
        let (used, _) = sim.request("strict.example", Some("s1"), &mut script).await;
        assert_eq!(used, first, "request {i}: the session moved");
    }
    assert_eq!(sim.state(first_index), State::Quarantined);
    // The rest of the pool meets it too: the incident gives the first upstream back.
    let mut recognised_at = None;
    for i in 0..40 {
        sim.request("strict.example", None, &mut script).await;
        let incident = !sim.health.view().target_incidents.is_empty();
        if incident && recognised_at.is_none() {
            recognised_at = Some(i);
        }
        if recognised_at.is_some() {
            assert!(
                in_service(&sim),
                "pool request {i}: still out after the incident"
            );
        }
    }
    assert!(recognised_at.is_some(), "no target incident");
    let view = sim.health.view();
    assert_eq!(view.target_incidents[0].target, "strict.example");
    let (_, outcome) = sim.request("easy.example", None, &mut script).await;
    assert_eq!(outcome, Some(Outcome::Ok));
    assert!(in_service(&sim));
}

/// Whether `i` is out of service (quarantined or dead).
fn is_out(sim: &Sim, i: usize) -> bool {
    matches!(sim.state(i), State::Quarantined | State::Dead)
}

/// Our network is down: no upstream can be reached, on any target. The engine needs three
/// samples of each upstream to call it failing; with quarantine at five consecutive failures the
/// incident is recognised before anybody could be quarantined, and while it lasts nobody is.
/// When the network comes back the incident ends and every upstream is healthy again.
#[tokio::test(start_paused = true)]
async fn a_local_outage_is_a_global_incident_and_quarantines_nobody_while_it_lasts() {
    let cfg = HealthConfig {
        quarantine_after_failures: 5,
        ..no_jitter()
    };
    let mut sim = Sim::new(10, cfg).await;
    let down = std::cell::Cell::new(true);
    let mut script = |_: &UpstreamId, _: &str, _: usize| {
        if down.get() {
            Outcome::ConnectError
        } else {
            Outcome::Ok
        }
    };
    let targets = ["a.example", "b.example", "c.example"];
    let mut recognised_at = None;
    for i in 0..400 {
        sim.request(targets[i % 3], None, &mut script).await;
        let view = sim.health.view();
        if view.global_incident {
            recognised_at.get_or_insert(i);
        }
        assert_eq!(
            sim.out(),
            0,
            "request {i}: quarantined during a local outage"
        );
        assert!(
            view.target_incidents.is_empty(),
            "request {i}: {:?}",
            view.target_incidents
        );
    }
    eprintln!("global incident recognised at request {recognised_at:?}");
    assert!(
        recognised_at.is_some_and(|i| i < 40),
        "recognised at {recognised_at:?}"
    );
    assert!(sim.health.view().global_incident, "still on while it lasts");

    // The network is back.
    down.set(false);
    let mut ended_at = None;
    for i in 0..400 {
        let (_, outcome) = sim.request(targets[i % 3], None, &mut script).await;
        assert_eq!(outcome, Some(Outcome::Ok));
        assert_eq!(sim.out(), 0, "request {i} after the outage");
        if !sim.health.view().global_incident {
            ended_at.get_or_insert(i);
        }
        if ended_at.is_some() && (0..10).all(|j| sim.state(j) == State::Healthy) {
            break;
        }
    }
    eprintln!("global incident over at request {ended_at:?} after the outage");
    assert!(ended_at.is_some(), "the incident never ended");
    assert!((0..10).all(|j| sim.state(j) == State::Healthy));
}

/// With the default thresholds quarantine (three failures in a row) comes as early as the third
/// sample the incident detection needs, so on a cold start the first upstreams to fail are taken
/// out before the incident is recognised: the quarantine cap bounds them, and once the incident
/// is recognised nobody else goes.
#[tokio::test(start_paused = true)]
async fn with_default_thresholds_a_global_incident_stops_quarantines_at_the_cap() {
    let mut sim = Sim::new(10, no_jitter()).await;
    let mut script = |_: &UpstreamId, _: &str, _: usize| Outcome::ConnectError;
    let cap = sim.health.view().quarantine_cap;
    let mut out_when_recognised = None;
    let mut out_before: HashSet<usize> = HashSet::new();
    for i in 0..400 {
        sim.request("a.example", None, &mut script).await;
        let view = sim.health.view();
        let out: HashSet<usize> = (0..10).filter(|j| is_out(&sim, *j)).collect();
        assert!(
            out.len() <= cap,
            "request {i}: {} out, cap {cap}",
            out.len()
        );
        match out_when_recognised {
            None if view.global_incident => {
                out_when_recognised = Some(out.len());
                out_before = out;
            }
            None => {}
            Some(_) => assert!(
                out.is_subset(&out_before),
                "request {i}: {out:?} out during the incident, {out_before:?} before it"
            ),
        }
    }
    eprintln!("default thresholds: {out_when_recognised:?} out when the incident was recognised");
    assert!(out_when_recognised.is_some(), "no global incident");
}

/// Back from quarantine, an upstream is half-open: an eighth of a share, doubling with each
/// success (cost 8 → 4 → 2 → 1) until `half_open_successes` in a row make it healthy. The costs
/// are what the store is told.
#[tokio::test(start_paused = true)]
async fn half_open_ramps_the_share_up_with_each_success_then_heals() {
    let cfg = no_jitter();
    let members: Vec<UpstreamId> = (0..4).map(|i| UpstreamId::new(format!("u{i}"))).collect();
    let h = PoolHealth::new(POOL, cfg.clone(), Strategy::LeastUsed, &members);
    let u0 = &members[0];
    let observe = |o: Outcome| h.observe(u0, "a.example", o, Duration::from_millis(10));
    for _ in 0..cfg.quarantine_after_failures {
        observe(Outcome::Timeout);
    }
    assert_eq!(h.state_of(u0), Some(State::Quarantined));
    tokio::time::advance(cfg.cooldown_base).await;
    let changes = h.tick();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        changes[0].transition.as_ref().map(|t| t.to),
        Some(State::HalfOpen)
    );
    let mut costs = vec![(State::HalfOpen, changes[0].member.cost)];
    assert!(changes[0].member.eligible);
    for _ in 0..cfg.half_open_successes {
        let state_before = h.state_of(u0);
        let changes = observe(Outcome::Ok);
        // A change is handed over only when the setting (or the state) moves.
        for c in &changes {
            assert_eq!(&c.upstream, u0);
            costs.push((h.state_of(u0).unwrap(), c.member.cost));
        }
        if changes.is_empty() {
            assert_eq!(
                state_before,
                h.state_of(u0),
                "a transition always comes with a change"
            );
        }
        assert_eq!(
            h.view().upstreams[u0].allocation_cost,
            costs.last().unwrap().1,
            "the view shows what the store was told"
        );
    }
    assert_eq!(
        costs,
        vec![
            (State::HalfOpen, 8),
            (State::HalfOpen, 4),
            (State::HalfOpen, 2),
            (State::HalfOpen, 1),
            (State::Healthy, 1),
        ]
    );
    assert_eq!(h.state_of(u0), Some(State::Healthy));

    // A failure on the way up sends it back out, with the next (doubled) cool-down.
    for _ in 0..cfg.quarantine_after_failures {
        observe(Outcome::Timeout);
    }
    tokio::time::advance(cfg.cooldown_base * 2).await;
    let changes = h.tick();
    assert_eq!(changes[0].member.cost, 8, "{changes:?}");
    observe(Outcome::Ok);
    let changes = observe(Outcome::Timeout);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        changes[0].transition.as_ref().map(|t| t.to),
        Some(State::Quarantined)
    );
    assert!(!changes[0].member.eligible);
    let left = h.view().upstreams[u0].cooldown_remaining_ms.unwrap();
    assert_eq!(
        Duration::from_millis(left),
        cfg.cooldown_base * 4,
        "the third quarantine in a row"
    );
}
