//! `redis-server` started by a test on a free loopback port, in a temp dir, without persistence
//! (`--save "" --appendonly no`), and killed when the fixture is dropped. Also a three-node Redis
//! Cluster built from such servers, and small inspection helpers (commands per client, MONITOR).
//!
//! Every wait is bounded; no fixed port is used (never 6379).

use std::collections::HashMap;
use std::path::Path;
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
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// A port on 127.0.0.1 that was free a moment ago; for a cluster node, its bus port
/// (port + 10000) too.
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

fn spawn(port: u16, cluster: bool, dir: &Path) -> Child {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--daemonize", "no", "--loglevel", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if cluster {
        cmd.args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", "2000"]);
    }
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
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::tempdir().unwrap();
            let port = pick_port(cluster);
            let mut server = RedisServer {
                port,
                cluster,
                child: Some(spawn(port, cluster, dir.path())),
                dir,
            };
            if server.wait_ready().await {
                return server;
            }
        }
        panic!("redis-server did not start");
    }

    /// Waits until PING answers, or the process died, or READY_TIMEOUT passed.
    async fn wait_ready(&mut self) -> bool {
        let steps = READY_TIMEOUT.as_millis() / 20;
        for _ in 0..steps {
            if pong(self.port).await {
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
            self.child = Some(spawn(self.port, self.cluster, self.dir.path()));
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

    /// Runs `redis-cli -p <port> <args>` and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
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

/// Three cluster-enabled servers joined into one cluster (no replicas).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start() -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(RedisServer::start_with(true).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
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
        // Every node must agree the cluster is up before clients use it.
        for _ in 0..250 {
            if nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            {
                return RedisCluster { nodes };
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        panic!("the cluster did not come up");
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}
