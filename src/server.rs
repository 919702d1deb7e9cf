//! Listeners: the accept loop and one hyper HTTP/1.1 connection per client.
//!
//! A connection permit is taken before `accept()`, so a flood waits in the kernel's backlog instead
//! of growing our memory; accept errors (out of file descriptors, mostly) back off and never end
//! the loop. Connection tasks live on the gateway's task tracker: shutdown asks each one to finish
//! its in-flight request and close, then waits for them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::proxy::Body;
use crate::state::Gateway;

const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Runs the accept loop until shutdown, serving each connection with `service`.
pub async fn serve<S, F>(
    gw: Arc<Gateway>,
    listener: TcpListener,
    max_connections: usize,
    service: S,
) where
    S: Fn(Arc<Gateway>, Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(max_connections));
    let mut backoff = ACCEPT_BACKOFF_START;
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = gw.shutdown.cancelled() => break,
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = gw.shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff = ACCEPT_BACKOFF_START;
                a
            }
            Err(e) => {
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = gw.shutdown.cancelled() => break,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let gw2 = gw.clone();
        let service = service.clone();
        gw.tasks.spawn(async move {
            serve_connection(gw2, stream, peer, service).await;
            drop(permit);
        });
    }
}

async fn serve_connection<S, F>(gw: Arc<Gateway>, stream: TcpStream, peer: SocketAddr, service: S)
where
    S: Fn(Arc<Gateway>, Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let server = &gw.config.server;
    let svc_gw = gw.clone();
    let svc = service_fn(move |req| {
        let fut = service(svc_gw.clone(), req, peer);
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .max_buf_size(server.max_header_bytes)
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = gw.shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(peer = %peer, error = %e, "client connection ended with an error");
    }
}
