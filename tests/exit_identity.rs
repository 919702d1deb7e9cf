//! Exit identity: probes record each member's exit IP from `exit_ip_url`, `/status` flags members
//! that share one, answers that are not exactly one address are ignored, and a ban through one
//! member is a ban on the members with the same exit IP.
//!
//! Every fake proxy leaves from 127.0.0.1, so each is given the address it claims
//! (`FakeProxyOpts::exit`, sent as `x-fake-exit`), which the origin's `/exit-ip` answers with.
//! The end-to-end tests probe for real (through the fakes, on loopback), so they wait on the real
//! clock, every wait bounded; the scheduling test runs on a paused clock with a scripted runner.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, ProxyOutcome, TestGateway,
};
use poolgate::app::StartOptions;
use poolgate::config::{Config, ProbeConfig};
use poolgate::probe::ExitIpFault;
use poolgate::probe::prober::Runner;
use poolgate::upstream::Upstream;
use serde_json::Value;

/// Long enough for a few probe rounds at `interval = "1s"`.
const WAIT: Duration = Duration::from_secs(15);

fn member_list(proxies: &[(&str, &FakeProxy)]) -> String {
    proxies
        .iter()
        .map(|(name, p)| format!("\"{}#{name}\"", p.url()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `[pools.<name>]` section probing `control` and asking `exit_url` for exit IPs.
fn pool_section(
    name: &str,
    members: &str,
    control: &Origin,
    exit_url: &str,
    extra: &str,
) -> String {
    format!(
        "[pools.{name}]\nupstreams = [{members}]\n{extra}\
         [pools.{name}.probe]\ntargets = [\"{}\"]\nexpect_body = \"control-ok\"\ninterval = \"1s\"\njitter = 0.2\ntimeout = \"2s\"\nexit_ip_url = \"{exit_url}\"\n",
        control.url("/probe"),
    )
}

async fn start(pools: &str) -> TestGateway {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nconnect_timeout = \"1s\"\n\
         [policy]\nallow_private_targets = true\n{pools}"
    );
    let config = Config::parse(&text, "test", None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    TestGateway::from_config(config).await
}

fn pool<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pool {name} in {status}"))
}

fn upstream<'a>(status: &'a Value, pool_name: &str, id: &str) -> &'a Value {
    pool(status, pool_name)["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == id)
        .unwrap_or_else(|| panic!("no upstream {id} in {status}"))
}

fn shares(u: &Value) -> Vec<String> {
    u["shares_exit_ip_with"]
        .as_array()
        .unwrap_or_else(|| panic!("no shares_exit_ip_with in {u}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Waits until every `(pool, id)` has an exit IP in `/status`; the last status.
async fn wait_for_exit_ips(gw: &TestGateway, members: &[(&str, &str)]) -> Value {
    let mut status = gw.status().await;
    for _ in 0..(WAIT.as_millis() / 100) {
        if members
            .iter()
            .all(|(p, id)| upstream(&status, p, id)["exit_ip"].is_string())
        {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = gw.status().await;
    }
    panic!("exit IPs of {members:?} not recorded within {WAIT:?}: {status}");
}

#[tokio::test]
async fn exit_ips_are_recorded_per_member_and_shared_ones_are_flagged() {
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let p0 = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.10")).await;
    let p1 = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.10")).await;
    let p2 = FakeProxy::start(FakeProxyOpts::with_exit("2001:db8::20")).await;
    let members = member_list(&[("p0", &p0), ("p1", &p1), ("p2", &p2)]);
    // The JSON form of the answer, `{"ip": …}`.
    let gw = start(&pool_section(
        "default",
        &members,
        &control,
        &control.url("/exit-ip.json"),
        "",
    ))
    .await;

    let status = wait_for_exit_ips(
        &gw,
        &[("default", "p0"), ("default", "p1"), ("default", "p2")],
    )
    .await;
    let (u0, u1, u2) = (
        upstream(&status, "default", "p0"),
        upstream(&status, "default", "p1"),
        upstream(&status, "default", "p2"),
    );
    assert_eq!(u0["exit_ip"], "203.0.113.10");
    assert_eq!(u1["exit_ip"], "203.0.113.10");
    assert_eq!(u2["exit_ip"], "2001:db8::20");
    assert_eq!(shares(u0), ["p1"]);
    assert_eq!(shares(u1), ["p0"]);
    assert!(shares(u2).is_empty(), "{u2}");
    let pool = pool(&status, "default");
    assert_eq!(pool["shared_exit_ips"], 1, "{pool}");
    assert!(pool["probes"]["exit_ip"]["recorded"].as_u64().unwrap() >= 3);
    assert_eq!(pool["probes"]["exit_ip"]["rejected"], 0);
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("poolgate_shared_exit_ips{pool=\"default\"} 1"),
        "{metrics}"
    );

    // p1's exit moves to p2's address: the flags follow.
    p1.set_exit(Some("2001:db8::20"));
    let mut moved = false;
    for _ in 0..(WAIT.as_millis() / 100) {
        let status = gw.status().await;
        if upstream(&status, "default", "p1")["exit_ip"] == "2001:db8::20" {
            assert_eq!(shares(upstream(&status, "default", "p2")), ["p1"]);
            assert!(shares(upstream(&status, "default", "p0")).is_empty());
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "p1's new exit IP recorded");
}

#[tokio::test]
async fn answers_that_are_not_one_address_are_ignored_and_counted() {
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let html = FakeProxy::start(FakeProxyOpts::with_exit(
        "<html><body>Your IP: 203.0.113.5</body></html>",
    ))
    .await;
    let host = FakeProxy::start(FakeProxyOpts::with_exit("proxy.example")).await;
    let list = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.5, 198.51.100.1")).await;
    let good = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.6")).await;
    // A valid address padded past the 1 KiB bound: refused whole, not cut to what parses.
    let padded = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.7")).await;
    let pools = format!(
        "{}{}",
        pool_section(
            "default",
            &member_list(&[
                ("html", &html),
                ("host", &host),
                ("list", &list),
                ("good", &good)
            ]),
            &control,
            &control.url("/exit-ip"),
            "",
        ),
        pool_section(
            "padded",
            &member_list(&[("padded", &padded)]),
            &control,
            &control.url("/exit-ip?pad=2000"),
            "",
        ),
    );
    let gw = start(&pools).await;

    wait_for_exit_ips(&gw, &[("default", "good")]).await;
    // Every member has been probed at least twice once each pool counts that many answers.
    let mut status = gw.status().await;
    for _ in 0..(WAIT.as_millis() / 100) {
        let rejected = |p: &str| {
            pool(&status, p)["probes"]["exit_ip"]["rejected"]
                .as_u64()
                .unwrap()
        };
        if rejected("default") >= 6 && rejected("padded") >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = gw.status().await;
    }
    eprintln!(
        "exit-IP answers: default {}, padded {}",
        pool(&status, "default")["probes"]["exit_ip"],
        pool(&status, "padded")["probes"]["exit_ip"]
    );
    assert!(
        pool(&status, "default")["probes"]["exit_ip"]["rejected"]
            .as_u64()
            .unwrap()
            >= 6
    );
    assert!(
        pool(&status, "padded")["probes"]["exit_ip"]["rejected"]
            .as_u64()
            .unwrap()
            >= 2
    );
    for (p, id) in [
        ("default", "html"),
        ("default", "host"),
        ("default", "list"),
        ("padded", "padded"),
    ] {
        let u = upstream(&status, p, id);
        assert!(u["exit_ip"].is_null(), "{id}: {u}");
        assert!(shares(u).is_empty(), "{id}: {u}");
        assert_eq!(
            u["state"], "healthy",
            "a bad answer is not held against the member: {u}"
        );
    }
    assert_eq!(
        upstream(&status, "default", "good")["exit_ip"],
        "203.0.113.6"
    );
    assert_eq!(pool(&status, "default")["shared_exit_ips"], 0);
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("poolgate_exit_ip_answers_total{pool=\"padded\",result=\"rejected\"}"),
        "{metrics}"
    );
    assert!(html.requests() >= 2, "the checks went through the members");
}

#[tokio::test]
async fn a_ban_through_one_member_is_shared_with_its_exit_ip_twin() {
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let site = Origin::start(OriginBehaviour::fixed("welcome")).await;
    let p0 = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.10")).await;
    let p1 = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.10")).await;
    let p2 = FakeProxy::start(FakeProxyOpts::with_exit("203.0.113.20")).await;
    let members = member_list(&[("p0", &p0), ("p1", &p1), ("p2", &p2)]);
    // A long cool-down: nothing comes back during the test. The pool may lose all but one.
    let gw = start(&format!(
        "{}[pools.default.health]\nmax_quarantined_percent = 100\nmin_in_service = 1\ncooldown_base = \"10m\"\ncooldown_jitter = 0.0\n",
        pool_section(
            "default",
            &members,
            &control,
            &control.url("/exit-ip"),
            "strategy = \"round-robin\"\n",
        )
    ))
    .await;
    wait_for_exit_ips(
        &gw,
        &[("default", "p0"), ("default", "p1"), ("default", "p2")],
    )
    .await;

    // The site bans p0's address: every page through p0 is a captcha.
    p0.set_mode(ProxyMode::Captcha).await;
    let client = gw.client();
    let mut status = gw.status().await;
    let mut out = false;
    for _ in 0..60 {
        let _ = client.get(site.url("/page")).send().await;
        status = gw.status().await;
        if upstream(&status, "default", "p0")["state"] == "quarantined"
            && upstream(&status, "default", "p1")["state"] == "quarantined"
        {
            out = true;
            break;
        }
    }
    let (u0, u1, u2) = (
        upstream(&status, "default", "p0"),
        upstream(&status, "default", "p1"),
        upstream(&status, "default", "p2"),
    );
    assert!(out, "p0 and its twin p1 quarantined: {u0}\n{u1}");
    assert_eq!(u2["state"], "healthy", "{u2}");
    // p1's own proxy never served a captcha: its bans are p0's, shared.
    assert!(u1["captcha_ratio"].as_f64().unwrap() > 0.0, "{u1}");
    assert!(
        !p1.seen().iter().any(|r| r.outcome == ProxyOutcome::Captcha),
        "p1 served no captcha itself"
    );
    let reason = u1["state_reason"].as_str().unwrap();
    assert!(reason.contains("captcha/block ratio"), "{reason}");

    // The target's row of the matrix shows p0's bans on p1 too, none on p2.
    let row = pool(&status, "default")["matrix"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["cells"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["upstream"] == "p0" && c["bans"].as_u64().unwrap() > 0)
        })
        .unwrap_or_else(|| panic!("no row with p0's bans: {status}"))
        .clone();
    let bans = |id: &str| {
        row["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["upstream"] == id)
            .map_or(0, |c| c["bans"].as_u64().unwrap())
    };
    assert!(bans("p1") > 0, "{row}");
    assert_eq!(
        bans("p1"),
        bans("p0"),
        "each ban through p0 is one on p1: {row}"
    );
    assert_eq!(bans("p2"), 0, "{row}");
    assert_eq!(
        row["incident"], false,
        "a shared ban is no target incident: {row}"
    );

    // Requests to the site now avoid both: they all go through p2.
    let site_seen = |p: &FakeProxy| {
        p.targets()
            .iter()
            .filter(|(_, t)| t.contains(&site.authority()))
            .count()
    };
    let (before0, before1, before2) = (site_seen(&p0), site_seen(&p1), site_seen(&p2));
    for _ in 0..10 {
        let resp = client.get(site.url("/page")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "welcome");
    }
    assert_eq!(site_seen(&p0), before0, "p0 is out");
    assert_eq!(site_seen(&p1), before1, "p1, p0's twin, is out");
    assert_eq!(site_seen(&p2), before2 + 10);
}

/// A probe runner on a script: probes of `failing` members fail, the others pass; exit IPs come
/// from `exits`; every exit-IP question is logged.
#[derive(Default)]
struct Scripted {
    failing: Vec<String>,
    exits: HashMap<String, IpAddr>,
    asked: Mutex<Vec<String>>,
}

impl Runner for Scripted {
    fn probe(
        &self,
        upstream: Arc<Upstream>,
        _cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<Duration, String>> + Send>> {
        let fails = self.failing.contains(&upstream.id.to_string());
        Box::pin(async move {
            if fails {
                Err("scripted failure".to_string())
            } else {
                Ok(Duration::from_millis(5))
            }
        })
    }

    fn exit_ip(
        &self,
        upstream: Arc<Upstream>,
        cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<IpAddr, ExitIpFault>> + Send>> {
        let id = upstream.id.to_string();
        assert!(cfg.exit_ip.is_some(), "asked without exit_ip_url");
        self.asked.lock().unwrap().push(id.clone());
        let ip = self.exits.get(&id).copied();
        Box::pin(async move { ip.ok_or(ExitIpFault::NotAnIp) })
    }
}

#[tokio::test(start_paused = true)]
async fn only_passing_probes_ask_for_the_exit_ip_and_each_one_does() {
    let runner = Arc::new(Scripted {
        failing: vec!["u2".to_string()],
        exits: [("u0", "203.0.113.1"), ("u1", "203.0.113.1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
            .collect(),
        asked: Mutex::new(Vec::new()),
    });
    // Ports where nothing listens: no probe or request leaves the process.
    let text = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
                [pools.default]\nupstreams = [\"http://127.0.0.1:9#u0\", \"http://127.0.0.1:9#u1\", \"http://127.0.0.1:9#u2\", \"http://127.0.0.1:9#u3\"]\n\
                [pools.default.probe]\ntargets = [\"http://control.test/\"]\ninterval = \"10s\"\njitter = 0.0\nexit_ip_url = \"http://ip.test/\"\n";
    let config = Config::parse(text, "test", None).unwrap();
    let gw = TestGateway::from_config_with(
        config,
        StartOptions {
            probe_runner: Some(runner.clone()),
            ..StartOptions::default()
        },
    )
    .await;
    // Three intervals: every idle member is probed about three times.
    tokio::time::sleep(Duration::from_secs(35)).await;
    let asked = runner.asked.lock().unwrap().clone();
    let count = |id: &str| asked.iter().filter(|a| *a == id).count();
    assert_eq!(count("u2"), 0, "a failing probe asks nothing: {asked:?}");
    for id in ["u0", "u1", "u3"] {
        assert!(
            count(id) >= 2,
            "{id} asked after each passing probe: {asked:?}"
        );
    }
    let status = gw.status().await;
    assert_eq!(upstream(&status, "default", "u0")["exit_ip"], "203.0.113.1");
    assert_eq!(shares(upstream(&status, "default", "u1")), ["u0"]);
    assert!(upstream(&status, "default", "u3")["exit_ip"].is_null());
    // The paused clock may move on while /status is asked over a socket: a probe may land meanwhile.
    let after = runner.asked.lock().unwrap().clone();
    let count_after = |id: &str| after.iter().filter(|a| *a == id).count() as u64;
    let counts = &pool(&status, "default")["probes"]["exit_ip"];
    let rejected = counts["rejected"].as_u64().unwrap();
    assert!(
        (count("u3") as u64..=count_after("u3")).contains(&rejected),
        "{counts}"
    );
    let recorded = counts["recorded"].as_u64().unwrap();
    assert!(
        ((count("u0") + count("u1")) as u64..=count_after("u0") + count_after("u1"))
            .contains(&recorded),
        "{counts}"
    );
}
