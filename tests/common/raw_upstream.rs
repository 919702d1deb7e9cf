//! A fake upstream HTTP proxy on 127.0.0.1:0 that answers every request head with scripted raw
//! bytes, for testing how the gateway copes with malformed, oversized or truncated responses.
//! It never dials anything. Each request it reads is recorded with the id of its connection, so a
//! test can tell whether the gateway reused a connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::MAX_ACCEPTS;

/// Longest request head read.
const MAX_HEAD: usize = 64 * 1024;
/// A connection with no request for this long is closed.
const IDLE: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Default)]
pub struct Script {
    /// Bytes written in answer to every request head.
    pub response: Vec<u8>,
    /// Close the connection after writing them.
    pub close: bool,
}

#[derive(Default)]
struct State {
    script: Mutex<Script>,
    /// Connection id of every request head read, in order.
    requests: Mutex<Vec<usize>>,
}

pub struct RawUpstream {
    pub addr: std::net::SocketAddr,
    state: Arc<State>,
    cancel: CancellationToken,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl RawUpstream {
    pub async fn start() -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let cancel = CancellationToken::new();
        let (st, token) = (state.clone(), cancel.clone());
        tokio::spawn(async move {
            for conn_id in 0..MAX_ACCEPTS {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = token.cancelled() => return,
                };
                let Ok((mut s, _)) = accepted else { continue };
                let (st, token) = (st.clone(), token.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    for _ in 0..10_000 {
                        let read = tokio::select! {
                            r = tokio::time::timeout(IDLE, s.read(&mut chunk)) => r,
                            _ = token.cancelled() => return,
                        };
                        let n = match read {
                            Ok(Ok(n)) if n > 0 => n,
                            _ => return,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        if buf.len() > MAX_HEAD {
                            return;
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            st.requests.lock().unwrap().push(conn_id);
                            let script = st.script.lock().unwrap().clone();
                            if s.write_all(&script.response).await.is_err() || script.close {
                                return;
                            }
                        }
                    }
                });
            }
        });
        RawUpstream {
            addr,
            state,
            cancel,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_script(&self, script: Script) {
        *self.state.script.lock().unwrap() = script;
    }

    /// Connection id of every request read so far.
    pub fn requests(&self) -> Vec<usize> {
        self.state.requests.lock().unwrap().clone()
    }
}
