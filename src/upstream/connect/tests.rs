use crate::outcome::Outcome;
use crate::target::Target;

use super::test_support::*;
use super::*;

#[tokio::test]
async fn refused_port_is_a_connect_error() {
    bounded(async {
        let port = {
            let (_l, port) = listener().await;
            port
        };
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(
            connector()
                .tunnel(&up, &Target::new("localhost", 443))
                .await,
        )
        .await;
        assert!(matches!(err, ConnectError::Refused { .. }), "{err:?}");
        assert_eq!(err.outcome(), Outcome::ConnectError);
        assert_eq!(err.proxy_status(), "connection_refused");
        assert!(err.to_string().contains(&format!("127.0.0.1:{port}")));

        let direct = upstream("direct://");
        let err = err_of(
            connector()
                .tunnel(&direct, &Target::new("127.0.0.1", port))
                .await,
        )
        .await;
        assert!(matches!(err, ConnectError::Refused { .. }), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn proxy_conn_is_for_http_proxies_only() {
    bounded(async {
        let (port, _peers) = echo_target().await;
        let mut io = connector()
            .proxy_conn(&upstream(&format!("http://127.0.0.1:{port}")))
            .await
            .unwrap();
        assert_echoes(&mut io).await;

        for url in ["socks5://127.0.0.1:1", "socks5h://127.0.0.1:1", "direct://"] {
            let err = err_of(connector().proxy_conn(&upstream(url)).await).await;
            assert!(matches!(err, ConnectError::NotHttpProxy { .. }), "{err:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn invalid_targets_are_rejected_before_dialing() {
    bounded(async {
        // Port 1 on loopback: if anything were dialed the error would be Refused instead.
        let up = with_password("http://127.0.0.1:1", PASSWORD);
        for target in [
            Target::new("evil\r\nX-Injected: 1", 443),
            Target::new("h", 0),
        ] {
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(matches!(err, ConnectError::InvalidTarget { .. }), "{err:?}");
            assert!(!err.to_string().contains('\n'));
            assert_eq!(err.outcome(), Outcome::OriginError);
        }
    })
    .await;
}
