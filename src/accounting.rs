//! Request accounting: every request the proxy accepts ends exactly once, as completed, rejected
//! or failed, so that `accepted = completed + rejected + failed + in_flight` holds in every
//! `/status` snapshot (the figures change under one lock).
//!
//! - accepted: hyper parsed a request head and handed it to the proxy service;
//! - rejected: the gateway refused it with a 4xx of its own (auth, policy, malformed, too large);
//! - failed: the gateway answered 5xx, or the response broke off (upstream or client went away);
//! - completed: a response (the upstream's, or the CONNECT 200) was delivered to its end.
//!
//! Requests hyper itself refuses before the service (unparseable heads, oversized heads, header
//! timeouts) never become accepted; connection refusals are counted apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::limits::EndGuard;

/// How an accepted request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Completed,
    Rejected,
    Failed,
}

#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct RequestCounts {
    pub accepted: u64,
    pub completed: u64,
    pub rejected: u64,
    pub failed: u64,
    pub in_flight: u64,
    /// Plain requests whose head was sent to an upstream (not part of the sum above): an
    /// upstream never parses more requests than this.
    pub forwarded: u64,
}

/// The gateway's traffic counters.
#[derive(Default)]
pub struct Counters {
    requests: Mutex<RequestCounts>,
    tunnels_open: AtomicU64,
    tunnels_total: AtomicU64,
}

impl Counters {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RequestCounts> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request as accepted; the ticket settles it.
    pub fn accept(self: &Arc<Self>) -> Ticket {
        let mut c = self.lock();
        c.accepted += 1;
        c.in_flight += 1;
        Ticket {
            counters: Some(self.clone()),
        }
    }

    fn settle(&self, end: End) {
        let mut c = self.lock();
        c.in_flight = c.in_flight.saturating_sub(1);
        match end {
            End::Completed => c.completed += 1,
            End::Rejected => c.rejected += 1,
            End::Failed => c.failed += 1,
        }
    }

    /// Counts a request head sent to an upstream.
    pub fn forwarded(&self) {
        self.lock().forwarded += 1;
    }

    pub fn requests(&self) -> RequestCounts {
        *self.lock()
    }

    /// Counts a tunnel as open until the guard is dropped.
    pub fn tunnel(self: &Arc<Self>) -> TunnelGuard {
        self.tunnels_open.fetch_add(1, Ordering::SeqCst);
        self.tunnels_total.fetch_add(1, Ordering::Relaxed);
        TunnelGuard(self.clone())
    }

    pub fn tunnels_open(&self) -> u64 {
        self.tunnels_open.load(Ordering::SeqCst)
    }

    pub fn tunnels_total(&self) -> u64 {
        self.tunnels_total.load(Ordering::Relaxed)
    }
}

/// One accepted request, until it is settled. Dropped unsettled (the client went away before the
/// response was through), it counts as failed.
pub struct Ticket {
    counters: Option<Arc<Counters>>,
}

impl Ticket {
    pub fn finish(mut self, end: End) {
        if let Some(c) = self.counters.take() {
            c.settle(end);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(c) = self.counters.take() {
            c.settle(End::Failed);
        }
    }
}

/// A response body that settles its ticket when it ends: completed when it ran to its end,
/// failed when it broke off.
impl EndGuard for Ticket {
    fn end(self, ok: bool) {
        self.finish(if ok { End::Completed } else { End::Failed });
    }
}

/// The traffic part of `/status`.
#[derive(Debug, Serialize)]
pub struct TrafficView {
    pub requests: RequestCounts,
    pub tunnels: TunnelCounts,
    pub connections: ConnectionCounts,
    pub config: crate::reload::ReloadLog,
}

#[derive(Debug, Serialize)]
pub struct TunnelCounts {
    pub open: u64,
    pub total: u64,
}

#[derive(Debug, Serialize)]
pub struct ConnectionCounts {
    /// Client connections open on the proxy port.
    pub open: u64,
    /// Connections refused by `max_connections` / `max_connections_per_client` since start.
    pub refused: u64,
}

impl TrafficView {
    pub async fn collect(gw: &crate::state::Gateway) -> Self {
        TrafficView {
            requests: gw.counters.requests(),
            tunnels: TunnelCounts {
                open: gw.counters.tunnels_open(),
                total: gw.counters.tunnels_total(),
            },
            connections: ConnectionCounts {
                open: gw.client_conns.open() as u64,
                refused: gw.client_conns.refused(),
            },
            config: gw.reloads.lock().await.clone(),
        }
    }
}

pub struct TunnelGuard(Arc<Counters>);

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.0.tunnels_open.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ticket_ends_once_and_the_sum_holds() {
        let c = Counters::new();
        let a = c.accept();
        let b = c.accept();
        let d = c.accept();
        let e = c.accept();
        a.finish(End::Completed);
        b.finish(End::Rejected);
        drop(d);
        let r = c.requests();
        assert_eq!(
            r,
            RequestCounts {
                accepted: 4,
                completed: 1,
                rejected: 1,
                failed: 1,
                in_flight: 1,
                forwarded: 0,
            }
        );
        e.end(true);
        let r = c.requests();
        assert_eq!(
            r.accepted,
            r.completed + r.rejected + r.failed + r.in_flight
        );
        assert_eq!(r.in_flight, 0);
    }
}
