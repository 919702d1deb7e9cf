//! Request accounting: every request the proxy accepts ends exactly once, as completed, rejected
//! or failed, so that `accepted = completed + rejected + failed + in_flight` holds in every
//! `/status` snapshot. The figures are kept per thread ([`PerThread`]), each part changing under
//! its own lock, and a snapshot holds every part's lock at once.
//!
//! - accepted: hyper parsed a request head and handed it to the proxy service;
//! - rejected: the gateway refused it with a 4xx of its own (auth, policy, malformed, too large);
//! - failed: the gateway answered 5xx, or the response broke off (upstream or client went away);
//! - completed: a response (the upstream's, or the CONNECT 200) was delivered to its end.
//!
//! Requests hyper itself refuses before the service (unparseable heads, oversized heads, header
//! timeouts) never become accepted; connection refusals are counted apart.
//!
//! Each request and tunnel is also counted by the front door it came in by ([`Door`]): a SOCKS5
//! connection is one request (accepted once its request is read), completed when its success
//! reply is sent. SOCKS5 replies are counted by code, and handshakes that never got to a request
//! (malformed, refused logins, too slow) apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::limits::EndGuard;
use crate::per_thread::PerThread;
use crate::socks5::Reply;

/// The front door a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// The HTTP proxy port (`server.listen`).
    Http,
    /// The SOCKS5 port (`server.socks_listen`).
    Socks5,
}

impl Door {
    pub const ALL: [Door; 2] = [Door::Http, Door::Socks5];

    /// Stable name for logs, `/status` and the `door` label of `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Http => "http",
            Door::Socks5 => "socks5",
        }
    }

    fn index(self) -> usize {
        match self {
            Door::Http => 0,
            Door::Socks5 => 1,
        }
    }
}

/// A count per front door.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct DoorCounts {
    pub http: u64,
    pub socks5: u64,
}

impl DoorCounts {
    pub fn get(&self, door: Door) -> u64 {
        match door {
            Door::Http => self.http,
            Door::Socks5 => self.socks5,
        }
    }

    fn slot(&mut self, door: Door) -> &mut u64 {
        match door {
            Door::Http => &mut self.http,
            Door::Socks5 => &mut self.socks5,
        }
    }

    fn load(counts: &[AtomicU64; 2]) -> Self {
        DoorCounts {
            http: counts[Door::Http.index()].load(Ordering::SeqCst),
            socks5: counts[Door::Socks5.index()].load(Ordering::SeqCst),
        }
    }
}

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
    /// `accepted` by front door.
    pub by_door: DoorCounts,
}

/// The gateway's traffic counters.
pub struct Counters {
    requests: PerThread<Mutex<RequestCounts>>,
    tunnels_open: AtomicU64,
    tunnels_total: AtomicU64,
    tunnels_open_by_door: [AtomicU64; 2],
    tunnels_by_door: [AtomicU64; 2],
    /// SOCKS5 replies sent to requests, by code (indexed by the code).
    socks5_replies: [AtomicU64; 9],
    /// SOCKS5 handshakes that ended before a request was read.
    socks5_handshakes_failed: AtomicU64,
}

impl Counters {
    /// Counters for `threads` proxy worker threads (see [`crate::workers`]) and the rest.
    pub fn new(threads: usize) -> Arc<Self> {
        Arc::new(Counters {
            requests: PerThread::new(threads, Default::default),
            tunnels_open: AtomicU64::new(0),
            tunnels_total: AtomicU64::new(0),
            tunnels_open_by_door: Default::default(),
            tunnels_by_door: Default::default(),
            socks5_replies: Default::default(),
            socks5_handshakes_failed: AtomicU64::new(0),
        })
    }

    fn lock(&self, part: usize) -> std::sync::MutexGuard<'_, RequestCounts> {
        self.requests
            .get(part)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request that came in by `door` as accepted; the ticket settles it.
    pub fn accept(self: &Arc<Self>, door: Door) -> Ticket {
        let part = self.requests.index_here();
        let mut c = self.lock(part);
        c.accepted += 1;
        c.in_flight += 1;
        *c.by_door.slot(door) += 1;
        Ticket {
            counters: Some(self.clone()),
            part,
        }
    }

    /// Settles in the part the request was accepted in, wherever it ends.
    fn settle(&self, part: usize, end: End) {
        let mut c = self.lock(part);
        c.in_flight = c.in_flight.saturating_sub(1);
        match end {
            End::Completed => c.completed += 1,
            End::Rejected => c.rejected += 1,
            End::Failed => c.failed += 1,
        }
    }

    /// Counts a request head sent to an upstream.
    pub fn forwarded(&self) {
        self.lock(self.requests.index_here()).forwarded += 1;
    }

    /// The sum over every thread's part, all locked at once (always in the same order).
    pub fn requests(&self) -> RequestCounts {
        let parts: Vec<_> = self
            .requests
            .iter()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let mut sum = RequestCounts::default();
        for c in &parts {
            sum.accepted += c.accepted;
            sum.completed += c.completed;
            sum.rejected += c.rejected;
            sum.failed += c.failed;
            sum.in_flight += c.in_flight;
            sum.forwarded += c.forwarded;
            for door in Door::ALL {
                *sum.by_door.slot(door) += c.by_door.get(door);
            }
        }
        sum
    }

    /// Counts a tunnel of a client that came in by `door` as open until the guard is dropped.
    pub fn tunnel(self: &Arc<Self>, door: Door) -> TunnelGuard {
        self.tunnels_open.fetch_add(1, Ordering::SeqCst);
        self.tunnels_total.fetch_add(1, Ordering::Relaxed);
        self.tunnels_open_by_door[door.index()].fetch_add(1, Ordering::SeqCst);
        self.tunnels_by_door[door.index()].fetch_add(1, Ordering::SeqCst);
        TunnelGuard(self.clone(), door)
    }

    /// Tunnels since start, by front door.
    pub fn tunnels_by_door(&self) -> DoorCounts {
        DoorCounts::load(&self.tunnels_by_door)
    }

    /// Tunnels open now, by front door.
    pub fn tunnels_open_by_door(&self) -> DoorCounts {
        DoorCounts::load(&self.tunnels_open_by_door)
    }

    /// Counts a SOCKS5 reply sent to a request.
    pub fn socks5_reply(&self, reply: Reply) {
        self.socks5_replies[usize::from(reply.code())].fetch_add(1, Ordering::Relaxed);
    }

    /// SOCKS5 replies since start, by code.
    pub fn socks5_replies(&self) -> Vec<(Reply, u64)> {
        Reply::ALL
            .iter()
            .map(|r| {
                let n = self.socks5_replies[usize::from(r.code())].load(Ordering::Relaxed);
                (*r, n)
            })
            .collect()
    }

    /// Counts a SOCKS5 handshake that ended before its request was read.
    pub fn socks5_handshake_failed(&self) {
        self.socks5_handshakes_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn socks5_handshakes_failed(&self) -> u64 {
        self.socks5_handshakes_failed.load(Ordering::Relaxed)
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
    /// The part of the counters it was accepted in.
    part: usize,
}

impl Ticket {
    pub fn finish(mut self, end: End) {
        if let Some(c) = self.counters.take() {
            c.settle(self.part, end);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(c) = self.counters.take() {
            c.settle(self.part, End::Failed);
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

pub struct TunnelGuard(Arc<Counters>, Door);

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.0.tunnels_open.fetch_sub(1, Ordering::SeqCst);
        self.0.tunnels_open_by_door[self.1.index()].fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_from_worker_threads_sum_up_even_when_settled_on_another_thread() {
        let c = Counters::new(2);
        let on = |home: usize, c: Arc<Counters>| {
            std::thread::spawn(move || {
                crate::per_thread::set_home(home);
                let kept = c.accept(Door::Http);
                c.accept(Door::Http).finish(End::Completed);
                c.forwarded();
                kept
            })
            .join()
            .unwrap()
        };
        let a = on(1, c.clone());
        let b = on(2, c.clone());
        let r = c.requests();
        assert_eq!(
            (r.accepted, r.completed, r.in_flight, r.forwarded),
            (4, 2, 2, 2)
        );
        // Settled here (home 0), each counts where it was accepted: nothing is clamped at zero.
        a.finish(End::Rejected);
        drop(b);
        let r = c.requests();
        assert_eq!(
            r,
            RequestCounts {
                accepted: 4,
                completed: 2,
                rejected: 1,
                failed: 1,
                in_flight: 0,
                forwarded: 2,
                by_door: DoorCounts { http: 4, socks5: 0 },
            }
        );
    }

    #[test]
    fn every_ticket_ends_once_and_the_sum_holds() {
        let c = Counters::new(0);
        let a = c.accept(Door::Http);
        let b = c.accept(Door::Socks5);
        let d = c.accept(Door::Http);
        let e = c.accept(Door::Socks5);
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
                by_door: DoorCounts { http: 2, socks5: 2 },
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
