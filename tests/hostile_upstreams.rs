//! Hostile upstreams: 40 malformed, oversized or truncated responses. Each gives the client a
//! clean 502 or a well-formed response (a body cut short ends with a close, never a reused,
//! half-framed connection), charges the upstream a failure, and the connection it came on is not
//! used again. The gateway keeps serving throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::TestGateway;
use common::raw_upstream::{RawUpstream, Script};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

/// (name, response bytes, close after writing)
fn cases() -> Vec<(&'static str, Vec<u8>, bool)> {
    let big = |n: usize| {
        format!(
            "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\nok",
            "a".repeat(n)
        )
    };
    let many = (0..300)
        .map(|i| format!("X-H{i}: {i}\r\n"))
        .collect::<String>();
    let s = |t: &str| t.as_bytes().to_vec();
    vec![
        (
            "status-letters",
            s("HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "status-4-digits",
            s("HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "status-missing",
            s("HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "bad-version",
            s("HTTX/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "version-2",
            s("HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        ("garbage", s("hello world\r\n\r\n"), false),
        ("empty-close", s(""), true),
        ("http09-body", s("ok"), true),
        ("status-line-only-close", s("HTTP/1.1 200 OK\r\n"), true),
        (
            "double-space-status",
            s("HTTP/1.1  200 OK\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "nul-in-header",
            s("HTTP/1.1 200 OK\r\nX-A: a\0b\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "header-no-colon",
            s("HTTP/1.1 200 OK\r\nX-A\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "obs-fold",
            s("HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok"),
            false,
        ),
        (
            "space-before-colon",
            s("HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok"),
            false,
        ),
        (
            "cl-te-conflict",
            s(
                "HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            ),
            false,
        ),
        (
            "te-cl-conflict",
            s(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            ),
            false,
        ),
        (
            "cl-cl-mismatch",
            s("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!"),
            false,
        ),
        (
            "cl-list-mismatch",
            s("HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok!"),
            false,
        ),
        (
            "cl-negative",
            s("HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok"),
            false,
        ),
        (
            "cl-letters",
            s("HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\nok"),
            false,
        ),
        (
            "cl-empty",
            s("HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nok"),
            false,
        ),
        (
            "cl-huge",
            s("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nok"),
            false,
        ),
        (
            "te-gzip",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok"),
            true,
        ),
        (
            "te-gzip-chunked",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
            false,
        ),
        (
            "te-twice",
            s(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            ),
            false,
        ),
        (
            "truncated-cl",
            s("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little"),
            true,
        ),
        (
            "truncated-chunked",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"),
            true,
        ),
        (
            "truncated-mid-chunk",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc"),
            true,
        ),
        ("truncated-head", s("HTTP/1.1 200 OK\r\nContent-Len"), true),
        (
            "bad-chunk-size",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n"),
            false,
        ),
        (
            "bad-chunk-later",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nqq\r\n0\r\n\r\n"),
            false,
        ),
        (
            "chunk-too-long",
            s("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokEXTRA\r\n0\r\n\r\n"),
            false,
        ),
        ("oversized-header", big(600 * 1024).into_bytes(), false),
        (
            "too-many-headers",
            format!("HTTP/1.1 200 OK\r\n{many}Content-Length: 2\r\n\r\nok").into_bytes(),
            false,
        ),
        (
            "bare-lf",
            s("HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
            false,
        ),
        (
            "bare-cr",
            s("HTTP/1.1 200 OK\rContent-Length: 2\r\r\nok"),
            false,
        ),
        (
            "switching-protocols",
            s(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: evil\r\nConnection: upgrade\r\n\r\nraw bytes",
            ),
            false,
        ),
        (
            "informational-then-garbage",
            s("HTTP/1.1 100 Continue\r\n\r\nnot http"),
            false,
        ),
        (
            "204-with-body",
            s("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
            false,
        ),
        (
            "close-delimited-body",
            s("HTTP/1.1 200 OK\r\n\r\nbody until close"),
            true,
        ),
    ]
}

/// Sends one proxy request with `Connection: close` and reads until the gateway closes.
async fn request(gw: &TestGateway) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(
        b"GET http://origin.test/x HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    for _ in 0..10_000 {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
    (out, false)
}

/// A clean 502, or a response whose framing is intact (or visibly cut short by the close).
fn judge(name: &str, bytes: &[u8]) -> &'static str {
    let mut hs = [httparse::EMPTY_HEADER; 128];
    let mut r = httparse::Response::new(&mut hs);
    let head = match r.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "{name}: not a response ({other:?}): {:?}",
            String::from_utf8_lossy(bytes)
        ),
    };
    let code = r.code.unwrap();
    let get = |k: &str| {
        r.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(k))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
    };
    if code == 502 {
        assert_eq!(
            get("x-pool-error").as_deref(),
            Some("upstream-bad-response"),
            "{name}"
        );
        return "502";
    }
    assert!(
        !(get("content-length").is_some() && get("transfer-encoding").is_some()),
        "{name}: both framings"
    );
    let body = &bytes[head..];
    if let Some(cl) = get("content-length") {
        let n: usize = cl.parse().unwrap();
        assert!(body.len() <= n, "{name}: more body than Content-Length");
        if body.len() < n {
            return "cut-short";
        }
    }
    "well-formed"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_upstream_responses_give_clean_502s() {
    common::init_tracing();
    let up = RawUpstream::start().await;
    let gw = TestGateway::start(&format!(
        "[pools.default]\nupstreams = [\"{}#raw\"]\nretries = 0\n",
        up.url()
    ))
    .await;
    let cases = cases();
    assert_eq!(cases.len(), 40);
    let mut tally = std::collections::BTreeMap::new();
    for (name, response, close) in &cases {
        up.set_script(Script {
            response: response.clone(),
            close: *close,
        });
        let (bytes, closed) = request(&gw).await;
        assert!(closed, "{name}: the client connection was not closed");
        let verdict = judge(name, &bytes);
        *tally.entry(verdict).or_insert(0) += 1;

        // The gateway still works, and not on the connection the bad response came on.
        let before = up.requests();
        up.set_script(Script {
            response: OK.as_bytes().to_vec(),
            close: false,
        });
        let (bytes, _) = request(&gw).await;
        assert!(
            String::from_utf8_lossy(&bytes).starts_with("HTTP/1.1 200"),
            "{name}: the next request failed: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        let after = up.requests();
        if verdict != "well-formed" {
            let bad_conn = before.last().copied();
            assert_ne!(after.last().copied(), bad_conn, "{name}: connection reused");
        }
    }
    eprintln!("hostile upstream verdicts: {tally:?}");
    assert!(tally.get("502").copied().unwrap_or(0) >= 30, "{tally:?}");
    // Failures were charged to the upstream.
    let st = gw.upstream_status("default", "raw").await;
    let outcomes = &st["outcomes"];
    let failures = ["reset", "upstream_error", "timeout", "connect_error"]
        .iter()
        .map(|k| outcomes[*k].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert!(failures >= 30, "{st}");
    let (accepted, completed, rejected, failed, in_flight) = gw.request_counts().await;
    assert_eq!(accepted, completed + rejected + failed + in_flight);
}

/// The class: a 1xx that reaches the gateway as a final answer to a request that asked for no
/// upgrade (a bare 101, a 101 with `Upgrade`, one after an interim 100, an unknown 1xx hyper
/// treats as final). Each ends in a 502 `upstream-bad-response`, is charged to the upstream, and
/// the connection it came on is dropped: the client never gets a raw pipe to the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrequested_protocol_switches_end_in_502() {
    common::init_tracing();
    let up = RawUpstream::start().await;
    let gw = TestGateway::start(&format!(
        "[pools.default]\nupstreams = [\"{}#raw\"]\nretries = 0\n",
        up.url()
    ))
    .await;
    let cases: [(&str, &str); 4] = [
        ("bare-101", "HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        (
            "101-upgrade-websocket",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x01\x05hello",
        ),
        (
            "100-then-101",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\nPRI * HTTP/2.0",
        ),
        (
            "101-with-length",
            "HTTP/1.1 101 Switching Protocols\r\nContent-Length: 2\r\n\r\nok",
        ),
    ];
    for (i, (name, response)) in cases.iter().enumerate() {
        up.set_script(Script {
            response: response.as_bytes().to_vec(),
            close: false,
        });
        let (bytes, closed) = request(&gw).await;
        assert!(closed, "{name}: the client connection was not closed");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("HTTP/1.1 502"), "{name}: {text:?}");
        assert_eq!(judge(name, &bytes), "502", "{name}");

        let before = up.requests();
        up.set_script(Script {
            response: OK.as_bytes().to_vec(),
            close: false,
        });
        let (bytes, _) = request(&gw).await;
        assert!(
            String::from_utf8_lossy(&bytes).starts_with("HTTP/1.1 200"),
            "{name}: the next request failed"
        );
        let after = up.requests();
        assert_ne!(
            after.last().copied(),
            before.last().copied(),
            "{name}: the switched connection was used again"
        );
        // Outcomes are recorded when the lease is released, which may finish just after the
        // response: polled for a bounded time.
        let mut st = serde_json::Value::Null;
        for _ in 0..100 {
            st = gw.upstream_status("default", "raw").await;
            if st["outcomes"]["upstream_error"].as_u64() == Some(i as u64 + 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            st["outcomes"]["upstream_error"].as_u64(),
            Some(i as u64 + 1),
            "{name}: not charged to the upstream: {st}"
        );
    }
}
