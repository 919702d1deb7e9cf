//! Where a pool's state lives in Redis.
//!
//! Every key of a pool starts with `<prefix>:{<pool>}:`, so the hash tag `{<pool>}` puts them all in
//! one Redis Cluster slot and every script can touch them together. Scripts are handed every key
//! they touch in KEYS; none is computed inside Lua.

/// The fixed KEYS of each script, in order, by name: each is `<prefix>:{<pool>}:<name>`. The
/// store sends these ([`PoolKeys::acquire`] and the like); tests and benchmarks that run a script
/// directly name its keys from here.
pub mod script_keys {
    /// `acquire.lua`; a session's key, then a subset's, follow when the mode needs them.
    pub const ACQUIRE: [&str; 12] = [
        "meta",
        "state",
        "members",
        "order",
        "leases",
        "lease_up",
        "live",
        "session_count",
        "instances",
        "held",
        "load",
        "load_of",
    ];
    /// `release.lua`.
    pub const RELEASE: [&str; 8] = [
        "leases",
        "lease_up",
        "live",
        "stats",
        "instances",
        "held",
        "load",
        "load_of",
    ];
    /// `configure.lua` (`sessions`: the sorted set of older versions, which it deletes).
    pub const CONFIGURE: [&str; 11] = [
        "meta", "state", "members", "order", "leases", "lease_up", "sessions", "live", "load",
        "load_of", "decl",
    ];
    /// `set_member.lua`.
    pub const SET_MEMBER: [&str; 7] = [
        "meta", "state", "members", "order", "live", "load", "load_of",
    ];
}

/// The keys of one pool (see README "Shared store (Redis)" for what each holds).
#[derive(Clone, Debug)]
pub(crate) struct PoolKeys {
    /// HASH: `rr` (round-robin cursor), `n` (member count). Exists once the pool is configured.
    pub meta: String,
    /// HASH: upstream → `e|k|c|s|r` (eligible, keeps sessions, cost, saved score, rr credit).
    pub state: String,
    /// ZSET: eligible upstream → allocation score.
    pub members: String,
    /// ZSET: upstream → position in the configured list.
    pub order: String,
    /// ZSET: lease id → deadline (ms since the epoch).
    pub leases: String,
    /// HASH: lease id → upstream.
    pub lease_up: String,
    /// HASH: upstream → live lease count.
    pub live: String,
    /// HASH: `<upstream>\n<outcome>` → count, `<upstream>\nlatency_us`, `<upstream>\nlatency_n`.
    pub stats: String,
    /// HASH: live sessions counted by expiry second (`<s>` → bindings, `n` their sum, `swept`
    /// the last second dropped), so that `/status` counts them without a per-binding entry.
    pub session_count: String,
    /// ZSET: session key → expiry, where versions before `session_count` counted sessions (134
    /// bytes a binding); `configure.lua` deletes it.
    pub legacy_sessions: String,
    /// ZSET: instance → deadline (ms) of its report of unlisted leases (`report.lua`).
    pub instances: String,
    /// HASH: instance → its unlisted leases, `<count> <upstream>` lines.
    pub held: String,
    /// ZSET: the load index of least-connections, `<allocs><pos><upstream>` → listed live ×
    /// cost, one entry per eligible member while `meta` field `load` is `1` (`acquire.lua`).
    pub load: String,
    /// HASH: upstream → `<cost> <its entry in load>`.
    pub load_of: String,
    /// ZSET: the members of a declaration under way → their positions (`configure.lua`).
    pub decl: String,
    /// Pub/sub channel of the pool's events.
    pub events: String,
    /// STRING: the members the pool's upstream lists contribute, one URL a line (`listed_put.lua`).
    pub listed: String,
    /// `<prefix>:{<pool>}:sess:`; a session's STRING key is this plus the session key.
    sess_prefix: String,
    /// `<prefix>:{<pool>}:sub:`; a label filter's subset ZSET is this plus its id.
    sub_prefix: String,
}

impl PoolKeys {
    pub fn new(prefix: &str, pool: &str) -> Self {
        let base = format!("{prefix}:{{{pool}}}");
        let key = |name: &str| format!("{base}:{name}");
        PoolKeys {
            meta: key("meta"),
            state: key("state"),
            members: key("members"),
            order: key("order"),
            leases: key("leases"),
            lease_up: key("lease_up"),
            live: key("live"),
            stats: key("stats"),
            session_count: key("session_count"),
            legacy_sessions: key("sessions"),
            instances: key("instances"),
            held: key("held"),
            load: key("load"),
            load_of: key("load_of"),
            decl: key("decl"),
            events: key("events"),
            listed: key("listed"),
            sess_prefix: key("sess:"),
            sub_prefix: key("sub:"),
        }
    }

    /// `acquire.lua`'s fixed keys ([`script_keys::ACQUIRE`]).
    pub fn acquire(&self) -> [&str; 12] {
        [
            &self.meta,
            &self.state,
            &self.members,
            &self.order,
            &self.leases,
            &self.lease_up,
            &self.live,
            &self.session_count,
            &self.instances,
            &self.held,
            &self.load,
            &self.load_of,
        ]
    }

    /// `release.lua`'s keys ([`script_keys::RELEASE`]).
    pub fn release(&self) -> [&str; 8] {
        [
            &self.leases,
            &self.lease_up,
            &self.live,
            &self.stats,
            &self.instances,
            &self.held,
            &self.load,
            &self.load_of,
        ]
    }

    /// `configure.lua`'s keys ([`script_keys::CONFIGURE`]).
    pub fn configure(&self) -> [&str; 11] {
        [
            &self.meta,
            &self.state,
            &self.members,
            &self.order,
            &self.leases,
            &self.lease_up,
            &self.legacy_sessions,
            &self.live,
            &self.load,
            &self.load_of,
            &self.decl,
        ]
    }

    /// `set_member.lua`'s keys ([`script_keys::SET_MEMBER`]).
    pub fn set_member(&self) -> [&str; 7] {
        [
            &self.meta,
            &self.state,
            &self.members,
            &self.order,
            &self.live,
            &self.load,
            &self.load_of,
        ]
    }

    /// ZSET: the members of label-filter subset `id` → allocations through it (`acquire.lua`).
    pub fn subset(&self, id: &str) -> String {
        format!("{}{id}", self.sub_prefix)
    }

    /// STRING: the upstream session `key` is bound to, with the binding's TTL.
    pub fn session(&self, key: &str) -> String {
        format!("{}{key}", self.sess_prefix)
    }
}

/// STRING: the holder's token of job lock `name`, with the lock's TTL.
pub(crate) fn lock_key(prefix: &str, name: &str) -> String {
    format!("{prefix}:lock:{{{name}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_key_lists_are_the_names_the_store_sends() {
        let k = PoolKeys::new("pg", "eu");
        let named = |names: &[&str]| -> Vec<String> {
            names.iter().map(|n| format!("pg:{{eu}}:{n}")).collect()
        };
        assert_eq!(k.acquire().to_vec(), named(&script_keys::ACQUIRE));
        assert_eq!(k.release().to_vec(), named(&script_keys::RELEASE));
        assert_eq!(k.configure().to_vec(), named(&script_keys::CONFIGURE));
        assert_eq!(k.set_member().to_vec(), named(&script_keys::SET_MEMBER));
    }

    #[test]
    fn every_key_of_a_pool_shares_its_hash_tag() {
        let k = PoolKeys::new("pg", "eu");
        for key in [
            &k.meta,
            &k.state,
            &k.members,
            &k.order,
            &k.leases,
            &k.lease_up,
            &k.live,
            &k.stats,
            &k.session_count,
            &k.legacy_sessions,
            &k.instances,
            &k.held,
            &k.load,
            &k.load_of,
            &k.decl,
            &k.events,
            &k.listed,
            &k.session("s1"),
            &k.subset("country=us#0a1b"),
        ] {
            assert!(key.starts_with("pg:{eu}:"), "{key}");
        }
        assert_eq!(k.session("a:b"), "pg:{eu}:sess:a:b");
        assert_eq!(lock_key("pg", "probe"), "pg:lock:{probe}");
    }
}
