use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::outcome::Outcome;
use crate::target::Target;
use crate::upstream::Credentials;
use crate::upstream::connect::test_support::*;
use crate::upstream::connect::{ConnectError, SocksFault};

#[derive(Debug, PartialEq)]
enum SocksDest {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Name(String),
}

/// A fake SOCKS5 server on loopback: greeting, optional user/pass, CONNECT. It never dials:
/// a loopback destination is answered by echoing locally, anything else is refused (0x02).
async fn fake_socks(
    password: Option<&'static str>,
) -> (u16, mpsc::UnboundedReceiver<(SocksDest, u16)>) {
    let (l, port) = listener().await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = serve_socks(s, password, tx).await;
            });
        }
    });
    (port, rx)
}

async fn serve_socks(
    mut s: TcpStream,
    password: Option<&str>,
    tx: mpsc::UnboundedSender<(SocksDest, u16)>,
) -> io::Result<()> {
    let mut greeting = [0u8; 2];
    s.read_exact(&mut greeting).await?;
    let mut methods = vec![0u8; usize::from(greeting[1])];
    s.read_exact(&mut methods).await?;
    assert_eq!(greeting[0], 5);
    match password {
        Some(expected) => {
            if !methods.contains(&2) {
                return s.write_all(&[5, 0xff]).await;
            }
            s.write_all(&[5, 2]).await?;
            let mut ver_len = [0u8; 2];
            s.read_exact(&mut ver_len).await?;
            let mut user = vec![0u8; usize::from(ver_len[1])];
            s.read_exact(&mut user).await?;
            let mut plen = [0u8; 1];
            s.read_exact(&mut plen).await?;
            let mut pass = vec![0u8; usize::from(plen[0])];
            s.read_exact(&mut pass).await?;
            if ver_len[0] != 1 || user != USER.as_bytes() || pass != expected.as_bytes() {
                return s.write_all(&[1, 1]).await;
            }
            s.write_all(&[1, 0]).await?;
        }
        None => {
            if !methods.contains(&0) {
                return s.write_all(&[5, 0xff]).await;
            }
            s.write_all(&[5, 0]).await?;
        }
    }
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    let dest = match req[3] {
        1 => {
            let mut ip = [0u8; 4];
            s.read_exact(&mut ip).await?;
            SocksDest::V4(ip.into())
        }
        4 => {
            let mut ip = [0u8; 16];
            s.read_exact(&mut ip).await?;
            SocksDest::V6(ip.into())
        }
        3 => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            s.read_exact(&mut name).await?;
            SocksDest::Name(String::from_utf8_lossy(&name).into_owned())
        }
        _ => return s.write_all(&[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]).await,
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await?;
    let allowed = req[1] == 1
        && match &dest {
            SocksDest::V4(ip) => ip.is_loopback(),
            SocksDest::V6(ip) => ip.is_loopback(),
            SocksDest::Name(name) => name == "localhost",
        };
    let _ = tx.send((dest, u16::from_be_bytes(port)));
    if !allowed {
        return s.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]).await;
    }
    s.write_all(&[5, 0, 0, 1, 127, 0, 0, 1, port[0], port[1]])
        .await?;
    echo(s).await;
    Ok(())
}

#[tokio::test]
async fn socks5_resolves_locally_and_socks5h_sends_the_name() {
    bounded(async {
        let (echo_port, _peers) = echo_target().await;
        let (port, mut seen) = fake_socks(Some(PASSWORD)).await;
        let target = Target::new("localhost", echo_port);

        let up = with_password(&format!("socks5://127.0.0.1:{port}"), PASSWORD);
        let mut io = connector().tunnel(&up, &target).await.unwrap();
        assert_echoes(&mut io).await;
        let (dest, dest_port) = seen.recv().await.unwrap();
        assert!(
            matches!(dest, SocksDest::V4(ip) if ip.is_loopback())
                || matches!(dest, SocksDest::V6(ip) if ip.is_loopback()),
            "{dest:?}"
        );
        assert_eq!(dest_port, echo_port);

        let up = with_password(&format!("socks5h://127.0.0.1:{port}"), PASSWORD);
        let mut io = connector().tunnel(&up, &target).await.unwrap();
        assert_echoes(&mut io).await;
        assert_eq!(
            seen.recv().await.unwrap(),
            (SocksDest::Name("localhost".into()), echo_port)
        );
    })
    .await;
}

#[tokio::test]
async fn socks_failures_keep_their_kind() {
    bounded(async {
        let (port, mut seen) = fake_socks(Some(PASSWORD)).await;
        let target = Target::new("localhost", 443);

        let up = with_password(&format!("socks5h://127.0.0.1:{port}"), "wrong-password");
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(
            matches!(
                err,
                ConnectError::Socks {
                    fault: SocksFault::AuthRejected,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.outcome(), Outcome::UpstreamError);
        assert!(!err.to_string().contains("wrong-password"));

        let up = upstream(&format!("socks5h://127.0.0.1:{port}"));
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(
            matches!(
                err,
                ConnectError::Socks {
                    fault: SocksFault::NoAcceptableAuth,
                    ..
                }
            ),
            "{err:?}"
        );

        // The fake refuses anything that is not loopback, and never dials it.
        let up = with_password(&format!("socks5h://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(
            connector()
                .tunnel(&up, &Target::new("example.com", 443))
                .await,
        )
        .await;
        assert!(
            matches!(
                err,
                ConnectError::Socks {
                    fault: SocksFault::NotAllowed,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.proxy_status(), "destination_unavailable");
        assert_eq!(
            seen.recv().await.unwrap(),
            (SocksDest::Name("example.com".into()), 443)
        );

        let mut up = upstream(&format!("socks5h://127.0.0.1:{port}"));
        up.credentials = Some(Credentials {
            username: USER.into(),
            password: String::new(),
        });
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(
            matches!(
                err,
                ConnectError::Socks {
                    fault: SocksFault::BadCredentials,
                    ..
                }
            ),
            "{err:?}"
        );
    })
    .await;
}

/// Resolves every name to `ip`: a name that points wherever the test wants, without DNS.
struct PointsAt(std::net::IpAddr);

impl crate::upstream::connect::Resolve for PointsAt {
    fn resolve(
        &self,
        _host: &str,
        port: u16,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = io::Result<Vec<std::net::SocketAddr>>>
                + Send
                + 'static,
        >,
    > {
        let addr = std::net::SocketAddr::new(self.0, port);
        Box::pin(async move { Ok(vec![addr]) })
    }
}

#[tokio::test]
async fn socks5_checks_the_address_it_resolved_before_sending_it() {
    bounded(async {
        let (echo_port, _peers) = echo_target().await;
        let (port, mut seen) = fake_socks(None).await;
        let target = Target::new("inside.test", echo_port);
        let up = upstream(&format!("socks5://127.0.0.1:{port}"));
        // The guard the gateway installs is the target policy; here, "nothing loopback".
        let guarded = |ip: &str| {
            connector()
                .with_resolver(std::sync::Arc::new(PointsAt(ip.parse().unwrap())))
                .with_guard(std::sync::Arc::new(
                    |_: &Target, a: std::net::SocketAddr| !a.ip().is_loopback(),
                ))
        };
        let err = err_of(guarded("127.0.0.1").tunnel(&up, &target).await).await;
        assert!(matches!(err, ConnectError::TargetDenied { .. }), "{err:?}");
        assert_eq!(err.outcome(), Outcome::OriginError);
        assert_eq!(err.proxy_status(), "destination_ip_prohibited");
        assert!(seen.try_recv().is_err(), "the proxy was sent nothing");

        // Allowed addresses go to the proxy as the address resolved here.
        let err = err_of(guarded("192.0.2.7").tunnel(&up, &target).await).await;
        assert!(matches!(err, ConnectError::Socks { .. }), "{err:?}");
        assert_eq!(
            seen.recv().await.unwrap(),
            (SocksDest::V4([192, 0, 2, 7].into()), echo_port)
        );

        // socks5h resolves nothing here: the name goes to the proxy, whatever it points at.
        let up = upstream(&format!("socks5h://127.0.0.1:{port}"));
        let err = err_of(guarded("127.0.0.1").tunnel(&up, &target).await).await;
        assert!(matches!(err, ConnectError::Socks { .. }), "{err:?}");
        assert_eq!(
            seen.recv().await.unwrap(),
            (SocksDest::Name("inside.test".into()), echo_port)
        );
    })
    .await;
}
