//! Absolute-form requests (`GET http://host/path`): forwarded through the leased upstream.
//!
//! To an HTTP proxy upstream the request goes in absolute form with the upstream's own
//! credentials; through a SOCKS or direct upstream it goes in origin form over a connection to
//! the target. Connections are kept alive and reused per upstream (and per target where the
//! connection is a tunnel).

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::body::OutBody;
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::health::classify::ResponseFrom;
use crate::limits::{self, BodyFault, LimitedBody, LookaheadFault};
use crate::proxy::ledger::{self, Metered, Way};
use crate::proxy::observe::Observed;
use crate::proxy::{self, framing, headers};
use crate::state::Gateway;
use crate::target::Target;
use crate::upstream::Upstream;
use crate::upstream::connect::ConnectError;
use crate::upstream::reuse::ConnKey;

pub async fn handle(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ProxyError> {
    let target = proxy::target_of(req.uri(), "the request URI has no usable host")?;
    if !matches!(req.uri().scheme_str(), Some("http")) {
        return Err(ProxyError::BadRequest(
            "only http:// URIs are forwarded; use CONNECT for https",
        ));
    }
    let route = proxy::route(gw, req.headers(), &target, false, peer).await?;
    let entry = ledger::routed(req.extensions(), &route);
    let limit = gw.live.load().server.max_request_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }

    // What of the body came with the head is checked before anything goes upstream.
    let (parts, body) = req.into_parts();
    let body = limits::read_ahead(body, limit)
        .await
        .map_err(|fault| match fault {
            LookaheadFault::Malformed => ProxyError::BadRequestBody,
            LookaheadFault::TooLarge => ProxyError::BodyTooLarge { limit },
        })?;
    let req = Request::from_parts(parts, body);

    let (mut lease, (sender, key, reused)) =
        proxy::open(gw, &route, |up| sender_for(gw, up, &target)).await?;
    let Some(upstream) = lease.upstream().cloned() else {
        return Err(ProxyError::NoUpstream);
    };

    ledger::attach(entry, &mut lease);
    let (mut parts, body) = req.into_parts();
    // The handler and the lease hold the request's entry; the upstream's request does not.
    parts.extensions.remove::<Arc<crate::access_log::Entry>>();
    headers::clean_request(&mut parts.headers);
    if upstream.scheme.speaks_http_proxy() {
        if let Some(c) = &upstream.credentials {
            let mut v = HeaderValue::from_str(&c.basic_header())
                .map_err(|_| ProxyError::BadRequest("unusable upstream credentials"))?;
            v.set_sensitive(true);
            parts.headers.insert(header::PROXY_AUTHORIZATION, v);
        }
    } else {
        parts.uri = origin_form(&parts.uri);
    }
    // The absolute-form target wins over whatever Host the client sent (RFC 9112 §3.2.2); a
    // Host that already names it (as nearly every client's does) is kept as it is.
    let named = parts.headers.get(header::HOST);
    if !named.is_some_and(|v| names_target(v.as_bytes(), &target)) {
        if let Ok(v) = HeaderValue::from_str(&host_header(&target)) {
            parts.headers.insert(header::HOST, v);
        }
    }
    let replay = body_is_empty(&body).then(|| parts.clone());
    let fault = Arc::new(BodyFault::default());
    let body = LimitedBody::new(body, limit, fault.clone());
    let body = Metered::new(body, lease.tap().cloned(), Way::Up);
    let out = Request::from_parts(parts, body.boxed_unsync());

    let timeout = gw.live.load().server.response_timeout;
    gw.counters.forwarded();
    let sent = tokio::time::timeout(
        timeout,
        send(gw, sender, key, reused, out, replay, &upstream, &target),
    )
    .await;
    let (resp, (key, sender)) = match sent {
        Ok(Ok(sent)) => sent,
        // The client's body broke off or passed the limit: the client's fault, not the
        // upstream's; the upstream connection is dropped with the half-sent request.
        Ok(Err(_)) if fault.too_large() => {
            lease.finish(crate::outcome::Outcome::Cancelled);
            return Err(ProxyError::BodyTooLarge { limit });
        }
        Ok(Err(_)) if fault.broken() => {
            lease.finish(crate::outcome::Outcome::Cancelled);
            return Err(ProxyError::BadRequestBody);
        }
        Ok(Err(e)) => {
            // A reused connection that turned out closed is replaced by a fresh one; when that
            // connect fails it is a connect failure, and for a session, its upstream's.
            let outcome = match &e {
                ProxyError::UpstreamConnect { source, .. } => source.outcome(),
                _ => crate::outcome::Outcome::Reset,
            };
            lease.finish(outcome);
            return Err(match (e, &route.session) {
                (ProxyError::UpstreamConnect { upstream, source }, Some(_)) => {
                    ProxyError::SessionUpstreamUnavailable {
                        upstream,
                        cause: Some(source),
                    }
                }
                (e, _) => e,
            });
        }
        Err(_) => {
            lease.finish(crate::outcome::Outcome::Timeout);
            return Err(ProxyError::UpstreamTimeout {
                upstream: upstream.id.clone(),
            });
        }
    };
    lease.mark_latency();

    let (mut parts, body) = resp.into_parts();
    if let Err(reason) = framing::check_response(parts.status, &parts.headers) {
        // The connection is not reused: its sender is dropped here.
        lease.finish(crate::outcome::Outcome::UpstreamError);
        return Err(ProxyError::UpstreamBadResponse {
            upstream: upstream.id.clone(),
            reason,
        });
    }
    // Through a SOCKS or direct upstream the response is the origin's: the upstream only
    // carried bytes.
    let from = if upstream.scheme.speaks_http_proxy() {
        ResponseFrom::Proxy
    } else {
        ResponseFrom::Origin
    };
    let (outcome, sniffer) = gw.captcha.classify_head(parts.status, &parts.headers, from);
    headers::clean_response(&mut parts.headers);
    let session = route.session.as_ref().map(|s| s.key.as_str());
    headers::annotate_response(&mut parts.headers, &upstream, session);
    // Only a connection whose response passed the checks goes back to the idle list, once that
    // response has been read to its end.
    let body = limits::Guarded::new(body, gw.conns.giveback(key, sender));
    // What of the body has already arrived is read before the head goes to the client, so a
    // response whose body is broken from the start becomes a clean 502.
    let body = match limits::read_ahead(body, u64::MAX).await {
        Ok(body) => body,
        Err(_) => {
            lease.finish(crate::outcome::Outcome::UpstreamError);
            return Err(ProxyError::UpstreamBadResponse {
                upstream: upstream.id.clone(),
                reason: "malformed body",
            });
        }
    };
    let body = Metered::new(body, lease.tap().cloned(), Way::Down);
    let body = Observed::new(body, lease, outcome, sniffer).boxed();
    Ok(Response::from_parts(parts, body))
}

/// A connection to give back to the idle list once its response is known to be usable.
type Recycle = (ConnKey, SendRequest<OutBody>);

/// Sends `req`, once more on a fresh connection when a reused one turns out to be closed before
/// the request could be delivered (the upstream's keep-alive timer won the race).
#[expect(
    clippy::too_many_arguments,
    reason = "one call site; a struct would only rename them"
)]
async fn send(
    gw: &Arc<Gateway>,
    mut sender: SendRequest<OutBody>,
    key: ConnKey,
    reused: bool,
    req: Request<OutBody>,
    replay: Option<http::request::Parts>,
    upstream: &Arc<Upstream>,
    target: &Target,
) -> Result<(Response<Incoming>, Recycle), ProxyError> {
    let first = sender.try_send_request(req).await;
    let (mut sender, req) = match first {
        Ok(resp) => return Ok((resp, (key, sender))),
        Err(mut e) => {
            let unsent = e.take_message();
            let retry = match (reused, unsent, replay) {
                (true, Some(req), _) => Some(req),
                (true, None, Some(parts)) => Some(Request::from_parts(parts, body::empty_out())),
                _ => None,
            };
            let Some(req) = retry else {
                return Err(ProxyError::UpstreamProtocol {
                    upstream: upstream.id.clone(),
                    source: e.into_error(),
                });
            };
            let (sender, _, _) =
                Box::pin(fresh_sender(gw, upstream, target))
                    .await
                    .map_err(|source| ProxyError::UpstreamConnect {
                        upstream: upstream.id.clone(),
                        source,
                    })?;
            (sender, req)
        }
    };
    match sender.send_request(req).await {
        Ok(resp) => Ok((resp, (key, sender))),
        Err(source) => Err(ProxyError::UpstreamProtocol {
            upstream: upstream.id.clone(),
            source,
        }),
    }
}

fn body_is_empty<B: http_body::Body>(body: &B) -> bool {
    body.is_end_stream()
}

fn conn_key(upstream: &Upstream, target: &Target) -> ConnKey {
    ConnKey {
        upstream: upstream.id.clone(),
        target: (!upstream.scheme.speaks_http_proxy()).then(|| target.clone()),
        login: upstream
            .templated
            .then(|| upstream.credentials.as_ref().map(|c| c.username.clone()))
            .flatten(),
    }
}

/// A sender for `target` through `upstream`: an idle kept-alive one, or a new connection.
async fn sender_for(
    gw: &Gateway,
    upstream: Arc<Upstream>,
    target: &Target,
) -> Result<(SendRequest<OutBody>, ConnKey, bool), ConnectError> {
    let key = conn_key(&upstream, target);
    if let Some(sender) = gw.conns.take(&key) {
        return Ok((sender, key, true));
    }
    // Boxed: dialing (and a TLS or SOCKS handshake) is kilobytes of state that a request reusing
    // a kept-alive connection should not carry, nor have moved into place with it.
    Box::pin(fresh_sender(gw, &upstream, target)).await
}

async fn fresh_sender(
    gw: &Gateway,
    upstream: &Upstream,
    target: &Target,
) -> Result<(SendRequest<OutBody>, ConnKey, bool), ConnectError> {
    let io = if upstream.scheme.speaks_http_proxy() {
        gw.connector.proxy_conn(upstream).await?
    } else {
        gw.connector.tunnel(upstream, target).await?
    };
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| ConnectError::Io {
            addr: upstream.id.to_string(),
            error: std::io::Error::other(e),
        })?;
    let upstream_id = upstream.id.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(upstream = %upstream_id, error = %e, "upstream connection ended");
        }
    });
    Ok((sender, conn_key(upstream, target), false))
}

/// `http://host/path?q` → `/path?q`, for upstreams that are not HTTP proxies.
fn origin_form(uri: &Uri) -> Uri {
    uri.path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"))
}

/// Whether a Host value names `target` as [`host_header`] would, the host in any letter case.
/// IPv6 literals always get a fresh Host. Compared byte by byte: it runs on every request.
fn names_target(value: &[u8], target: &Target) -> bool {
    let host = target.host.as_bytes();
    if value.len() < host.len() || !value[..host.len()].eq_ignore_ascii_case(host) {
        return false;
    }
    if host.contains(&b':') {
        return false;
    }
    match &value[host.len()..] {
        [] => target.port == 80,
        [b':', port @ ..] => port == itoa::Buffer::new().format(target.port).as_bytes(),
        _ => false,
    }
}

fn host_header(target: &Target) -> String {
    if target.port == 80 {
        if target.host.contains(':') {
            format!("[{}]", target.host)
        } else {
            target.host.clone()
        }
    } else {
        target.authority()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_that_names_the_target_is_recognised_and_any_other_is_not() {
        let t = Target::new("a.test", 8080);
        assert!(names_target(b"a.test:8080", &t));
        assert!(names_target(b"A.Test:8080", &t));
        for other in [
            &b"a.test"[..],
            b"a.test:80",
            b"a.test:08080",
            b"b.test:8080",
            b"a.test:",
            b"",
        ] {
            assert!(
                !names_target(other, &t),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        let t = Target::new("a.test", 80);
        assert!(names_target(b"a.test", &t));
        assert!(names_target(b"a.test:80", &t));
        assert!(!names_target(b"a.test:8080", &t));
        assert!(!names_target(b"a.test.evil", &t));
        let t = Target::new("::1", 80);
        assert!(!names_target(b"[::1]", &t));
        // What the gateway would write itself is recognised as naming the target.
        for t in [Target::new("a.test", 80), Target::new("a.test", 81)] {
            assert!(names_target(host_header(&t).as_bytes(), &t), "{t}");
        }
    }
}
