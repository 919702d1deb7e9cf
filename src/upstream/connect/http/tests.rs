use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

use super::{MAX_REPLY_HEAD, REPLY_HEAD_START, read_connect_reply};
use crate::outcome::Outcome;
use crate::target::Target;
use crate::upstream::connect::test_support::*;
use crate::upstream::connect::{BoxIo, ConnectError, Connector, ReplyFault};

/// The reply head read from `chunks` written one by one, as a proxy trickling it out would.
async fn reply_from(chunks: Vec<Vec<u8>>) -> Result<Bytes, ConnectError> {
    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    let writer = tokio::spawn(async move {
        for c in chunks {
            if theirs.write_all(&c).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    });
    let mut conn: BoxIo = Box::new(ours);
    let got = read_connect_reply(&mut conn, "proxy").await;
    writer.abort();
    got
}

#[tokio::test]
async fn connect_reply_heads_read_in_pieces_keep_the_bytes_after_them() {
    // The end of the head comes together with the first tunnel bytes.
    let head = b"HTTP/1.1 200 Connection established\r\nVia: x".to_vec();
    let mut pieces: Vec<Vec<u8>> = head.chunks(3).map(<[u8]>::to_vec).collect();
    pieces.push(b"\r\n\r\nSSH-2.0-hello".to_vec());
    assert_eq!(&reply_from(pieces).await.unwrap()[..], b"SSH-2.0-hello");
    // A head past the first buffer's size, still within the cap.
    let mut long = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..40 {
        long.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "v".repeat(200)).as_bytes());
    }
    long.extend_from_slice(b"\r\n");
    assert!(long.len() > REPLY_HEAD_START && long.len() < MAX_REPLY_HEAD);
    assert!(reply_from(vec![long]).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_connect_reply_head_past_the_cap_is_refused_as_oversized() {
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    while head.len() <= MAX_REPLY_HEAD {
        head.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let err = reply_from(vec![head]).await.unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
    let err = reply_from(vec![b"HTTP/1.1 200 OK\r\nVia".to_vec()])
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("larger than"), "{err}");
}

fn is_loopback_host(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[derive(Clone, Copy)]
enum Answer {
    /// 200 with early bytes in the same write, then echo (acting as the target itself).
    Tunnel,
    Status(u16),
    /// These bytes, then close.
    Raw(&'static [u8]),
    /// A reply header that never ends.
    Endless,
    /// Accept and never answer.
    Silent,
    /// No CONNECT parsing: echo everything (a stand-in for `proxy_conn`).
    Echo,
}

const EARLY: &[u8] = b"EARLY";

#[derive(Debug)]
struct Seen {
    method: String,
    path: String,
    host: Option<String>,
    auth: Option<String>,
}

/// A fake HTTP proxy on loopback. It never dials: a CONNECT to a loopback target is answered
/// by echoing locally, anything else gets 403.
async fn fake_proxy(
    answer: Answer,
    tls: Option<TlsAcceptor>,
) -> (u16, mpsc::UnboundedReceiver<Seen>) {
    let (l, port) = listener().await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(tcp).await {
                            serve_proxy(s, answer, tx).await;
                        }
                    }
                    None => serve_proxy(tcp, answer, tx).await,
                }
            });
        }
    });
    (port, rx)
}

async fn serve_proxy<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    answer: Answer,
    tx: mpsc::UnboundedSender<Seen>,
) {
    match answer {
        Answer::Echo => return echo(s).await,
        Answer::Silent => {
            let _hold = s;
            return std::future::pending().await;
        }
        _ => {}
    }
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = req.parse(&head) else {
        return;
    };
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
    };
    let seen = Seen {
        method: req.method.unwrap_or_default().to_string(),
        path: req.path.unwrap_or_default().to_string(),
        host: header("host"),
        auth: header("proxy-authorization"),
    };
    let loopback = seen
        .path
        .rsplit_once(':')
        .is_some_and(|(h, _)| is_loopback_host(h.trim_start_matches('[').trim_end_matches(']')));
    let _ = tx.send(seen);
    match answer {
        Answer::Tunnel if !loopback => {
            let _ = s.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
        }
        Answer::Tunnel => {
            let mut reply = b"HTTP/1.1 200 Connection established\r\nVia: fake\r\n\r\n".to_vec();
            reply.extend_from_slice(EARLY);
            if s.write_all(&reply).await.is_ok() {
                echo(s).await;
            }
        }
        Answer::Status(code) => {
            let reply = format!(
                "HTTP/1.1 {code} Nope\r\nProxy-Authenticate: Basic realm=\"fake\"\r\n\
                 Content-Length: 5\r\n\r\nnope!"
            );
            let _ = s.write_all(reply.as_bytes()).await;
        }
        Answer::Raw(bytes) => {
            let _ = s.write_all(bytes).await;
        }
        Answer::Endless => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
            let pad = format!("X-Pad: {}\r\n", "a".repeat(1000));
            for _ in 0..40 {
                if s.write_all(pad.as_bytes()).await.is_err() {
                    return;
                }
            }
            let _ = s.read(&mut chunk).await;
        }
        Answer::Silent | Answer::Echo => {}
    }
}

/// A self-signed certificate for "localhost", an acceptor serving it, and a client config
/// trusting it.
fn tls_pair() -> (TlsAcceptor, Arc<rustls::ClientConfig>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    (TlsAcceptor::from(Arc::new(server)), client_config(roots))
}

#[tokio::test]
async fn http_connect_sends_auth_and_returns_early_bytes_first() {
    bounded(async {
        let (port, mut seen) = fake_proxy(Answer::Tunnel, None).await;
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let target = Target::new("127.0.0.1", 4443);
        let mut io = connector().tunnel(&up, &target).await.unwrap();

        let mut early = [0u8; 5];
        io.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, EARLY);
        assert_echoes(&mut io).await;

        let seen = seen.recv().await.unwrap();
        assert_eq!(
            (seen.method.as_str(), seen.path.as_str()),
            ("CONNECT", "127.0.0.1:4443")
        );
        assert_eq!(seen.host.as_deref(), Some("127.0.0.1:4443"));
        let expected = up.credentials.as_ref().map(|c| c.basic_header());
        assert_eq!(seen.auth, expected);
    })
    .await;
}

#[tokio::test]
async fn http_connect_to_ipv6_target_brackets_the_authority() {
    bounded(async {
        let (port, mut seen) = fake_proxy(Answer::Tunnel, None).await;
        let up = upstream(&format!("http://127.0.0.1:{port}"));
        let mut io = connector()
            .tunnel(&up, &Target::new("[::1]", 443))
            .await
            .unwrap();
        let mut early = [0u8; 5];
        io.read_exact(&mut early).await.unwrap();
        let seen = seen.recv().await.unwrap();
        assert_eq!(seen.path, "[::1]:443");
        assert_eq!(seen.auth, None);
    })
    .await;
}

#[tokio::test]
async fn proxy_407_is_an_upstream_error_without_the_password() {
    bounded(async {
        let (port, mut seen) = fake_proxy(Answer::Status(407), None).await;
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(
            connector()
                .tunnel(&up, &Target::new("localhost", 443))
                .await,
        )
        .await;
        assert!(matches!(err, ConnectError::ProxyAuth { .. }), "{err:?}");
        assert_eq!(err.outcome(), Outcome::UpstreamError);
        assert_eq!(err.proxy_status(), "proxy_configuration_error");
        assert!(seen.recv().await.unwrap().auth.is_some());

        let (port, _seen) = fake_proxy(Answer::Status(502), None).await;
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(
            connector()
                .tunnel(&up, &Target::new("localhost", 443))
                .await,
        )
        .await;
        assert!(
            matches!(err, ConnectError::ProxyRefused { status: 502, .. }),
            "{err:?}"
        );
        assert_eq!(err.outcome(), Outcome::UpstreamError);
    })
    .await;
}

#[tokio::test]
async fn malformed_oversized_and_truncated_replies() {
    bounded(async {
        let target = Target::new("127.0.0.1", 443);

        let (port, _s) = fake_proxy(Answer::Raw(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), None).await;
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(
            matches!(
                err,
                ConnectError::BadReply {
                    fault: ReplyFault::Invalid(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.outcome(), Outcome::UpstreamError);
        assert_eq!(err.proxy_status(), "http_protocol_error");

        let (port, _s) = fake_proxy(Answer::Endless, None).await;
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(
            matches!(
                err,
                ConnectError::BadReply {
                    fault: ReplyFault::Oversized,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.proxy_status(), "http_response_header_section_size");

        let (port, _s) = fake_proxy(Answer::Raw(b"HTTP/1.1 200 OK\r\nVia: x\r\n"), None).await;
        let up = upstream(&format!("http://127.0.0.1:{port}"));
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(
            matches!(
                err,
                ConnectError::BadReply {
                    fault: ReplyFault::Incomplete,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.outcome(), Outcome::Reset);

        let (port, _s) = fake_proxy(Answer::Raw(b""), None).await;
        let up = upstream(&format!("http://127.0.0.1:{port}"));
        let err = err_of(connector().tunnel(&up, &target).await).await;
        assert!(matches!(err, ConnectError::Reset { .. }), "{err:?}");
        assert_eq!(err.proxy_status(), "connection_terminated");
    })
    .await;
}

#[tokio::test]
async fn silent_proxy_times_out_within_connect_timeout() {
    bounded(async {
        let (port, _s) = fake_proxy(Answer::Silent, None).await;
        let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
        let connector = Connector::new(
            client_config(RootCertStore::empty()),
            Duration::from_millis(200),
        );
        let started = std::time::Instant::now();
        let err = err_of(connector.tunnel(&up, &Target::new("localhost", 443)).await).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(matches!(err, ConnectError::Timeout { .. }), "{err:?}");
        assert_eq!(err.outcome(), Outcome::Timeout);
        assert_eq!(err.proxy_status(), "connection_timeout");
    })
    .await;
}

#[tokio::test]
async fn https_upstream_speaks_tls_to_the_proxy() {
    bounded(async {
        let (acceptor, trusting) = tls_pair();
        let connector = Connector::new(trusting, Duration::from_secs(5));

        let (port, mut seen) = fake_proxy(Answer::Tunnel, Some(acceptor.clone())).await;
        let up = with_password(&format!("https://localhost:{port}"), PASSWORD);
        let mut io = connector
            .tunnel(&up, &Target::new("localhost", 8443))
            .await
            .unwrap();
        let mut early = [0u8; 5];
        io.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, EARLY);
        assert_echoes(&mut io).await;
        let seen = seen.recv().await.unwrap();
        assert_eq!(seen.path, "localhost:8443");
        assert_eq!(seen.auth, up.credentials.as_ref().map(|c| c.basic_header()));

        let (port, _s) = fake_proxy(Answer::Echo, Some(acceptor.clone())).await;
        let mut io = connector
            .proxy_conn(&upstream(&format!("https://localhost:{port}")))
            .await
            .unwrap();
        assert_echoes(&mut io).await;

        // The certificate names `localhost`, not the IP literal.
        let by_ip = with_password(&format!("https://127.0.0.1:{port}"), PASSWORD);
        let err = err_of(connector.proxy_conn(&by_ip).await).await;
        assert!(matches!(err, ConnectError::Tls { .. }), "{err:?}");
        assert_eq!(err.proxy_status(), "tls_certificate_error");
        assert_eq!(err.outcome(), Outcome::ConnectError);

        // A client that does not trust the certificate.
        let up = with_password(&format!("https://localhost:{port}"), PASSWORD);
        let err = err_of(self::connector().proxy_conn(&up).await).await;
        assert_eq!(err.proxy_status(), "tls_certificate_error", "{err:?}");
    })
    .await;
}
