//! A `redis-server` of the store benchmarks' own (`store_bench`, `filter_bench`), on a free
//! loopback port, without persistence, stopped on drop.

use std::error::Error;
use std::process::{Command, Stdio};
use std::time::Duration;

type BoxError = Box<dyn Error + Send + Sync>;

/// A `redis-server` on a free loopback port, killed on drop.
pub struct Server(std::process::Child, pub u16);

impl Server {
    pub fn start() -> Result<Server, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()?;
        let server = Server(child, port);
        for _ in 0..250 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not start".into())
    }

    /// Commands Redis has run so far (INFO stats `total_commands_processed`).
    #[allow(dead_code, reason = "store_bench does not count commands")]
    pub fn commands(&self) -> Result<u64, BoxError> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.1.to_string(), "INFO", "stats"])
            .output()?;
        let text = String::from_utf8(out.stdout)?;
        text.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .ok_or("no total_commands_processed")?
            .trim()
            .parse()
            .map_err(Into::into)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
