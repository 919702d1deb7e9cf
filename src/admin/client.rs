//! The tiny client behind `poolgate status`: one GET over a plain TCP socket, bounded in time,
//! with a Bearer token when the admin listener needs one for reads.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

/// The environment variable `poolgate status` reads its token from.
pub const TOKEN_ENV: &str = "POOLGATE_ADMIN_TOKEN";

/// Fetches `/status` from `addr` (`host:port`, or an `http://host:port` URL), sending `token` (the
/// read token or the admin token) as a Bearer token when given. Errors never contain the token.
pub fn fetch_status(addr: &str, token: Option<&str>) -> Result<String, String> {
    // Checked before anything is sent: a line break would end the header early.
    if token.is_some_and(|t| t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic())) {
        return Err("the admin token must be visible ASCII without spaces".to_string());
    }
    let hostport = addr
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let sock = hostport
        .to_socket_addrs()
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    let mut s =
        TcpStream::connect_timeout(&sock, TIMEOUT).map_err(|e| format!("{hostport}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /status HTTP/1.1\r\nHost: {hostport}\r\n{authorization}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed response")?;
    if !head.starts_with("HTTP/1.1 200") {
        let line = head.lines().next().unwrap_or("no status line").to_string();
        if head.starts_with("HTTP/1.1 401") {
            let hint = if token.is_some() {
                "the token was refused".to_string()
            } else {
                format!("this admin listener needs a token: pass --token or set {TOKEN_ENV}")
            };
            return Err(format!("{line} ({hint})"));
        }
        return Err(line);
    }
    Ok(body.to_string())
}

/// `/status` as a readable table: one block per pool, one row per upstream.
pub fn render_table(json: &str) -> Result<String, String> {
    use std::fmt::Write as _;
    let s: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not a /status document: {e}"))?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "instance {}  up {}s  store {} ({})",
        s["instance_id"].as_str().unwrap_or("?"),
        s["uptime_s"],
        s["store"]["kind"].as_str().unwrap_or("?"),
        s["store"]["health"].as_str().unwrap_or("?")
    );
    let ratio = |v: &serde_json::Value| {
        v.as_f64()
            .map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0))
    };
    let millis = |v: &serde_json::Value| v.as_f64().map_or("-".to_string(), |r| format!("{r:.0}"));
    for p in s["pools"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "\npool {}{}  strategy {}  sessions {}  leases {}  quarantined {}/{}",
            p["name"].as_str().unwrap_or("?"),
            if p["default"] == true {
                " (default)"
            } else {
                ""
            },
            p["strategy"].as_str().unwrap_or("?"),
            p["sessions_live"],
            p["leases_live"],
            p["quarantine_cap"]["used"],
            p["quarantine_cap"]["limit"],
        );
        if p["incidents"]["global"] == true {
            let _ = writeln!(
                out,
                "  ! global incident: most upstreams are failing at once"
            );
        }
        for t in p["incidents"]["targets"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  ! target incident: {}",
                t["target"].as_str().unwrap_or("?")
            );
        }
        let _ = writeln!(
            out,
            "  {:<34} {:<12} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7}  REASON",
            "UPSTREAM", "STATE", "LEASES", "ALLOCS", "SUCCESS", "CAPTCHA", "P50ms", "P95ms"
        );
        for u in p["upstreams"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  {:<34} {:<12} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7}  {}",
                u["id"].as_str().unwrap_or("?"),
                u["state"].as_str().unwrap_or("?"),
                u["leases_live"],
                u["allocations"],
                ratio(&u["success_ratio"]),
                ratio(&u["captcha_ratio"]),
                millis(&u["latency_p50_ms"]),
                millis(&u["latency_p95_ms"]),
                u["state_reason"].as_str().unwrap_or(""),
            );
        }
    }
    Ok(out)
}
