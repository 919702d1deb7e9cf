//! The ClientHello reader of TLS interception (`proxy::inspect::HelloReader`), fed the input in
//! chunks the input picks: it must settle (hello, not TLS) or ask for more, never spin, and
//! never take a hello for something else however the bytes are split.
//!
//! Input: byte 0 is the chunk length (1 to 256), the rest the client's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::proxy::inspect::{HelloReader, HelloStep};

fuzz_target!(|data: &[u8]| {
    let Some((&len, bytes)) = data.split_first() else {
        return;
    };
    let step = usize::from(len) + 1;
    let split = run(bytes.chunks(step));
    let whole = run(std::iter::once(bytes).filter(|b| !b.is_empty()));
    // A hello read whole is read the same split; bytes that are not a hello are never one.
    if let HelloStep::Hello(_) = whole {
        assert_eq!(split, whole);
    }
    if let HelloStep::Hello(_) = split {
        assert_eq!(split, whole);
    }
});

fn run<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> HelloStep {
    let mut reader = HelloReader::default();
    for chunk in chunks {
        match reader.feed(chunk) {
            HelloStep::More => {}
            settled => return settled,
        }
    }
    HelloStep::More
}
