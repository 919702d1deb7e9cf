//! Upstream URLs: `Upstream::parse`, and `to_url` reading back into the same upstream (the form
//! instances hand lists to each other in).
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::upstream::{Upstream, UpstreamUrlError};

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
            // Errors never echo the input, which may hold a password; the one that quotes
            // anything quotes the scheme, the text before `://` (credentials come after it).
            if let UpstreamUrlError::Scheme(scheme) = &e {
                let before = url.trim().split('#').next().unwrap_or_default();
                let quoted = before
                    .split_once("://")
                    .map(|(s, _)| s.to_ascii_lowercase());
                assert_eq!(Some(scheme), quoted.as_ref());
            }
        }
    }
});
