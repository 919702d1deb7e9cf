//! Session bindings read, ended and undone outside an acquire (binding is `acquire.rs`'s).

use std::sync::Arc;

use super::conn::Deferred;
use super::scripts::{self, Call};
use super::{Fault, Inner, PoolLocal, broken};
use crate::store::{Store, StoreError};
use crate::upstream::UpstreamId;

impl Inner {
    pub(super) async fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> Result<Option<UpstreamId>, StoreError> {
        let p = self.pool(pool)?;
        if self.is_degraded() {
            return self.fallback.session_upstream(pool, key).await;
        }
        match self.session_upstream_remote(&p, key).await {
            Ok(v) => Ok(v),
            Err(Fault::Down(why) | Fault::Broken(why)) => Err(StoreError::Unavailable(why)),
        }
    }

    pub(super) async fn end_session(&self, pool: &str, key: &str) -> Result<bool, StoreError> {
        let p = self.pool(pool)?;
        let local = self.fallback.end_session(pool, key).await?;
        match self.end_session_remote(&p, key).await {
            Ok(remote) => Ok(remote || local),
            // An operator's action is not deferred: say the store is unavailable.
            Err(Fault::Down(why) | Fault::Broken(why)) => Err(StoreError::Unavailable(why)),
        }
    }

    pub(super) async fn unbind(
        self: &Arc<Self>,
        pool: &str,
        key: &str,
        upstream: &UpstreamId,
    ) -> Result<(), StoreError> {
        let p = self.pool(pool)?;
        self.fallback.unbind(pool, key, upstream).await?;
        let deferred = || Deferred::Unbind {
            pool: pool.to_string(),
            key: key.to_string(),
            upstream: upstream.clone(),
        };
        if self.defer_if_degraded(deferred) {
            return Ok(());
        }
        match self.unbind_remote(&p, key, upstream).await {
            Ok(()) => Ok(()),
            Err(Fault::Down(why)) => {
                self.defer_and_degrade(deferred(), &why);
                Ok(())
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }

    /// A session's upstream, read without refreshing it (one GET, no script needed).
    async fn session_upstream_remote(
        &self,
        p: &PoolLocal,
        key: &str,
    ) -> Result<Option<UpstreamId>, Fault> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(p.keys.session(key));
        let v: Option<String> = self.query(&cmd).await?;
        Ok(v.map(UpstreamId::new))
    }

    async fn end_session_remote(&self, p: &PoolLocal, key: &str) -> Result<bool, Fault> {
        let k = &p.keys;
        let mut inv = Call::new(&scripts::END_SESSION, 2);
        inv.key(&k.session(key)).key(&k.session_count);
        let n: i64 = self.eval(&inv, self.timeout).await?;
        Ok(n > 0)
    }

    pub(super) async fn unbind_remote(
        &self,
        p: &PoolLocal,
        key: &str,
        upstream: &UpstreamId,
    ) -> Result<(), Fault> {
        let k = &p.keys;
        let mut inv = Call::new(&scripts::UNBIND, 2);
        inv.key(&k.session(key))
            .key(&k.session_count)
            .arg(upstream.as_str());
        let _: i64 = self.eval(&inv, self.timeout).await?;
        Ok(())
    }
}
