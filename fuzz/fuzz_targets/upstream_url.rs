//! Upstream URLs: `Upstream::parse`, and `to_url` reading back into the same upstream (the form
//! instances hand lists to each other in).
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::upstream::Upstream;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    match Upstream::parse(url) {
        Ok(u) => {
            let again = Upstream::parse(&u.to_url());
            assert_eq!(again.as_ref(), Ok(&u), "to_url does not read back: {url:?}");
        }
        Err(e) => {
            // Errors never echo the input (it may hold a password).
            let shown = e.to_string();
            if url.len() >= 8 {
                assert!(!shown.contains(url.trim()) || url.trim().len() < 8);
            }
        }
    }
});
