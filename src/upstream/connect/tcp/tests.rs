use std::net::SocketAddr;

use super::connect_any;
use crate::upstream::connect::test_support::{assert_echoes, bounded, echo_target, listener};
use crate::upstream::connect::{BoxIo, ConnectError};

#[tokio::test]
async fn connect_any_moves_past_a_dead_address() {
    bounded(async {
        let (port, _peers) = echo_target().await;
        let dead = {
            let (_l, dead) = listener().await;
            dead
        };
        let addrs = [
            SocketAddr::from(([127, 0, 0, 1], dead)),
            SocketAddr::from(([127, 0, 0, 1], port)),
        ];
        let tcp = connect_any(&addrs, None, "test").await.unwrap();
        assert!(tcp.nodelay().unwrap());
        let mut io: BoxIo = Box::new(tcp);
        assert_echoes(&mut io).await;

        let err = connect_any(&addrs[..1], None, "test").await.unwrap_err();
        assert!(matches!(err, ConnectError::Refused { .. }), "{err:?}");
    })
    .await;
}
