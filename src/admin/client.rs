//! The tiny client behind `poolgate status`: one GET over a plain TCP socket, bounded in time.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

/// Fetches `/status` from `addr` (`host:port`, or an `http://host:port` URL).
pub fn fetch_status(addr: &str) -> Result<String, String> {
    let hostport = addr
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let sock = hostport
        .to_socket_addrs()
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    let mut s =
        TcpStream::connect_timeout(&sock, TIMEOUT).map_err(|e| format!("{hostport}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /status HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed response")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or("no status line").to_string());
    }
    Ok(body.to_string())
}
