//! CONNECT: a byte tunnel to the target through the leased upstream.
//!
//! The upstream leg is opened first, so a failure is answered with a proper 502 rather than a 200
//! followed by a closed socket. Then, in hyper's order: answer 200 with an empty body, take the
//! upgraded connection in a tracked task (hyper no longer tracks it), and copy both ways until
//! either side closes. The lease is held, and renewed, for the tunnel's whole life.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::error::ProxyError;
use crate::health::Outcome;
use crate::limits::{self, Activity, Tracked};
use crate::pool::Lease;
use crate::proxy::{self, Body, headers};
use crate::state::Gateway;
use crate::target::Target;
use crate::upstream::connect::BoxIo;

pub async fn handle(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ProxyError> {
    let target = Target::from_uri(req.uri(), None)
        .ok_or(ProxyError::BadRequest("CONNECT needs a host:port target"))?;
    let route = proxy::route(gw, req.headers(), &target, true, peer).await?;
    let (mut lease, io) = proxy::open(gw, &route, |up| {
        let gw = gw.clone();
        let target = target.clone();
        async move { gw.connector.tunnel(&up, &target).await }
    })
    .await?;
    lease.mark_latency();

    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::OK;
    if let Some(up) = lease.upstream() {
        let session = route.session.as_ref().map(|s| s.key.as_str());
        headers::annotate_response(resp.headers_mut(), up.id.as_str(), session);
    }

    let relay_gw = gw.clone();
    gw.tasks.spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => relay(&relay_gw, TokioIo::new(upgraded), io, lease).await,
            Err(e) => {
                tracing::debug!(error = %e, "client upgrade failed");
                lease.finish(Outcome::Cancelled);
            }
        }
    });
    Ok(resp)
}

/// Copies bytes both ways until one side closes, renewing the lease while the tunnel lives. A
/// tunnel with no bytes moving for `tunnel_idle_timeout` is closed, and so is every tunnel still
/// open when the shutdown grace has run out.
async fn relay(
    gw: &Gateway,
    client: TokioIo<hyper::upgrade::Upgraded>,
    upstream: BoxIo,
    lease: Lease,
) {
    let _open = gw.counters.tunnel();
    let idle_timeout = gw.live.load().server.tunnel_idle_timeout;
    let activity = Activity::new();
    let mut client = Tracked::new(client, activity.clone());
    let mut upstream = Tracked::new(upstream, activity.clone());
    let renew_every = lease.ttl() / 2;
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    let mut renew = tokio::time::interval(renew_every);
    renew.tick().await;
    let outcome = loop {
        tokio::select! {
            _ = limits::idle(&activity, idle_timeout) => {
                tracing::debug!("closing idle tunnel");
                break Outcome::Ok;
            }
            _ = gw.tunnels_stop.cancelled() => {
                tracing::debug!("closing tunnel: shutdown grace expired");
                break Outcome::Cancelled;
            }
            r = &mut copy => break match r {
                Ok(_) => Outcome::Ok,
                // Which side broke off is unknown here, so the upstream is not blamed.
                Err(e) => {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                    Outcome::Cancelled
                }
            },
            _ = renew.tick() => lease.extend().await,
        }
    };
    lease.finish(outcome);
}
