use std::net::IpAddr;

use crate::outcome::Outcome;
use crate::target::Target;
use crate::upstream::connect::ConnectError;
use crate::upstream::connect::test_support::{
    assert_echoes, bounded, connector, echo_target, err_of, upstream,
};

#[tokio::test]
async fn direct_connects_to_each_address_in_turn_from_the_bind_address() {
    bounded(async {
        let (port, mut peers) = echo_target().await;
        let mut io = connector()
            .tunnel(&upstream("direct://"), &Target::new("127.0.0.1", port))
            .await
            .unwrap();
        assert_echoes(&mut io).await;

        // `localhost` may resolve to ::1 first, where nothing listens: the next address wins.
        let mut io = connector()
            .tunnel(&upstream("direct://"), &Target::new("localhost", port))
            .await
            .unwrap();
        assert_echoes(&mut io).await;

        let mut io = connector()
            .tunnel(
                &upstream("direct://127.0.0.1"),
                &Target::new("localhost", port),
            )
            .await
            .unwrap();
        assert_echoes(&mut io).await;
        let mut last = None;
        while let Ok(peer) = peers.try_recv() {
            last = Some(peer);
        }
        assert_eq!(last.map(|p| p.ip()), Some(IpAddr::from([127, 0, 0, 1])));
    })
    .await;
}

#[tokio::test]
async fn direct_bind_family_mismatch_is_not_the_upstreams_fault() {
    bounded(async {
        let up = upstream("direct://127.0.0.1");
        let err = err_of(connector().tunnel(&up, &Target::new("::1", 443)).await).await;
        assert!(matches!(err, ConnectError::TargetDns { .. }), "{err:?}");
        assert_eq!(err.outcome(), Outcome::OriginError);
        assert_eq!(err.proxy_status(), "dns_error");
    })
    .await;
}
