//! Keep-alive connections to upstreams, reused across requests.
//!
//! A connection is keyed by upstream and, for upstreams that are not HTTP proxies (SOCKS, direct),
//! by target too, since such a connection is a tunnel to one origin. A sender goes back to the
//! idle list only once hyper says it is ready for another request, that is after the previous
//! response was read to its end.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::target::Target;
use crate::upstream::UpstreamId;

/// Body of a request sent upstream: the client's (through its size limit), or empty when a
/// request is replayed.
pub type OutBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub upstream: UpstreamId,
    /// `None` for an HTTP proxy upstream, whose connection carries requests for any target.
    pub target: Option<Target>,
}

pub struct ConnPool {
    idle: Mutex<HashMap<ConnKey, Vec<Idle>>>,
    max_idle_per_key: usize,
    idle_timeout: Duration,
}

struct Idle {
    sender: SendRequest<OutBody>,
    since: Instant,
}

impl ConnPool {
    pub fn new(max_idle_per_key: usize, idle_timeout: Duration) -> Self {
        ConnPool {
            idle: Mutex::new(HashMap::new()),
            max_idle_per_key,
            idle_timeout,
        }
    }

    /// An idle connection for `key` that is still open, newest first.
    pub fn take(&self, key: &ConnKey) -> Option<SendRequest<OutBody>> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Returns `sender` to the idle list once it can take another request; dropped instead when
    /// the connection closes first or the list is full.
    pub fn recycle(self: &std::sync::Arc<Self>, key: ConnKey, mut sender: SendRequest<OutBody>) {
        let pool = self.clone();
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let now = Instant::now();
            let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            let list = idle.entry(key).or_default();
            list.retain(|c| {
                now.duration_since(c.since) < pool.idle_timeout && !c.sender.is_closed()
            });
            if list.len() < pool.max_idle_per_key {
                list.push(Idle { sender, since: now });
            }
        });
    }

    /// Closes connections idle for longer than the timeout; run periodically.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|_, list| {
            list.retain(|c| {
                now.duration_since(c.since) < self.idle_timeout && !c.sender.is_closed()
            });
            !list.is_empty()
        });
    }

    /// Drops every idle connection (shutdown).
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
