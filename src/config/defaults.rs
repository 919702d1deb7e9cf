//! Defaults and bounds of the config's values, shared by the sections that read them; the
//! captcha and probe ones sit with their sections.

pub const DEFAULT_PROXY_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";
pub const DEFAULT_POOL: &str = "default";
/// Shortest admin token (and read token) accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// How long a client may take to send a request head before the connection is closed.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Largest request head (request line + headers) accepted from a client.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
pub const MIN_MAX_HEADER_BYTES: usize = 8 * 1024;
/// Client connections served at once; connections past it are refused (503 and close).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;
/// Client connections one client address may hold at once; more are refused like the above.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: u32 = 1_000;
/// A keep-alive client connection with no request in flight and no bytes moving is closed after
/// this long (or after `header_read_timeout`, if shorter: hyper's head timer also runs while a
/// connection waits for its next request).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// A CONNECT tunnel with no bytes moving either way is closed after this long.
pub const DEFAULT_TUNNEL_IDLE_TIMEOUT_MS: u64 = 5 * 60_000;
/// Largest request body forwarded (bytes); bodies stream through, nothing is buffered.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 100 * 1024 * 1024;
/// Failed logins from one client address within `login_failure_window` before its logins are
/// refused for `login_lockout` without checking a password.
pub const DEFAULT_MAX_LOGIN_FAILURES: u32 = 10;
pub const DEFAULT_LOGIN_FAILURE_WINDOW_MS: u64 = 60_000;
pub const DEFAULT_LOGIN_LOCKOUT_MS: u64 = 60_000;
/// Longest failure window or lockout accepted.
pub const MAX_LOGIN_BACKOFF_MS: u64 = 24 * 3_600_000;
/// Longest user name accepted in `[auth.users]`.
pub const MAX_USER_NAME_LEN: usize = 128;
/// How long in-flight requests and tunnels get to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 30_000;
/// Bound on DNS + TCP + TLS + CONNECT/SOCKS handshake to an upstream.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Bound on waiting for an upstream's response head after the request was sent.
pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 60_000;
/// Idle keep-alive connections to upstreams are closed after this long.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_UPSTREAM_MAX_IDLE_PER_KEY: usize = 32;
/// More proxy worker threads than this is a typo, not a machine.
pub const MAX_WORKERS: usize = 1024;
pub const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_SESSION_TTL_MS: u64 = 10 * 60_000;
pub const MAX_SESSION_TTL_MS: u64 = 24 * 3_600_000;
/// A lease outlives the longest exchange; tunnels renew theirs while open.
pub const DEFAULT_LEASE_TTL_MS: u64 = 10 * 60_000;
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
pub const DEFAULT_RETRIES: u32 = 2;
/// How often `upstreams_url` is fetched again.
pub const DEFAULT_UPSTREAMS_URL_INTERVAL_MS: u64 = 10 * 60_000;
/// Fetching a list more often than this is hammering its provider.
pub const MIN_UPSTREAMS_URL_INTERVAL_MS: u64 = 10_000;
/// Admission probes in flight at once per pool: public lists are long and mostly dead, so more
/// than the idle probes' `concurrency`.
pub const DEFAULT_ADMISSION_CONCURRENCY: usize = 16;
pub const MAX_ADMISSION_CONCURRENCY: usize = 256;
pub const MAX_RETRIES: u32 = 10;
/// Store pools one pool may be spread over (`pools.<name>.shards`).
pub const MAX_SHARDS: u32 = 64;
/// Highest rate limit accepted (requests per second); one request per microsecond.
pub const MAX_RATE_LIMIT_PER_S: f64 = 1_000_000.0;
/// Requests that may pass at once before a rate limit spaces them; 1 spaces every request evenly.
pub const DEFAULT_RATE_LIMIT_BURST: u32 = 1;
pub const MAX_RATE_LIMIT_BURST: u32 = 1_000_000;
