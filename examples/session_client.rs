//! A client that keeps one sticky session through poolgate.
//!
//! Every request carries `X-Pool-Session: <key>`, so all of them leave through the same upstream;
//! the gateway says which in `X-Pool-Upstream`. The first request asks the gateway to mint the key
//! (`X-Pool-Session: create`) and the rest reuse the key it returned.
//!
//! Run a gateway (`cargo run --release -- --config gateway.toml`), then:
//!
//! ```text
//! cargo run --example session_client -- http://127.0.0.1:8080 http://example.com/ 5
//! ```
//!
//! The same with curl:
//!
//! ```text
//! curl -sx http://127.0.0.1:8080 -H 'X-Pool-Session: create' -D - -o /dev/null http://example.com/
//! curl -sx http://127.0.0.1:8080 -H 'X-Pool-Session: <key from above>' -D - -o /dev/null http://example.com/
//! curl -sx http://user-session-abc:x@127.0.0.1:8080 https://example.com/   # username form, works for HTTPS
//! ```

use std::error::Error;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let gateway = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let url = args.next().unwrap_or_else(|| "http://example.com/".into());
    let count: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(5);

    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&gateway)?)
        .build()?;

    let first = client
        .get(&url)
        .header("X-Pool-Session", "create")
        .send()
        .await?;
    let key = first
        .headers()
        .get("x-pool-session")
        .ok_or("the gateway returned no X-Pool-Session")?
        .to_str()?
        .to_string();
    println!(
        "session {key}: {} via {:?}",
        first.status(),
        first.headers().get("x-pool-upstream")
    );

    for _ in 1..count {
        let resp = client
            .get(&url)
            .header("X-Pool-Session", &key)
            .send()
            .await?;
        println!(
            "session {key}: {} via {:?}",
            resp.status(),
            resp.headers().get("x-pool-upstream")
        );
    }
    Ok(())
}
