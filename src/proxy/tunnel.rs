//! CONNECT: a byte tunnel to the target through the leased upstream.
//!
//! The upstream leg is opened first, so a failure is answered with a proper 502 rather than a 200
//! followed by a closed socket. Then, in hyper's order: answer 200 with an empty body, take the
//! upgraded connection in a tracked task (hyper no longer tracks it), and carry it ([`Carry`]:
//! hand it to [`crate::intercept`] for pools with `inspect_tls`, or copy both ways until the
//! tunnel ends). The lease is held, and renewed, for the tunnel's whole life. The SOCKS5 front
//! door ([`crate::proxy::socks`]) carries its tunnels the same way.
//!
//! An opaque tunnel is judged by its bytes alone ([`judge`]): the upstream closing it at once
//! with (next to) nothing sent, or a TLS handshake that gets no answer at all within
//! `connect_timeout`, counts against the upstream; everything else is `ok` or, when the client
//! broke off, `cancelled`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::accounting::Door;
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::intercept::{self, HostPattern};
use crate::limits::{Activity, Tracked};
use crate::outcome::Outcome;
use crate::pool::lease::Lease;
use crate::pool::select::Route;
use crate::proxy::inspect::{self, Opening};
use crate::proxy::pipe::{self, End, Side};
use crate::proxy::{self, headers};
use crate::server::AfterUpgrade;
use crate::state::Gateway;
use crate::target::Target;
use crate::upstream::connect::{BoxIo, Io, Rewind};

/// An upstream that ends a tunnel this soon after it was established...
pub const EARLY_CLOSE_WITHIN: Duration = Duration::from_secs(2);
/// ...having sent fewer bytes than this (not even a TLS record header: nothing an origin could
/// have said, such as a TLS alert, got through) failed the tunnel.
pub const EARLY_CLOSE_MAX_BYTES: u64 = 5;

pub async fn handle(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ProxyError> {
    let target = proxy::target_of(req.uri(), "CONNECT needs a host:port target")?;
    let route = proxy::route(gw, req.headers(), &target, true, peer).await?;
    let entry = proxy::ledger::routed(req.extensions(), &route);
    let (mut lease, io) = proxy::open(gw, &route, |up| {
        let gw = gw.clone();
        let target = target.clone();
        async move { gw.connector.tunnel(&up, &target).await }
    })
    .await?;
    lease.mark_latency();
    proxy::ledger::attach(entry, &mut lease);

    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::OK;
    let carry = Carry::plan(gw, Door::Http, &route, target);
    if let Some(up) = lease.upstream() {
        headers::annotate_response(resp.headers_mut(), up, carry.session.as_deref());
    }

    let gw = gw.clone();
    let after = req.extensions().get::<AfterUpgrade>().cloned();
    let tasks = gw.tasks.clone();
    let tunnel = async move {
        let client = match hyper::upgrade::on(req).await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(error = %e, "client upgrade failed");
                lease.finish(Outcome::Cancelled);
                return;
            }
        };
        carry.run(gw, unwrap_client(client), io, lease).await
    };
    // The connection's task runs the tunnel once hyper hands the connection over; a connection
    // served without that hook (none today) gets a task of its own.
    match after {
        Some(after) => after.set(tunnel),
        None => {
            tasks.spawn(tunnel);
        }
    }
    Ok(resp)
}

/// How a tunnel is carried once its client has been told it is up (CONNECT's 200, the SOCKS5
/// success reply): inspected, for a pool with `inspect_tls` and a target it does not exclude, or
/// relayed as bytes. Every front door's tunnels go through here.
pub struct Carry {
    door: Door,
    inspect: bool,
    exclude: Vec<HostPattern>,
    target: Target,
    /// The route's session key, for inspected responses' `X-Pool-Session`.
    pub session: Option<String>,
}

impl Carry {
    /// Decides how a tunnel to `target` on `route` is carried (counting a tunnel its pool would
    /// inspect but interception cannot or may not).
    pub fn plan(gw: &Gateway, door: Door, route: &Route, target: Target) -> Carry {
        let pool = &route.pool.config;
        let inspect = pool.inspect_tls
            && gw.intercept.enabled()
            && !intercept::excluded(&pool.inspect_exclude, &target.host);
        if pool.inspect_tls && !inspect {
            intercept::InterceptStats::bump(&gw.intercept.stats.tunnels_excluded);
        }
        Carry {
            door,
            inspect,
            exclude: if inspect {
                pool.inspect_exclude.clone()
            } else {
                Vec::new()
            },
            target,
            session: route.session.as_ref().map(|s| s.key.as_str().to_string()),
        }
    }

    /// Carries the tunnel between `client` and `upstream` to its end, holding `lease` for its
    /// whole life and recording its outcome there.
    pub async fn run(self, gw: Arc<Gateway>, client: BoxIo, upstream: BoxIo, lease: Lease) {
        if !self.inspect {
            return relay(&gw, self.door, client, upstream, lease).await;
        }
        // Boxed: inspection's state is large, and an opaque tunnel should not carry (and copy
        // into its task) room for it.
        match Box::pin(inspect::open(&gw, client, &self.target, &self.exclude)).await {
            Opening::Inspect(hello) => {
                Box::pin(inspect::serve(
                    gw,
                    hello,
                    upstream,
                    lease,
                    self.target,
                    self.session,
                ))
                .await
            }
            Opening::PassThrough(client) => relay(&gw, self.door, client, upstream, lease).await,
            Opening::Gone => lease.finish(Outcome::Cancelled),
        }
    }
}

/// The client's connection as the socket it is, without hyper's wrapping (any bytes hyper read
/// past the CONNECT come first): a tunnel between two bare sockets copies without locks.
fn unwrap_client(upgraded: Upgraded) -> BoxIo {
    match upgraded.downcast::<TokioIo<Tracked<TcpStream>>>() {
        Ok(parts) => {
            // The connection's own activity tracker; the tunnel keeps its own.
            let socket = parts.io.into_inner().into_inner();
            if parts.read_buf.is_empty() {
                Box::new(socket)
            } else {
                Box::new(Rewind::new(parts.read_buf, socket))
            }
        }
        Err(upgraded) => Box::new(TokioIo::new(upgraded)),
    }
}

/// Copies bytes both ways until the tunnel ends, renewing the lease while it lives, and records
/// the tunnel's outcome as [`judge`] sees it. A tunnel with no bytes moving for
/// `tunnel_idle_timeout` is closed, and so is every tunnel still open when the shutdown grace has
/// run out.
pub async fn relay(gw: &Gateway, door: Door, client: impl Io, upstream: BoxIo, lease: Lease) {
    let _open = gw.counters.tunnel(door);
    let idle_timeout = gw.live.load().server.tunnel_idle_timeout;
    let activity = Activity::new();
    let renew_every = lease.ttl() / 2;
    let no_reply_within = Some(gw.config.server.connect_timeout);
    let copy = pipe::copy_metered(
        client,
        upstream,
        activity.clone(),
        no_reply_within,
        lease.tap().cloned(),
    );
    tokio::pin!(copy);
    // One timer serves both the idle check and the lease's renewal, set for whichever is due
    // first: a tunnel is mostly short, and a timer costs as much to arm and drop as the rest of
    // its bookkeeping.
    let start = Instant::now();
    let mut renew_at = start + renew_every;
    let wake = tokio::time::sleep_until(renew_at.min(start + idle_timeout));
    tokio::pin!(wake);
    let report = loop {
        tokio::select! {
            _ = &mut wake => {
                let idle_left = activity.idle_left(idle_timeout);
                if idle_left.is_zero() {
                    tracing::debug!("closing idle tunnel");
                    lease.finish(Outcome::Ok);
                    return;
                }
                let now = Instant::now();
                if now >= renew_at {
                    lease.extend().await;
                    renew_at = now + renew_every;
                }
                wake.as_mut().reset(renew_at.min(now + idle_left.max(Duration::from_millis(1))));
            }
            _ = gw.tunnels_stop.cancelled() => {
                tracing::debug!("closing tunnel: shutdown grace expired");
                lease.finish(Outcome::Cancelled);
                return;
            }
            r = &mut copy => break r,
        }
    };
    let outcome = judge(&report);
    if outcome != Outcome::Ok {
        tracing::debug!(
            upstream = %lease.grant().map_or("?", |g| g.upstream.as_str()),
            outcome = outcome.as_str(),
            client_bytes = report.client_bytes,
            upstream_bytes = report.upstream_bytes,
            duration_ms = report.duration.as_millis() as u64,
            "tunnel judged"
        );
    }
    lease.finish(outcome);
}

/// The outcome of an opaque tunnel, from its bytes and who ended it.
pub fn judge(r: &pipe::Report) -> Outcome {
    match &r.first_end {
        Some((Side::Upstream, _, after))
            if *after <= EARLY_CLOSE_WITHIN && r.upstream_bytes < EARLY_CLOSE_MAX_BYTES =>
        {
            Outcome::Reset
        }
        // The client's TLS handshake got no answer at all within connect_timeout.
        _ if r.no_reply => Outcome::Timeout,
        // The client left before anything came back: it went away, nobody is to blame.
        Some((Side::Client, End::Eof, _)) if r.upstream_bytes == 0 => Outcome::Cancelled,
        // Which side broke the exchange is not always the side at fault: an error mid-stream is
        // not blamed on the upstream.
        Some((_, End::Error(..), _)) => Outcome::Cancelled,
        _ => Outcome::Ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::pipe::Report;

    fn report(first_end: Option<(Side, End, Duration)>, up: u64, no_reply: bool) -> Report {
        Report {
            client_bytes: 300,
            upstream_bytes: up,
            first_end,
            no_reply,
            duration: Duration::from_secs(1),
        }
    }

    #[test]
    fn judges_early_closes_and_silent_handshakes_against_the_upstream() {
        let ms = Duration::from_millis;
        let eof = |side, after| Some((side, End::Eof, after));
        assert_eq!(
            judge(&report(eof(Side::Upstream, ms(50)), 0, false)),
            Outcome::Reset
        );
        assert_eq!(
            judge(&report(
                Some((
                    Side::Upstream,
                    End::Error(Side::Upstream, std::io::ErrorKind::ConnectionReset.into()),
                    ms(50)
                )),
                0,
                false
            )),
            Outcome::Reset
        );
        // A TLS alert from the origin (7 bytes) is the origin speaking: not blamed.
        assert_eq!(
            judge(&report(eof(Side::Upstream, ms(50)), 7, false)),
            Outcome::Ok
        );
        // Late, or the client closed first: not the upstream's doing.
        assert_eq!(
            judge(&report(eof(Side::Upstream, ms(5000)), 0, false)),
            Outcome::Ok
        );
        assert_eq!(
            judge(&report(eof(Side::Client, ms(50)), 10, false)),
            Outcome::Ok
        );
        assert_eq!(
            judge(&report(eof(Side::Client, ms(50)), 0, false)),
            Outcome::Cancelled
        );
        assert_eq!(judge(&report(None, 0, true)), Outcome::Timeout);
        assert_eq!(
            judge(&report(
                Some((
                    Side::Client,
                    End::Error(Side::Client, std::io::ErrorKind::BrokenPipe.into()),
                    ms(5000)
                )),
                10_000,
                false
            )),
            Outcome::Cancelled
        );
    }
}
