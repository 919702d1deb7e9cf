//! Proxy worker threads: one single-threaded runtime per thread, all accepting on the proxy port.
//!
//! A client connection lives its whole life on the thread that accepted it, and so do the
//! upstream connections it opens and the idle ones it reuses ([`home`] picks the thread's own
//! idle lists in [`crate::upstream::reuse`]): a request and the upstream connection it travels on
//! wake each other on one thread, without the work-stealing scheduler's cross-thread wake-ups and
//! shared queues. Everything else (admin, probes, health ticks, the Redis client's connection)
//! stays on the main runtime.
//!
//! The threads share one listening socket: each registers its own handle with its own runtime,
//! and whichever is free takes the next connection.

use std::cell::Cell;
use std::io;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::state::Gateway;
use crate::{proxy, server};

thread_local! {
    static HOME: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker thread this runs on, from 1; 0 on any other thread (the main runtime,
/// or every thread when the gateway serves on its caller's runtime).
pub fn home() -> usize {
    HOME.get()
}

/// Makes this thread worker thread `index` (from 1) for [`home`].
pub(crate) fn set_home(index: usize) {
    HOME.set(index);
}

/// One `T` for each worker thread and one for every other thread, each on cache lines of its
/// own: state that every request writes stays on the core of the thread that writes it, instead
/// of its lines passing between cores on every request.
pub struct PerThread<T>(Box<[CachePadded<T>]>);

impl<T> PerThread<T> {
    /// Room for `threads` worker threads (a thread whose [`home`] is past them uses the last).
    pub fn new(threads: usize, mut make: impl FnMut() -> T) -> Self {
        PerThread((0..=threads).map(|_| CachePadded::new(make())).collect())
    }

    /// The index of this thread's `T`.
    pub fn index_here(&self) -> usize {
        home().min(self.0.len() - 1)
    }

    /// This thread's `T`.
    pub fn here(&self) -> &T {
        &self.0[self.index_here()]
    }

    /// The `T` at `index` (from [`PerThread::index_here`]).
    pub fn get(&self, index: usize) -> &T {
        &self.0[index.min(self.0.len() - 1)]
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|t| &**t)
    }
}

/// Running worker threads. Dropped (at the end of shutdown, or with the gateway), they stop
/// accepting if they have not yet, and their runtimes end with whatever is still on them.
pub struct Workers {
    _exit: DropGuard,
}

/// Starts `threads` workers serving the proxy port of `gw` on `listener`, once each has its
/// handle of the socket registered. The returned future ends once every worker has stopped
/// accepting (at shutdown).
pub async fn start(
    gw: &Arc<Gateway>,
    listener: TcpListener,
    threads: usize,
) -> io::Result<(Workers, impl Future<Output = ()> + Send + 'static)> {
    let listener = listener.into_std()?;
    let exit = CancellationToken::new();
    // Made first: a worker that fails to start stops the ones started before it.
    let workers = Workers {
        _exit: exit.clone().drop_guard(),
    };
    let mut stopped = Vec::with_capacity(threads);
    for index in 1..=threads {
        let listener = listener.try_clone()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (ready, registered) = tokio::sync::oneshot::channel::<io::Result<()>>();
        let (done, accepting_ended) = tokio::sync::oneshot::channel::<()>();
        let gw = gw.clone();
        let exit = exit.clone();
        std::thread::Builder::new()
            .name(format!("poolgate-proxy-{index}"))
            .spawn(move || {
                set_home(index);
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(l) => {
                            let _ = ready.send(Ok(()));
                            l
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let serve = server::serve(gw, listener, server::Listener::Proxy, proxy::handle);
                    tokio::select! {
                        _ = serve => {}
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
