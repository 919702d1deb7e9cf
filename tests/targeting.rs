//! Exit targeting end to end: labels on upstreams, filters from the proxy username and from
//! `X-Pool-Labels`, sessions inside a filter, 503 `no-matching-upstream`, on the embedded store
//! and on a real Redis, and caps inside a filter held across two instances.
//!
//! Which upstream served a request is read from the fake upstreams' own records, not from the
//! gateway's headers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::gateway::GatewayProcess;
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, RedisServer, TestGateway};

/// The fakes, by name, with their labels as TOML.
const MEMBERS: &[(&str, &str)] = &[
    ("us1", "country = \"us\", type = \"residential\""),
    ("us2", "country = \"US\", type = \"residential\""),
    ("ca1", "country = \"ca\", type = \"residential\""),
    ("de1", "country = \"de\", type = \"datacenter\""),
    ("de2", "country = \"de\", type = \"datacenter\""),
    (
        "m1",
        "country = \"us\", type = \"mobile\", carrier = \"tmo\"",
    ),
];

struct Fakes {
    by_name: BTreeMap<&'static str, FakeProxy>,
}

impl Fakes {
    async fn start() -> Fakes {
        let mut by_name = BTreeMap::new();
        for (name, _) in MEMBERS {
            by_name.insert(*name, FakeProxy::start(FakeProxyOpts::default()).await);
        }
        Fakes { by_name }
    }

    /// `upstreams = [...]` with every fake as a labelled table.
    fn upstreams(&self) -> String {
        let entries: Vec<String> = MEMBERS
            .iter()
            .map(|(name, labels)| {
                format!(
                    "{{ url = \"{}\", name = \"{name}\", labels = {{ {labels} }} }}",
                    self.by_name[name].url()
                )
            })
            .collect();
        format!("upstreams = [{}]", entries.join(", "))
    }

    /// The fakes that served anything (requests or tunnels) since the last `clear`.
    fn used(&self) -> BTreeSet<&'static str> {
        self.by_name
            .iter()
            .filter(|(_, f)| f.requests() + f.connects() > 0)
            .map(|(n, _)| *n)
            .collect()
    }

    fn clear(&self) {
        for f in self.by_name.values() {
            f.clear();
        }
    }
}

fn names(list: &[&'static str]) -> BTreeSet<&'static str> {
    list.iter().copied().collect()
}

fn config(fakes: &Fakes, origin: &Origin, store: &str, pool_extra: &str) -> String {
    format!(
        "{store}\n[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\n{}\n{pool_extra}\n",
        origin.port(),
        fakes.upstreams()
    )
}

fn client_as(proxy: &str, user: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{user}:pw@{proxy}")).unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// `n` GETs through the gateway as `user` (with extra headers); the statuses seen.
async fn gets(
    proxy: &str,
    origin: &Origin,
    user: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> BTreeSet<u16> {
    let client = client_as(proxy, user);
    let mut statuses = BTreeSet::new();
    for _ in 0..n {
        let mut req = client.get(origin.url("/ok"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        statuses.insert(resp.status().as_u16());
        resp.bytes().await.unwrap();
    }
    statuses
}

/// One request through `curl` as `user`, through a CONNECT tunnel when `tunnel`: (status line
/// and headers of the proxy's answer or the origin's, lower-case).
async fn curl(proxy: &str, origin: &Origin, user: &str, tunnel: bool) -> String {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null"]);
    if tunnel {
        cmd.arg("--proxytunnel");
    }
    let out = cmd
        .arg(origin.url("/ok"))
        .env_clear()
        .env("http_proxy", format!("http://{user}:pw@{proxy}"))
        .output()
        .await
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).to_lowercase()
}

/// A proxy username, extra headers, and the fakes the requests may (and must all) reach.
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

/// What every store must do with filters: only matching members, alternatives, the header over
/// the username, declared and foreign keys, no match, and sessions inside a filter.
async fn filters_choose_only_matching_members(proxy: &str, origin: &Origin, fakes: &Fakes) {
    let cases: &[Case] = &[
        ("acct-country-us", &[], &["us1", "us2", "m1"]),
        ("acct-country-us-type-residential", &[], &["us1", "us2"]),
        ("acct-cc-US-type-residential", &[], &["us1", "us2"]),
        (
            "acct-country-us|ca-type-residential",
            &[],
            &["us1", "us2", "ca1"],
        ),
        ("acct-type-datacenter", &[], &["de1", "de2"]),
        // A key some member declares applies (read, like every pair, after the first token the
        // gateway knows); another gateway's parameter is ignored.
        ("acct-type-mobile|residential-carrier-tmo", &[], &["m1"]),
        ("acct-zone-x-country-ca", &[], &["ca1"]),
        // The header wins over the username.
        (
            "acct-country-de",
            &[("X-Pool-Labels", "country=ca")],
            &["ca1"],
        ),
        (
            "acct",
            &[("X-Pool-Labels", "type=mobile|datacenter")],
            &["de1", "de2", "m1"],
        ),
    ];
    for (user, headers, want) in cases {
        fakes.clear();
        let statuses = gets(proxy, origin, user, headers, 30).await;
        assert_eq!(statuses, BTreeSet::from([200]), "{user} {headers:?}");
        assert_eq!(fakes.used(), names(want), "{user} {headers:?}");
    }

    // The same through curl, plain and through a CONNECT tunnel.
    for tunnel in [false, true] {
        fakes.clear();
        for _ in 0..6 {
            let head = curl(proxy, origin, "acct-country-de", tunnel).await;
            assert!(head.contains(" 200"), "{head}");
        }
        assert_eq!(fakes.used(), names(&["de1", "de2"]), "tunnel: {tunnel}");
    }

    // Nothing matches: 503, with the filter named.
    fakes.clear();
    for user in [
        "acct-country-fr",
        "acct-country-us-type-datacenter",
        "acct-type-mobile-carrier-att",
    ] {
        let resp = client_as(proxy, user)
            .get(origin.url("/ok"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503, "{user}");
        assert_eq!(
            resp.headers()["x-pool-error"],
            "no-matching-upstream",
            "{user}"
        );
        let body = resp.text().await.unwrap();
        assert!(
            body.contains("country=") || body.contains("carrier="),
            "{user}: {body}"
        );
    }
    let head = curl(proxy, origin, "acct-country-fr", true).await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(
        head.contains("x-pool-error: no-matching-upstream"),
        "{head}"
    );
    // A malformed header is the client's error, not an ignored one.
    let resp = client_as(proxy, "acct")
        .get(origin.url("/ok"))
        .header("X-Pool-Labels", "country")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(fakes.used().is_empty(), "{:?}", fakes.used());

    // Sessions: sticky inside their filter, and the same key with another filter is another
    // session.
    let mut bound = BTreeMap::new();
    for (user, allowed) in [
        ("acct-country-us-session-s1", &["us1", "us2", "m1"][..]),
        ("acct-country-de-session-s1", &["de1", "de2"][..]),
        (
            "acct-session-s1-type-residential",
            &["us1", "us2", "ca1"][..],
        ),
    ] {
        fakes.clear();
        gets(proxy, origin, user, &[], 12).await;
        let used = fakes.used();
        assert_eq!(used.len(), 1, "{user}: {used:?}");
        let one = *used.iter().next().unwrap();
        assert!(allowed.contains(&one), "{user}: {one}");
        bound.insert(user, one);
    }
    assert_ne!(
        bound["acct-country-us-session-s1"],
        bound["acct-country-de-session-s1"]
    );
    // Many keys inside one filter spread over its members.
    fakes.clear();
    for k in 0..40 {
        gets(
            proxy,
            origin,
            &format!("acct-type-datacenter-session-k{k}"),
            &[],
            1,
        )
        .await;
    }
    assert_eq!(fakes.used(), names(&["de1", "de2"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_on_the_embedded_store() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let fakes = Fakes::start().await;
    let gw = TestGateway::start(&config(
        &fakes,
        &origin,
        "",
        "metric_labels = [\"country\"]",
    ))
    .await;
    filters_choose_only_matching_members(&gw.proxy.to_string(), &origin, &fakes).await;

    // /metrics splits the upstream gauge by the keys the operator named, and no others.
    let metrics = gw.metrics().await;
    for line in [
        "poolgate_upstreams{pool=\"default\",state=\"healthy\",country=\"us\"} 3",
        "poolgate_upstreams{pool=\"default\",state=\"healthy\",country=\"de\"} 2",
        "poolgate_upstreams{pool=\"default\",state=\"healthy\",country=\"ca\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing in:\n{metrics}"
        );
    }
    assert!(
        !metrics.contains("type=\"mobile\""),
        "only metric_labels keys are labels"
    );
    // Bytes by label value: the sum of the members with that value, in /status and /metrics.
    let status = gw.status().await;
    let by_label = &status["pools"][0]["bytes_by_label"]["country"];
    let us_down = by_label["us"]["bytes_down"].as_u64().unwrap();
    let members_down: u64 = status["pools"][0]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["labels"]["country"] == "us")
        .map(|u| u["bytes_down"].as_u64().unwrap())
        .sum();
    assert!(us_down > 0 && us_down == members_down, "{by_label}");
    let line = format!(
        "poolgate_label_bytes_total{{pool=\"default\",label=\"country\",value=\"us\",direction=\"down\"}} {us_down}"
    );
    let metrics = gw.metrics().await;
    assert!(
        metrics.lines().any(|l| l == line),
        "{line} missing in:\n{metrics}"
    );

    // /status shows each upstream's labels and, per pool, states by label value.
    let status = gw.status().await;
    let pool = &status["pools"][0];
    let m1 = pool["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == "m1")
        .unwrap();
    assert_eq!(
        m1["labels"],
        serde_json::json!({"carrier": "tmo", "country": "us", "type": "mobile"})
    );
    assert_eq!(pool["labels"]["country"]["us"]["healthy"], 3, "{pool}");
    assert_eq!(pool["labels"]["type"]["datacenter"]["healthy"], 2, "{pool}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_on_redis_with_every_strategy() {
    let redis = RedisServer::start().await;
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let fakes = Fakes::start().await;
    let store = format!("[store]\nkind = \"redis\"\nurl = \"{}\"\n", redis.url());
    let gw = TestGateway::start(&config(&fakes, &origin, &store, "")).await;
    filters_choose_only_matching_members(&gw.proxy.to_string(), &origin, &fakes).await;
    drop(gw);
    // The other strategies choose inside the filter too, and the subsets live in Redis.
    for strategy in ["round-robin", "least-connections", "weighted"] {
        let gw = TestGateway::start(&config(
            &fakes,
            &origin,
            &store,
            &format!("strategy = \"{strategy}\""),
        ))
        .await;
        fakes.clear();
        let proxy = gw.proxy.to_string();
        assert_eq!(
            gets(
                &proxy,
                &origin,
                "acct-country-us|ca-type-residential",
                &[],
                12
            )
            .await,
            BTreeSet::from([200])
        );
        // Ties go to the fewest allocations so far, which earlier requests made uneven: the
        // members used are some of the filter's, only round-robin must use them all.
        let used = fakes.used();
        assert!(
            !used.is_empty() && used.is_subset(&names(&["us1", "us2", "ca1"])),
            "{strategy}: {used:?}"
        );
        if strategy == "round-robin" {
            let counts: Vec<usize> = ["us1", "us2", "ca1"]
                .iter()
                .map(|n| fakes.by_name[n].requests())
                .collect();
            assert_eq!(
                counts,
                [4, 4, 4],
                "round-robin takes turns inside the filter"
            );
        }
    }
    let keys = redis.cli(&["--scan", "--pattern", "*:sub:*"]);
    assert!(keys.contains("country=ca|us,type=residential#"), "{keys}");
}

/// Two instances on one Redis, a cap of one lease per upstream: requests inside a filter never
/// hold more than one lease on a member, whichever instance they come through, and never leave
/// through a member outside the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_hold_inside_a_filter_across_two_instances() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    let origin = Origin::start(OriginBehaviour::delayed(Duration::from_millis(100))).await;
    let fakes = Fakes::start().await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{}",
        config(
            &fakes,
            &origin,
            &format!("[store]\nkind = \"redis\"\nurl = \"{}\"\n", redis.url()),
            "max_concurrency = 1\nqueue_timeout = \"30s\"",
        )
    );
    let a = GatewayProcess::spawn(&text).await;
    let b = GatewayProcess::spawn(&text).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let proxy = if i % 2 == 0 { &a.proxy } else { &b.proxy }.to_string();
        let url = origin.url("/slow");
        tasks.push(tokio::spawn(async move {
            let resp = client_as(&proxy, "acct-country-de")
                .get(url)
                .send()
                .await
                .unwrap();
            resp.status().as_u16()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(fakes.used(), names(&["de1", "de2"]));
    for n in ["de1", "de2"] {
        assert_eq!(fakes.by_name[n].peak_in_flight(), 1, "{n}");
    }
    assert_eq!(
        fakes.by_name["de1"].requests() + fakes.by_name["de2"].requests(),
        16
    );
}

/// A provider's backconnect gateway as one member: its username's `{session}` and `{country}`
/// are filled per request, the same session giving the same value on HTTP and CONNECT alike, and
/// neither the template nor a filled value reaches `/status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_upstream_gets_its_username_filled_per_session() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let provider = FakeProxy::start(FakeProxyOpts::default()).await;
    let url = format!(
        "http://customer-acme-session-{{session}}-country-{{country}}:s3cret@{}#provider",
        provider.addr()
    );
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [{{ url = \"{url}\", labels = {{ country = \"us\", type = \"residential\" }} }}]\n",
        origin.port()
    ))
    .await;
    let proxy = gw.proxy.to_string();
    let logins = |provider: &FakeProxy| -> Vec<String> {
        let seen = provider.auth_seen();
        provider.clear();
        seen
    };
    gets(&proxy, &origin, "acct-session-s1", &[], 3).await;
    for tunnel in [true, false] {
        assert!(
            curl(&proxy, &origin, "acct-session-s1", tunnel)
                .await
                .contains(" 200")
        );
    }
    let s1 = logins(&provider);
    assert_eq!(s1.len(), 5, "{s1:?}");
    let first = &s1[0];
    assert!(s1.iter().all(|l| l == first), "{s1:?}");
    let user = first.strip_suffix(":s3cret").unwrap();
    let id = user
        .strip_prefix("customer-acme-session-")
        .and_then(|r| r.strip_suffix("-country-us"))
        .unwrap_or_else(|| panic!("{user}"));
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");

    // Another session, another filter (a new session even with the same key), no session at all.
    gets(&proxy, &origin, "acct-session-s2", &[], 1).await;
    gets(&proxy, &origin, "acct-session-s1-type-residential", &[], 1).await;
    gets(&proxy, &origin, "acct", &[], 2).await;
    let others = logins(&provider);
    assert_eq!(others.len(), 4, "{others:?}");
    let distinct: BTreeSet<&String> = others.iter().chain([first]).collect();
    assert_eq!(
        distinct.len(),
        5,
        "every request without a shared session differs: {others:?}"
    );

    let status = gw.status().await.to_string();
    for secret in ["s3cret", "customer-acme", id] {
        assert!(!status.contains(secret), "{secret} in /status");
    }
}

/// Python requests, configured only with a proxy URL that carries the username tokens: plain
/// HTTP and HTTPS (a CONNECT tunnel) both leave through the filter's members only, and a session
/// inside the filter stays on one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_selects_exits_by_username() {
    let have = std::process::Command::new("python3")
        .args(["-c", "import requests"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        have,
        "python3 with requests is needed (scripts/test installs it)"
    );
    let ca = common::TestCa::new();
    let plain = Origin::start(OriginBehaviour::fixed("py-plain")).await;
    let tls = Origin::start_tls(OriginBehaviour::fixed("py-tls"), &ca).await;
    let fakes = Fakes::start().await;
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\n{}\n",
        tls.port(),
        fakes.upstreams()
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let run = |user: &str| {
        format!(
            "import requests\n\
             proxy = 'http://{user}:pw@{proxy}'\n\
             s = requests.Session()\n\
             s.trust_env = False\n\
             for url in ['{plain}', '{tls}'] * 3:\n\
             \x20   r = s.get(url, proxies={{'http': proxy, 'https': proxy}}, verify='{ca}', timeout=10)\n\
             \x20   r.raise_for_status()\n\
             \x20   print(r.text)\n",
            proxy = gw.proxy,
            plain = plain.url("/p"),
            tls = tls.url("/t"),
            ca = ca_file.display(),
        )
    };
    for (user, want) in [
        ("acct-country-de", &["de1", "de2"][..]),
        (
            "acct-country-us-type-residential-session-py1",
            &["us1", "us2"][..],
        ),
    ] {
        fakes.clear();
        let out = tokio::process::Command::new("python3")
            .args(["-c", &run(user)])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{user}: python failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            text.lines().filter(|l| *l == "py-plain").count(),
            3,
            "{text}"
        );
        assert_eq!(text.lines().filter(|l| *l == "py-tls").count(), 3, "{text}");
        let used = fakes.used();
        assert!(
            !used.is_empty() && used.is_subset(&names(want)),
            "{user}: {used:?}"
        );
        if user.contains("-session-") {
            assert_eq!(used.len(), 1, "{user}: a session keeps one exit: {used:?}");
        }
    }
}

/// The dashboard in headless Chromium, opened filtered by a label (`#label=country=de`): only the
/// matching upstreams' rows, each with its labels shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_filters_its_tables_by_a_label() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let fakes = Fakes::start().await;
    let gw = TestGateway::start(&config(&fakes, &origin, "", "")).await;
    let profile = tempfile::tempdir().unwrap();
    let dump = |url: String| {
        let profile = profile.path().display().to_string();
        async move {
            let out = tokio::time::timeout(
                Duration::from_secs(60),
                tokio::process::Command::new("chromium")
                    .args([
                        "--headless",
                        "--no-sandbox",
                        "--disable-gpu",
                        "--disable-dev-shm-usage",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--disable-sync",
                        "--no-first-run",
                        "--disable-quic",
                        "--virtual-time-budget=5000",
                    ])
                    .arg(format!("--user-data-dir={profile}"))
                    .arg("--dump-dom")
                    .arg(url)
                    .output(),
            )
            .await
            .expect("chromium finishes")
            .expect("chromium runs (scripts/test installs it)");
            let full = String::from_utf8_lossy(&out.stdout).into_owned();
            full.split("<script").next().unwrap_or("").to_string()
        }
    };
    let all = dump(format!("http://{}/dashboard", gw.admin)).await;
    assert!(all.contains("data-loaded=\"yes\""), "{all}");
    assert_eq!(all.matches("<tr class=\"upstream\"").count(), MEMBERS.len());
    let de = dump(format!("http://{}/dashboard#label=country=de", gw.admin)).await;
    assert!(de.contains("data-loaded=\"yes\""), "{de}");
    assert_eq!(de.matches("<tr class=\"upstream\"").count(), 2, "{de}");
    assert!(
        de.contains(">de1<") && de.contains(">de2<") && !de.contains(">us1<"),
        "{de}"
    );
    assert!(de.contains("country=de type=datacenter"), "{de}");
}

/// A filter whose every member is out of service behaves like an exhausted pool: the request
/// waits up to `queue_timeout`, then gets `503 pool-exhausted`; other filters are served, and a
/// member restored serves the filter again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_with_every_member_out_of_service_is_an_exhausted_pool() {
    const TOKEN: &str = "targeting-test-admin-token";
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let fakes = Fakes::start().await;
    let gw = TestGateway::start_with(
        &format!("admin_token = \"{TOKEN}\""),
        &config(&fakes, &origin, "", "queue_timeout = \"300ms\""),
    )
    .await;
    let admin = reqwest::Client::builder().no_proxy().build().unwrap();
    let act = |id: &str, action: &str| {
        let body = serde_json::json!({"pool": "default", "upstream": id, "action": action, "duration_s": 300});
        admin
            .post(format!("http://{}/admin/upstream", gw.admin))
            .bearer_auth(TOKEN)
            .body(body.to_string())
            .send()
    };
    for id in ["de1", "de2"] {
        let r = act(id, "quarantine").await.unwrap();
        assert!(r.status().is_success(), "{id}: {}", r.text().await.unwrap());
    }
    let proxy = gw.proxy.to_string();
    let started = std::time::Instant::now();
    let resp = client_as(&proxy, "acct-country-de")
        .get(origin.url("/ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["x-pool-error"], "pool-exhausted");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "it waited for queue_timeout"
    );
    assert_eq!(
        gets(&proxy, &origin, "acct-country-us", &[], 2).await,
        BTreeSet::from([200])
    );
    fakes.clear();
    let r = act("de2", "restore").await.unwrap();
    assert!(r.status().is_success());
    assert_eq!(
        gets(&proxy, &origin, "acct-country-de", &[], 3).await,
        BTreeSet::from([200])
    );
    assert_eq!(fakes.used(), names(&["de2"]));
}
