//! Request smuggling: a corpus of raw requests (tests/corpus/requests.txt) sent byte-exact over
//! TCP. Each one gets a 4xx and a close, or is forwarded framed canonically; the upstream never
//! parses more requests than the gateway forwarded, and never one it did not (zero smuggled).
//! Also: bytes pipelined after a CONNECT never go anywhere unless the upstream answered 2xx.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CORPUS: &str = include_str!("corpus/requests.txt");
/// How long one exchange may take before the test gives up on it.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

struct Entry {
    name: String,
    expect: String,
    bytes: Vec<u8>,
}

/// Parses the corpus: `=== name expect` headers, escaped bytes, placeholders.
fn corpus(authority: &str) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    for line in CORPUS.lines() {
        if let Some(head) = line.strip_prefix("=== ") {
            let mut parts = head.split_whitespace();
            entries.push(Entry {
                name: parts.next().unwrap().to_string(),
                expect: parts.next().unwrap().to_string(),
                bytes: Vec::new(),
            });
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else {
            let e = entries.last_mut().expect("bytes before the first entry");
            let line = line
                .replace("{U}", &format!("http://{authority}"))
                .replace("{T}", authority);
            e.bytes.extend(unescape(&expand(&line)));
        }
    }
    entries
}

fn expand(line: &str) -> String {
    let mut out = line.to_string();
    while let Some(start) = out.find("{REP:") {
        let end = start + out[start..].find('}').unwrap();
        let spec: Vec<&str> = out[start + 5..end].split(':').collect();
        let n: usize = spec[0].parse().unwrap();
        out = format!("{}{}{}", &out[..start], spec[1].repeat(n), &out[end + 1..]);
    }
    out
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            match b[i + 1] {
                b'r' => out.push(b'\r'),
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'\\' => out.push(b'\\'),
                b'x' => {
                    let hex = std::str::from_utf8(&b[i + 2..i + 4]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 2;
                }
                other => panic!("unknown escape \\{}", other as char),
            }
            i += 2;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Sends `bytes`, closes the write half, and reads until the gateway closes (bounded).
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8], half_close: bool) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A rejected request may close the connection before everything was written.
    let _ = s.write_all(bytes).await;
    if half_close {
        let _ = s.shutdown().await;
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + EXCHANGE_TIMEOUT;
    for _ in 0..100_000 {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
    (out, false)
}

/// One response read off the wire: status and headers.
struct Parsed {
    status: u16,
    headers: Vec<(String, String)>,
}

/// Splits the byte stream into responses using their own framing. Panics on anything that is not
/// a well-formed HTTP/1.1 response sequence.
fn responses(mut buf: &[u8], name: &str) -> Vec<Parsed> {
    let mut out = Vec::new();
    for _ in 0..100 {
        if buf.is_empty() {
            break;
        }
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        let head_len = match r.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!(
                "{name}: malformed response {other:?}: {:?}",
                String::from_utf8_lossy(buf)
            ),
        };
        let status = r.code.unwrap();
        let headers: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        buf = &buf[head_len..];
        let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if (100..200).contains(&status) {
            out.push(Parsed { status, headers });
            continue;
        }
        if let Some(cl) = get("content-length") {
            let n: usize = cl.parse().unwrap();
            assert!(buf.len() >= n, "{name}: truncated body");
            buf = &buf[n..];
        } else if get("transfer-encoding").is_some() {
            for _ in 0..10_000 {
                let line_end = buf.windows(2).position(|w| w == b"\r\n").unwrap();
                let size =
                    usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16)
                        .unwrap();
                buf = &buf[line_end + 2 + size + 2..];
                if size == 0 {
                    break;
                }
            }
        } else {
            buf = &[];
        }
        out.push(Parsed { status, headers });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_corpus_smuggles_nothing() {
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start_with(
        "max_header_bytes = 16384",
        &format!(
            "[policy]\nallow_targets = [\"127.0.0.1\"]\n[pools.default]\nupstreams = [\"{}\"]\n",
            upstream.url()
        ),
    )
    .await;
    let entries = corpus(&origin.authority());
    assert!(entries.len() >= 150, "corpus has {} entries", entries.len());

    let (mut rejected, mut forwarded_entries, mut forwarded_total) = (0, 0, 0);
    let mut wrong = Vec::new();
    for e in &entries {
        let up_before = upstream.requests() + upstream.connects();
        let fwd_before = gw.status().await["requests"]["forwarded"].as_u64().unwrap();
        let (bytes, closed) = exchange(gw.proxy, &e.bytes, true).await;
        let resps = responses(&bytes, &e.name);
        let finals: Vec<&Parsed> = resps.iter().filter(|r| r.status >= 200).collect();
        let ok = finals.iter().filter(|r| r.status == 200).count();
        for (i, r) in finals.iter().enumerate() {
            assert!(
                r.status == 200 || (400..500).contains(&r.status),
                "{}: status {}",
                e.name,
                r.status
            );
            if r.status == 200 {
                assert!(
                    r.headers.iter().any(|(k, _)| k == "x-pool-upstream"),
                    "{}",
                    e.name
                );
            } else {
                assert_eq!(i, finals.len() - 1, "{}: a response after a 4xx", e.name);
            }
        }
        assert!(closed, "{}: connection left open", e.name);
        let upstream_parsed = upstream.requests() + upstream.connects() - up_before;
        let fwd = gw.status().await["requests"]["forwarded"].as_u64().unwrap() - fwd_before;
        assert_eq!(
            upstream_parsed as u64,
            fwd,
            "{}: the upstream parsed {upstream_parsed} requests, the gateway forwarded {fwd}: {:?}",
            e.name,
            String::from_utf8_lossy(&bytes)
        );
        assert!(ok as u64 <= fwd, "{}", e.name);
        match e.expect.as_str() {
            "reject" => {
                if ok != 0 || finals.last().is_none_or(|r| r.status < 400) {
                    wrong.push(format!(
                        "{}: expected a rejection, got {ok} forwarded",
                        e.name
                    ));
                }
                rejected += 1;
            }
            "forward" => {
                if ok == 0 || ok != finals.len() {
                    wrong.push(format!(
                        "{}: expected forwarding: {:?}",
                        e.name,
                        String::from_utf8_lossy(&bytes)
                    ));
                }
                forwarded_entries += 1;
            }
            _ => {}
        }
        forwarded_total += fwd;
    }

    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Nothing smuggled: no upstream ever saw `/smuggled`, every upstream request was forwarded by
    // the gateway, and every forwarded request was framed one way only.
    for seen in upstream.seen() {
        assert!(
            !seen.target.contains("/smuggled"),
            "smuggled: {}",
            seen.target
        );
        let has = |h: &str| seen.header(h).is_some();
        assert!(
            !(has("content-length") && has("transfer-encoding")),
            "forwarded with both framings: {:?}",
            seen.headers
        );
        if let Some(te) = seen.header("transfer-encoding") {
            assert_eq!(te, "chunked");
        }
    }
    assert!(
        origin
            .requests()
            .iter()
            .all(|r| !r.path.contains("smuggled"))
    );
    assert_eq!(
        (upstream.requests() + upstream.connects()) as u64,
        forwarded_total
    );
    let (accepted, completed, rej, failed, in_flight) = gw.request_counts().await;
    assert_eq!(accepted, completed + rej + failed + in_flight);
    eprintln!(
        "corpus: {} entries, {rejected} rejected as expected, {forwarded_entries} forwarded as expected, {forwarded_total} requests forwarded; gateway accepted {accepted}",
        entries.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pipelined_after_connect_wait_for_a_2xx() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [\"{}\"]\nretries = 0\n",
        origin.port(),
        upstream.url()
    ))
    .await;
    let pipelined = format!(
        "CONNECT {a} HTTP/1.1\r\nHost: {a}\r\n\r\nGET /tunnelled HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n",
        a = origin.authority()
    );

    // The upstream refuses the CONNECT: the pipelined request goes nowhere.
    upstream.set_mode(ProxyMode::Fail502).await;
    let (bytes, closed) = exchange(gw.proxy, pipelined.as_bytes(), true).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 502"), "{text}");
    assert!(closed);
    assert_eq!(responses(&bytes, "refused").len(), 1, "{text}");
    assert_eq!(origin.request_count(), 0);

    // The upstream accepts: the same bytes arrive through the tunnel, after the 200.
    upstream.set_mode(ProxyMode::Normal).await;
    let (bytes, _) = exchange(gw.proxy, pipelined.as_bytes(), false).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let tunnel_reply = text.split_once("\r\n\r\n").unwrap().1;
    assert!(tunnel_reply.starts_with("HTTP/1.1 200"), "{text}");
    let reqs = origin.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/tunnelled");
}
