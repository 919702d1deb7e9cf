//! What the request path tells the access log and the byte meter, in one place so the handlers
//! each need a line or two.
//!
//! [`begin`] makes a request's access-log entry (when the log is on) and leaves a copy in the
//! request's extensions; [`routed`] fills in what routing decided; [`attach`] gives it, after
//! the upstream is connected, to the lease, which tells it the outcome at release. The handler
//! keeps its own copy until the response is made ([`answered`]), so the line is written when
//! both are done: after the response body for a forwarded request, at the close of a tunnel.
//! [`Metered`] counts a body's bytes on its way through.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::access_log::Entry;
use crate::meter::Tap;
use crate::pool::lease::Lease;
use crate::pool::select::Route;
use crate::state::Gateway;

/// The request's entry, when the access log is on; a copy rides in the request's extensions.
pub fn begin<B>(gw: &Gateway, req: &mut Request<B>, peer: SocketAddr) -> Option<Arc<Entry>> {
    let log = gw.access_log.as_ref()?;
    let entry = log.entry(peer, req.method(), req.version(), host_port(req.uri()));
    req.extensions_mut().insert(entry.clone());
    Some(entry)
}

/// `host:port` of a request's target, its port filled in from the scheme; never a userinfo
/// part, a path or a query.
fn host_port(uri: &http::Uri) -> Option<String> {
    let a = uri.authority()?;
    let port = a.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    Some(format!("{}:{port}", a.host()))
}

/// A SOCKS5 request's entry, when the access log is on: method `SOCKS5`, the target as asked.
pub fn begin_socks(gw: &Gateway, peer: SocketAddr, target: String) -> Option<Arc<Entry>> {
    let log = gw.access_log.as_ref()?;
    let method = http::Method::from_bytes(b"SOCKS5").unwrap_or(http::Method::CONNECT);
    Some(log.entry(peer, &method, http::Version::HTTP_11, Some(target)))
}

/// The request's entry with routing's decisions: user, session, pool, label filter.
pub fn routed(ext: &http::Extensions, route: &Route) -> Option<Arc<Entry>> {
    let entry = ext.get::<Arc<Entry>>()?.clone();
    fill_route(&entry, route);
    Some(entry)
}

/// Routing's decisions into `entry`, for a front door that keeps its entry itself.
pub fn fill_route(entry: &Entry, route: &Route) {
    entry.update(|f| {
        f.user = route.user.clone();
        f.session = route.session.as_ref().map(|s| s.key.as_str().to_string());
        f.pool = Some(route.pool.name().to_string());
        f.label = route.filter.as_ref().map(|v| v.name());
    });
}

/// The connected upstream joins the entry, and the lease carries the entry to its release.
pub fn attach(entry: Option<Arc<Entry>>, lease: &mut Lease) {
    let Some(entry) = entry else { return };
    let upstream = lease.grant().map(|g| g.upstream.as_str().to_string());
    let tap = lease.tap().cloned();
    let retries = lease.retries();
    entry.update(|f| {
        f.upstream = upstream;
        f.tap = tap;
        f.retries = retries;
    });
    lease.set_entry(entry);
}

/// The status the client got and, for a response the gateway made, its `X-Pool-Error` code.
pub fn answered(entry: Option<Arc<Entry>>, status: http::StatusCode, error: Option<&'static str>) {
    if let Some(entry) = entry {
        entry.update(|f| {
            f.status = Some(status.as_u16());
            f.error = error;
        });
    }
}

/// Which way a [`Metered`] body goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Out through the upstream (a request body).
    Up,
    /// Back from it (a response body).
    Down,
}

pin_project! {
    /// A body whose data bytes are counted on `tap` as they pass.
    pub struct Metered<B> {
        #[pin]
        inner: B,
        tap: Option<Arc<Tap>>,
        way: Way,
    }
}

impl<B> Metered<B> {
    pub fn new(inner: B, tap: Option<Arc<Tap>>, way: Way) -> Self {
        Metered { inner, tap, way }
    }
}

impl<B: Body<Data = Bytes>> Body for Metered<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(tap)) = (&polled, this.tap.as_ref()) {
            if let Some(data) = frame.data_ref() {
                let n = data.len() as u64;
                match this.way {
                    Way::Up => tap.up(n),
                    Way::Down => tap.down(n),
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_host_and_port_only() {
        let t = |s: &str| host_port(&s.parse().unwrap());
        assert_eq!(t("http://a.test/x?q=secret"), Some("a.test:80".into()));
        assert_eq!(
            t("http://user:pw@a.test:8080/x"),
            Some("a.test:8080".into())
        );
        assert_eq!(t("https://a.test/"), Some("a.test:443".into()));
        assert_eq!(t("a.test:443"), Some("a.test:443".into()));
        assert_eq!(t("http://[::1]:81/"), Some("[::1]:81".into()));
        assert_eq!(t("/origin-form"), None);
    }
}
