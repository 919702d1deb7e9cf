//! One probe: a request to a control target through one upstream, judged by its answer.
//!
//! The probe goes the way client traffic goes: absolute-form through an HTTP proxy for an
//! `http://` control target, through a tunnel (CONNECT, SOCKS or direct) otherwise, with TLS to
//! the origin for `https://`. It passes when the status is the expected one, the body (its first
//! [`BODY_LIMIT`] bytes) holds the expected string, and the whole exchange fits the latency
//! ceiling.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::ControlTarget;
use crate::upstream::connect::{BoxIo, ConnectError, Connector};
use crate::upstream::{Scheme, Upstream};

/// How much of a control target's body is read for the expected string.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Why a probe failed. Never holds upstream credentials.
#[derive(Debug, Error)]
pub enum ProbeFault {
    #[error("{0}")]
    Connect(#[from] ConnectError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("TLS to the control target failed: {0}")]
    OriginTls(std::io::Error),
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("answered {got}, expected {expected}")]
    Status {
        got: http::StatusCode,
        expected: http::StatusCode,
    },
    #[error("the answer does not contain the expected text")]
    Body,
    #[error("answered in {took:?}, over the latency ceiling of {ceiling:?}")]
    TooSlow { took: Duration, ceiling: Duration },
}

impl ProbeFault {
    /// Whether the upstream itself failed (could not be reached or did not relay), as opposed to
    /// a wrong answer that may be the control target's doing.
    pub fn is_connect(&self) -> bool {
        matches!(self, ProbeFault::Connect(_))
    }
}

/// Probes `target` through `upstream`; the latency on success.
pub async fn check(
    connector: &Connector,
    upstream: &Upstream,
    target: &ControlTarget,
    timeout: Duration,
    max_latency: Option<Duration>,
) -> Result<Duration, ProbeFault> {
    let started = Instant::now();
    let exchange = exchange(connector, upstream, target);
    let took = match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => {
            result?;
            started.elapsed()
        }
        Err(_) => return Err(ProbeFault::Timeout(timeout)),
    };
    match max_latency {
        Some(ceiling) if took > ceiling => Err(ProbeFault::TooSlow { took, ceiling }),
        _ => Ok(took),
    }
}

/// Sends a `GET` for `target` through `upstream`: the answer's head, and the connection's task
/// (to abort once the body has been read as far as wanted).
async fn send(
    connector: &Connector,
    upstream: &Upstream,
    target: &ControlTarget,
) -> Result<(Response<Incoming>, JoinHandle<Result<(), hyper::Error>>), ProbeFault> {
    let absolute = !target.https && upstream.scheme.speaks_http_proxy();
    let io: BoxIo = if absolute {
        connector.proxy_conn(upstream).await?
    } else {
        let tunnel = connector.tunnel(upstream, &target.target).await?;
        if target.https {
            let name = ServerName::try_from(target.target.host.clone()).map_err(|_| {
                ProbeFault::OriginTls(std::io::Error::other("not a valid TLS server name"))
            })?;
            Box::new(
                connector
                    .tls()
                    .connect(name, tunnel)
                    .await
                    .map_err(ProbeFault::OriginTls)?,
            )
        } else {
            tunnel
        }
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    // The connection task ends with the exchange: the request says `Connection: close`, and
    // dropping `sender` ends it otherwise.
    let conn = tokio::spawn(conn);

    let uri = if absolute {
        target.url.clone()
    } else {
        target
            .url
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/")
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/"))
    };
    let mut req = Request::get(uri)
        .header(header::HOST, host_header(target))
        .header(
            header::USER_AGENT,
            concat!("poolgate-probe/", env!("CARGO_PKG_VERSION")),
        )
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|_| ProbeFault::Body)?;
    if absolute && upstream.scheme != Scheme::Direct {
        if let Some(c) = &upstream.credentials {
            if let Ok(mut v) = http::HeaderValue::from_str(&c.basic_header()) {
                v.set_sensitive(true);
                req.headers_mut().insert(header::PROXY_AUTHORIZATION, v);
            }
        }
    }
    match sender.send_request(req).await {
        Ok(resp) => Ok((resp, conn)),
        Err(e) => {
            conn.abort();
            Err(e.into())
        }
    }
}

async fn exchange(
    connector: &Connector,
    upstream: &Upstream,
    target: &ControlTarget,
) -> Result<(), ProbeFault> {
    let (resp, conn) = send(connector, upstream, target).await?;
    let status = resp.status();
    if status != target.expect_status {
        conn.abort();
        return Err(ProbeFault::Status {
            got: status,
            expected: target.expect_status,
        });
    }
    if let Some(expected) = &target.expect_body {
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        let mut found = false;
        while seen.len() < BODY_LIMIT {
            match body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        let room = BODY_LIMIT - seen.len();
                        seen.extend_from_slice(&data[..data.len().min(room)]);
                        if contains(&seen, expected.as_bytes()) {
                            found = true;
                            break;
                        }
                    }
                }
                None => break,
            }
        }
        conn.abort();
        if !found {
            return Err(ProbeFault::Body);
        }
    } else {
        conn.abort();
    }
    Ok(())
}

/// Longest exit-IP answer read: an address, or a small JSON object holding one. A longer answer
/// is rejected whole, never cut to something that parses.
pub const EXIT_IP_BODY_LIMIT: usize = 1024;

/// Why no exit IP was learnt from an `exit_ip_url` answer. Never holds upstream credentials.
#[derive(Debug, Error)]
pub enum ExitIpFault {
    #[error("{0}")]
    Fetch(#[from] ProbeFault),
    #[error("the answer is longer than {EXIT_IP_BODY_LIMIT} bytes")]
    TooLong,
    #[error("the answer is not an IP address, nor JSON with one in `ip` or `origin`")]
    NotAnIp,
    #[error("exit IPs are not measured (no exit_ip_url, or a runner that does not)")]
    Unmeasured,
}

impl ExitIpFault {
    /// The service answered, but not with an address: the answer is ignored and counted.
    pub fn is_malformed(&self) -> bool {
        matches!(self, ExitIpFault::TooLong | ExitIpFault::NotAnIp)
    }
}

/// Asks `target` (an `exit_ip_url`) through `upstream` which address the request came from.
pub async fn exit_ip(
    connector: &Connector,
    upstream: &Upstream,
    target: &ControlTarget,
    timeout: Duration,
) -> Result<IpAddr, ExitIpFault> {
    let fetch = async {
        let (resp, conn) = send(connector, upstream, target).await?;
        let status = resp.status();
        if status != target.expect_status {
            conn.abort();
            return Err(ExitIpFault::Fetch(ProbeFault::Status {
                got: status,
                expected: target.expect_status,
            }));
        }
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        let read = async {
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    seen.extend_from_slice(&data);
                    if seen.len() > EXIT_IP_BODY_LIMIT {
                        return Err(ExitIpFault::TooLong);
                    }
                }
            }
            Ok(())
        };
        let read = read.await;
        conn.abort();
        read?;
        parse_exit_ip(&seen)
    };
    match tokio::time::timeout(timeout, fetch).await {
        Ok(r) => r,
        Err(_) => Err(ProbeFault::Timeout(timeout).into()),
    }
}

impl From<hyper::Error> for ExitIpFault {
    fn from(e: hyper::Error) -> Self {
        ExitIpFault::Fetch(ProbeFault::Http(e))
    }
}

/// An exit-IP answer, strictly: the whole body (surrounding whitespace aside) is one IPv4 or IPv6
/// literal, or a JSON object whose `ip` (else `origin`) is one. Lists (`"a, b"`), host names,
/// ports, brackets, zones and the unspecified address are refused.
pub fn parse_exit_ip(body: &[u8]) -> Result<IpAddr, ExitIpFault> {
    if body.len() > EXIT_IP_BODY_LIMIT {
        return Err(ExitIpFault::TooLong);
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ExitIpFault::NotAnIp)?
        .trim_matches(|c: char| c.is_ascii_whitespace());
    let literal = if text.starts_with('{') {
        let json: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|_| ExitIpFault::NotAnIp)?;
        let field = json.get("ip").or_else(|| json.get("origin"));
        match field.and_then(|v| v.as_str()) {
            Some(v) => v.to_string(),
            None => return Err(ExitIpFault::NotAnIp),
        }
    } else {
        text.to_string()
    };
    match literal.parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => Ok(ip),
        _ => Err(ExitIpFault::NotAnIp),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn host_header(target: &ControlTarget) -> String {
    let default_port = if target.https { 443 } else { 80 };
    if target.target.port == default_port {
        if target.target.host.contains(':') {
            format!("[{}]", target.target.host)
        } else {
            target.target.host.clone()
        }
    } else {
        target.target.authority()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_search_finds_split_needles() {
        assert!(contains(b"hello world", b"o w"));
        assert!(!contains(b"hello", b"world"));
        assert!(contains(b"", b""));
    }

    #[test]
    fn exit_ip_answers_are_parsed_strictly() {
        let ok = |b: &str| parse_exit_ip(b.as_bytes()).map(|ip| ip.to_string()).ok();
        assert_eq!(ok("203.0.113.7\n").as_deref(), Some("203.0.113.7"));
        assert_eq!(ok("2001:db8::1").as_deref(), Some("2001:db8::1"));
        assert_eq!(
            ok(r#"{"ip": "203.0.113.7"}"#).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(
            ok(r#"{"origin": "2001:db8::2"}"#).as_deref(),
            Some("2001:db8::2")
        );
        for bad in [
            "",
            "<html><body>203.0.113.7</body></html>",
            "proxy.example",
            "203.0.113.7, 198.51.100.1",
            "203.0.113.7:8080",
            "[2001:db8::1]",
            "fe80::1%eth0",
            "0.0.0.0",
            "203.0.113",
            r#"{"ip": 203}"#,
            r#"{"address": "203.0.113.7"}"#,
            r#"{"origin": "203.0.113.7, 198.51.100.1"}"#,
        ] {
            assert!(
                matches!(parse_exit_ip(bad.as_bytes()), Err(ExitIpFault::NotAnIp)),
                "{bad:?} accepted"
            );
        }
        let long = format!("203.0.113.7{}", " ".repeat(EXIT_IP_BODY_LIMIT));
        assert!(matches!(
            parse_exit_ip(long.as_bytes()),
            Err(ExitIpFault::TooLong)
        ));
        assert!(matches!(
            parse_exit_ip(&[0xff, 0xfe]),
            Err(ExitIpFault::NotAnIp)
        ));
    }
}
