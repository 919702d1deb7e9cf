//! `redis-server` started by a test on a free loopback port, in a temp dir, without persistence
//! (`--save "" --appendonly no`), and killed when the fixture is dropped. Also a Redis Cluster
//! built from such servers (three masters, with or without a replica each), a master with
//! replicas watched by three sentinels, a TLS-only server, and small inspection helpers (commands
//! per client, MONITOR, cluster slot owners).
//!
//! Every wait is bounded; no fixed port is used (never 6379).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long a started server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Start attempts on fresh ports (another process may grab a port between pick and bind).
const START_ATTEMPTS: usize = 5;

pub struct RedisServer {
    port: u16,
    cluster: bool,
    /// More arguments (replica of, TLS files, sentinel, node timeout), kept for `restart`.
    extra: Vec<String>,
    /// Listens with TLS only: readiness is a TCP connect, commands go through `redis-cli --tls`.
    tls: Option<TlsFiles>,
    /// Runs as a sentinel (`sentinel.conf` in `dir`).
    sentinel: bool,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// The PEM files a TLS server was started with (paths in the server's temp dir).
#[derive(Clone)]
pub struct TlsFiles {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// How a server is started beyond the defaults.
#[derive(Clone, Default)]
pub struct Setup {
    pub cluster: bool,
    pub extra: Vec<String>,
    /// PEM contents (CA, certificate, key) for a TLS-only server; written to its temp dir.
    pub tls: Option<(String, String, String)>,
    /// Lines of a sentinel's `sentinel.conf` (the server is started with `--sentinel`).
    pub sentinel: Option<Vec<String>>,
}

/// A port on 127.0.0.1 that was free a moment ago; for a cluster node, its bus port
/// (port + 10000) too.
/// The gateway's Redis store on `url`, its keys under `prefix`, as instance `instance`, with a
/// generous store timeout (the machine may be busy).
pub fn redis_store(url: &str, prefix: &str, instance: &str) -> poolgate::store::AnyStore {
    use poolgate::store::redis::{RedisSettings, RedisStore};
    poolgate::store::AnyStore::Redis(
        RedisStore::new(RedisSettings {
            url: url.to_string(),
            timeout: Duration::from_secs(5),
            key_prefix: prefix.into(),
            instance_id: instance.into(),
            tls: Default::default(),
        })
        .unwrap(),
    )
}

fn pick_port(cluster: bool) -> u16 {
    for _ in 0..100 {
        let port = super::free_port();
        if !cluster {
            return port;
        }
        if port < 50_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn spawn(port: u16, server: &RedisServer) -> Child {
    let dir = server.dir.path();
    let mut cmd = Command::new("redis-server");
    if server.sentinel {
        cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
    }
    match &server.tls {
        None => cmd.args(["--port", &port.to_string()]),
        Some(files) => cmd
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .arg("--tls-ca-cert-file")
            .arg(&files.ca)
            .arg("--tls-cert-file")
            .arg(&files.cert)
            .arg("--tls-key-file")
            .arg(&files.key),
    };
    cmd.args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--daemonize", "no", "--loglevel", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if server.cluster {
        cmd.args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", "2000"]);
    }
    // Last, so that they override the defaults above.
    cmd.args(&server.extra);
    cmd.spawn()
        .expect("redis-server is installed (apt-get install redis-server)")
}

/// True once `127.0.0.1:port` answers PING with PONG.
async fn pong(port: u16) -> bool {
    let attempt = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.ok()?;
        Some(buf[..n].starts_with(b"+PONG"))
    };
    tokio::time::timeout(Duration::from_millis(500), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

impl RedisServer {
    /// A standalone server.
    pub async fn start() -> RedisServer {
        Self::start_with(false).await
    }

    async fn start_with(cluster: bool) -> RedisServer {
        Self::start_setup(Setup {
            cluster,
            ..Setup::default()
        })
        .await
    }

    /// A server started as `setup` says.
    pub async fn start_setup(setup: Setup) -> RedisServer {
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::tempdir().unwrap();
            let tls = setup.tls.as_ref().map(|(ca, cert, key)| {
                let files = TlsFiles {
                    ca: dir.path().join("ca.pem"),
                    cert: dir.path().join("server.pem"),
                    key: dir.path().join("server.key"),
                };
                std::fs::write(&files.ca, ca).unwrap();
                std::fs::write(&files.cert, cert).unwrap();
                std::fs::write(&files.key, key).unwrap();
                files
            });
            if let Some(lines) = &setup.sentinel {
                std::fs::write(dir.path().join("sentinel.conf"), lines.join("\n") + "\n").unwrap();
            }
            let port = pick_port(setup.cluster);
            let mut server = RedisServer {
                port,
                cluster: setup.cluster,
                extra: setup.extra.clone(),
                tls,
                sentinel: setup.sentinel.is_some(),
                child: None,
                dir,
            };
            server.child = Some(spawn(port, &server));
            if server.wait_ready().await {
                return server;
            }
        }
        panic!("redis-server did not start");
    }

    /// Waits until PING answers (a TLS server: until it accepts a connection), or the process
    /// died, or READY_TIMEOUT passed.
    async fn wait_ready(&mut self) -> bool {
        let steps = READY_TIMEOUT.as_millis() / 20;
        for _ in 0..steps {
            let ready = match self.tls {
                None => pong(self.port).await,
                Some(_) => TcpStream::connect(("127.0.0.1", self.port)).await.is_ok(),
            };
            if ready {
                return true;
            }
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server (SIGKILL: nothing is saved, clients see their connections drop).
    pub fn stop(&mut self) {
        self.kill();
    }

    /// Starts a fresh server on the same port (empty: persistence is off).
    pub async fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            self.child = Some(spawn(self.port, self));
            if self.wait_ready().await {
                return;
            }
            self.kill();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// SIGSTOP: the server keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    /// Runs `redis-cli -p <port> <args>` (with `--tls` for a TLS server) and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        match &self.tls {
            None => cli(self.port, args),
            Some(files) => {
                let mut all: Vec<&str> = vec!["--tls", "--cacert"];
                let ca = files.ca.to_string_lossy().into_owned();
                let (cert, key) = (
                    files.cert.to_string_lossy().into_owned(),
                    files.key.to_string_lossy().into_owned(),
                );
                all.push(&ca);
                // The server's own pair doubles as a client certificate from the same CA.
                all.extend(["--cert", &cert, "--key", &key]);
                all.extend(args);
                cli(self.port, &all)
            }
        }
    }

    /// The TLS files of a TLS-only server.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// `cmdstat_<name>` → calls, from `INFO commandstats`.
    pub fn command_calls(&self) -> HashMap<String, u64> {
        let info = self.cli(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_string(), calls.parse().ok()?))
            })
            .collect()
    }

    /// `addr` of every client whose name starts with `prefix` (from `CLIENT LIST`).
    pub fn client_addrs(&self, prefix: &str) -> Vec<String> {
        let list = self.cli(&["CLIENT", "LIST"]);
        list.lines()
            .filter_map(|l| {
                let field = |k: &str| {
                    l.split(' ')
                        .find_map(|f| f.strip_prefix(&format!("{k}=")))
                        .map(str::to_string)
                };
                let name = field("name")?;
                name.starts_with(prefix).then(|| field("addr")).flatten()
            })
            .collect()
    }

    /// Starts MONITOR on this server: every command any client sends, as it is executed.
    pub async fn monitor(&self) -> Monitor {
        Monitor::start(self.port).await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server would not die from SIGTERM; SIGKILL works either way.
        self.kill();
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli is installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Commands seen by MONITOR, collected in the background until dropped.
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    async fn start(port: u16) -> Monitor {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"MONITOR\r\n").await.unwrap();
        let mut reader = BufReader::new(s);
        let mut first = String::new();
        tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut first))
            .await
            .unwrap()
            .unwrap();
        assert!(first.starts_with("+OK"), "MONITOR answered {first}");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let task = tokio::spawn(async move {
            let mut line = String::new();
            // Bounded by the connection: ends when the server or this fixture goes away.
            while reader.read_line(&mut line).await.unwrap_or(0) > 0 {
                sink.lock().unwrap().push(line.trim_end().to_string());
                line.clear();
            }
        });
        Monitor { lines, task }
    }

    /// Forgets what was seen so far.
    pub fn clear(&self) {
        self.lines.lock().unwrap().clear();
    }

    /// Commands sent by clients at `addrs` (not those run inside scripts), upper-cased names.
    pub fn commands_from(&self, addrs: &[String]) -> Vec<String> {
        self.calls_from(addrs)
            .into_iter()
            .filter_map(|call| call.into_iter().next())
            .collect()
    }

    /// Like [`Monitor::commands_from`], each command with its arguments (as MONITOR quotes them;
    /// an argument holding a quote is cut there).
    pub fn calls_from(&self, addrs: &[String]) -> Vec<Vec<String>> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| {
                // `+1700000000.123456 [0 127.0.0.1:54321] "EVALSHA" "…" …`
                let start = l.find('[')?;
                let end = l[start..].find(']')? + start;
                let addr = l[start + 1..end].split(' ').nth(1)?;
                if !addrs.iter().any(|a| a == addr) {
                    return None;
                }
                let mut call: Vec<String> = l[end + 1..]
                    .trim()
                    .split('"')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect();
                let name = call.first_mut()?;
                *name = name.to_ascii_uppercase();
                Some(call)
            })
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Three cluster-enabled masters joined into one cluster, with or without one replica each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters, no replicas.
    pub async fn start() -> RedisCluster {
        Self::start_nodes(3, 0, &[]).await
    }

    /// Three masters and a replica of each, with `cluster-node-timeout` at `node_timeout_ms`:
    /// a master is failed over about two node timeouts after it died.
    pub async fn start_with_replicas(node_timeout_ms: u64) -> RedisCluster {
        let t = node_timeout_ms.to_string();
        Self::start_nodes(6, 1, &["--cluster-node-timeout", &t]).await
    }

    async fn start_nodes(count: usize, replicas: usize, extra: &[&str]) -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..count {
            nodes.push(
                RedisServer::start_setup(Setup {
                    cluster: true,
                    extra: extra.iter().map(|a| a.to_string()).collect(),
                    ..Setup::default()
                })
                .await,
            );
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let replicas = replicas.to_string();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        // Every node must agree the cluster is up, and every replica must have synced, before
        // clients use it.
        let want_replicas = count - 3;
        for _ in 0..500 {
            let up = cluster
                .nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if up && cluster.synced_replicas() == want_replicas {
                return cluster;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        panic!("the cluster did not come up");
    }

    /// Replicas whose link to their master is up.
    fn synced_replicas(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| {
                n.cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            })
            .count()
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The index in `nodes` of the master serving `key`'s slot, as the first live node sees it.
    pub fn master_of(&self, key: &str) -> Option<usize> {
        let asker = self.nodes.iter().find(|n| n.child.is_some())?;
        let slot: u16 = asker
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .ok()?;
        let nodes = asker.cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].split(',').any(|flag| flag == "master") || f[2].contains("fail")
            {
                continue;
            }
            let serves = f[8..].iter().any(|range| {
                let mut ends = range.split('-');
                let lo = ends.next().and_then(|v| v.parse::<u16>().ok());
                let hi = ends.next().and_then(|v| v.parse::<u16>().ok()).or(lo);
                matches!((lo, hi), (Some(lo), Some(hi)) if (lo..=hi).contains(&slot))
            });
            if serves {
                let port: u16 = f[1].split(['@', ':']).nth(1)?.parse().ok()?;
                return self.nodes.iter().position(|n| n.port() == port);
            }
        }
        None
    }
}

/// A master, its replicas and three sentinels watching it as `mymaster`, quorum 2.
pub struct SentinelGroup {
    /// The servers, the first one the master at start.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

/// The master name the sentinels know.
pub const SENTINEL_MASTER: &str = "mymaster";

impl SentinelGroup {
    /// `replicas` replicas; a master not answering for `down_after_ms` is failed over.
    pub async fn start(replicas: usize, down_after_ms: u64) -> SentinelGroup {
        let master = RedisServer::start().await;
        let mut servers = vec![master];
        let mport = servers[0].port().to_string();
        for _ in 0..replicas {
            servers.push(
                RedisServer::start_setup(Setup {
                    extra: vec!["--replicaof".into(), "127.0.0.1".into(), mport.clone()],
                    ..Setup::default()
                })
                .await,
            );
        }
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let lines = vec![
                format!("sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {mport} 2"),
                format!("sentinel down-after-milliseconds {SENTINEL_MASTER} {down_after_ms}"),
                format!("sentinel failover-timeout {SENTINEL_MASTER} 10000"),
                format!("sentinel parallel-syncs {SENTINEL_MASTER} 1"),
            ];
            sentinels.push(
                RedisServer::start_setup(Setup {
                    sentinel: Some(lines),
                    ..Setup::default()
                })
                .await,
            );
        }
        let group = SentinelGroup { servers, sentinels };
        // Bounded: until every replica is synced and every sentinel knows the others and the
        // replicas (a failover needs both).
        for _ in 0..500 {
            let synced = group.servers[1..].iter().all(|r| {
                r.cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            });
            let known = group.sentinels.iter().all(|s| {
                let info = s.cli(&["SENTINEL", "MASTER", SENTINEL_MASTER]);
                field_after(&info, "num-other-sentinels") == Some(2)
                    && field_after(&info, "num-slaves") == Some(replicas as u64)
            });
            if synced && known {
                return group;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        panic!("the sentinels did not settle");
    }

    /// `redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// The master's port as the first sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        let out = self.sentinels[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER]);
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// The server listening on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.servers.iter().find(|s| s.port() == port)
    }
}

/// In redis-cli's answer of alternating field and value lines, the number after `name`.
fn field_after(text: &str, name: &str) -> Option<u64> {
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() == name {
            return lines.next()?.trim().parse().ok();
        }
    }
    None
}
