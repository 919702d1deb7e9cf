//! Fixtures shared by the connector's tests: loopback listeners, an echo target, connectors and
//! upstreams with known credentials, and checks that no secret leaks into an error.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::{BoxIo, ConnectError, Connector};
use crate::upstream::{Credentials, Upstream};

pub(super) const USER: &str = "alice";

pub(super) const PASSWORD: &str = "pa55-w0rd-xyz";

/// Every test body runs under this bound so a stuck fake fails the test instead of hanging.
pub(super) async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("test timed out")
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn client_config(roots: RootCertStore) -> Arc<rustls::ClientConfig> {
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

pub(super) fn connector() -> Connector {
    Connector::new(
        client_config(RootCertStore::empty()),
        Duration::from_secs(5),
    )
}

pub(super) fn upstream(url: &str) -> Upstream {
    Upstream::parse(url).unwrap()
}

pub(super) fn with_password(url: &str, password: &str) -> Upstream {
    let mut u = upstream(url);
    u.credentials = Some(Credentials {
        username: USER.into(),
        password: password.into(),
    });
    u
}

/// Neither the password nor the Basic token built from it may leak into an error.
pub(super) fn assert_no_secret(err: &ConnectError) {
    let token = Credentials {
        username: USER.into(),
        password: PASSWORD.into(),
    }
    .basic_header();
    let token = token.trim_start_matches("Basic ");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains(PASSWORD), "{text}");
        assert!(!text.contains(token), "{text}");
    }
}

pub(super) async fn echo<S: AsyncRead + AsyncWrite + Unpin>(stream: S) {
    let (mut r, mut w) = tokio::io::split(stream);
    let _ = tokio::io::copy(&mut r, &mut w).await;
}

pub(super) async fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// An echo server standing in for the target; reports each client's address.
pub(super) async fn echo_target() -> (u16, mpsc::UnboundedReceiver<SocketAddr>) {
    let (l, port) = listener().await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, peer)) = l.accept().await {
            let _ = tx.send(peer);
            tokio::spawn(echo(s));
        }
    });
    (port, rx)
}

/// Writes `ping`, expects it back.
pub(super) async fn assert_echoes(io: &mut BoxIo) {
    io.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    io.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
}

pub(super) async fn err_of(result: Result<BoxIo, ConnectError>) -> ConnectError {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            assert_no_secret(&e);
            e
        }
    }
}
