//! `/metrics`: the snapshot series refreshed from the same data as `/status` at each scrape
//! (states, leases, sessions, incidents, the bounded top-targets matrix, and every count
//! `/status` shows), then everything encoded as Prometheus (OpenMetrics) text.

use crate::accounting::{Door, DoorCounts};
use crate::admin::status::Status;
use crate::metrics::{
    Labels, Metrics, PoolLabel, ProbeLabels, RefusalLabels, SourceLabels, StateLabels,
    StatusFamily, StoreLabels, TargetLabels, UpstreamLabels, rate_labels,
};
use crate::ratelimit::Scope;

impl Metrics {
    /// Refreshes the snapshot series from `status` and encodes everything.
    pub fn render(&self, status: &Status) -> Result<String, std::fmt::Error> {
        for f in [
            &self.quarantine_limit,
            &self.quarantine_used,
            &self.sessions_live,
            &self.target_incidents,
            &self.global_incident,
        ] {
            f.clear();
        }
        self.upstreams_by_state.clear();
        self.leases_live.clear();
        self.success_ratio.clear();
        self.captcha_ratio.clear();
        self.target_success_ratio.clear();
        self.target_captcha_ratio.clear();
        self.store_up.clear();
        self.probe_results.clear();
        self.probe_incident.clear();
        self.source_upstreams.clear();
        self.source_fetches.clear();

        self.uptime.set(status.uptime_s as i64);
        self.store_up
            .get_or_create(&StoreLabels {
                kind: status.store.kind.to_string(),
            })
            .set(i64::from(status.store.health == "ok"));
        for p in &status.pools {
            let pool = PoolLabel {
                pool: p.name.clone(),
            };
            if p.metric_labels.is_empty() {
                for (state, n) in &p.counts_by_state {
                    self.upstreams_by_state
                        .get_or_create(&StateLabels {
                            pool: p.name.clone(),
                            state: state.to_string(),
                            by: Vec::new(),
                        })
                        .set(*n as i64);
                }
            } else {
                // Split by the values of the keys the operator named (bounded by them).
                let mut counts: std::collections::BTreeMap<StateLabels, i64> = Default::default();
                for u in &p.upstreams {
                    let by = p
                        .metric_labels
                        .iter()
                        .map(|k| (k.clone(), u.labels.get(k).cloned().unwrap_or_default()))
                        .collect();
                    let state = u.health.as_ref().map_or("unknown", |h| h.state);
                    *counts
                        .entry(StateLabels {
                            pool: p.name.clone(),
                            state: state.to_string(),
                            by,
                        })
                        .or_default() += 1;
                }
                for (labels, n) in counts {
                    self.upstreams_by_state.get_or_create(&labels).set(n);
                }
            }
            self.quarantine_limit
                .get_or_create(&pool)
                .set(p.quarantine_cap.limit as i64);
            self.quarantine_used
                .get_or_create(&pool)
                .set(p.quarantine_cap.used as i64);
            self.sessions_live
                .get_or_create(&pool)
                .set(p.sessions_live as i64);
            self.target_incidents
                .get_or_create(&pool)
                .set(p.incidents.targets.len() as i64);
            self.global_incident
                .get_or_create(&pool)
                .set(i64::from(p.incidents.global));
            // Per-upstream series only for pools of at most `per_upstream_max` members.
            for u in p.upstreams.iter().filter(|_| p.per_upstream) {
                let labels = UpstreamLabels {
                    pool: p.name.clone(),
                    upstream: u.id.clone(),
                };
                self.leases_live
                    .get_or_create(&labels)
                    .set(u.stats.leases_live as i64);
                if let Some(h) = &u.health {
                    if let Some(r) = h.success_ratio {
                        self.success_ratio.get_or_create(&labels).set(r);
                    }
                    if let Some(r) = h.captcha_ratio {
                        self.captcha_ratio.get_or_create(&labels).set(r);
                    }
                }
            }
            if let Some(probes) = &p.probes {
                for (result, n) in [
                    ("passed", probes.passed),
                    ("failed", probes.failed - probes.failed_unjudged),
                    ("unjudged", probes.failed_unjudged),
                ] {
                    self.probe_results
                        .get_or_create(&ProbeLabels {
                            pool: p.name.clone(),
                            result,
                        })
                        .set(n as i64);
                }
                self.probe_incident
                    .get_or_create(&pool)
                    .set(i64::from(probes.incident.is_some()));
            }
            if let Some(src) = &p.sources {
                let label = |state| SourceLabels {
                    pool: p.name.clone(),
                    state,
                };
                for (state, n) in [
                    ("listed", src.listed),
                    ("admitted", src.admitted),
                    ("probing", src.probing),
                    ("pending", src.pending),
                    ("rejected", src.rejected),
                ] {
                    self.source_upstreams
                        .get_or_create(&label(state))
                        .set(n as i64);
                }
                for (state, n) in [("ok", src.fetches_ok), ("failed", src.fetches_failed)] {
                    self.source_fetches
                        .get_or_create(&label(state))
                        .set(n as i64);
                }
            }
            for row in p.matrix.iter().filter(|_| p.per_upstream) {
                for cell in &row.cells {
                    let labels = TargetLabels {
                        pool: p.name.clone(),
                        target: row.target.clone(),
                        upstream: cell.upstream.clone(),
                    };
                    self.target_success_ratio
                        .get_or_create(&labels)
                        .set(cell.success_ratio);
                    self.target_captcha_ratio
                        .get_or_create(&labels)
                        .set(cell.captcha_ratio);
                }
            }
            // Every limit's series from the start, at 0, as `/status` shows them.
            for scope in Scope::ALL {
                let labels = rate_labels(&p.name, scope);
                drop(self.rate_limited.get_or_create(&labels));
                drop(self.rate_limit_waits.get_or_create(&labels));
            }
            // The refusals alerts watch, from the start at 0, so their rate is defined before
            // the first one.
            for code in ["pool-exhausted", "no-upstream-available"] {
                drop(self.refusals.get_or_create(&RefusalLabels {
                    pool: p.name.clone(),
                    code,
                }));
            }
        }
        self.status_series.set(status_families(status));
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// The snapshot series of `s`: every family always, with a series per figure `/status` shows.
fn status_families(s: &Status) -> Vec<StatusFamily> {
    let mut out = Vec::new();
    let mut family = |name, help, counter, samples| {
        out.push(StatusFamily {
            name,
            help,
            counter,
            samples,
        })
    };
    let one = |value: u64| vec![(Labels::new(), value)];
    let by = |label: &'static str, values: &[(&'static str, u64)]| -> Vec<(Labels, u64)> {
        values
            .iter()
            .map(|(k, v)| (vec![(label, k.to_string())], *v))
            .collect()
    };

    let r = &s.traffic.requests;
    let doors = |counts: &DoorCounts| -> Vec<(Labels, u64)> {
        Door::ALL
            .iter()
            .map(|d| (vec![("door", d.as_str().to_string())], counts.get(*d)))
            .collect()
    };
    family(
        "poolgate_requests_accepted",
        "Client requests accepted (an HTTP head parsed, a SOCKS5 request read) since start, by front door",
        true,
        doors(&r.by_door),
    );
    family(
        "poolgate_requests_ended",
        "Accepted client requests that ended, by how (completed, rejected: a 4xx of the gateway, failed: a 5xx of the gateway or a broken response)",
        true,
        by(
            "end",
            &[
                ("completed", r.completed),
                ("rejected", r.rejected),
                ("failed", r.failed),
            ],
        ),
    );
    family(
        "poolgate_requests_in_flight",
        "Accepted client requests not yet ended",
        false,
        one(r.in_flight),
    );
    family(
        "poolgate_requests_forwarded",
        "Plain requests whose head was sent to an upstream, since start",
        true,
        one(r.forwarded),
    );
    family(
        "poolgate_tunnels",
        "Tunnels (CONNECT, SOCKS5) since start, by front door",
        true,
        doors(&s.traffic.tunnels.by_door),
    );
    family(
        "poolgate_tunnels_open",
        "Tunnels (CONNECT, SOCKS5) open now, by front door",
        false,
        doors(&s.traffic.tunnels.open_by_door),
    );
    let socks = &s.traffic.socks5;
    family(
        "poolgate_socks5_replies",
        "SOCKS5 replies to requests since start, by reply (succeeded, not_allowed, host_unreachable, ...)",
        true,
        socks
            .replies
            .iter()
            .map(|(k, v)| (vec![("reply", k.to_string())], *v))
            .collect(),
    );
    family(
        "poolgate_socks5_handshakes_failed",
        "SOCKS5 handshakes that ended before a request was read (malformed, no acceptable method, refused login, too slow) since start",
        true,
        one(socks.handshakes_failed),
    );
    family(
        "poolgate_connections_open",
        "Client connections open on the proxy port",
        false,
        one(s.traffic.connections.open),
    );
    family(
        "poolgate_connections_refused",
        "Client connections refused by the connection limits since start",
        true,
        one(s.traffic.connections.refused),
    );
    let c = &s.traffic.config;
    family(
        "poolgate_config_generation",
        "Config generation: 1 at start, +1 per successful reload",
        false,
        one(c.generation),
    );
    family(
        "poolgate_config_reloads",
        "Config reloads since start by result (ok, failed)",
        true,
        by(
            "result",
            &[("ok", c.reloads_ok), ("failed", c.reloads_failed)],
        ),
    );

    let i = &s.intercept;
    family(
        "poolgate_intercept_tunnels",
        "Tunnels of inspecting pools since start by mode (inspected, excluded, passthrough)",
        true,
        by(
            "mode",
            &[
                ("inspected", i.tunnels_inspected),
                ("excluded", i.tunnels_excluded),
                ("passthrough", i.tunnels_passthrough),
            ],
        ),
    );
    family(
        "poolgate_intercept_requests",
        "Requests relayed inside inspected tunnels since start",
        true,
        one(i.requests),
    );
    family(
        "poolgate_intercept_handshake_failures",
        "Failed TLS handshakes of interception since start by side (client: with the gateway, origin: with the origin)",
        true,
        by(
            "side",
            &[
                ("client", i.client_handshake_failures),
                ("origin", i.origin_handshake_failures),
            ],
        ),
    );
    family(
        "poolgate_intercept_certs_minted",
        "Leaf certificates minted since start",
        true,
        one(i.certs_minted),
    );
    family(
        "poolgate_intercept_cert_cache_entries",
        "Leaf certificates cached now",
        false,
        one(i.cert_cache_entries as u64),
    );
    family(
        "poolgate_intercept_cert_cache_capacity",
        "Leaf certificates the cache holds at most",
        false,
        one(i.cert_cache_capacity as u64),
    );

    let a = &s.auth;
    family(
        "poolgate_auth_password_checks",
        "Proxy passwords checked with argon2 since start (cache hits and lockout refusals not included)",
        true,
        one(a.password_checks),
    );
    family(
        "poolgate_auth_failures",
        "Proxy logins refused for an unknown user or a wrong password since start",
        true,
        one(a.failures),
    );
    family(
        "poolgate_auth_lockout_refusals",
        "Proxy logins refused without a check since start, their client address being locked out by its failed logins",
        true,
        one(a.lockout_refusals),
    );
    family(
        "poolgate_auth_clients_locked_out",
        "Client addresses whose proxy logins are refused now after too many failures",
        false,
        one(a.clients_locked_out),
    );
    family(
        "poolgate_auth_cache_entries",
        "Successful proxy password checks remembered now",
        false,
        one(a.cache_entries),
    );

    let mut user_bytes = Vec::new();
    for u in &s.users {
        for (direction, n) in [("up", u.bytes_up), ("down", u.bytes_down)] {
            let l = vec![
                ("user", u.name.clone()),
                ("direction", direction.to_string()),
            ];
            user_bytes.push((l, n));
        }
    }
    family(
        "poolgate_user_bytes",
        "Bytes through the gateway per authenticated user since start on this instance, by direction (up, down)",
        true,
        user_bytes,
    );
    let l = &s.access_log;
    family(
        "poolgate_access_log_lines",
        "Access-log lines since start by result (written, dropped: the writer fell behind or could not write)",
        true,
        by(
            "result",
            &[("written", l.lines_written), ("dropped", l.lines_dropped)],
        ),
    );

    let mut allocations = Vec::new();
    let mut outcomes = Vec::new();
    let mut quarantines = Vec::new();
    let mut target_exchanges = Vec::new();
    let mut probes_in_flight = Vec::new();
    let mut reference_probes = Vec::new();
    let mut exit_ip_answers = Vec::new();
    let mut shared_exit_ips = Vec::new();
    let mut rate_limit_keys = Vec::new();
    let mut skipped_lines = Vec::new();
    let mut pool_bytes = Vec::new();
    let mut upstream_bytes = Vec::new();
    let mut label_bytes = Vec::new();
    for p in &s.pools {
        let pool = || ("pool", p.name.clone());
        for (direction, n) in [("up", p.bytes_up), ("down", p.bytes_down)] {
            pool_bytes.push((vec![pool(), ("direction", direction.to_string())], n));
        }
        for (key, values) in &p.bytes_by_label {
            for (value, b) in values {
                for (direction, n) in [("up", b.bytes_up), ("down", b.bytes_down)] {
                    let l = vec![
                        pool(),
                        ("label", key.clone()),
                        ("value", value.clone()),
                        ("direction", direction.to_string()),
                    ];
                    label_bytes.push((l, n));
                }
            }
        }
        for u in p.upstreams.iter().filter(|_| p.per_upstream) {
            let labels = || vec![pool(), ("upstream", u.id.clone())];
            for (direction, n) in [("up", u.bytes_up), ("down", u.bytes_down)] {
                if let Some(n) = n {
                    let mut l = labels();
                    l.push(("direction", direction.to_string()));
                    upstream_bytes.push((l, n));
                }
            }
            allocations.push((labels(), u.stats.allocations));
            for (outcome, n) in &u.stats.outcomes {
                let mut l = labels();
                l.push(("outcome", outcome.to_string()));
                outcomes.push((l, *n));
            }
            if let Some(h) = &u.health {
                quarantines.push((labels(), h.quarantines_total));
            }
        }
        for row in p.matrix.iter().filter(|_| p.per_upstream) {
            for cell in &row.cells {
                for (result, n) in [
                    ("ok", cell.counts.ok),
                    ("faults", cell.counts.faults),
                    ("bans", cell.counts.bans),
                ] {
                    let l = vec![
                        pool(),
                        ("target", row.target.clone()),
                        ("upstream", cell.upstream.clone()),
                        ("result", result.to_string()),
                    ];
                    target_exchanges.push((l, n));
                }
            }
        }
        if let Some(probes) = &p.probes {
            probes_in_flight.push((vec![pool()], probes.in_flight as u64));
            reference_probes.push((vec![pool()], probes.reference_probes));
            for (result, n) in [
                ("recorded", probes.exit_ip.recorded),
                ("rejected", probes.exit_ip.rejected),
                ("failed", probes.exit_ip.failed),
            ] {
                exit_ip_answers.push((vec![pool(), ("result", result.to_string())], n));
            }
        }
        shared_exit_ips.push((vec![pool()], p.shared_exit_ips as u64));
        rate_limit_keys.push((vec![pool()], p.rate_limit.keys_tracked as u64));
        if let Some(src) = &p.sources {
            skipped_lines.push((vec![pool()], src.skipped_lines as u64));
        }
    }
    family(
        "poolgate_pool_bytes",
        "Bytes through a pool's upstreams since start on this instance, by direction (up: request bodies and tunnel bytes out through the upstream, down: back)",
        true,
        pool_bytes,
    );
    family(
        "poolgate_label_bytes",
        "Bytes through the upstreams with one value of a metric_labels key, since start on this instance, by direction",
        true,
        label_bytes,
    );
    family(
        "poolgate_upstream_bytes",
        "Bytes through each upstream since start on this instance, by direction; only for pools of at most [metrics] per_upstream_max members",
        true,
        upstream_bytes,
    );
    family(
        "poolgate_upstream_allocations",
        "Leases granted per upstream since start, as the store counts them",
        true,
        allocations,
    );
    family(
        "poolgate_upstream_outcomes",
        "Recorded exchange outcomes per upstream since start, as the store counts them (every request of an inspected tunnel and every feedback report included)",
        true,
        outcomes,
    );
    family(
        "poolgate_upstream_quarantines",
        "Quarantines per upstream since start",
        true,
        quarantines,
    );
    family(
        "poolgate_target_exchanges",
        "Exchanges health counted per busiest target and upstream by result (ok, faults, bans)",
        false,
        target_exchanges,
    );
    family(
        "poolgate_probes_in_flight",
        "Probes of a pool under way",
        false,
        probes_in_flight,
    );
    family(
        "poolgate_reference_probes",
        "Reference probes (through other upstreams, after a failed probe) since start",
        true,
        reference_probes,
    );
    family(
        "poolgate_exit_ip_answers",
        "Answers of a pool's exit_ip_url since start, by result (recorded, rejected as not one address, failed)",
        true,
        exit_ip_answers,
    );
    family(
        "poolgate_shared_exit_ips",
        "Exit IPs that two members of the pool or more share",
        false,
        shared_exit_ips,
    );
    family(
        "poolgate_rate_limit_keys",
        "Rate-limit buckets this instance holds now",
        false,
        rate_limit_keys,
    );
    family(
        "poolgate_source_skipped_lines",
        "Malformed lines skipped at the last read of a pool's lists",
        false,
        skipped_lines,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;

    /// Exchanges are counted per pool, member and outcome (the kept series are the families'
    /// own), latency per pool, and an outcome never seen has no series.
    #[test]
    fn exchanges_count_per_member_and_outcome() {
        let m = Metrics::new();
        m.set_per_upstream_max(2);
        for _ in 0..3 {
            m.record("p", "http://a:1", 2, Outcome::Ok, 0.01);
        }
        m.record("p", "http://a:1", 2, Outcome::Timeout, 0.5);
        m.record("p", "http://b:1", 2, Outcome::Ok, 0.02);
        m.record("q", "http://a:1", 2, Outcome::Ok, 0.02);
        // A pool over per_upstream_max: its members are counted together.
        m.record("big", "http://a:1", 3, Outcome::Ok, 0.02);
        m.record("big", "http://b:1", 3, Outcome::Ok, 0.02);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry.lock().unwrap()).unwrap();
        for line in [
            r#"poolgate_requests_total{pool="p",upstream="http://a:1",outcome="ok"} 3"#,
            r#"poolgate_requests_total{pool="p",upstream="http://a:1",outcome="timeout"} 1"#,
            r#"poolgate_requests_total{pool="p",upstream="http://b:1",outcome="ok"} 1"#,
            r#"poolgate_requests_total{pool="q",upstream="http://a:1",outcome="ok"} 1"#,
            r#"poolgate_requests_total{pool="big",upstream="",outcome="ok"} 2"#,
            r#"poolgate_request_duration_seconds_count{pool="p"} 5"#,
            r#"poolgate_request_duration_seconds_count{pool="q"} 1"#,
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(!out.contains(r#"outcome="captcha""#), "{out}");
        assert!(!out.contains(r#"pool="big",upstream="http"#), "{out}");
    }
}
