//! One probe: a request to a control target through one upstream, judged by its answer.
//!
//! The probe goes the way client traffic goes: absolute-form through an HTTP proxy for an
//! `http://` control target, through a tunnel (CONNECT, SOCKS or direct) otherwise, with TLS to
//! the origin for `https://`. It passes when the status is the expected one, the body (its first
//! [`BODY_LIMIT`] bytes) holds the expected string, and the whole exchange fits the latency
//! ceiling.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use thiserror::Error;
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

async fn exchange(
    connector: &Connector,
    upstream: &Upstream,
    target: &ControlTarget,
) -> Result<(), ProbeFault> {
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
    let resp = sender.send_request(req).await?;
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
}
