//! `direct://`: straight to the target from this machine, no proxy in between.

use std::net::SocketAddr;

use super::error::target_dns;
use super::tcp::connect_any;
use super::{BoxIo, ConnectError, Connector};
use crate::target::Target;
use crate::upstream::Upstream;

/// On the addresses the target policy allows, from `upstream.bind` when set, trying each address
/// in turn.
pub(super) async fn tunnel(
    connector: &Connector,
    upstream: &Upstream,
    target: &Target,
) -> Result<BoxIo, ConnectError> {
    let addrs = connector.guarded_addrs(target).await?;
    let addrs: Vec<SocketAddr> = match upstream.bind {
        // A socket bound to one family cannot reach the other.
        Some(bind) => addrs
            .into_iter()
            .filter(|a| a.is_ipv4() == bind.is_ipv4())
            .collect(),
        None => addrs,
    };
    if addrs.is_empty() {
        return Err(target_dns(
            target,
            "no address of the bind address's family",
        ));
    }
    let tcp = connect_any(&addrs, upstream.bind, &target.authority()).await?;
    Ok(Box::new(tcp))
}

#[cfg(test)]
mod tests;
