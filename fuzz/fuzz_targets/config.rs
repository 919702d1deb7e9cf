//! The config loader: TOML text to a validated `Config` (or every problem, each with its key).
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text, "fuzz.toml", None) {
        Ok(c) => {
            assert!(!c.pools.is_empty());
            assert!(c.pools.contains_key(&c.default_pool));
        }
        Err(e) => assert!(!e.problems.is_empty()),
    }
});
