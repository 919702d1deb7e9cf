use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Rewind;
use crate::upstream::connect::test_support::bounded;

#[tokio::test]
async fn rewind_yields_prefix_then_inner_and_writes_through() {
    bounded(async {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut rewind = Rewind::new(Bytes::from_static(b"abc"), ours);
        theirs.write_all(b"def").await.unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 2];
        while got.len() < 6 {
            let n = rewind.read(&mut byte).await.unwrap();
            got.extend_from_slice(&byte[..n]);
        }
        assert_eq!(got, b"abcdef");
        rewind.write_all(b"xyz").await.unwrap();
        let mut back = [0u8; 3];
        theirs.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"xyz");
    })
    .await;
}
