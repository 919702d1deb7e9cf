//! The traffic part of `/status`: request, tunnel and connection counts and the reload history,
//! read from the gateway's counters at the time of the call.

use serde::Serialize;

use crate::accounting::RequestCounts;
use crate::state::{Gateway, ReloadLog};

/// The traffic part of `/status`.
#[derive(Debug, Serialize)]
pub struct TrafficView {
    pub requests: RequestCounts,
    pub tunnels: TunnelCounts,
    pub connections: ConnectionCounts,
    pub config: ReloadLog,
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
    pub async fn collect(gw: &Gateway) -> Self {
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
