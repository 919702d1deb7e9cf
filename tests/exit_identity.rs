//! Exit identity: probes record each member's exit IP from `exit_ip_url`, `/status` flags members
//! that share one, answers that are not exactly one address are ignored, and a ban through one
//! member is a ban on the members with the same exit IP.
//!
//! Every fake proxy leaves from 127.0.0.1, so each is given the address it claims
//! (`FakeProxyOpts::exit`, sent as `x-fake-exit`), which the origin's `/exit-ip` answers with.
//! The probes are real (through the fakes, on loopback), so the tests wait on the real clock,
//! every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{
    FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, ProxyOutcome, TestGateway,
};
use poolgate::config::Config;
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
