//! Exit identity: the IP address each member's traffic leaves from, as the prober measured it
//! (`[pools.<name>.probe] exit_ip_url`), and the members grouped by it.
//!
//! Members that share an exit IP are one visitor to a target site: a ban earned through one is a
//! ban on the others too. The engine asks [`ExitIps::twins`] when it records a ban, so the
//! grouping is kept incrementally (one map from member to IP, one from IP to members) and a
//! lookup costs two hash probes, never a scan of the pool.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::fast_map::FastMap;
use crate::upstream::UpstreamId;

#[derive(Debug, Default)]
pub struct ExitIps {
    /// Each measured member's last known exit IP; members not yet measured are absent.
    of: FastMap<UpstreamId, IpAddr>,
    /// The members behind each exit IP (at least one each; empty groups are removed).
    members: HashMap<IpAddr, Vec<UpstreamId>>,
}

impl ExitIps {
    /// Records `ip` as `upstream`'s exit IP; whether that changed anything.
    pub fn set(&mut self, upstream: &UpstreamId, ip: IpAddr) -> bool {
        match self.of.get(upstream) {
            Some(old) if *old == ip => return false,
            Some(_) => self.unlink(upstream),
            None => {}
        }
        self.of.insert(upstream.clone(), ip);
        let group = self.members.entry(ip).or_default();
        group.push(upstream.clone());
        group.sort();
        true
    }

    /// Forgets members that left the pool.
    pub fn retain(&mut self, keep: impl Fn(&UpstreamId) -> bool) {
        let gone: Vec<UpstreamId> = self.of.keys().filter(|id| !keep(id)).cloned().collect();
        for id in gone {
            self.unlink(&id);
            self.of.remove(&id);
        }
    }

    fn unlink(&mut self, upstream: &UpstreamId) {
        let Some(ip) = self.of.get(upstream) else {
            return;
        };
        if let Some(group) = self.members.get_mut(ip) {
            group.retain(|id| id != upstream);
            if group.is_empty() {
                self.members.remove(ip);
            }
        }
    }

    pub fn ip_of(&self, upstream: &UpstreamId) -> Option<IpAddr> {
        self.of.get(upstream).copied()
    }

    /// The other members with `upstream`'s exit IP (none when it is unknown or not shared).
    pub fn twins<'a>(&'a self, upstream: &'a UpstreamId) -> impl Iterator<Item = &'a UpstreamId> {
        self.of
            .get(upstream)
            .and_then(|ip| self.members.get(ip))
            .into_iter()
            .flatten()
            .filter(move |id| *id != upstream)
    }

    /// Exit IPs that two members or more share.
    pub fn shared(&self) -> usize {
        self.members.values().filter(|g| g.len() > 1).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> UpstreamId {
        UpstreamId::new(s)
    }

    fn twins(e: &ExitIps, of: &str) -> Vec<String> {
        e.twins(&id(of)).map(|u| u.to_string()).collect()
    }

    #[test]
    fn members_with_one_exit_ip_are_twins_until_one_moves_or_leaves() {
        let mut e = ExitIps::default();
        let a: IpAddr = "203.0.113.7".parse().unwrap();
        let b: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(e.set(&id("u1"), a));
        assert!(e.set(&id("u2"), a));
        assert!(e.set(&id("u3"), b));
        assert!(!e.set(&id("u3"), b), "the same IP again changes nothing");
        assert_eq!(twins(&e, "u1"), ["u2"]);
        assert_eq!(twins(&e, "u2"), ["u1"]);
        assert!(twins(&e, "u3").is_empty());
        assert!(twins(&e, "u9").is_empty(), "an unmeasured member has none");
        assert_eq!(e.shared(), 1);

        // u2's exit moves to u3's: the groups follow.
        assert!(e.set(&id("u2"), b));
        assert!(twins(&e, "u1").is_empty());
        assert_eq!(twins(&e, "u3"), ["u2"]);
        assert_eq!(e.shared(), 1);

        e.retain(|u| u.as_str() != "u3");
        assert!(twins(&e, "u2").is_empty());
        assert_eq!(e.ip_of(&id("u3")), None);
        assert_eq!(e.ip_of(&id("u2")), Some(b));
        assert_eq!(e.shared(), 0);
    }
}
