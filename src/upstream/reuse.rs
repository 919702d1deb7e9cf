//! Keep-alive connections to upstreams, reused across requests.
//!
//! A connection is keyed by upstream and, for upstreams that are not HTTP proxies (SOCKS, direct),
//! by target too, since such a connection is a tunnel to one origin. A sender goes back to the
//! idle list when its response has been read to its end ([`Giveback`], the end guard of that
//! body) and hyper says it is ready for another request; that is nearly always so at once, and a
//! task waits for it otherwise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::limits::EndGuard;
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

    /// The guard that gives `sender` back once the response it carries has been read to its end
    /// (see [`crate::limits::Guarded`]); dropped unfinished, the connection is not reused.
    pub fn giveback(self: &Arc<Self>, key: ConnKey, sender: SendRequest<OutBody>) -> Giveback {
        Giveback {
            pool: self.clone(),
            key,
            sender,
        }
    }

    /// Puts `sender` on the idle list: dropped instead when the list is full.
    fn put(&self, key: ConnKey, sender: SendRequest<OutBody>) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        list.retain(|c| now.duration_since(c.since) < self.idle_timeout && !c.sender.is_closed());
        if list.len() < self.max_idle_per_key {
            list.push(Idle { sender, since: now });
        }
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
