//! The traffic part of `/status`: request, tunnel and connection counts and the reload history,
//! read from the gateway's counters at the time of the call.

use serde::Serialize;

use std::collections::BTreeMap;

use crate::accounting::{DoorCounts, RequestCounts};
use crate::state::{Gateway, ReloadLog};

/// The traffic part of `/status`.
#[derive(Debug, Serialize)]
pub struct TrafficView {
    pub requests: RequestCounts,
    pub tunnels: TunnelCounts,
    pub connections: ConnectionCounts,
    pub config: ReloadLog,
    pub socks5: Socks5Counts,
}

#[derive(Debug, Serialize)]
pub struct TunnelCounts {
    pub open: u64,
    pub total: u64,
    /// `total` by front door.
    pub by_door: DoorCounts,
    /// `open` by front door.
    pub open_by_door: DoorCounts,
}

/// What the SOCKS5 front door answered.
#[derive(Debug, Serialize)]
pub struct Socks5Counts {
    /// Replies to requests since start, by code name (`succeeded`, `not_allowed`, ...).
    pub replies: BTreeMap<&'static str, u64>,
    /// Handshakes that ended before a request was read: malformed, no acceptable method, a
    /// refused login, or too slow.
    pub handshakes_failed: u64,
}

#[derive(Debug, Serialize)]
pub struct ConnectionCounts {
    /// Client connections open on the proxy port.
    pub open: u64,
    /// Connections refused by `max_connections` / `max_connections_per_client` since start.
    pub refused: u64,
}

impl TrafficView {
    pub async fn collect(gw: &Gateway) -> Self {
        TrafficView {
            requests: gw.counters.requests(),
            tunnels: TunnelCounts {
                open: gw.counters.tunnels_open(),
                total: gw.counters.tunnels_total(),
                by_door: gw.counters.tunnels_by_door(),
                open_by_door: gw.counters.tunnels_open_by_door(),
            },
            connections: ConnectionCounts {
                open: gw.client_conns.open() as u64,
                refused: gw.client_conns.refused(),
            },
            config: gw.reloads.lock().await.clone(),
            socks5: Socks5Counts {
                replies: gw
                    .counters
                    .socks5_replies()
                    .into_iter()
                    .map(|(r, n)| (r.as_str(), n))
                    .collect(),
                handshakes_failed: gw.counters.socks5_handshakes_failed(),
            },
        }
    }
}
