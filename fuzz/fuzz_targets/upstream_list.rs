//! Upstream lists (`sources::list::parse`): each entry once, every other non-comment line
//! accounted for by a message that never quotes the line.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use poolgate::sources::list;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let listed = list::parse(text, "fuzz.txt");
    let ids: HashSet<_> = listed.upstreams.iter().map(|u| u.id.clone()).collect();
    assert_eq!(ids.len(), listed.upstreams.len(), "an id listed twice");
    let lines = text.lines().count();
    assert!(listed.upstreams.len() + listed.skipped.len() <= lines);
});
