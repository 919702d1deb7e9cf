//! Job locks (see `job_lock.rs`): one key each, never served from the local view.

use std::sync::Arc;
use std::time::Duration;

use super::keys::lock_key;
use super::scripts::{self, Call};
use super::{Fault, Inner, broken, millis};
use crate::store::{LockToken, StoreError};

impl Inner {
    pub(super) async fn lock(
        self: &Arc<Self>,
        name: &str,
        ttl: Duration,
    ) -> Result<Option<LockToken>, StoreError> {
        let token = LockToken::random();
        let mut inv = Call::new(&scripts::LOCK_ACQUIRE, 1);
        inv.key(&lock_key(&self.prefix, name))
            .arg(token.as_str())
            .arg(millis(ttl));
        Ok(self.lock_call(&inv).await?.then_some(token))
    }

    pub(super) async fn extend_lock(
        self: &Arc<Self>,
        name: &str,
        token: &LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut inv = Call::new(&scripts::LOCK_EXTEND, 1);
        inv.key(&lock_key(&self.prefix, name))
            .arg(token.as_str())
            .arg(millis(ttl));
        self.lock_call(&inv).await
    }

    pub(super) async fn unlock(
        self: &Arc<Self>,
        name: &str,
        token: &LockToken,
    ) -> Result<bool, StoreError> {
        let mut inv = Call::new(&scripts::LOCK_RELEASE, 1);
        inv.key(&lock_key(&self.prefix, name)).arg(token.as_str());
        self.lock_call(&inv).await
    }

    /// Runs a lock script. Locks are never served from the local view: exclusion across
    /// instances cannot be promised without Redis, so a degraded store answers an error.
    async fn lock_call(self: &Arc<Self>, inv: &Call) -> Result<bool, StoreError> {
        if self.is_degraded() {
            return Err(StoreError::Unavailable(
                "redis unreachable: locks are not available while degraded".into(),
            ));
        }
        match self.eval::<i64>(inv, self.timeout).await {
            Ok(n) => Ok(n == 1),
            Err(Fault::Down(why)) => {
                self.degrade(&why);
                Err(StoreError::Unavailable(format!("redis unreachable: {why}")))
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }
}
