//! Limits on what clients may hold: connections (in total and per client address), idle time of
//! keep-alive connections and tunnels, and request body size.
//!
//! - [`ClientConns`] admits a new connection or refuses it cleanly; connections already open are
//!   never touched by a refusal.
//! - [`Activity`] and [`Tracked`] record when bytes last moved on a stream and when its last
//!   request ended; [`idle`] resolves once a stream has been idle (and, for keep-alive
//!   connections, without a request in flight) for the timeout, and [`expired`] adds the deadline
//!   for a client's next request head. Time is tokio's, so the logic is tested on a paused clock.
//! - [`LimitedBody`] streams a request body through and fails it once it passes the limit, without
//!   buffering anything.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Boxed error for bodies the gateway produces or wraps.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------------------------
// Connections.

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `server.max_connections` are open.
    Total,
    /// This client address holds `server.max_connections_per_client`.
    PerClient,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Total => "max_connections",
            Refusal::PerClient => "max_connections_per_client",
        }
    }
}

#[derive(Default)]
struct ConnCounts {
    total: usize,
    per_client: HashMap<IpAddr, u32>,
}

/// Open client connections, in total and per client address.
#[derive(Default)]
pub struct ClientConns {
    counts: Mutex<ConnCounts>,
    refused: AtomicU64,
}

/// Holds one admitted connection; dropping it frees the slot.
pub struct ConnSlot {
    conns: Arc<ClientConns>,
    ip: IpAddr,
}

impl ClientConns {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Admits a connection from `ip` if both limits allow it.
    pub fn try_admit(
        self: &Arc<Self>,
        ip: IpAddr,
        max_total: usize,
        max_per_client: u32,
    ) -> Result<ConnSlot, Refusal> {
        let ip = ip.to_canonical();
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let refusal = if c.total >= max_total {
            Some(Refusal::Total)
        } else if c.per_client.get(&ip).copied().unwrap_or(0) >= max_per_client {
            Some(Refusal::PerClient)
        } else {
            None
        };
        if let Some(r) = refusal {
            drop(c);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(r);
        }
        c.total += 1;
        *c.per_client.entry(ip).or_insert(0) += 1;
        Ok(ConnSlot {
            conns: self.clone(),
            ip,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Connections refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.conns.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_client.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_client.remove(&self.ip);
            }
        }
    }
}

/// What a refused client is told before the connection closes.
pub fn refusal_response(r: Refusal) -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nx-pool-error: connection-limit\r\n\
         proxy-status: poolgate; error=connection_limit_reached; details=\"{} reached\"\r\n\
         connection: close\r\ncontent-length: 0\r\n\r\n",
        r.as_str()
    )
}

// ---------------------------------------------------------------------------------------------
// Activity and idleness.

struct ActivityInner {
    base: Instant,
    /// Milliseconds after `base` when bytes last moved.
    last_ms: AtomicU64,
    /// Requests in flight on the connection (a keep-alive connection is idle only at zero).
    busy: AtomicUsize,
    /// Milliseconds after `base` when the last request in flight ended (0: none has yet): the
    /// client's next request head is due `header_read_timeout` after it.
    free_ms: AtomicU64,
}

/// When bytes last moved on a stream, and whether a request is in flight on it.
#[derive(Clone)]
pub struct Activity(Arc<ActivityInner>);

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

impl Activity {
    pub fn new() -> Self {
        Activity(Arc::new(ActivityInner {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            free_ms: AtomicU64::new(0),
        }))
    }

    fn now_ms(&self) -> u64 {
        self.0.base.elapsed().as_millis() as u64
    }

    pub fn touch(&self) {
        self.0.last_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    /// Time since bytes last moved.
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.0.last_ms.load(Ordering::Relaxed));
        self.0.base.elapsed().saturating_sub(last)
    }

    /// Time since the last request in flight ended (or since the stream was opened).
    fn free_for(&self) -> Duration {
        let free = Duration::from_millis(self.0.free_ms.load(Ordering::SeqCst));
        self.0.base.elapsed().saturating_sub(free)
    }

    /// How long until `timeout` has passed since a moment `elapsed` ago (zero once it has), for
    /// deadlines that only run with no request in flight: all of `timeout` while one is.
    fn left(&self, timeout: Duration, elapsed: Duration) -> Duration {
        if self.is_busy() {
            timeout
        } else {
            timeout.saturating_sub(elapsed)
        }
    }

    /// How long until the stream has seen no bytes for `timeout` with no request in flight (zero
    /// once it has): the earliest moment an idle check can close it, so an active stream costs a
    /// timer per `timeout`, not a poll loop.
    pub fn idle_left(&self, timeout: Duration) -> Duration {
        self.left(timeout, self.idle_for())
    }

    /// Marks a request in flight until the guard is dropped.
    pub fn busy(&self) -> BusyGuard {
        self.0.busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard(self.clone())
    }

    pub fn is_busy(&self) -> bool {
        self.0.busy.load(Ordering::SeqCst) > 0
    }
}

/// A request in flight on a connection (see [`Activity::busy`]).
pub struct BusyGuard(Activity);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let inner = &self.0.0;
        let ms = self.0.now_ms();
        inner.last_ms.fetch_max(ms, Ordering::Relaxed);
        // Stored before the count drops, so whoever sees no request in flight sees when the last
        // one ended.
        inner.free_ms.store(ms, Ordering::SeqCst);
        inner.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a keep-alive client connection is to be closed (see [`expired`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No bytes moved for the idle timeout, with no request in flight.
    Idle,
    /// No request head completed within the head timeout after the last request ended.
    Head,
}

/// Resolves when a client connection is to be closed: [`Expiry::Head`] once no request has been
/// in flight for `head` (the client had that long to complete its next request head, however
/// slowly its bytes trickle in), [`Expiry::Idle`] once no bytes have moved for `idle` with no
/// request in flight (`None`: not checked, as while the connection is closing anyway).
///
/// The head deadline runs from the end of the last request, as hyper's own header-read timer
/// does, but costs one timer per connection and period instead of one armed and cleared for
/// every request head: requests only store a timestamp, and the timer re-arms lazily.
pub async fn expired(activity: &Activity, idle: Option<Duration>, head: Duration) -> Expiry {
    loop {
        let mut wait = activity.left(head, activity.free_for());
        if wait.is_zero() {
            return Expiry::Head;
        }
        if let Some(idle) = idle {
            let idle_left = activity.left(idle, activity.idle_for());
            if idle_left.is_zero() {
                return Expiry::Idle;
            }
            wait = wait.min(idle_left);
        }
        tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
    }
}

pin_project! {
    /// A stream that records its reads and writes in an [`Activity`].
    pub struct Tracked<T> {
        #[pin]
        inner: T,
        activity: Activity,
    }
}

impl<T> Tracked<T> {
    pub fn new(inner: T, activity: Activity) -> Self {
        activity.touch();
        Tracked { inner, activity }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    pub fn into_inner(self) -> T {
        self.inner
    }

    /// The tracker, for bytes moved around this stream (a tunnel's `splice(2)`).
    pub fn activity(&self) -> &Activity {
        &self.activity
    }
}

impl<T: AsyncRead> AsyncRead for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.inner.poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        r
    }
}

impl<T: AsyncWrite> AsyncWrite for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = this.inner.poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies.

/// Something to settle when a body ends: `ok` is false when it failed.
pub trait EndGuard: Send + 'static {
    fn end(self, ok: bool);
}

impl EndGuard for BusyGuard {
    fn end(self, _ok: bool) {}
}

pin_project! {
    /// A body that holds a guard until its last frame (or until it is dropped).
    pub struct Guarded<B, G> {
        #[pin]
        inner: B,
        guard: Option<G>,
    }
}

impl<B: Body, G: EndGuard> Guarded<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        let mut guard = Some(guard);
        if inner.is_end_stream() {
            // No body: hyper may never poll it.
            if let Some(g) = guard.take() {
                g.end(true);
            }
        }
        Guarded { inner, guard }
    }

    /// A body whose guard was settled before it was made (an error answer, already counted).
    pub fn settled(inner: B) -> Self {
        Guarded { inner, guard: None }
    }
}

impl<B: Body, G: EndGuard> Body for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let end = match &polled {
            Poll::Ready(None) => Some(true),
            Poll::Ready(Some(Err(_))) => Some(false),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => Some(true),
            _ => None,
        };
        if let Some(ok) = end {
            if let Some(g) = this.guard.take() {
                g.end(ok);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What went wrong with a client's request body, if anything; shared between the body (which
/// sees it) and the request path (which answers for it).
#[derive(Default)]
pub struct BodyFault(AtomicUsize);

impl BodyFault {
    const NONE: usize = 0;
    const TOO_LARGE: usize = 1;
    const BROKEN: usize = 2;

    pub fn too_large(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::TOO_LARGE
    }

    pub fn broken(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::BROKEN
    }

    fn set(&self, v: usize) {
        let _ = self
            .0
            .compare_exchange(Self::NONE, v, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// The body passed more than the allowed bytes.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {limit} bytes")]
pub struct TooLarge {
    pub limit: u64,
}

pin_project! {
    /// A request body streamed through with a byte limit; records in a [`BodyFault`] why it
    /// failed (too large, or the client's framing broke).
    pub struct LimitedBody<B> {
        #[pin]
        inner: B,
        seen: u64,
        limit: u64,
        fault: Arc<BodyFault>,
    }
}

impl<B> LimitedBody<B> {
    pub fn new(inner: B, limit: u64, fault: Arc<BodyFault>) -> Self {
        LimitedBody {
            inner,
            seen: 0,
            limit,
            fault,
        }
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.seen += data.len() as u64;
                    if *this.seen > *this.limit {
                        this.fault.set(BodyFault::TOO_LARGE);
                        return Poll::Ready(Some(Err(Box::new(TooLarge { limit: *this.limit }))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.fault.set(BodyFault::BROKEN);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// ---------------------------------------------------------------------------------------------
// Look-ahead.

/// At most this much of a request body is read ahead before anything is sent upstream.
pub const MAX_LOOKAHEAD_BYTES: u64 = 64 * 1024;
/// How long the look-ahead waits for each next frame: bodies that came with their head are all
/// there at once; a slow upload is not held up for longer than this.
pub const LOOKAHEAD_WAIT: Duration = Duration::from_millis(20);

/// Why the look-ahead refused a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookaheadFault {
    /// Broken framing (bad chunk size, chunk extension) in the part that had arrived.
    Malformed,
    /// Already larger than the limit.
    TooLarge,
}

pin_project! {
    /// A body whose first frames were read ahead: they are replayed, then the rest streams.
    /// When the look-ahead reached the end, the length is exact, so it is sent with
    /// `Content-Length`.
    pub struct ReadAhead<B> {
        frames: std::collections::VecDeque<Frame<Bytes>>,
        #[pin]
        rest: B,
        // The look-ahead saw the end of the body.
        complete: bool,
        len: u64,
        // Data bytes read ahead and not yet replayed.
        buffered: u64,
    }
}

/// Reads what has already arrived of `body` (up to [`MAX_LOOKAHEAD_BYTES`], waiting at most
/// [`LOOKAHEAD_WAIT`] for each frame), so that a malformed or oversized body that came with its
/// head is refused before anything is sent upstream.
pub async fn read_ahead<B>(mut body: B, limit: u64) -> Result<ReadAhead<B>, LookaheadFault>
where
    B: Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let mut frames = std::collections::VecDeque::new();
    let mut len = 0u64;
    let mut complete = body.is_end_stream();
    while !complete && len <= MAX_LOOKAHEAD_BYTES {
        match tokio::time::timeout(LOOKAHEAD_WAIT, body.frame()).await {
            Err(_) => break,
            Ok(None) => complete = true,
            Ok(Some(Err(_))) => return Err(LookaheadFault::Malformed),
            Ok(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    len += d.len() as u64;
                    if len > limit {
                        return Err(LookaheadFault::TooLarge);
                    }
                }
                frames.push_back(frame);
                complete = body.is_end_stream();
            }
        }
    }
    Ok(ReadAhead {
        frames,
        rest: body,
        complete,
        len,
        buffered: len,
    })
}

impl<B> Body for ReadAhead<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(f) = this.frames.pop_front() {
            if let Some(d) = f.data_ref() {
                *this.buffered -= d.len() as u64;
            }
            return Poll::Ready(Some(Ok(f)));
        }
        if *this.complete {
            return Poll::Ready(None);
        }
        this.rest.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && (self.complete || self.rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // What is still to come: the replayed frames plus the rest. (The inner body's own hint
        // no longer counts what was read ahead; hyper checks the total against Content-Length.)
        if self.complete {
            SizeHint::with_exact(self.buffered)
        } else {
            let rest = self.rest.size_hint();
            let mut hint = SizeHint::new();
            hint.set_lower(rest.lower() + self.buffered);
            if let Some(upper) = rest.upper() {
                hint.set_upper(upper + self.buffered);
            }
            hint
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn connection_limits_total_and_per_client() {
        let c = ClientConns::new();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = c.try_admit(a, 3, 2).unwrap();
        let _s2 = c.try_admit(a, 3, 2).unwrap();
        assert_eq!(c.try_admit(a, 3, 2).err(), Some(Refusal::PerClient));
        let _s3 = c.try_admit(b, 3, 2).unwrap();
        assert_eq!(c.try_admit(b, 3, 2).err(), Some(Refusal::Total));
        assert_eq!(c.open(), 3);
        assert_eq!(c.refused(), 2);
        drop(s1);
        assert!(c.try_admit(a, 3, 2).is_ok());
        // IPv4-mapped is the same client.
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        assert!(c.try_admit(mapped, 10, 1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_left_restarts_with_bytes_and_stands_still_while_busy() {
        let (client, server) = tokio::io::duplex(1024);
        let activity = Activity::new();
        let mut tracked = Tracked::new(server, activity.clone());
        let mut client = client;
        let timeout = Duration::from_secs(10);

        // Bytes every 6 s: never idle, and each restarts the full timeout.
        let mut buf = [0u8; 1];
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            assert_eq!(activity.idle_left(timeout), Duration::from_secs(4));
            client.write_all(b"x").await.unwrap();
            tracked.read_exact(&mut buf).await.unwrap();
            assert_eq!(activity.idle_left(timeout), timeout);
        }
        // A request in flight keeps it from being idle even without bytes.
        let busy = activity.busy();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(activity.idle_left(timeout), timeout);
        drop(busy);
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(activity.idle_left(timeout), Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(activity.idle_left(timeout), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_head_deadline_runs_from_the_last_request_whatever_bytes_trickle_in() {
        let (mut client, server) = tokio::io::duplex(1024);
        let activity = Activity::new();
        let mut tracked = Tracked::new(server, activity.clone());
        let (head, idle) = (Duration::from_secs(10), Some(Duration::from_secs(60)));
        let start = Instant::now();

        // A byte a second keeps the connection from being idle, not from missing its deadline.
        let trickle = async {
            let mut buf = [0u8; 1];
            for _ in 0..30 {
                client.write_all(b"x").await.unwrap();
                tracked.read_exact(&mut buf).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            why = expired(&activity, idle, head) => assert_eq!(why, Expiry::Head),
            _ = trickle => panic!("a head trickling in for 30 s was never cut off"),
        }
        assert_eq!(start.elapsed(), head);

        // A request in flight has no head deadline; the next one runs from its end.
        let busy = activity.busy();
        tokio::select! {
            _ = expired(&activity, idle, head) => panic!("expired with a request in flight"),
            _ = tokio::time::sleep(Duration::from_secs(45)) => {}
        }
        drop(busy);
        let t = Instant::now();
        assert_eq!(expired(&activity, idle, head).await, Expiry::Head);
        assert_eq!(t.elapsed(), head);

        // An idle timeout shorter than the head deadline closes first, and only when asked for.
        let busy = activity.busy();
        drop(busy);
        let t = Instant::now();
        let short = Some(Duration::from_secs(3));
        assert_eq!(expired(&activity, short, head).await, Expiry::Idle);
        assert_eq!(t.elapsed(), Duration::from_secs(3));
        assert_eq!(expired(&activity, None, head).await, Expiry::Head);
        assert_eq!(t.elapsed(), head);
    }

    #[tokio::test]
    async fn limited_body_fails_past_the_limit_and_says_why() {
        let fault = Arc::new(BodyFault::default());
        let body = LimitedBody::new(Full::new(Bytes::from(vec![0u8; 100])), 100, fault.clone());
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 100);
        assert!(!fault.too_large());

        let chunks = Chunks((0..5).map(|_| Bytes::from(vec![1u8; 30])).collect());
        let body = LimitedBody::new(chunks, 100, fault.clone());
        assert!(body.collect().await.is_err());
        assert!(fault.too_large());
    }

    /// A body of several data frames.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }
}
