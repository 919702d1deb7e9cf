//! Proxy worker threads: one single-threaded runtime per thread, all accepting on the proxy port
//! (and on the SOCKS5 port, when it is on).
//!
//! A client connection lives its whole life on the thread that accepted it, and so do the
//! upstream connections it opens and the idle ones it reuses ([`crate::per_thread::home`] picks the thread's own
//! idle lists in [`crate::upstream::reuse`]): a request and the upstream connection it travels on
//! wake each other on one thread, without the work-stealing scheduler's cross-thread wake-ups and
//! shared queues. Everything else (admin, probes, health ticks, the Redis client's connection)
//! stays on the main runtime.
//!
//! On Linux each thread listens on a socket of its own, all bound to the proxy address with
//! `SO_REUSEPORT`, and the kernel spreads new connections evenly over them (by their addresses).
//! On one shared socket, whichever thread wakes first takes a burst of connections, and a
//! client's long-lived connections can end up mostly on one thread while another idles.
//! Elsewhere the threads share one socket.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::per_thread::set_home;
use crate::state::Gateway;
use crate::{proxy, server};

/// Running worker threads. Dropped (at the end of shutdown, or with the gateway), they stop
/// accepting if they have not yet, and their runtimes end with whatever is still on them.
pub struct Workers {
    _exit: DropGuard,
}

/// Connections a listening socket queues before the gateway accepts them (as tokio's own bind).
const BACKLOG: i32 = 1024;

/// The proxy port's listening sockets, one for each of `threads` workers (at least one).
///
/// The address is first bound plainly, without `SO_REUSEPORT`: that bind fails, as a gateway's
/// always has, when anything else holds the port, another gateway's reuse-port group included,
/// instead of joining it and sharing its connections. It also settles port 0 to a real port.
/// Then, on Linux, every worker's socket is bound to that address with `SO_REUSEPORT`.
pub fn bind(addr: SocketAddr, threads: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let probe = socket(addr, false)?;
    if !cfg!(target_os = "linux") || threads <= 1 {
        probe.listen(BACKLOG)?;
        let listener = std::net::TcpListener::from(probe);
        return (0..threads.max(1)).map(|_| listener.try_clone()).collect();
    }
    let addr = probe
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("the proxy socket has no IP address"))?;
    drop(probe);
    (0..threads)
        .map(|_| {
            let s = socket(addr, true)?;
            s.listen(BACKLOG)?;
            Ok(s.into())
        })
        .collect()
}

/// A TCP socket bound to `addr`, non-blocking, with `SO_REUSEADDR` (as tokio's bind) and, when
/// `shared` (Linux only), `SO_REUSEPORT`.
fn socket(addr: SocketAddr, shared: bool) -> io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    #[cfg(unix)]
    s.set_reuse_address(true)?;
    #[cfg(target_os = "linux")]
    s.set_reuse_port(shared)?;
    #[cfg(not(target_os = "linux"))]
    let _ = shared;
    s.bind(&addr.into())?;
    Ok(s)
}

/// Starts one worker serving the proxy port of `gw` on each of `listeners` (from [`bind`]), and
/// the SOCKS5 port on each of `socks` (from [`bind`] too, one per worker; empty when the port is
/// off), once each has its sockets registered. The returned future ends once every worker has
/// stopped accepting (at shutdown).
pub async fn start(
    gw: &Arc<Gateway>,
    listeners: Vec<std::net::TcpListener>,
    socks: Vec<std::net::TcpListener>,
) -> io::Result<(Workers, impl Future<Output = ()> + Send + 'static)> {
    let threads = listeners.len();
    let mut socks = socks.into_iter();
    let exit = CancellationToken::new();
    // Made first: a worker that fails to start stops the ones started before it.
    let workers = Workers {
        _exit: exit.clone().drop_guard(),
    };
    let mut stopped = Vec::with_capacity(threads);
    for (index, listener) in (1..=threads).zip(listeners) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (ready, registered) = tokio::sync::oneshot::channel::<io::Result<()>>();
        let (done, accepting_ended) = tokio::sync::oneshot::channel::<()>();
        let gw = gw.clone();
        let exit = exit.clone();
        let socks = socks.next();
        std::thread::Builder::new()
            .name(format!("poolgate-proxy-{index}"))
            .spawn(move || {
                set_home(index);
                runtime.block_on(async move {
                    let registered = TcpListener::from_std(listener).and_then(|l| {
                        let socks = socks.map(TcpListener::from_std).transpose()?;
                        Ok((l, socks))
                    });
                    let (listener, socks) = match registered {
                        Ok(ls) => {
                            let _ = ready.send(Ok(()));
                            ls
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let serve_socks = {
                        let gw = gw.clone();
                        async move {
                            if let Some(l) = socks {
                                server::serve_streams(gw, l, proxy::socks::handle).await;
                            }
                        }
                    };
                    let serve = server::serve(gw, listener, server::Listener::Proxy, proxy::handle);
                    tokio::select! {
                        _ = async { tokio::join!(serve, serve_socks) } => {}
                        _ = exit.cancelled() => {}
                    }
                    let _ = done.send(());
                    // The connections, tunnels and lease releases this thread started run on its
                    // runtime: it lives on until the gateway is done with them.
                    exit.cancelled().await;
                });
            })?;
        registered
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the worker thread ended at start")))?;
        stopped.push(accepting_ended);
    }
    let all_stopped = async move {
        for s in stopped {
            let _ = s.await;
        }
    };
    Ok((workers, all_stopped))
}
