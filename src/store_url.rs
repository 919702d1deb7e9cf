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
