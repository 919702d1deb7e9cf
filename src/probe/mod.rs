//! Active probes: requests to control targets through upstreams that passive health cannot judge
//! (quarantined ones whose cool-down ended, dead ones, idle ones, and candidates of an upstream
//! list before admission).

pub mod check;
pub mod prober;
pub mod status;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use check::{ExitIpFault, ProbeFault, check};

use crate::config::ProbeConfig;
use crate::upstream::Upstream;
use crate::upstream::connect::Connector;

/// How a probe is carried out; the gateway's runs [`crate::probe::probe`], tests substitute their
/// own to drive the scheduler on a paused clock.
pub trait Runner: Send + Sync + 'static {
    /// Probes `upstream`: the latency when it passed, why not otherwise (credential-free).
    fn probe(
        &self,
        upstream: Arc<Upstream>,
        cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<Duration, String>> + Send>>;

    /// Asks the pool's `exit_ip_url` through `upstream` which address its traffic leaves from.
    /// Runners that do not measure exit IPs keep this default.
    fn exit_ip(
        &self,
        upstream: Arc<Upstream>,
        cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<IpAddr, ExitIpFault>> + Send>> {
        let _ = (upstream, cfg);
        Box::pin(async { Err(ExitIpFault::Unmeasured) })
    }
}

/// Probes through the gateway's connector, as client traffic goes.
pub struct LiveRunner {
    pub connector: Connector,
}

impl Runner for LiveRunner {
    fn probe(
        &self,
        upstream: Arc<Upstream>,
        cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<Duration, String>> + Send>> {
        let connector = self.connector.clone();
        Box::pin(async move {
            probe(&connector, &upstream, &cfg)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn exit_ip(
        &self,
        upstream: Arc<Upstream>,
        cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<IpAddr, ExitIpFault>> + Send>> {
        let connector = self.connector.clone();
        Box::pin(async move {
            match &cfg.exit_ip {
                Some(target) => check::exit_ip(&connector, &upstream, target, cfg.timeout).await,
                None => Err(ExitIpFault::Unmeasured),
            }
        })
    }
}

/// Probes `upstream` against the pool's control targets, starting at a random one so that
/// probes spread over them; passes at the first that answers as expected. On failure, the fault
/// of the last target tried (every one failed).
pub async fn probe(
    connector: &Connector,
    upstream: &Upstream,
    cfg: &ProbeConfig,
) -> Result<Duration, ProbeFault> {
    let n = cfg.targets.len();
    let start = if n > 1 {
        rand::random::<u32>() as usize % n
    } else {
        0
    };
    let mut last = None;
    for i in 0..n {
        let target = &cfg.targets[(start + i) % n];
        match check(connector, upstream, target, cfg.timeout, cfg.max_latency).await {
            Ok(took) => return Ok(took),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(ProbeFault::Timeout(Duration::ZERO)))
}
