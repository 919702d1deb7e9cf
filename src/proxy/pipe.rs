//! A two-way byte copy that remembers who did what: how many bytes each side sent, which side
//! ended first (and how), and when. An opaque tunnel is judged from this alone (see
//! [`crate::proxy::tunnel`]).
//!
//! Each direction copies until its reader ends, then half-closes the other side's writer, as
//! `tokio::io::copy_bidirectional` does; an error in either direction ends both.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, tcp};
use tokio::time::Instant;

use crate::limits::{Activity, Tracked};
use crate::meter::Tap;
use crate::upstream::connect::Io;

/// Bytes moved per read when a direction gets busy (see [`pump`]).
const BUF_BYTES: usize = 16 * 1024;
/// The most a busy direction's buffer grows to while reads keep filling it: a bulk transfer then
/// costs a quarter of the system calls. Larger measured slower (256 KiB: about 20% more CPU per
/// GB, the buffers no longer staying in cache), and would let many slow clients of fast
/// downloads hold that much each.
const MAX_BUF_BYTES: usize = 64 * 1024;
/// How long a busy direction keeps its copy buffer after its last bytes: long enough that a bulk
/// transfer, whose reads often find nothing for a moment, never gives it back mid-stream.
const KEEP_BUFFER: Duration = Duration::from_secs(1);
/// Whether a busy direction between two bare sockets moves its bytes by `splice(2)`.
const SPLICE: bool = cfg!(target_os = "linux");
/// First byte of a TLS handshake record (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;
/// `client_first` before the client sent anything.
const NO_BYTE: u16 = u16::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Upstream,
}

/// How a direction ended.
#[derive(Debug)]
pub enum End {
    /// The reader reached end of stream.
    Eof,
    /// Reading or writing failed; the side whose socket failed.
    Error(Side, io::Error),
}

/// What happened in a tunnel.
#[derive(Debug)]
pub struct Report {
    /// Bytes the client sent towards the upstream.
    pub client_bytes: u64,
    /// Bytes the upstream (that is, the origin through it) sent towards the client.
    pub upstream_bytes: u64,
    /// The side that ended first (its stream closed or failed), how, and when (since the start).
    pub first_end: Option<(Side, End, Duration)>,
    /// The client began a TLS handshake and nothing came back within the no-reply limit.
    pub no_reply: bool,
    pub duration: Duration,
}

/// Copies both ways between `client` and `upstream` until both directions end, one fails, or —
/// when `no_reply_within` is set and the client's first byte starts a TLS handshake — the
/// upstream side has sent nothing at all within that time (the handshake can no longer complete
/// in time, so the tunnel is given up). Bytes moving either way touch `activity`.
///
/// Two bare TCP sockets are split in place; anything else through tokio's split, whose halves
/// take a lock on every read and write.
pub async fn copy<C: Io, U: Io>(
    client: C,
    upstream: U,
    activity: Activity,
    no_reply_within: Option<Duration>,
) -> Report {
    copy_metered(client, upstream, activity, no_reply_within, None).await
}

/// [`copy`], counting the bytes on `tap` as they go (a long tunnel shows in the byte counts
/// while it lasts): client to upstream is up, upstream to client is down.
pub async fn copy_metered<C: Io, U: Io>(
    mut client: C,
    mut upstream: U,
    activity: Activity,
    no_reply_within: Option<Duration>,
    tap: Option<Arc<Tap>>,
) -> Report {
    let tap = tap.as_deref();
    if let (Some(client), Some(upstream)) = (client.as_socket(), upstream.as_socket()) {
        return run(
            client.split(),
            upstream.split(),
            activity,
            no_reply_within,
            tap,
        )
        .await;
    }
    let client = tokio::io::split(client);
    let upstream = tokio::io::split(upstream);
    run(client, upstream, activity, no_reply_within, tap).await
}

/// [`copy`] on the ends' (read, write) halves.
async fn run<CR, CW, UR, UW>(
    (client_r, client_w): (CR, CW),
    (up_r, up_w): (UR, UW),
    activity: Activity,
    no_reply_within: Option<Duration>,
    tap: Option<&Tap>,
) -> Report
where
    CR: AsyncRead + Readable + Unpin,
    CW: AsyncWrite + Writable + Unpin,
    UR: AsyncRead + Readable + Unpin,
    UW: AsyncWrite + Writable + Unpin,
{
    let mut client_r = Tracked::new(client_r, activity.clone());
    let mut client_w = Tracked::new(client_w, activity.clone());
    let mut up_r = Tracked::new(up_r, activity.clone());
    let mut up_w = Tracked::new(up_w, activity.clone());
    let start = Instant::now();
    let up_bytes = AtomicU64::new(0);
    let down_bytes = AtomicU64::new(0);
    let client_first = AtomicU16::new(NO_BYTE);
    let to_upstream = pump(
        &mut client_r,
        &mut up_w,
        (Side::Client, Side::Upstream),
        &up_bytes,
        Some(&client_first),
        tap,
        &activity,
    );
    let to_client = pump(
        &mut up_r,
        &mut client_w,
        (Side::Upstream, Side::Client),
        &down_bytes,
        None,
        tap,
        &activity,
    );
    tokio::pin!(to_upstream, to_client);

    let no_reply_deadline = no_reply_within.map(|d| start + d);
    let mut first_end: Option<(Side, End, Duration)> = None;
    let mut up_done = false;
    let mut down_done = false;
    let mut no_reply = false;
    let mut watching = no_reply_deadline.is_some();
    // Armed once, not at every turn of the loop: a timer costs as much to arm and drop as the
    // rest of a short tunnel's bookkeeping.
    let no_reply_at = tokio::time::sleep_until(no_reply_deadline.unwrap_or(start));
    tokio::pin!(no_reply_at);
    while !(up_done && down_done) {
        tokio::select! {
            end = &mut to_upstream, if !up_done => {
                up_done = true;
                let failed = matches!(end, End::Error(..));
                let side = match &end { End::Error(side, _) => *side, End::Eof => Side::Client };
                first_end.get_or_insert((side, end, start.elapsed()));
                if failed { break; }
            }
            end = &mut to_client, if !down_done => {
                down_done = true;
                // The upstream side ended: whatever it did, it did not stay silent.
                watching = false;
                let failed = matches!(end, End::Error(..));
                let side = match &end { End::Error(side, _) => *side, End::Eof => Side::Upstream };
                first_end.get_or_insert((side, end, start.elapsed()));
                if failed { break; }
            }
            _ = &mut no_reply_at, if watching => {
                watching = false;
                let tls = client_first.load(Ordering::Relaxed) == u16::from(TLS_HANDSHAKE);
                if tls && down_bytes.load(Ordering::Relaxed) == 0 {
                    no_reply = true;
                    break;
                }
            }
        }
    }
    Report {
        client_bytes: up_bytes.load(Ordering::Relaxed),
        upstream_bytes: down_bytes.load(Ordering::Relaxed),
        first_end,
        no_reply,
        duration: start.elapsed(),
    }
}

/// A read half whose socket can be waited on without a buffer: a bare TCP socket's.
trait Readable {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

impl Readable for tcp::ReadHalf<'_> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl<T> Readable for tokio::io::ReadHalf<T> {}

impl<T: Readable> Readable for Tracked<T> {
    fn socket(&self) -> Option<&TcpStream> {
        self.get_ref().socket()
    }
}

/// A write half whose socket can be written without a buffer (by `splice(2)`): a bare TCP
/// socket's.
trait Writable {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

impl Writable for tcp::WriteHalf<'_> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl<T> Writable for tokio::io::WriteHalf<T> {}

impl<T: Writable> Writable for Tracked<T> {
    fn socket(&self) -> Option<&TcpStream> {
        self.get_ref().socket()
    }
}

/// Copies `r` into `w` until `r` ends, then shuts `w` down. `sides` is (reader's side, writer's
/// side), to say whose socket failed.
///
/// An idle direction holds no copy buffer. Reading a bare socket, it waits for readiness alone
/// and then reads into a buffer of [`BUF_BYTES`] or more; it keeps that buffer for the next read
/// only when this one filled it (more is likely waiting), and otherwise gives it back at once and
/// waits on readiness again: no timer per read, and a drained socket holds nothing. Any other
/// stream it waits on with a 64-byte buffer (what an empty `BytesMut` reserves when first read
/// into): a short message is written from it as is, and one that fills it takes a [`BUF_BYTES`]
/// buffer together with whatever else can be read at once, so the bytes go out in one write; that
/// buffer is kept while bytes keep coming and given back after [`KEEP_BUFFER`] without any. A read
/// that fills the buffer doubles it for the next one, up to [`MAX_BUF_BYTES`], and a bare
/// socket's next buffer keeps that size. Neither is zeroed. An idle tunnel so holds at most 128
/// bytes of buffers rather than two zeroed 16 KiB ones, and a bulk transfer keeps its buffer
/// while its reads fill it.
///
/// On Linux, once a read between two bare sockets fills its buffer, the direction moves its
/// bytes with `splice(2)` instead ([`crate::proxy::splice`]): no copy through user space, and
/// no buffer held at all.
#[allow(clippy::too_many_arguments)]
async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    sides: (Side, Side),
    count: &AtomicU64,
    first: Option<&AtomicU16>,
    tap: Option<&Tap>,
    activity: &Activity,
) -> End
where
    R: AsyncRead + Readable + Unpin,
    W: AsyncWrite + Writable + Unpin,
{
    let tally = |n: usize| {
        count.fetch_add(n as u64, Ordering::Relaxed);
        match (tap, sides.0) {
            (Some(t), Side::Client) => t.up(n as u64),
            (Some(t), Side::Upstream) => t.down(n as u64),
            (None, _) => {}
        }
    };
    let mut small = BytesMut::new();
    let mut big: Option<BytesMut> = None;
    // The size of a bare socket's next buffer: grows with reads that fill it.
    let mut next_size = BUF_BYTES;
    let mut ended = false;
    // Busy between two bare sockets: moving bytes by splice(2).
    let mut splicing = false;
    while !ended {
        #[cfg(target_os = "linux")]
        if splicing && let (Some(from), Some(to)) = (r.socket(), w.socket()) {
            use crate::proxy::splice::{Spliced, transfer};
            match transfer(from, to).await {
                Spliced::Moved(n) => {
                    activity.touch();
                    tally(n);
                    continue;
                }
                Spliced::Eof => break,
                Spliced::ReadFailed(e) => return End::Error(sides.0, e),
                Spliced::WriteFailed(e) => return End::Error(sides.1, e),
                // Out of descriptors for a pipe: this chunk is copied.
                Spliced::NoPipe => {}
            }
        }
        let chunk = match big.take() {
            Some(mut buf) => {
                buf.clear();
                match tokio::time::timeout(KEEP_BUFFER, r.read_buf(&mut buf)).await {
                    // Quiet for a while: wait on without the buffer.
                    Err(_) => continue,
                    Ok(Ok(0)) => break,
                    Ok(Ok(_)) => Some(buf),
                    Ok(Err(e)) => return End::Error(sides.0, e),
                }
            }
            None => match r.socket() {
                // A bare socket: wait for bytes holding no buffer at all, then read what came
                // at once (a message past the small buffer would otherwise take two reads).
                Some(socket) => {
                    if let Err(e) = socket.readable().await {
                        return End::Error(sides.0, e);
                    }
                    let mut buf = BytesMut::with_capacity(next_size);
                    match r.read_buf(&mut buf).await {
                        Ok(0) => break,
                        Ok(_) => Some(buf),
                        Err(e) => return End::Error(sides.0, e),
                    }
                }
                None => {
                    small.clear();
                    let n = match r.read_buf(&mut small).await {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) => return End::Error(sides.0, e),
                    };
                    if n < small.capacity() {
                        None
                    } else {
                        // More is likely waiting: take it now, into the full-size buffer.
                        let mut buf = BytesMut::with_capacity(BUF_BYTES);
                        buf.extend_from_slice(&small);
                        match ready_now(r.read_buf(&mut buf)).await {
                            Some(Ok(0)) => ended = true,
                            Some(Err(e)) => return End::Error(sides.0, e),
                            Some(Ok(_)) | None => {}
                        }
                        Some(buf)
                    }
                }
            },
        };
        let bytes: &[u8] = chunk.as_deref().unwrap_or(&small);
        if let Some(first) = first {
            let _ = first.compare_exchange(
                NO_BYTE,
                u16::from(bytes[0]),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        if let Err(e) = w.write_all(bytes).await {
            return End::Error(sides.1, e);
        }
        tally(bytes.len());
        big = chunk.and_then(|buf| {
            let filled = buf.len() == buf.capacity();
            if filled && SPLICE && r.socket().is_some() && w.socket().is_some() {
                // Busy between two bare sockets: splice from now on, holding no buffer.
                splicing = true;
                None
            } else if !filled && r.socket().is_some() {
                // The socket is drained: wait on its readiness without the buffer.
                next_size = buf.capacity();
                None
            } else if filled && buf.capacity() < MAX_BUF_BYTES {
                // Reads fill it: more is coming than it holds.
                next_size = buf.capacity() * 2;
                Some(BytesMut::with_capacity(next_size))
            } else {
                Some(buf)
            }
        });
    }
    finish(w, sides).await
}

/// Polls `fut` once: its output if it is ready, `None` if it would wait (the waker stays
/// registered with the reader, so a later wait on it still wakes).
async fn ready_now<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        Poll::Ready(match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        })
    })
    .await
}

/// The reader ended: flush and half-close the writer.
async fn finish<W: AsyncWrite + Unpin>(w: &mut W, sides: (Side, Side)) -> End {
    if let Err(e) = w.flush().await {
        return End::Error(sides.1, e);
    }
    // Half-close: the peer learns that no more bytes come. A peer that is already gone is no
    // error of this direction.
    let _ = w.shutdown().await;
    End::Eof
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn counts_bytes_and_tells_which_side_ended_first() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let run = tokio::spawn(copy(client, upstream, Activity::new(), None));
        client_peer.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        upstream_peer.read_exact(&mut got).await.unwrap();
        upstream_peer.write_all(b"hi").await.unwrap();
        let mut got = [0u8; 2];
        client_peer.read_exact(&mut got).await.unwrap();
        drop(upstream_peer);
        // The client sees end of stream once the upstream closed.
        let mut rest = Vec::new();
        client_peer.read_to_end(&mut rest).await.unwrap();
        drop(client_peer);
        let report = run.await.unwrap();
        assert_eq!((report.client_bytes, report.upstream_bytes), (5, 2));
        assert!(
            matches!(report.first_end, Some((Side::Upstream, End::Eof, _))),
            "{report:?}"
        );
        assert!(!report.no_reply);
    }

    #[tokio::test]
    async fn bursts_small_and_large_arrive_whole_and_in_order() {
        let (client, mut client_peer) = duplex(64 * 1024);
        let (upstream, mut upstream_peer) = duplex(64 * 1024);
        let run = tokio::spawn(copy(client, upstream, Activity::new(), None));
        // Sizes around the idle buffer's and the busy buffer's capacities.
        let sizes = [
            1usize,
            63,
            64,
            65,
            1000,
            16 * 1024,
            16 * 1024 + 1,
            200_000,
            7,
        ];
        let mut sent = Vec::new();
        let mut got = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            let chunk: Vec<u8> = (0..*n).map(|j| (i * 31 + j) as u8).collect();
            let write = client_peer.write_all(&chunk);
            let mut part = vec![0u8; *n];
            let read = upstream_peer.read_exact(&mut part);
            let (w, r) = tokio::join!(write, read);
            w.unwrap();
            r.unwrap();
            sent.extend_from_slice(&chunk);
            got.extend_from_slice(&part);
        }
        assert_eq!(got, sent);
        drop(client_peer);
        let mut rest = Vec::new();
        upstream_peer.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        drop(upstream_peer);
        let report = run.await.unwrap();
        assert_eq!(report.client_bytes, sent.len() as u64);
        assert_eq!(report.upstream_bytes, 0);
    }

    #[tokio::test]
    async fn a_bulk_stream_through_growing_buffers_arrives_whole() {
        // A pipe far larger than the first busy buffer: reads fill it, and it grows to the cap.
        let (client, mut client_peer) = duplex(1024 * 1024);
        let (upstream, mut upstream_peer) = duplex(1024 * 1024);
        let run = tokio::spawn(copy(client, upstream, Activity::new(), None));
        let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let write = async {
            upstream_peer.write_all(&data).await.unwrap();
            drop(upstream_peer);
        };
        let mut got = Vec::new();
        let read = client_peer.read_to_end(&mut got);
        let ((), r) = tokio::join!(write, read);
        r.unwrap();
        assert!(
            got == data,
            "{} bytes of {} arrived, or out of order",
            got.len(),
            data.len()
        );
        drop(client_peer);
        let report = run.await.unwrap();
        assert_eq!(report.upstream_bytes, data.len() as u64);
    }

    /// Two connected loopback sockets.
    pub(in crate::proxy) async fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn a_bulk_stream_between_two_sockets_arrives_whole() {
        // client_peer ⇄ [client | copy | upstream] ⇄ upstream_peer, all loopback sockets.
        let (mut client_peer, client) = socket_pair().await;
        let (upstream, mut upstream_peer) = socket_pair().await;
        let run = tokio::spawn(copy(client, upstream, Activity::new(), None));
        client_peer.write_all(b"GET /bulk\r\n").await.unwrap();
        let mut request = [0u8; 11];
        upstream_peer.read_exact(&mut request).await.unwrap();
        let data: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let write = async {
            upstream_peer.write_all(&data).await.unwrap();
            upstream_peer.shutdown().await.unwrap();
            upstream_peer
        };
        let mut got = Vec::new();
        let read = client_peer.read_to_end(&mut got);
        let (upstream_peer, r) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(write, read) })
                .await
                .unwrap();
        r.unwrap();
        assert!(
            got == data,
            "{} of {} bytes, or out of order",
            got.len(),
            data.len()
        );
        drop((client_peer, upstream_peer));
        let report = run.await.unwrap();
        assert_eq!(report.client_bytes, 11);
        assert_eq!(report.upstream_bytes, data.len() as u64);
        // The bulk direction went by splice(2): its pipe is back in this thread's cache.
        #[cfg(target_os = "linux")]
        assert!(crate::proxy::splice::cached_pipes() >= 1);
    }

    #[tokio::test(start_paused = true)]
    async fn short_messages_between_two_sockets_arrive_after_quiet_spells() {
        // Each direction goes idle (its buffer given back after KEEP_BUFFER) between messages and
        // waits on the bare socket's readiness alone; every message still arrives whole.
        let (mut client_peer, client) = socket_pair().await;
        let (upstream, mut upstream_peer) = socket_pair().await;
        let run = tokio::spawn(copy(client, upstream, Activity::new(), None));
        let mut sent = 0u64;
        for (i, n) in [1usize, 63, 64, 65, 5000, 16 * 1024 + 3]
            .into_iter()
            .enumerate()
        {
            let up: Vec<u8> = (0..n).map(|j| (i * 7 + j) as u8).collect();
            client_peer.write_all(&up).await.unwrap();
            let mut got = vec![0u8; n];
            upstream_peer.read_exact(&mut got).await.unwrap();
            assert_eq!(got, up, "message {i} upstream");
            let down: Vec<u8> = up.iter().rev().copied().collect();
            upstream_peer.write_all(&down).await.unwrap();
            let mut got = vec![0u8; n];
            client_peer.read_exact(&mut got).await.unwrap();
            assert_eq!(got, down, "message {i} back");
            sent += n as u64;
            tokio::time::sleep(KEEP_BUFFER * 2).await;
        }
        drop((client_peer, upstream_peer));
        let report = run.await.unwrap();
        assert_eq!((report.client_bytes, report.upstream_bytes), (sent, sent));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tls_hello_without_any_reply_gives_up_at_the_limit() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, _upstream_peer) = duplex(1024);
        let run = tokio::spawn(copy(
            client,
            upstream,
            Activity::new(),
            Some(Duration::from_secs(10)),
        ));
        client_peer.write_all(&[0x16, 3, 1, 0, 1, 0]).await.unwrap();
        let report = run.await.unwrap();
        assert!(report.no_reply);
        assert_eq!(report.upstream_bytes, 0);
        assert!(report.duration >= Duration::from_secs(10));

        // Not TLS: the limit does not apply (a plain protocol may wait for its server).
        let (client, mut client_peer) = duplex(1024);
        let (upstream, upstream_peer) = duplex(1024);
        let run = tokio::spawn(copy(
            client,
            upstream,
            Activity::new(),
            Some(Duration::from_secs(10)),
        ));
        client_peer.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_secs(20)).await;
        drop(upstream_peer);
        drop(client_peer);
        let report = run.await.unwrap();
        assert!(!report.no_reply);
    }
}
