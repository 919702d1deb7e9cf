//! A hand-written SOCKS5 server (RFC 1928 CONNECT, RFC 1929 user/pass) on
//! 127.0.0.1:0.
//!
//! Targets (IPv4, IPv6 or domain) are resolved first and refused with reply
//! 0x02 ("connection not allowed by ruleset") unless every resolved address
//! is loopback: the fake never dials anything else.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{Gauge, MAX_ACCEPTS, connect_loopback, resolve_loopback_only};

/// SOCKS5 reply codes used by the fake.
pub mod reply {
    pub const SUCCEEDED: u8 = 0x00;
    pub const GENERAL_FAILURE: u8 = 0x01;
    pub const NOT_ALLOWED: u8 = 0x02;
    pub const CONNECTION_REFUSED: u8 = 0x05;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    pub const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;
}

/// Options for [`FakeSocks::start`].
#[derive(Clone, Debug, Default)]
pub struct FakeSocksOpts {
    /// Require RFC 1929 username/password with these values. Without it the
    /// server picks "no auth" when offered, else accepts any user/pass.
    pub credentials: Option<(String, String)>,
    /// Sleep this long (tokio time) before dialing the target.
    pub delay: Option<Duration>,
}

impl FakeSocksOpts {
    pub fn with_credentials(user: &str, pass: &str) -> Self {
        Self {
            credentials: Some((user.to_string(), pass.to_string())),
            ..Self::default()
        }
    }
}

/// The address of a CONNECT request, by SOCKS address type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocksAddr {
    /// ATYP 0x01
    Ipv4(Ipv4Addr),
    /// ATYP 0x04
    Ipv6(Ipv6Addr),
    /// ATYP 0x03
    Domain(String),
}

impl SocksAddr {
    /// The SOCKS ATYP byte.
    pub fn atyp(&self) -> u8 {
        match self {
            SocksAddr::Ipv4(_) => 0x01,
            SocksAddr::Domain(_) => 0x03,
            SocksAddr::Ipv6(_) => 0x04,
        }
    }

    /// Host as text (IPv6 without brackets).
    pub fn host(&self) -> String {
        match self {
            SocksAddr::Ipv4(a) => a.to_string(),
            SocksAddr::Ipv6(a) => a.to_string(),
            SocksAddr::Domain(d) => d.clone(),
        }
    }
}

/// One CONNECT (or other command) request.
#[derive(Clone, Debug)]
pub struct SocksRequest {
    pub command: u8,
    pub addr: SocksAddr,
    pub port: u16,
    /// The reply code sent (see [`reply`]).
    pub reply: u8,
}

struct SocksState {
    credentials: Option<(String, String)>,
    delay: Option<Duration>,
    accepted: AtomicUsize,
    connects: AtomicUsize,
    requests: Mutex<Vec<SocksRequest>>,
    auth: Mutex<Vec<(String, String)>>,
    greetings: Mutex<Vec<Vec<u8>>>,
    gauge: Arc<Gauge>,
}

/// A running fake SOCKS5 server. Dropping it stops it and closes every tunnel.
pub struct FakeSocks {
    addr: SocketAddr,
    state: Arc<SocksState>,
    cancel: CancellationToken,
}

impl Drop for FakeSocks {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl FakeSocks {
    pub async fn start(opts: FakeSocksOpts) -> FakeSocks {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake socks on 127.0.0.1:0");
        let addr = listener.local_addr().expect("socks local_addr");
        let state = Arc::new(SocksState {
            credentials: opts.credentials,
            delay: opts.delay,
            accepted: AtomicUsize::new(0),
            connects: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            auth: Mutex::new(Vec::new()),
            greetings: Mutex::new(Vec::new()),
            gauge: Gauge::new(),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(accept_loop(listener, Arc::clone(&state), cancel.clone()));
        FakeSocks {
            addr,
            state,
            cancel,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `socks5://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("socks5://{}", self.addr)
    }

    /// `socks5h://127.0.0.1:PORT`
    pub fn url_h(&self) -> String {
        format!("socks5h://{}", self.addr)
    }

    /// `socks5://user:pass@127.0.0.1:PORT` if credentials are configured.
    pub fn url_with_auth(&self) -> String {
        match &self.state.credentials {
            Some((u, p)) => format!("socks5://{u}:{p}@{}", self.addr),
            None => self.url(),
        }
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// SOCKS requests read (any command, any outcome).
    pub fn connects(&self) -> usize {
        self.state.connects.load(Ordering::SeqCst)
    }

    /// Every request read, with the reply sent.
    pub fn requests(&self) -> Vec<SocksRequest> {
        self.state.requests.lock().expect("requests").clone()
    }

    /// Requests answered 0x02 (target not loopback).
    pub fn refused(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.reply == reply::NOT_ALLOWED)
            .count()
    }

    /// Every RFC 1929 (user, pass) received, valid or not.
    pub fn auth_seen(&self) -> Vec<(String, String)> {
        self.state.auth.lock().expect("auth").clone()
    }

    /// Method lists offered in the greetings.
    pub fn methods_offered(&self) -> Vec<Vec<u8>> {
        self.state.greetings.lock().expect("greetings").clone()
    }

    /// Open tunnels.
    pub fn tunnels(&self) -> usize {
        self.state.gauge.current()
    }

    pub fn peak_tunnels(&self) -> usize {
        self.state.gauge.peak()
    }

    pub fn reset_peak(&self) {
        self.state.gauge.reset_peak();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<SocksState>, cancel: CancellationToken) {
    for _ in 0..MAX_ACCEPTS {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            },
        };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        let st = Arc::clone(&state);
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = c.cancelled() => {}
                _ = serve(stream, st) => {}
            }
        });
    }
}

async fn send_reply(s: &mut TcpStream, code: u8, bound: Option<SocketAddr>) -> std::io::Result<()> {
    let mut out = vec![5, code, 0];
    match bound {
        Some(SocketAddr::V4(a)) => {
            out.push(0x01);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        Some(SocketAddr::V6(a)) => {
            out.push(0x04);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        None => out.extend_from_slice(&[0x01, 0, 0, 0, 0, 0, 0]),
    }
    s.write_all(&out).await?;
    s.flush().await
}

async fn serve(mut s: TcpStream, st: Arc<SocksState>) -> std::io::Result<()> {
    // Greeting: VER NMETHODS METHODS...
    let mut hdr = [0u8; 2];
    s.read_exact(&mut hdr).await?;
    if hdr[0] != 5 {
        return Ok(());
    }
    let mut methods = vec![0u8; usize::from(hdr[1])];
    s.read_exact(&mut methods).await?;
    st.greetings
        .lock()
        .expect("greetings")
        .push(methods.clone());
    let method = match (
        &st.credentials,
        methods.contains(&0x00),
        methods.contains(&0x02),
    ) {
        (Some(_), _, true) => 0x02,
        (Some(_), _, false) => 0xFF,
        (None, true, _) => 0x00,
        (None, false, true) => 0x02,
        (None, false, false) => 0xFF,
    };
    s.write_all(&[5, method]).await?;
    if method == 0xFF {
        return Ok(());
    }
    if method == 0x02 {
        // RFC 1929: VER ULEN UNAME PLEN PASSWD
        let mut ver_ulen = [0u8; 2];
        s.read_exact(&mut ver_ulen).await?;
        if ver_ulen[0] != 1 {
            return Ok(());
        }
        let mut user = vec![0u8; usize::from(ver_ulen[1])];
        s.read_exact(&mut user).await?;
        let plen = s.read_u8().await?;
        let mut pass = vec![0u8; usize::from(plen)];
        s.read_exact(&mut pass).await?;
        let user = String::from_utf8_lossy(&user).into_owned();
        let pass = String::from_utf8_lossy(&pass).into_owned();
        st.auth
            .lock()
            .expect("auth")
            .push((user.clone(), pass.clone()));
        let ok = match &st.credentials {
            Some((u, p)) => *u == user && *p == pass,
            None => true,
        };
        s.write_all(&[1, if ok { 0 } else { 1 }]).await?;
        if !ok {
            return Ok(());
        }
    }

    // Request: VER CMD RSV ATYP DST.ADDR DST.PORT
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    if req[0] != 5 {
        return Ok(());
    }
    let addr = match req[3] {
        0x01 => {
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await?;
            SocksAddr::Ipv4(Ipv4Addr::from(b))
        }
        0x04 => {
            let mut b = [0u8; 16];
            s.read_exact(&mut b).await?;
            SocksAddr::Ipv6(Ipv6Addr::from(b))
        }
        0x03 => {
            let len = s.read_u8().await?;
            let mut b = vec![0u8; usize::from(len)];
            s.read_exact(&mut b).await?;
            SocksAddr::Domain(String::from_utf8_lossy(&b).into_owned())
        }
        _ => {
            st.connects.fetch_add(1, Ordering::SeqCst);
            return send_reply(&mut s, reply::ADDRESS_TYPE_NOT_SUPPORTED, None).await;
        }
    };
    let port = s.read_u16().await?;
    st.connects.fetch_add(1, Ordering::SeqCst);
    let record = |code: u8| {
        st.requests.lock().expect("requests").push(SocksRequest {
            command: req[1],
            addr: addr.clone(),
            port,
            reply: code,
        });
    };
    if req[1] != 0x01 {
        record(reply::COMMAND_NOT_SUPPORTED);
        return send_reply(&mut s, reply::COMMAND_NOT_SUPPORTED, None).await;
    }
    let addrs = match resolve_loopback_only(&addr.host(), port).await {
        Ok(a) => a,
        Err(_) => {
            record(reply::NOT_ALLOWED);
            return send_reply(&mut s, reply::NOT_ALLOWED, None).await;
        }
    };
    if let Some(d) = st.delay {
        tokio::time::sleep(d).await;
    }
    let mut upstream = match connect_loopback(&addrs).await {
        Ok(u) => u,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                reply::CONNECTION_REFUSED
            } else {
                reply::GENERAL_FAILURE
            };
            record(code);
            return send_reply(&mut s, code, None).await;
        }
    };
    record(reply::SUCCEEDED);
    let _tunnel = st.gauge.enter();
    send_reply(&mut s, reply::SUCCEEDED, upstream.local_addr().ok()).await?;
    let _ = tokio::io::copy_bidirectional(&mut s, &mut upstream).await;
    Ok(())
}
