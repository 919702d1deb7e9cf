//! The `[store] url` of a Redis store: how it is read, and how it is shown without its password.
//! Below config, which checks the URL at load, and the Redis store, which connects to it.

/// Default first segment of every Redis key.
pub const DEFAULT_KEY_PREFIX: &str = "pg";
/// Default bound on one Redis call, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 250;

/// What `[store] url` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One Redis server: `redis://`, `rediss://`, `redis+unix://`, `unix://`.
    Single(String),
    /// A Redis Cluster, from seed nodes: `redis+cluster://[user:pass@]h1:p1,h2:p2` (or
    /// `rediss+cluster://` for TLS). Each entry is one node's `redis://` URL.
    Cluster(Vec<String>),
    /// A master found through Redis Sentinel:
    /// `redis+sentinel://[user:pass@]h1:p1,h2:p2/<master name>[/<db>]`. The credentials and the
    /// database are the master's; the sentinels are asked without credentials.
    Sentinel {
        /// Each sentinel's `redis://host:port` URL (port 26379 when none is given).
        sentinels: Vec<String>,
        /// The master's name as the sentinels know it (`sentinel monitor <name> …`).
        master: String,
        /// `redis://[user:pass@]<first sentinel>/<db>`: only its credentials and database are
        /// used, for the master the sentinels name.
        auth: String,
    },
}

/// Default port of a sentinel listed without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Reads a store URL. Errors never repeat the URL (it may hold a password).
pub fn parse_target(url: &str) -> Result<Target, String> {
    if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        return parse_sentinel(rest);
    }
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
            "must start with redis://, rediss://, redis+unix://, redis+cluster://, rediss+cluster:// or redis+sentinel://"
                .into(),
        );
    }
    check(url)?;
    Ok(Target::Single(url.to_string()))
}

/// `[user:pass@]h1:p1,h2:p2/<master>[/<db>]`, after `redis+sentinel://`.
fn parse_sentinel(rest: &str) -> Result<Target, String> {
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut path = path.split('/');
    let master = path.next().unwrap_or("").trim();
    if master.is_empty() {
        return Err("a sentinel URL names the master after the hosts: redis+sentinel://h1:26379,h2:26379/mymaster".into());
    }
    let db = path.next().filter(|d| !d.is_empty()).unwrap_or("0");
    if db.parse::<u16>().is_err() || path.next().is_some() {
        return Err("a sentinel URL ends with /<master name> or /<master name>/<db number>".into());
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',').map(str::trim) {
        if host.is_empty() {
            return Err("a sentinel URL lists host:port pairs separated by commas".into());
        }
        let has_port = match host.strip_prefix('[') {
            Some(v6) => v6.contains("]:"),
            None => host.contains(':'),
        };
        let node = if has_port {
            format!("redis://{host}")
        } else {
            format!("redis://{host}:{DEFAULT_SENTINEL_PORT}")
        };
        check(&node)?;
        sentinels.push(node);
    }
    let first = sentinels[0].trim_start_matches("redis://");
    let auth = match auth {
        Some(auth) => format!("redis://{auth}@{first}/{db}"),
        None => format!("redis://{first}/{db}"),
    };
    check(&auth)?;
    Ok(Target::Sentinel {
        sentinels,
        master: master.to_string(),
        auth,
    })
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
        assert_eq!(
            parse_target("redis+sentinel://u:s3cret@127.0.0.1:26379,h2/mymaster").unwrap(),
            Target::Sentinel {
                sentinels: vec!["redis://127.0.0.1:26379".into(), "redis://h2:26379".into()],
                master: "mymaster".into(),
                auth: "redis://u:s3cret@127.0.0.1:26379/0".into(),
            }
        );
        match parse_target("redis+sentinel://a:1/m/2").unwrap() {
            Target::Sentinel { auth, .. } => assert_eq!(auth, "redis://a:1/2"),
            other => panic!("{other:?}"),
        }
        for bad in [
            "http://x",
            "redis+cluster://",
            "redis+cluster://a:1,,b:2",
            "redis+sentinel://:s3cret@a:1",
            "redis+sentinel://:s3cret@a:1/",
            "redis+sentinel://:s3cret@a:1,,b:2/m",
            "redis+sentinel://:s3cret@a:1/m/x",
        ] {
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
            redact("redis+sentinel://u:s3cret@a:1,b:2/mymaster"),
            "redis+sentinel://u:***@a:1,b:2/mymaster"
        );
        assert_eq!(
            redact("redis+unix:///run/r.sock?db=1&pass=s3cret"),
            "redis+unix:///run/r.sock?db=1&pass=***"
        );
    }
}
