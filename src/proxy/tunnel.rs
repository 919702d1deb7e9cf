//! CONNECT: a byte tunnel to the target through the leased upstream.
//!
//! The upstream leg is opened first, so a failure is answered with a proper 502 rather than a 200
//! followed by a closed socket. Then, in hyper's order: answer 200 with an empty body, take the
//! upgraded connection in a tracked task (hyper no longer tracks it), and copy both ways until
//! either side closes. The lease is held, and renewed, for the tunnel's whole life.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::error::ProxyError;
use crate::health::Outcome;
use crate::pool::Lease;
use crate::proxy::{self, Body, headers};
use crate::state::Gateway;
use crate::target::Target;
use crate::upstream::connect::BoxIo;

pub async fn handle(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let target = Target::from_uri(req.uri(), None)
        .ok_or(ProxyError::BadRequest("CONNECT needs a host:port target"))?;
    let route = proxy::route(gw, req.headers(), &target, true)?;
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

    gw.tasks.spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => relay(TokioIo::new(upgraded), io, lease).await,
            Err(e) => {
                tracing::debug!(error = %e, "client upgrade failed");
                lease.finish(Outcome::Cancelled);
            }
        }
    });
    Ok(resp)
}

/// Copies bytes both ways until one side closes, renewing the lease while the tunnel lives.
async fn relay(mut client: TokioIo<hyper::upgrade::Upgraded>, mut upstream: BoxIo, lease: Lease) {
    let renew_every = lease.ttl() / 2;
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    let mut renew = tokio::time::interval(renew_every);
    renew.tick().await;
    let outcome = loop {
        tokio::select! {
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
