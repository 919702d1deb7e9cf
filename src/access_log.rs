//! The access log: one line per client request (a forwarded request when its response has
//! ended, a tunnel when it closes), as JSON or Apache's combined format.
//!
//! Lines are written off the request path. A request fills an [`Entry`] as it goes (routing,
//! the upstream, the status, the outcome); the entry's last holder drops it (the handler, or the
//! lease at release), which hands a [`Record`] to a bounded queue without waiting. A writer
//! thread formats and writes the queue's lines in batches, flushing each, and rests briefly after
//! a batch that emptied the queue (so that a busy gateway does not wake it for every line). When the queue is
//! full the line is dropped and counted ([`AccessLog::dropped`]): traffic never waits for the
//! log. A file is reopened (for logrotate) when [`AccessLog::reopen`] is called: on SIGHUP and
//! SIGUSR1 (see `crate::shutdown`).
//!
//! A line never holds a password or an upstream's credentials: the user is the authenticated
//! name, upstream ids are redacted URLs, and the target is host:port without path or query.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::config::{AccessFormat, AccessTarget, LogConfig};
use crate::meter::Tap;
use crate::outcome::Outcome;

/// How long the writer sleeps between looks at a reopen request when no line comes.
const WRITER_WAKE: Duration = Duration::from_millis(250);
/// Lines written at most before a flush, when the queue keeps coming.
const MAX_BATCH_LINES: usize = 1024;
/// After a batch that emptied the queue, the writer rests this long before it looks again, so that
/// under load lines gather into batches: one write per rest instead of a wake-up of the writer
/// (and a system call) per request. A line is written at most this much later.
const BATCH_PAUSE: std::time::Duration = Duration::from_millis(20);

/// The access log's handle: the queue's sending side and its counters.
pub struct AccessLog {
    queue: SyncSender<Record>,
    format: AccessFormat,
    instance_id: Arc<str>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    written: AtomicU64,
    dropped: AtomicU64,
    /// Queued and not yet written (and flushed).
    pending: AtomicU64,
    reopen: AtomicBool,
}

/// The access log's figures for `/status`.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct AccessLogStats {
    pub enabled: bool,
    /// Lines written since start.
    pub lines_written: u64,
    /// Lines dropped since start because the writer fell behind (or could not write).
    pub lines_dropped: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("log.access: cannot open `{path}`: {source}")]
pub struct OpenError {
    path: PathBuf,
    source: std::io::Error,
}

impl AccessLog {
    /// Opens the log `config` asks for (none: `Ok(None)`) and starts its writer thread.
    pub fn start(config: &LogConfig, instance_id: &str) -> Result<Option<Arc<Self>>, OpenError> {
        let Some(target) = &config.access else {
            return Ok(None);
        };
        let sink = Sink::open(target)?;
        let (log, rx) = Self::queue(
            config.access_buffer_lines,
            config.access_format,
            instance_id,
        );
        let counts = log.counts.clone();
        let format = log.format;
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx, sink, format, &counts))
            .map_err(|source| OpenError {
                path: PathBuf::from("<writer thread>"),
                source,
            })?;
        Ok(Some(Arc::new(log)))
    }

    fn queue(capacity: usize, format: AccessFormat, instance_id: &str) -> (Self, Receiver<Record>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let log = AccessLog {
            queue: tx,
            format,
            instance_id: Arc::from(instance_id),
            counts: Arc::default(),
        };
        (log, rx)
    }

    /// Queues `record`, or drops and counts it when the queue is full.
    pub fn send(&self, record: Record) {
        self.counts.pending.fetch_add(1, Ordering::Relaxed);
        match self.queue.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.pending.fetch_sub(1, Ordering::Relaxed);
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Asks the writer to reopen its file before its next line (logrotate moved it away).
    pub fn reopen(&self) {
        self.counts.reopen.store(true, Ordering::Relaxed);
    }

    pub fn stats(&self) -> AccessLogStats {
        AccessLogStats {
            enabled: true,
            lines_written: self.counts.written.load(Ordering::Relaxed),
            lines_dropped: self.dropped(),
        }
    }

    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// Waits until every queued line is written and flushed, at most `within`; whether it was.
    pub async fn settle(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.counts.pending.load(Ordering::Relaxed) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// A new entry for a request from `client`, begun now.
    pub fn entry(
        self: &Arc<Self>,
        client: SocketAddr,
        method: &http::Method,
        version: http::Version,
        target: Option<String>,
    ) -> Arc<Entry> {
        Arc::new(Entry {
            log: self.clone(),
            at: SystemTime::now(),
            started: Instant::now(),
            client,
            method: method.as_str().into(),
            version,
            target,
            fields: Mutex::default(),
        })
    }
}

/// Where lines go.
enum Sink {
    Stderr,
    File {
        path: PathBuf,
        file: std::io::BufWriter<std::fs::File>,
    },
}

impl Sink {
    fn open(target: &AccessTarget) -> Result<Self, OpenError> {
        match target {
            AccessTarget::Stderr => Ok(Sink::Stderr),
            AccessTarget::File(path) => Ok(Sink::File {
                file: open_append(path)?,
                path: path.clone(),
            }),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stderr => std::io::stderr().lock().write_all(bytes),
            Sink::File { file, .. } => file.write_all(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Stderr => Ok(()),
            Sink::File { file, .. } => file.flush(),
        }
    }

    /// Opens the path again (the old file was moved away); keeps the old one when that fails.
    fn reopen(&mut self) {
        if let Sink::File { path, file } = self {
            let _ = file.flush();
            match open_append(path) {
                Ok(f) => {
                    *file = f;
                    tracing::info!(path = %path.display(), "access log reopened");
                }
                Err(e) => tracing::warn!(error = %e, "access log not reopened; writing on"),
            }
        }
    }
}

fn open_append(path: &PathBuf) -> Result<std::io::BufWriter<std::fs::File>, OpenError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(|f| std::io::BufWriter::with_capacity(64 * 1024, f))
        .map_err(|source| OpenError {
            path: path.clone(),
            source,
        })
}

/// The writer thread: formats and writes queued lines, flushing when the queue runs dry, until
/// every sender is gone.
fn write_lines(rx: Receiver<Record>, mut sink: Sink, format: AccessFormat, counts: &Counts) {
    let mut line = String::with_capacity(512);
    let mut batch = Vec::with_capacity(64 * 1024);
    loop {
        let first = match rx.recv_timeout(WRITER_WAKE) {
            Ok(r) => Some(r),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if counts.reopen.swap(false, Ordering::Relaxed) {
            sink.reopen();
        }
        let Some(first) = first else { continue };
        let mut n = 0u64;
        let mut next = Some(first);
        let mut drained = false;
        while let Some(record) = next {
            line.clear();
            record.format(format, &mut line);
            batch.extend_from_slice(line.as_bytes());
            n += 1;
            next = if n < MAX_BATCH_LINES as u64 {
                let r = rx.try_recv().ok();
                drained = r.is_none();
                r
            } else {
                None
            };
        }
        let result = sink.write(&batch).and_then(|()| sink.flush());
        batch.clear();
        match result {
            Ok(()) => counts.written.fetch_add(n, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, lines = n, "access log lines lost");
                counts.dropped.fetch_add(n, Ordering::Relaxed)
            }
        };
        counts.pending.fetch_sub(n, Ordering::Relaxed);
        if drained {
            std::thread::sleep(BATCH_PAUSE);
        }
    }
    let _ = sink.flush();
}

/// What a request's line says beyond its start, filled in as the request goes.
#[derive(Debug, Default)]
pub struct Fields {
    pub user: Option<Arc<str>>,
    pub session: Option<String>,
    pub pool: Option<String>,
    /// The label filter the request asked for (`country=us`), when it asked for one.
    pub label: Option<String>,
    /// The upstream's redacted id.
    pub upstream: Option<String>,
    pub status: Option<u16>,
    /// The outcome recorded at the lease's release.
    pub outcome: Option<Outcome>,
    /// The `X-Pool-Error` code of a response the gateway made itself.
    pub error: Option<&'static str>,
    /// Upstreams tried before the one that carried the request.
    pub retries: u32,
    /// The exchange's byte counts.
    pub tap: Option<Arc<Tap>>,
}

/// One request's line in the making; written when the last holder drops it.
pub struct Entry {
    log: Arc<AccessLog>,
    at: SystemTime,
    started: Instant,
    client: SocketAddr,
    method: Box<str>,
    version: http::Version,
    /// host:port, when the request named a usable one.
    target: Option<String>,
    fields: Mutex<Fields>,
}

impl Entry {
    /// Changes the fields (a lock taken a few times per request, never per chunk).
    pub fn update(&self, f: impl FnOnce(&mut Fields)) {
        f(&mut self.fields.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let f = std::mem::take(&mut *self.fields.lock().unwrap_or_else(|e| e.into_inner()));
        let bytes = f.tap.as_ref().map(|t| t.totals()).unwrap_or_default();
        let record = Record {
            time: self.at,
            client: self.client,
            user: f.user,
            session: f.session,
            pool: f.pool,
            label: f.label,
            upstream: f.upstream,
            target: self.target.take(),
            method: std::mem::take(&mut self.method).into_string(),
            version: version_str(self.version),
            status: f.status.unwrap_or(0),
            outcome: class(f.outcome, f.error),
            error: f.error,
            bytes_up: bytes.up,
            bytes_down: bytes.down,
            duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            retries: f.retries,
            instance: self.log.instance_id.clone(),
        };
        self.log.send(record);
    }
}

fn version_str(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// The outcome class of a line: what the upstream's exchange came to, or `gateway-error` when
/// the gateway answered itself without an exchange that judged anything.
pub fn class(outcome: Option<Outcome>, error: Option<&'static str>) -> &'static str {
    match (outcome, error) {
        (Some(o), _) if o.is_judgement() => o.class(),
        (_, Some(_)) => "gateway-error",
        (Some(_), None) => "cancelled",
        (None, None) => "ok",
    }
}

/// One line, as queued for the writer. Field names are a public contract (docs/operations.md,
/// "Access log").
#[derive(Debug)]
pub struct Record {
    /// When the request began; written RFC 3339 UTC with milliseconds (by the writer, off the
    /// request path, as every other formatting).
    pub time: SystemTime,
    pub client: SocketAddr,
    pub user: Option<Arc<str>>,
    pub session: Option<String>,
    pub pool: Option<String>,
    pub label: Option<String>,
    pub upstream: Option<String>,
    pub target: Option<String>,
    pub method: String,
    /// For the combined format's request line only.
    pub version: &'static str,
    /// The status the client got (0 when none was sent).
    pub status: u16,
    pub outcome: &'static str,
    pub error: Option<&'static str>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: f64,
    pub retries: u32,
    pub instance: Arc<str>,
}

/// Appends `s` as a JSON string.
fn json_str(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `,"key":` and the string or `null`.
fn json_field(out: &mut String, key: &str, value: Option<&str>) {
    out.push_str(",\"");
    out.push_str(key);
    out.push_str("\":");
    match value {
        Some(v) => json_str(out, v),
        None => out.push_str("null"),
    }
}

impl Record {
    /// Appends the line (with its newline) in `format` to `out`.
    pub fn format(&self, format: AccessFormat, out: &mut String) {
        use std::fmt::Write as _;
        match format {
            // Written by hand rather than through serde: the writer thread formats every line, and
            // this is a fixed shape of strings and numbers.
            AccessFormat::Json => {
                let _ = write!(
                    out,
                    "{{\"time\":\"{}\",\"client\":\"{}\"",
                    humantime::format_rfc3339_millis(self.time),
                    self.client
                );
                json_field(out, "user", self.user.as_deref());
                json_field(out, "session", self.session.as_deref());
                json_field(out, "pool", self.pool.as_deref());
                json_field(out, "label", self.label.as_deref());
                json_field(out, "upstream", self.upstream.as_deref());
                json_field(out, "target", self.target.as_deref());
                json_field(out, "method", Some(&self.method));
                let _ = write!(out, ",\"status\":{}", self.status);
                json_field(out, "outcome", Some(self.outcome));
                json_field(out, "error", self.error);
                let _ = write!(
                    out,
                    ",\"bytes_up\":{},\"bytes_down\":{},\"duration_ms\":{:.3},\"retries\":{}",
                    self.bytes_up, self.bytes_down, self.duration_ms, self.retries
                );
                json_field(out, "instance", Some(&self.instance));
                out.push('}');
            }
            AccessFormat::Combined => {
                let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
                let user = self.user.as_deref().unwrap_or("-");
                let time = humantime::format_rfc3339_millis(self.time).to_string();
                let _ = write!(
                    out,
                    "{} - {} [{}] \"{} {} {}\" {} {} \"-\" \"-\"",
                    self.client.ip(),
                    token(user),
                    clf_time(&time),
                    token(&self.method),
                    token(&dash(&self.target)),
                    self.version,
                    self.status,
                    self.bytes_down,
                );
                for (key, value) in [
                    ("pool", dash(&self.pool)),
                    ("upstream", dash(&self.upstream)),
                    ("outcome", self.outcome.to_string()),
                    ("error", self.error.unwrap_or("-").to_string()),
                    ("session", dash(&self.session)),
                    ("label", dash(&self.label)),
                    ("bytes_up", self.bytes_up.to_string()),
                    ("bytes_down", self.bytes_down.to_string()),
                    ("duration_ms", format!("{:.3}", self.duration_ms)),
                    ("retries", self.retries.to_string()),
                    ("instance", self.instance.to_string()),
                ] {
                    let _ = write!(out, " {key}={}", token(&value));
                }
            }
        }
        out.push('\n');
    }
}

/// A value as one space-free token of a combined line: bytes outside visible ASCII, quotes and
/// backslashes as `\xNN`.
fn token(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_graphic() && b != b'"' && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `2026-12-06T17:37:18.123Z` → `06/Dec/2026:17:37:18 +0000`.
fn clf_time(rfc3339: &str) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let part = |r: std::ops::Range<usize>| rfc3339.get(r).unwrap_or("00");
    let month = part(5..7)
        .parse::<usize>()
        .ok()
        .and_then(|m| MONTHS.get(m.wrapping_sub(1)))
        .unwrap_or(&"Jan");
    format!(
        "{}/{month}/{}:{} +0000",
        part(8..10),
        part(0..4),
        part(11..19)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            time: humantime::parse_rfc3339("2026-12-06T17:37:18.123Z").unwrap(),
            client: "127.0.0.1:5000".parse().unwrap(),
            user: Some("alice".into()),
            session: Some("s1".into()),
            pool: Some("default".into()),
            label: None,
            upstream: Some("http://up.test:8080".into()),
            target: Some("example.com:443".into()),
            method: "CONNECT".into(),
            version: "HTTP/1.1",
            status: 200,
            outcome: "ok",
            error: None,
            bytes_up: 517,
            bytes_down: 4096,
            duration_ms: 12.5,
            retries: 1,
            instance: "host-1-abcd".into(),
        }
    }

    #[test]
    fn a_json_line_holds_every_field() {
        let mut out = String::new();
        let mut r = record();
        r.session = Some("quote\" back\\ nl\n tab\t bell\u{7} é".into());
        r.format(AccessFormat::Json, &mut out);
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(out.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        for key in [
            "time",
            "client",
            "user",
            "session",
            "pool",
            "label",
            "upstream",
            "target",
            "method",
            "status",
            "outcome",
            "error",
            "bytes_up",
            "bytes_down",
            "duration_ms",
            "retries",
            "instance",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {out}");
        }
        assert_eq!(v["bytes_down"], 4096);
        assert_eq!(v["time"], "2026-12-06T17:37:18.123Z");
        assert_eq!(v["client"], "127.0.0.1:5000");
        assert_eq!(v["user"], "alice");
        assert_eq!(v["instance"], "host-1-abcd");
        assert_eq!(v["session"], "quote\" back\\ nl\n tab\t bell\u{7} é");
        assert_eq!(v["duration_ms"], 12.5);
        assert_eq!(v["status"], 200);
        assert!(v["error"].is_null());
        assert!(v["label"].is_null());
    }

    #[test]
    fn a_combined_line_starts_as_apache_writes_it() {
        let mut out = String::new();
        let mut r = record();
        r.user = Some("a b\"c".into());
        r.format(AccessFormat::Combined, &mut out);
        assert!(
            out.starts_with(
                "127.0.0.1 - a\\x20b\\x22c [06/Dec/2026:17:37:18 +0000] \"CONNECT example.com:443 HTTP/1.1\" 200 4096 \"-\" \"-\" pool=default upstream=http://up.test:8080 outcome=ok error=- session=s1 label=- bytes_up=517 bytes_down=4096 duration_ms=12.500 retries=1 instance=host-1-abcd"
            ),
            "{out}"
        );
        assert_eq!(out.lines().count(), 1);
    }

    #[test]
    fn classes_follow_the_outcome_then_the_gateways_own_error() {
        assert_eq!(class(Some(Outcome::Ok), None), "ok");
        assert_eq!(
            class(Some(Outcome::Timeout), Some("upstream-timeout")),
            "proxy-fault"
        );
        assert_eq!(class(Some(Outcome::Blocked), None), "origin-ban");
        assert_eq!(class(Some(Outcome::Captcha), None), "captcha");
        assert_eq!(class(Some(Outcome::OriginError), None), "origin-error");
        assert_eq!(
            class(Some(Outcome::Cancelled), Some("body-too-large")),
            "gateway-error"
        );
        assert_eq!(class(None, Some("auth-required")), "gateway-error");
        assert_eq!(class(Some(Outcome::Cancelled), None), "cancelled");
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        // No writer drains this queue: past its two places every line is dropped.
        let (log, _rx) = AccessLog::queue(2, AccessFormat::Json, "i");
        let log = Arc::new(log);
        for _ in 0..5 {
            let e = log.entry(
                "127.0.0.1:1".parse().unwrap(),
                &http::Method::GET,
                http::Version::HTTP_11,
                None,
            );
            drop(e);
        }
        assert_eq!(log.dropped(), 3);
        assert_eq!(log.stats().lines_dropped, 3);
    }
}
