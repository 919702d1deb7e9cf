//! Where a pool's state lives in Redis, and how the store URL is read (and shown without its
//! password).
//!
//! Every key of a pool starts with `<prefix>:{<pool>}:`, so the hash tag `{<pool>}` puts them all in
//! one Redis Cluster slot and every script can touch them together. Scripts are handed every key
//! they touch in KEYS; none is computed inside Lua.

/// Default first segment of every key.
pub const DEFAULT_KEY_PREFIX: &str = "pg";

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
    /// ZSET: session key → expiry (ms), to count live sessions.
    pub sessions: String,
    /// ZSET: instance → deadline (ms) of its report of unlisted leases (`report.lua`).
    pub instances: String,
    /// HASH: instance → its unlisted leases, `<count> <upstream>` lines.
    pub held: String,
    /// Pub/sub channel of the pool's events.
    pub events: String,
    /// STRING: the members the pool's upstream lists contribute, one URL a line (`listed_put.lua`).
    pub listed: String,
    /// `<prefix>:{<pool>}:sess:`; a session's STRING key is this plus the session key.
    sess_prefix: String,
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
            sessions: key("sessions"),
            instances: key("instances"),
            held: key("held"),
            events: key("events"),
            listed: key("listed"),
            sess_prefix: key("sess:"),
        }
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

/// What `[store] url` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One Redis server: `redis://`, `rediss://`, `redis+unix://`, `unix://`.
    Single(String),
    /// A Redis Cluster, from seed nodes: `redis+cluster://[user:pass@]h1:p1,h2:p2` (or
    /// `rediss+cluster://` for TLS). Each entry is one node's `redis://` URL.
    Cluster(Vec<String>),
}

/// Reads a store URL. Errors never repeat the URL (it may hold a password).
pub fn parse_target(url: &str) -> Result<Target, String> {
    let cluster = [
        ("redis+cluster://", "redis"),
        ("rediss+cluster://", "rediss"),
    ]
    .into_iter()
    .find_map(|(prefix, scheme)| url.strip_prefix(prefix).map(|rest| (scheme, rest)));
    if let Some((scheme, rest)) = cluster {
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, rest),
        };
        let hosts = hosts.split(['/', '?']).next().unwrap_or("");
        let mut nodes = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            if host.is_empty() {
                return Err("a cluster URL lists host:port pairs separated by commas".into());
            }
            let node = match auth {
                Some(auth) => format!("{scheme}://{auth}@{host}"),
                None => format!("{scheme}://{host}"),
            };
            check(&node)?;
            nodes.push(node);
        }
        if nodes.is_empty() {
            return Err("a cluster URL needs at least one host:port".into());
        }
        return Ok(Target::Cluster(nodes));
    }
    if !["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|p| url.starts_with(p))
    {
        return Err(
            "must start with redis://, rediss://, redis+unix://, redis+cluster:// or rediss+cluster://"
                .into(),
        );
    }
    check(url)?;
    Ok(Target::Single(url.to_string()))
}

fn check(url: &str) -> Result<(), String> {
    redis::Client::open(url)
        .map(|_| ())
        .map_err(|_| "is not a valid Redis URL".to_string())
}

/// `url` with its password (and any `pass=`/`password=` query value) replaced by `***`, for logs,
/// errors and `/status`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{hosts}"),
            None => format!("***@{hosts}"),
        },
        None => rest.to_string(),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _))
                        if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") =>
                    {
                        format!("{k}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => rest,
    };
    format!("{scheme}://{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
            &k.sessions,
            &k.instances,
            &k.held,
            &k.events,
            &k.listed,
            &k.session("s1"),
        ] {
            assert!(key.starts_with("pg:{eu}:"), "{key}");
        }
        assert_eq!(k.session("a:b"), "pg:{eu}:sess:a:b");
        assert_eq!(lock_key("pg", "probe"), "pg:lock:{probe}");
    }

    #[test]
    fn urls_are_read_and_redacted() {
        assert_eq!(
            parse_target("redis://:s3cret@127.0.0.1:7000/0").unwrap(),
            Target::Single("redis://:s3cret@127.0.0.1:7000/0".into())
        );
        assert_eq!(
            parse_target("redis+cluster://u:s3cret@127.0.0.1:7000,127.0.0.1:7001").unwrap(),
            Target::Cluster(vec![
                "redis://u:s3cret@127.0.0.1:7000".into(),
                "redis://u:s3cret@127.0.0.1:7001".into()
            ])
        );
        for bad in ["http://x", "redis+cluster://", "redis+cluster://a:1,,b:2"] {
            let e = parse_target(bad).unwrap_err();
            assert!(!e.contains("s3cret"));
        }
        assert_eq!(redact("redis://u:s3cret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis+cluster://u:s3cret@a:1,b:2"),
            "redis+cluster://u:***@a:1,b:2"
        );
        assert_eq!(
            redact("redis+unix:///run/r.sock?db=1&pass=s3cret"),
            "redis+unix:///run/r.sock?db=1&pass=***"
        );
    }
}
