//! Hash maps for keys the gateway itself chose: pool names, upstream ids, lease numbers.
//!
//! These are looked up several times per request, where SipHash (the standard library's
//! default, built to resist keys chosen by an attacker) was a measurable share of the work.
//! foldhash is several times faster and still seeded per process. Maps keyed by what clients
//! send (session keys, target hosts, client addresses) keep the standard hasher.

/// A `HashMap` with foldhash; build one with `FastMap::default()`.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
