//! Keep-alive connections to upstreams, reused across requests.
//!
//! A connection is keyed by upstream and, for upstreams that are not HTTP proxies (SOCKS, direct),
//! by target too, since such a connection is a tunnel to one origin. A sender goes back to the
//! idle list when its response has been read to its end ([`Giveback`], the end guard of that
//! body) and hyper says it is ready for another request; that is nearly always so at once, and a
//! task waits for it otherwise.
//!
//! Each proxy worker thread has idle lists of its own ([`crate::per_thread::home`]): a connection's
//! task runs on the thread that opened it, so a request sent on it from another thread would wake
//! that thread twice for every exchange.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::fast_map::FastMap;
use crate::limits::EndGuard;
use crate::per_thread::PerThread;
use crate::target::Target;
use crate::upstream::UpstreamId;

use crate::body::OutBody;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub upstream: UpstreamId,
    /// `None` for an HTTP proxy upstream, whose connection carries requests for any target.
    pub target: Option<Target>,
    /// A provider upstream's filled username: a connection made with one session's credentials
    /// is never reused for another's.
    pub login: Option<String>,
}

pub struct ConnPool {
    /// By home thread (see the module doc).
    homes: PerThread<Mutex<IdleLists>>,
    max_idle_per_key: usize,
    idle_timeout: Duration,
}

struct Idle {
    sender: SendRequest<OutBody>,
    since: Instant,
}

/// Idle connections by key, in two maps: one per kind of key, since only one kind holds what
/// clients chose.
#[derive(Default)]
struct IdleLists {
    /// Connections to HTTP proxy upstreams, keyed by the gateway's own upstream ids: the fast
    /// hasher (see [`crate::fast_map`]); these are looked up twice per forwarded request.
    proxies: FastMap<UpstreamId, Vec<Idle>>,
    /// Tunnels to one target (SOCKS, direct): the target is the client's, so the standard hasher.
    tunnels: HashMap<ConnKey, Vec<Idle>>,
}

impl IdleLists {
    fn get_mut(&mut self, key: &ConnKey) -> Option<&mut Vec<Idle>> {
        match key.target {
            None => self.proxies.get_mut(&key.upstream),
            Some(_) => self.tunnels.get_mut(key),
        }
    }

    fn entry(&mut self, key: ConnKey) -> &mut Vec<Idle> {
        match key.target {
            None => self.proxies.entry(key.upstream).or_default(),
            Some(_) => self.tunnels.entry(key).or_default(),
        }
    }

    fn remove(&mut self, key: &ConnKey) {
        match key.target {
            None => self.proxies.remove(&key.upstream),
            Some(_) => self.tunnels.remove(key),
        };
    }

    /// Keeps the connections `keep` says yes to; drops the lists left empty.
    fn retain(&mut self, mut keep: impl FnMut(&Idle) -> bool) {
        let mut each = |list: &mut Vec<Idle>| {
            list.retain(&mut keep);
            !list.is_empty()
        };
        self.proxies.retain(|_, list| each(list));
        self.tunnels.retain(|_, list| each(list));
    }

    fn clear(&mut self) {
        self.proxies.clear();
        self.tunnels.clear();
    }
}

impl ConnPool {
    /// A pool with idle lists for `threads` worker threads and one for every other thread.
    pub fn new(threads: usize, max_idle_per_key: usize, idle_timeout: Duration) -> Self {
        ConnPool {
            homes: PerThread::new(threads, Default::default),
            max_idle_per_key,
            idle_timeout,
        }
    }

    /// This thread's idle lists, locked.
    fn here(&self) -> std::sync::MutexGuard<'_, IdleLists> {
        self.homes.here().lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection for `key` that is still open, newest first.
    pub fn take(&self, key: &ConnKey) -> Option<SendRequest<OutBody>> {
        let now = Instant::now();
        let mut idle = self.here();
        let list = idle.get_mut(key)?;
        let mut found = None;
        while let Some(c) = list.pop() {
            if now.duration_since(c.since) < self.idle_timeout && c.sender.is_ready() {
                found = Some(c.sender);
                break;
            }
        }
        if list.is_empty() {
            idle.remove(key);
        }
        found
    }

    /// The guard that gives `sender` back once the response it carries has been read to its end
    /// (see [`crate::limits::Guarded`]); dropped unfinished, the connection is not reused.
    pub fn giveback(self: &Arc<Self>, key: ConnKey, sender: SendRequest<OutBody>) -> Giveback {
        Giveback {
            pool: self.clone(),
            key,
            sender,
        }
    }

    /// Puts `sender` on the idle list: dropped instead when the list is full of live ones.
    fn put(&self, key: ConnKey, sender: SendRequest<OutBody>) {
        let now = Instant::now();
        let mut idle = self.here();
        let list = idle.entry(key);
        // Stale and closed connections make room only when room is short: the sweep and `take`
        // skip them otherwise, and checking the whole list on every request cost more than that.
        if list.len() >= self.max_idle_per_key {
            list.retain(|c| self.keeps(c, now));
        }
        if list.len() < self.max_idle_per_key {
            list.push(Idle { sender, since: now });
        }
    }

    /// Closes connections idle for longer than the timeout; run periodically.
    pub fn sweep(&self) {
        let now = Instant::now();
        for home in self.homes.iter() {
            home.lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|c| self.keeps(c, now));
        }
    }

    /// Whether an idle connection is still worth keeping: open, and idle for less than the timeout.
    fn keeps(&self, c: &Idle, now: Instant) -> bool {
        now.duration_since(c.since) < self.idle_timeout && !c.sender.is_closed()
    }

    /// Drops every idle connection (shutdown).
    pub fn clear(&self) {
        for home in self.homes.iter() {
            home.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

/// Gives an upstream connection back to its pool when the response body it carries ends well.
pub struct Giveback {
    pool: Arc<ConnPool>,
    key: ConnKey,
    sender: SendRequest<OutBody>,
}

impl EndGuard for Giveback {
    fn end(self, ok: bool) {
        let Giveback {
            pool,
            key,
            mut sender,
        } = self;
        if !ok || sender.is_closed() {
            return;
        }
        if sender.is_ready() {
            pool.put(key, sender);
            return;
        }
        // The connection's task has not yet taken in the end of the response: it will shortly.
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    pool.put(key, sender);
                }
            });
        }
    }
}
