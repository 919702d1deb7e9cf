//! Fetching `upstreams_url`: one GET from this machine (not through an upstream: the list is
//! the operator's, like a config file), bounded in time and size.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use thiserror::Error;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::upstream::connect::BoxIo;

/// A list larger than this is refused: no honest upstream list is, and the gateway holds it in
/// memory while parsing.
pub const MAX_LIST_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Error)]
pub enum FetchError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("TLS failed: {0}")]
    Tls(std::io::Error),
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("answered {0}, expected 200")]
    Status(http::StatusCode),
    #[error("the list is larger than {MAX_LIST_BYTES} bytes or its body broke off")]
    Body,
    #[error("the list is not UTF-8 text")]
    NotText,
    #[error("not a fetchable URL")]
    Url,
}

/// The URL as logs and `/status` show it: no user info, no query (either may hold a token).
pub fn redact(url: &Uri) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let host = url.host().unwrap_or("");
    let port = url.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    let query = if url.query().is_some() { "?…" } else { "" };
    format!("{scheme}://{host}{port}{}{query}", url.path())
}

/// GETs `url` and returns its body as text.
pub async fn fetch(url: &Uri, tls: &TlsConnector, timeout: Duration) -> Result<String, FetchError> {
    match tokio::time::timeout(timeout, exchange(url, tls)).await {
        Ok(r) => r,
        Err(_) => Err(FetchError::Timeout(timeout)),
    }
}

async fn exchange(url: &Uri, tls: &TlsConnector) -> Result<String, FetchError> {
    let https = url.scheme_str() == Some("https");
    let host = url.host().ok_or(FetchError::Url)?;
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((bare_host, port))
        .await
        .map_err(FetchError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let io: BoxIo = if https {
        let name = ServerName::try_from(bare_host.to_string()).map_err(|_| FetchError::Url)?;
        Box::new(tls.connect(name, tcp).await.map_err(FetchError::Tls)?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let conn = tokio::spawn(conn);
    let path = url.path_and_query().map_or("/", |pq| pq.as_str());
    let authority = url.authority().map_or(host, |a| a.as_str());
    // The Host header never carries user info.
    let host_header = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let mut req = Request::get(path)
        .header(header::HOST, host_header)
        .header(
            header::USER_AGENT,
            concat!("poolgate/", env!("CARGO_PKG_VERSION")),
        )
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|_| FetchError::Url)?;
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode(userinfo);
        if let Ok(mut v) = http::HeaderValue::from_str(&format!("Basic {basic}")) {
            v.set_sensitive(true);
            req.headers_mut().insert(header::AUTHORIZATION, v);
        }
    }
    let resp = sender.send_request(req).await?;
    if resp.status() != http::StatusCode::OK {
        conn.abort();
        return Err(FetchError::Status(resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_LIST_BYTES)
        .collect()
        .await
        .map_err(|_| FetchError::Body)?
        .to_bytes();
    conn.abort();
    String::from_utf8(body.to_vec()).map_err(|_| FetchError::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_user_info_and_query() {
        let u: Uri = "https://me:secret@lists.example:8443/p.txt?token=abc"
            .parse()
            .unwrap();
        assert_eq!(redact(&u), "https://lists.example:8443/p.txt?…");
        let u: Uri = "http://lists.example/p.txt".parse().unwrap();
        assert_eq!(redact(&u), "http://lists.example/p.txt");
    }
}
