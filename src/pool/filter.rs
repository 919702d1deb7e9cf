//! Label filters over a pool: which members a request's `-country-us` (or `X-Pool-Labels`)
//! leaves, found once per filter and pool version, not per request.
//!
//! A filter keeps the pairs whose key is one of the targeting names or is declared by some
//! member; other pairs are another gateway's parameters and are ignored. Its members are found
//! from an index of the pool's labels (the members with one of the first key's values, then
//! checked against the rest), never by walking a large pool per request, and the view is cached
//! per pool version. A view carries its own placement ring, so a session inside a filter is
//! placed among the matching members only: an upstream with other labels joining or leaving
//! moves none of the filter's sessions.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::xxh3_64;

use crate::error::ProxyError;
use crate::fast_map::FastMap;
use crate::pool::Ring;
use crate::session::LabelWant;
use crate::store::Subset;
use crate::upstream::{Filter, Upstream, UpstreamId};

/// Views cached per pool version; past this the cache starts over.
const MAX_CACHED: usize = 1024;

/// A pool's members as one label filter sees them.
#[derive(Debug)]
pub struct FilterView {
    pub filter: Filter,
    /// `<filter>#<digest of the members>`: the store's name for the subset, the same on every
    /// instance with the same members and labels.
    pub id: String,
    /// The matching members, in the pool's order.
    pub members: Vec<UpstreamId>,
    /// Sticky placement among the matching members.
    pub ring: Ring,
}

impl FilterView {
    pub fn subset(&self) -> Subset<'_> {
        Subset {
            id: &self.id,
            members: &self.members,
        }
    }

    /// How the filter is named in session bindings and messages.
    pub fn name(&self) -> String {
        self.filter.to_string()
    }
}

/// The labels of one pool's members, indexed for filters.
#[derive(Debug, Default)]
pub struct LabelIndex {
    /// Label keys some member declares.
    declared: BTreeSet<String>,
    /// `(key, value)` → positions of the members with that label, ascending.
    by_label: HashMap<(String, String), Vec<u32>>,
    cache: Mutex<FastMap<Filter, Arc<FilterView>>>,
}

impl LabelIndex {
    pub fn new(members: &[UpstreamId], upstreams: &FastMap<UpstreamId, Arc<Upstream>>) -> Self {
        let mut index = LabelIndex::default();
        for (pos, id) in members.iter().enumerate() {
            let Some(up) = upstreams.get(id) else {
                continue;
            };
            for (k, v) in up.labels.iter() {
                index.declared.insert(k.to_string());
                index
                    .by_label
                    .entry((k.to_string(), v.to_string()))
                    .or_default()
                    .push(pos as u32);
            }
        }
        index
    }

    /// Label keys some member declares, sorted.
    pub fn declared(&self) -> impl Iterator<Item = &str> {
        self.declared.iter().map(String::as_str)
    }

    /// The filter `wants` makes in this pool: `None` when nothing of it applies here (every
    /// request without labels), else its view; 503 `no-matching-upstream` when no member
    /// matches.
    pub fn view(
        &self,
        pool: &str,
        wants: &[LabelWant],
        members: &[UpstreamId],
        upstreams: &FastMap<UpstreamId, Arc<Upstream>>,
    ) -> Result<Option<Arc<FilterView>>, ProxyError> {
        let pairs: Vec<(String, Vec<String>)> = wants
            .iter()
            .filter(|w| w.named || self.declared.contains(&w.key))
            .map(|w| (w.key.clone(), w.values.clone()))
            .collect();
        if pairs.is_empty() {
            return Ok(None);
        }
        let filter = Filter::new(pairs);
        let cached = self.cache_lock().get(&filter).cloned();
        let view = match cached {
            Some(v) => v,
            None => {
                let view = Arc::new(self.build(filter.clone(), members, upstreams));
                let mut cache = self.cache_lock();
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
                cache.insert(filter, view.clone());
                view
            }
        };
        if view.members.is_empty() {
            return Err(ProxyError::NoMatchingUpstream {
                pool: pool.to_string(),
                filter: view.name(),
            });
        }
        Ok(Some(view))
    }

    fn cache_lock(&self) -> std::sync::MutexGuard<'_, FastMap<Filter, Arc<FilterView>>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn build(
        &self,
        filter: Filter,
        members: &[UpstreamId],
        upstreams: &FastMap<UpstreamId, Arc<Upstream>>,
    ) -> FilterView {
        // Candidates: the members with one of the first key's values, in the pool's order.
        let mut positions: Vec<u32> = Vec::new();
        if let Some((key, values)) = filter.pairs().first() {
            for v in values {
                if let Some(ps) = self.by_label.get(&(key.clone(), v.clone())) {
                    positions.extend(ps);
                }
            }
        }
        positions.sort_unstable();
        positions.dedup();
        let matching: Vec<UpstreamId> = positions
            .into_iter()
            .filter_map(|p| members.get(p as usize))
            .filter(|id| {
                upstreams
                    .get(*id)
                    .is_some_and(|u| filter.matches(&u.labels))
            })
            .cloned()
            .collect();
        let mut digest_input = String::new();
        for id in &matching {
            digest_input.push_str(id.as_str());
            digest_input.push('\n');
        }
        FilterView {
            id: format!("{filter}#{:016x}", xxh3_64(digest_input.as_bytes())),
            ring: Ring::new(&matching),
            members: matching,
            filter,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::upstream::Labels;

    fn member(id: &str, labels: &[(&str, &str)]) -> Upstream {
        let mut u = Upstream::parse(&format!("http://10.0.0.1:3128#{id}")).unwrap();
        u.labels = Labels::new(labels.iter().copied()).unwrap();
        u
    }

    fn pool(members: &[Upstream]) -> (Vec<UpstreamId>, FastMap<UpstreamId, Arc<Upstream>>) {
        let ids = members.iter().map(|u| u.id.clone()).collect();
        let map = members
            .iter()
            .map(|u| (u.id.clone(), Arc::new(u.clone())))
            .collect();
        (ids, map)
    }

    fn want(key: &str, values: &[&str], named: bool) -> LabelWant {
        LabelWant {
            key: key.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
            named,
        }
    }

    fn view(
        members: &[Upstream],
        wants: &[LabelWant],
    ) -> Result<Option<Arc<FilterView>>, ProxyError> {
        let (ids, map) = pool(members);
        LabelIndex::new(&ids, &map).view("p", wants, &ids, &map)
    }

    fn first_choices(v: &FilterView, keys: usize) -> Vec<UpstreamId> {
        (0..keys)
            .map(|k| v.ring.preferred(&format!("k{k}"), 1, &[])[0].clone())
            .collect()
    }

    #[test]
    fn a_member_with_other_labels_moves_no_session_of_the_filter() {
        let mut members: Vec<Upstream> = (0..20)
            .map(|i| member(&format!("us{i}"), &[("country", "us")]))
            .chain((0..20).map(|i| member(&format!("de{i}"), &[("country", "de")])))
            .collect();
        let us = [want("country", &["us"], true)];
        let before = view(&members, &us).unwrap().unwrap();
        assert_eq!(before.members.len(), 20);
        members.push(member("de-new", &[("country", "de")]));
        members.retain(|u| u.id.as_str() != "de3");
        let after = view(&members, &us).unwrap().unwrap();
        assert_eq!(before.id, after.id, "same members, same subset");
        assert_eq!(first_choices(&before, 2000), first_choices(&after, 2000));

        // A matching member joining takes only its share of the keys, and names a new subset.
        members.push(member("us-new", &[("country", "us")]));
        let grown = view(&members, &us).unwrap().unwrap();
        assert_ne!(before.id, grown.id);
        let (old, new) = (first_choices(&before, 2000), first_choices(&grown, 2000));
        let moved = old.iter().zip(&new).filter(|(a, b)| a != b).count();
        assert!(
            new.iter()
                .zip(&old)
                .all(|(n, o)| n == o || n.as_str() == "us-new")
        );
        assert!(moved > 20 && moved < 200, "{moved} of 2000 moved");
    }

    #[test]
    fn only_named_or_declared_keys_filter_and_no_match_names_the_filter() {
        let members = [
            member("a", &[("country", "us"), ("carrier", "tmo")]),
            member("b", &[("country", "ca")]),
        ];
        // No labels asked, or only keys nobody declares: no filter at all.
        assert!(view(&members, &[]).unwrap().is_none());
        assert!(
            view(&members, &[want("zone", &["x"], false)])
                .unwrap()
                .is_none()
        );
        // A declared key filters; alternatives widen.
        let v = view(&members, &[want("carrier", &["tmo"], false)])
            .unwrap()
            .unwrap();
        assert_eq!(v.members, [UpstreamId::new("a")]);
        let v = view(&members, &[want("country", &["ca", "us"], true)])
            .unwrap()
            .unwrap();
        assert_eq!(v.members.len(), 2);
        // A targeting name filters even when no member declares it.
        let e = view(&members, &[want("city", &["paris"], true)]).unwrap_err();
        assert!(matches!(e, ProxyError::NoMatchingUpstream { .. }));
        assert!(e.to_string().contains("city=paris"), "{e}");
        let e = view(
            &members,
            &[
                want("country", &["us"], true),
                want("carrier", &["att"], false),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("carrier=att,country=us"), "{e}");
    }
}
