//! Leaf certificates minted on the fly for the names clients ask for, kept in a bounded LRU.
//!
//! Every leaf shares one ECDSA P-256 key made at start, so minting a leaf is one signature
//! (well under a millisecond) and the cache holds certificates, not keys. Each cached entry is a
//! ready rustls server config presenting `[leaf, CA]`, offering ALPN `http/1.1` only. A leaf is
//! re-minted once it is older than [`LEAF_REFRESH_AFTER`], long before it expires.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::KeyPair;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::{CertifiedKey, SigningKey, SingleCertAndKey};

use super::ca::{Ca, LEAF_VALIDITY_DAYS};

/// Cached leaves are replaced after this long (they are valid for [`LEAF_VALIDITY_DAYS`]).
pub const LEAF_REFRESH_AFTER: Duration =
    Duration::from_secs(LEAF_VALIDITY_DAYS as u64 * 86_400 / 2);

/// One minted leaf: the certificate and the server config that presents it.
pub struct Leaf {
    pub cert: CertificateDer<'static>,
    pub config: Arc<ServerConfig>,
    minted_at: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("cannot sign a certificate for {name:?}: {error}")]
    Sign { name: String, error: rcgen::Error },
    #[error("cannot build a TLS config: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Mints and caches leaves. Lookups take a short lock; minting happens outside it.
pub struct LeafCache {
    ca: Ca,
    leaf_key: KeyPair,
    signing_key: Arc<dyn SigningKey>,
    provider: Arc<CryptoProvider>,
    lru: Mutex<Lru<Arc<Leaf>>>,
    minted: AtomicU64,
}

impl LeafCache {
    pub fn new(ca: Ca, capacity: NonZeroUsize) -> Result<Self, MintError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let leaf_key = KeyPair::generate().map_err(|error| MintError::Sign {
            name: String::new(),
            error,
        })?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let signing_key = provider.key_provider.load_private_key(der)?;
        Ok(LeafCache {
            ca,
            leaf_key,
            signing_key,
            provider,
            lru: Mutex::new(Lru::new(capacity.get())),
            minted: AtomicU64::new(0),
        })
    }

    /// The leaf for `name` (lower-case DNS name or IP literal): cached, or minted now.
    pub fn get(&self, name: &str) -> Result<Arc<Leaf>, MintError> {
        if let Some(leaf) = self.lock().get(name) {
            if leaf.minted_at.elapsed() < LEAF_REFRESH_AFTER {
                return Ok(leaf);
            }
        }
        let fresh = Arc::new(self.mint(name)?);
        let mut lru = self.lock();
        // Two connections may have minted the same name at once: the first one cached wins, so a
        // name keeps one certificate.
        if let Some(leaf) = lru.get(name) {
            if leaf.minted_at.elapsed() < LEAF_REFRESH_AFTER {
                return Ok(leaf);
            }
        }
        lru.insert(name.to_string(), fresh.clone());
        Ok(fresh)
    }

    fn mint(&self, name: &str) -> Result<Leaf, MintError> {
        let cert = self
            .ca
            .sign_leaf(name, &self.leaf_key)
            .map_err(|error| MintError::Sign {
                name: name.to_string(),
                error,
            })?;
        let certified = CertifiedKey::new(
            vec![cert.clone(), self.ca.cert_der().clone()],
            self.signing_key.clone(),
        );
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        self.minted.fetch_add(1, Ordering::Relaxed);
        Ok(Leaf {
            cert,
            config: Arc::new(config),
            minted_at: Instant::now(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru<Arc<Leaf>>> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves cached now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }

    /// Leaves minted since start (a re-mint after eviction counts again).
    pub fn minted(&self) -> u64 {
        self.minted.load(Ordering::Relaxed)
    }

    /// The CA certificate the leaves chain to.
    pub fn ca_cert(&self) -> &CertificateDer<'static> {
        self.ca.cert_der()
    }
}

/// A least-recently-used map from names to values, bounded to `capacity` entries. Each entry
/// carries the tick of its last use; `order` maps ticks back to names, so the oldest entry is the
/// first of `order`. O(log n) per operation, no unsafe code.
struct Lru<V> {
    capacity: usize,
    map: HashMap<String, (V, u64)>,
    order: BTreeMap<u64, String>,
    tick: u64,
}

impl<V: Clone> Lru<V> {
    fn new(capacity: usize) -> Self {
        Lru {
            capacity: capacity.max(1),
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The value for `key`, now the most recently used.
    fn get(&mut self, key: &str) -> Option<V> {
        let tick = self.next_tick();
        let (value, used) = self.map.get_mut(key)?;
        self.order.remove(used);
        *used = tick;
        self.order.insert(tick, key.to_string());
        Some(value.clone())
    }

    /// Inserts or replaces `key`, evicting the least recently used entry when full.
    fn insert(&mut self, key: String, value: V) {
        let tick = self.next_tick();
        if let Some((old, used)) = self.map.get_mut(&key) {
            self.order.remove(used);
            *old = value;
            *used = tick;
            self.order.insert(tick, key);
            return;
        }
        if self.map.len() >= self.capacity {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.map.remove(&oldest);
            }
        }
        self.order.insert(tick, key.clone());
        self.map.insert(key, (value, tick));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut lru = Lru::new(2);
        lru.insert("a".into(), 1);
        lru.insert("b".into(), 2);
        assert_eq!(lru.get("a"), Some(1));
        lru.insert("c".into(), 3);
        assert_eq!(lru.get("b"), None, "b was the least recently used");
        assert_eq!(lru.get("a"), Some(1));
        assert_eq!(lru.get("c"), Some(3));
        lru.insert("c".into(), 4);
        assert_eq!((lru.len(), lru.get("c")), (2, Some(4)));
        assert_eq!(lru.order.len(), lru.map.len());
    }

    fn cache(capacity: usize) -> LeafCache {
        let generated = super::super::ca::generate("test").unwrap();
        let ca = Ca::from_pem(
            &generated.cert_pem,
            std::path::Path::new("c"),
            &generated.key_pem,
            std::path::Path::new("k"),
        )
        .unwrap();
        LeafCache::new(ca, NonZeroUsize::new(capacity).unwrap()).unwrap()
    }

    #[test]
    fn a_thousand_names_keep_the_cache_at_its_bound_and_a_name_keeps_its_leaf() {
        let certs = cache(1000);
        let first = certs.get("name-0.example").unwrap();
        for i in 0..1500 {
            certs.get(&format!("name-{i}.example")).unwrap();
            assert!(certs.len() <= 1000);
        }
        assert_eq!(certs.len(), 1000);
        assert_eq!(certs.minted(), 1500);
        // name-0 was evicted long ago: asking again mints a new leaf.
        let again = certs.get("name-0.example").unwrap();
        assert_ne!(first.cert, again.cert);
        // A cached name is served from the cache: same certificate, nothing minted.
        let minted = certs.minted();
        let same = certs.get("name-0.example").unwrap();
        assert_eq!(same.cert, again.cert);
        assert!(Arc::ptr_eq(&same.config, &again.config));
        assert_eq!(certs.minted(), minted);
    }
}
