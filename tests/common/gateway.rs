//! A poolgate instance started in-process on loopback ports chosen by the kernel.

use std::net::SocketAddr;
use std::time::Duration;

use poolgate::app::{self, Drained, Running, StartOptions};
use poolgate::config::Config;

use super::TestCa;

/// GET `path` of the admin listener at `admin`, never through a proxy: the status and the body.
pub async fn admin_get(admin: impl std::fmt::Display, path: &str) -> (u16, String) {
    let r = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(format!("http://{admin}{path}"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// GET `path` of the admin listener at `admin`, read as JSON.
pub async fn admin_json(admin: impl std::fmt::Display, path: &str) -> serde_json::Value {
    let (_, body) = admin_get(admin, path).await;
    serde_json::from_str(&body).unwrap()
}

pub struct TestGateway {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    running: Option<Running>,
}

impl TestGateway {
    /// Starts a gateway from config text without a `[server]` table; `server_extra` is added
    /// inside `[server]` (listen addresses are always 127.0.0.1:0).
    pub async fn start_with(server_extra: &str, rest: &str) -> TestGateway {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{server_extra}\n{rest}"
        );
        let config =
            Config::parse(&text, "test", None).unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
        Self::from_config(config).await
    }

    pub async fn start(rest: &str) -> TestGateway {
        Self::start_with("", rest).await
    }

    pub async fn from_config(config: Config) -> TestGateway {
        Self::from_config_with(config, StartOptions::default()).await
    }

    /// Full config text (listen addresses included) with start options (resolver, config path).
    pub async fn start_text_with(text: &str, options: StartOptions) -> TestGateway {
        let config =
            Config::parse(text, "test", None).unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
        Self::from_config_with(config, options).await
    }

    /// Starts from a config file, which `reload` re-reads.
    pub async fn start_file(path: &std::path::Path) -> TestGateway {
        let config = Config::load(path).unwrap_or_else(|e| panic!("{e}"));
        let options = StartOptions {
            config_path: Some(path.to_path_buf()),
            ..StartOptions::default()
        };
        Self::from_config_with(config, options).await
    }

    pub async fn from_config_with(config: Config, options: StartOptions) -> TestGateway {
        let running = app::start_with(config, options)
            .await
            .expect("gateway starts");
        TestGateway {
            proxy: running.proxy_addr,
            admin: running.admin_addr,
            running: Some(running),
        }
    }

    /// The SOCKS5 port (the config must set `server.socks_listen`).
    pub fn socks(&self) -> SocketAddr {
        self.running()
            .socks_addr
            .expect("server.socks_listen is set")
    }

    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy)
    }

    /// A proxy URL carrying a username (for username session tokens).
    pub fn proxy_url_as(&self, user: &str) -> String {
        format!("http://{user}:x@{}", self.proxy)
    }

    /// A client that sends everything through the gateway.
    pub fn client(&self) -> reqwest::Client {
        self.client_via(&self.proxy_url(), None)
    }

    /// A client through `proxy_url`, trusting `ca` for HTTPS origins when given.
    pub fn client_via(&self, proxy_url: &str, ca: Option<&TestCa>) -> reqwest::Client {
        let mut b = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(proxy_url).unwrap())
            .timeout(Duration::from_secs(20));
        if let Some(ca) = ca {
            b = b
                .add_root_certificate(ca.reqwest_cert())
                .tls_built_in_root_certs(false);
        }
        b.build().unwrap()
    }

    /// The admin `/status` document.
    pub async fn status(&self) -> serde_json::Value {
        admin_json(self.admin, "/status").await
    }

    /// The admin `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// `/status` figures of one upstream of one pool.
    pub async fn upstream_status(&self, pool: &str, id: &str) -> serde_json::Value {
        let status = self.status().await;
        status["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == pool)
            .and_then(|p| {
                p["upstreams"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|u| u["id"] == id)
            })
            .cloned()
            .unwrap_or_else(|| panic!("no upstream {id} in pool {pool}: {status}"))
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("gateway running")
    }

    /// `/status` request counters: (accepted, completed, rejected, failed, in_flight).
    pub async fn request_counts(&self) -> (u64, u64, u64, u64, u64) {
        let s = self.status().await;
        let r = &s["requests"];
        let n = |k: &str| {
            r[k].as_u64()
                .unwrap_or_else(|| panic!("no requests.{k} in {s}"))
        };
        (
            n("accepted"),
            n("completed"),
            n("rejected"),
            n("failed"),
            n("in_flight"),
        )
    }

    /// Shuts down and returns how it ended and how many leases were left live in the store.
    pub async fn shutdown_counting_leases(mut self) -> (Drained, u64) {
        let running = self.running.take().expect("gateway running");
        let gw = running.gateway().clone();
        let drained = running.shutdown().await;
        let mut left = 0;
        for pool in gw.pools.load().iter() {
            use poolgate::store::Store as _;
            let st = gw.store.status(pool.name()).await.unwrap();
            left += st.members.iter().map(|m| m.leases_live).sum::<u64>();
        }
        (drained, left)
    }

    pub async fn shutdown(mut self) -> Drained {
        match self.running.take() {
            Some(r) => r.shutdown().await,
            None => Drained::Clean,
        }
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(r) = &self.running {
            r.begin_shutdown();
        }
    }
}

/// The `poolgate` binary running as a child process (for signals and per-process memory).
pub struct GatewayProcess {
    pub child: tokio::process::Child,
    pub proxy: String,
    pub admin: String,
    /// Every log line after the listening one, collected until the process exits.
    pub log: tokio::task::JoinHandle<Vec<String>>,
    _dir: tempfile::TempDir,
}

impl GatewayProcess {
    /// Starts the binary on `config` (which should listen on 127.0.0.1:0) and waits for its
    /// `poolgate listening proxy=… admin=…` line.
    pub async fn spawn(config: &str) -> GatewayProcess {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .arg("--config")
            .arg(&path)
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let field = |line: &str, name: &str| {
            line.split(&format!("{name}="))
                .nth(1)
                .map(|rest| rest.split_whitespace().next().unwrap_or("").to_string())
        };
        let (proxy, admin) = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let (Some(p), Some(a)) = (field(&line, "proxy"), field(&line, "admin")) {
                    return (p, a);
                }
            }
            panic!("the gateway exited before listening");
        })
        .await
        .expect("the gateway logs its addresses");
        let log = tokio::spawn(async move {
            let mut all = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                all.push(line);
            }
            all
        });
        GatewayProcess {
            child,
            proxy,
            admin,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }
}
