//! The proxy itself: one request from admission to the upstream and back.
//!
//! `handle` is the service hyper calls for every request on the proxy port. It sends absolute-form
//! requests to [`forward`] and CONNECT to [`tunnel`]; both share the steps here: admit the target,
//! read the session, pick the pool ([`route`]), then lease and connect with retry ([`open`]).
//! The SOCKS5 port's connections go to [`socks`], which routes with [`route_ask`] from the login
//! it read and carries its tunnels as [`tunnel`] does.

pub mod forward;
pub mod framing;
pub mod headers;
pub mod inspect;
pub mod ledger;
pub mod observe;
pub mod pipe;
pub mod respond;
pub mod socks;
#[cfg(target_os = "linux")]
pub mod splice;
pub mod tunnel;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;

use crate::accounting::{Door, End, Ticket};
use crate::admit;
use crate::auth::AuthFailure;
use crate::config::{AuthConfig, UserConfig};
use crate::error::ProxyError;
use crate::limits::Guarded;
use crate::outcome::Outcome;
use crate::pool::PoolSet;
use crate::pool::lease::Lease;
use crate::pool::select::{self, Route, SessionPlan};
use crate::proxy::respond::ErrorResponse;
use crate::session::{self, SessionRequest};
use crate::state::Gateway;
use crate::store::Store;
use crate::target::{Target, TargetError};
use crate::upstream::connect::ConnectError;
use crate::upstream::{Upstream, UpstreamId};

use crate::body::Body;

/// The client's target from its request URI (absolute form or CONNECT authority), its host in
/// its one canonical spelling; `unusable` says what was missing when there is no host or port.
fn target_of(uri: &http::Uri, unusable: &'static str) -> Result<Target, ProxyError> {
    Target::from_uri(uri, None).map_err(|e| match e {
        TargetError::Unusable => ProxyError::BadRequest(unusable),
        TargetError::BadHost => ProxyError::BadRequest(e.message()),
    })
}

/// The proxy service: never fails, every error becomes its response here. Every request is
/// counted as accepted and settled exactly once (see [`crate::accounting`]).
pub async fn handle(
    gw: Arc<Gateway>,
    mut req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Guarded<Body, Ticket>> {
    let ticket = gw.counters.accept(Door::Http);
    let entry = ledger::begin(&gw, &mut req, peer);
    let connect = req.method() == Method::CONNECT;
    let result = if let Err(e) = framing::check_request(&req) {
        Err(e)
    } else if connect {
        tunnel::handle(&gw, req, peer).await
    } else if req.uri().scheme().is_some() && req.uri().authority().is_some() {
        forward::handle(&gw, req, peer).await
    } else {
        Err(ProxyError::NotProxyRequest)
    };
    match result {
        Ok(resp) => {
            ledger::answered(entry, resp.status(), None);
            resp.map(|body| Guarded::new(body, ticket))
        }
        Err(e) => {
            tracing::debug!(error = %e, code = e.code(), "request failed");
            let status = e.status();
            ledger::answered(entry, status, Some(e.code()));
            ticket.finish(if status.is_client_error() {
                End::Rejected
            } else {
                End::Failed
            });
            let mut resp = e.to_response();
            // After a refused CONNECT the client may already have sent tunnel bytes (a TLS
            // hello); they must never be read as a next request. A malformed request, or one whose
            // body was not read to its end, gets no second chance on this connection.
            if connect
                || status == http::StatusCode::BAD_REQUEST
                || status == http::StatusCode::PAYLOAD_TOO_LARGE
            {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            resp.map(Guarded::settled)
        }
    }
}

/// Admission and routing of an HTTP request, either kind: what its headers ask for (session,
/// pool, credentials), then [`route_ask`].
pub async fn route(
    gw: &Gateway,
    headers: &HeaderMap,
    target: &Target,
    connect: bool,
    peer: SocketAddr,
) -> Result<Route, ProxyError> {
    // The client allowlist comes before anything of the request is read.
    admit::check_client(&gw.live.load().auth, peer.ip())?;
    let ask: SessionRequest = session::parse(headers).map_err(|e| {
        if e.is_proxy_auth() {
            ProxyError::BadUsername(e)
        } else {
            ProxyError::BadSessionHeader(e)
        }
    })?;
    route_ask(gw, ask, target, connect, peer).await
}

/// Admission and routing common to every front door, from what the client asked for:
/// authentication, target policy, session, pool. The client allowlist is the front door's to
/// check, before it reads anything of the request ([`route`], the SOCKS5 handshake).
pub async fn route_ask(
    gw: &Gateway,
    ask: SessionRequest,
    target: &Target,
    connect: bool,
    peer: SocketAddr,
) -> Result<Route, ProxyError> {
    let live = gw.live.load_full();
    let user_name: Option<Arc<str>> = live
        .auth
        .required()
        .then(|| ask.user.as_deref().map(Arc::from))
        .flatten();
    let user = login(
        gw,
        &live.auth,
        peer.ip(),
        ask.user.as_deref(),
        ask.password.as_deref(),
    )
    .await?;
    gw.policy.load().check(target, connect)?;
    let pools: Arc<PoolSet> = gw.pools.load_full();
    let allowed = user.and_then(|u| u.pools.as_ref());
    // A user limited to some pools who names none uses the default pool if allowed, else the
    // first of theirs.
    let wanted = match (ask.pool.as_deref(), allowed) {
        (None, Some(list)) if !list.iter().any(|p| *p == live.default_pool) => {
            list.first().map(String::as_str)
        }
        (named, _) => named,
    };
    let pool = pools.get(wanted)?.clone();
    if let Some(list) = allowed {
        if !list.iter().any(|p| p == pool.name()) {
            return Err(ProxyError::PoolDenied(pool.name().to_string()));
        }
    }
    let filter = pool.filter(&ask.labels)?;
    let (key, minted) = match (ask.session, ask.create) {
        (Some(key), _) => (Some(key), false),
        (None, true) => (Some(session::mint_key()), true),
        (None, false) => (None, false),
    };
    let session = key.map(|key| SessionPlan {
        binding: match &filter {
            Some(f) => format!("{key}|{}", f.filter),
            None => key.as_str().to_string(),
        },
        key,
        ttl: ask.ttl.unwrap_or(pool.config.session_ttl),
        minted,
    });
    Ok(Route {
        pool,
        filter,
        session,
        target_host: Arc::from(target.host.as_str()),
        user: user_name,
    })
}

/// Checks a client's proxy login when users are configured, the login back-off's lockout
/// included: the user logged in, or `None` when no users are configured (anyone may use the
/// proxy, within `client_cidrs`). [`route_ask`] calls it; a front door whose protocol answers the
/// login before the request (SOCKS5) calls it first, and [`route_ask`]'s own check then finds the
/// login remembered.
pub async fn login<'a>(
    gw: &Gateway,
    auth: &'a AuthConfig,
    client: IpAddr,
    user: Option<&str>,
    password: Option<&str>,
) -> Result<Option<&'a UserConfig>, ProxyError> {
    if !auth.required() {
        return Ok(None);
    }
    let user = gw
        .auth
        .authenticate(auth, client, user, password)
        .await
        .map_err(|e| match e {
            AuthFailure::LockedOut { retry_after } => ProxyError::AuthLockedOut { retry_after },
            AuthFailure::Missing | AuthFailure::Invalid => ProxyError::AuthRequired,
        })?;
    Ok(Some(user))
}

/// Leases an upstream and connects through it, trying further upstreams when connecting fails
/// before anything was sent. A session keeps its upstream: only a binding made by this very
/// request (nothing has used it yet) may be undone and moved.
pub async fn open<T, F, Fut>(
    gw: &Gateway,
    route: &Route,
    mut connect: F,
) -> Result<(Lease, T), ProxyError>
where
    F: FnMut(Arc<Upstream>) -> Fut,
    Fut: Future<Output = Result<T, ConnectError>>,
{
    // Once per request (a CONNECT tunnel is one request), not once per attempt.
    let refused = |e: &ProxyError| gw.metrics.pool_refused(route.pool.name(), e.code());
    select::admit_user(gw, route).await.inspect_err(refused)?;
    let mut tried: Vec<UpstreamId> = Vec::new();
    let mut last: Option<(UpstreamId, ConnectError)> = None;
    for _ in 0..=route.pool.config.retries {
        let mut lease = match select::acquire(gw, route, &tried).await {
            Ok(lease) => lease,
            Err(ProxyError::NoUpstream) if last.is_some() => break,
            Err(e) => {
                refused(&e);
                return Err(e);
            }
        };
        let (Some(mut upstream), Some(grant)) = (lease.upstream().cloned(), lease.grant().cloned())
        else {
            return Err(ProxyError::NoUpstream);
        };
        if upstream.templated {
            upstream = Arc::new(upstream.filled(&|name| route.placeholder(&upstream, name)));
            lease.use_upstream(upstream.clone());
        }
        match connect(upstream).await {
            Ok(conn) => {
                let mut lease = lease;
                let user = route.user.as_deref();
                lease.set_tap(
                    gw.meter
                        .tap(route.pool.name(), grant.upstream.as_str(), user),
                );
                lease.set_retries(u32::try_from(tried.len()).unwrap_or(u32::MAX));
                return Ok((lease, conn));
            }
            Err(ConnectError::TargetDenied { target }) => {
                // The target's name points into an internal network: nothing was dialed, and no
                // other upstream fares better. Not the upstream's fault.
                tracing::info!(target = %target, "resolved target denied by policy");
                lease.finish(Outcome::OriginError);
                return Err(ProxyError::TargetDenied(
                    "the target resolves to addresses this proxy may not reach",
                ));
            }
            Err(e) => {
                tracing::info!(upstream = %grant.upstream, error = %e, "upstream connect failed");
                let outcome = e.outcome();
                lease.finish(outcome);
                if outcome == Outcome::OriginError {
                    // The target itself is at fault (no such name): another upstream fares no better.
                    return Err(ProxyError::UpstreamConnect {
                        upstream: grant.upstream,
                        source: e,
                    });
                }
                if let Some(s) = &route.session {
                    if !grant.bound_now {
                        return Err(ProxyError::SessionUpstreamUnavailable {
                            upstream: grant.upstream,
                            cause: Some(e),
                        });
                    }
                    gw.store
                        .unbind(route.pool.name(), &s.binding, &grant.upstream)
                        .await?;
                }
                tried.push(grant.upstream.clone());
                last = Some((grant.upstream, e));
            }
        }
    }
    match last {
        Some((upstream, source)) => Err(ProxyError::UpstreamConnect { upstream, source }),
        None => Err(ProxyError::NoUpstream),
    }
}
