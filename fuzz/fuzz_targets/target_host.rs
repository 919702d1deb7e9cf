//! Target hosts: `target::canonical_host`, `Target::parse` and `Target::from_uri`. The canonical
//! form is a fixed point, and a parsed target's authority reads back as the same target.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::target::{Target, canonical_host};

fuzz_target!(|data: &[u8]| {
    let Some((&p, rest)) = data.split_first() else {
        return;
    };
    let Ok(raw) = std::str::from_utf8(rest) else {
        return;
    };
    if let Ok(host) = canonical_host(raw) {
        assert_eq!(
            canonical_host(&host).as_deref(),
            Ok(host.as_str()),
            "not a fixed point"
        );
    }
    let port = u16::from(p) * 257;
    if let Ok(t) = Target::parse(raw, port) {
        assert_ne!(t.port, 0);
        let authority = t.authority();
        let uri: http::Uri = format!("http://{authority}/")
            .parse()
            .expect("a target's authority is a valid URI authority");
        assert_eq!(Target::from_uri(&uri, None), Ok(t));
    }
    if let Ok(uri) = raw.parse::<http::Uri>() {
        if let Ok(t) = Target::from_uri(&uri, Some(80)) {
            assert_eq!(Target::parse(&t.host, t.port).as_ref(), Ok(&t));
        }
    }
});
