//! poolgate: an HTTP forward-proxy gateway that pools upstream proxies.
//!
//! Clients point `HTTP_PROXY`/`HTTPS_PROXY` at the gateway; for every request it leases an
//! upstream from a pool (sticky per session when asked), forwards through it, records the outcome,
//! and shows it all on an admin listener.
//!
//! # Layout
//! - [`config`]: the TOML file → a validated [`config::Config`].
//! - [`app`]: builds the shared [`state::Gateway`], binds listeners, owns shutdown.
//! - [`shutdown`]: signals and what each one means.
//! - [`reload`]: config reload (SIGHUP, `POST /admin/reload`) without dropping work.
//! - [`server`]: accept loop (connection limits) and per-connection hyper service.
//! - [`limits`]: connection limits, idle timeouts, request body limit.
//! - [`accounting`]: accepted = completed + rejected + failed + in flight.
//! - [`admit`]: client allowlist and target policy (ports, internal addresses, own listeners).
//! - [`auth`]: proxy credentials against argon2 hashes, with a cache of successful checks.
//! - [`session`]: session key, pool and lifetime from headers and proxy usernames.
//! - [`proxy`]: the request path: [`proxy::forward`] (absolute-form), [`proxy::tunnel`]
//!   (CONNECT), [`proxy::framing`] (what is refused so nothing is framed two ways),
//!   [`proxy::headers`] (hygiene), [`proxy::observe`] (lease held while the body streams),
//!   [`proxy::pipe`] (the tunnel copy that knows who closed and who sent what).
//! - [`pool`]: pools, [`pool::select`] (which upstream), [`pool::ring`] (sticky placement: consistent hashing),
//!   [`pool::lease`].
//! - [`ratelimit`]: per-instance rate limits per upstream, upstream × target and user.
//! - [`store`]: the [`store::Store`] interface and its backends: [`store::memory`] (embedded)
//!   and [`store::redis`] (shared by instances; one Lua script of `lua/` per decision).
//! - [`upstream`]: upstream URLs and ids, [`upstream::connect`] (http/https/socks5/direct),
//!   [`upstream::reuse`] (keep-alive), [`upstream::tls`].
//! - [`health`]: [`health::classify`] (outcomes, captcha sniffing), [`health::state`] (the
//!   per-upstream state machine), [`health::blame`] (per-target stats, incidents),
//!   [`health::engine`] (per pool: guards and allocator changes).
//! - [`sources`]: upstream lists that change at run time (`upstreams_file`, `upstreams_url`),
//!   candidates admitted by probe, unlisted members drained; [`sources::list`] (the line format),
//!   [`sources::fetch`] (the URL).
//! - [`probe`]: active probes: [`mod@probe::check`] (one request to a control target through an
//!   upstream), [`probe::prober`] (the background scheduler: recovery, idle and dead upstreams,
//!   probe incidents, one prober per pool across instances).
//! - [`admin`]: `/status`, `/metrics`, `/dashboard`, `/healthz`, `/readyz`, admin actions, and
//!   the `poolgate status` client.
//! - [`intercept`]: opt-in TLS interception on CONNECT: [`intercept::ca`] (the CA),
//!   [`intercept::certs`] (leaf certificates, LRU), [`intercept::relay`] (HTTP/1.1 relayed and
//!   classified inside the tunnel).
//! - [`feedback`]: `POST /feedback`, outcomes reported by clients of opaque tunnels.
//! - [`error`]: the one error type and its one error → response function.
//!
//! # Request flow
//! `server (limits) → proxy::handle (framing) → admit (client) → session → auth → admit
//! (target) → pool::select (ratelimit) → store::acquire → upstream::connect (resolved-address policy) →
//! proxy::{forward | tunnel [→ intercept::relay]} → health::classify → store::release`
//!
//! Background tasks (each cancelled on shutdown): the health tick (cool-downs), the prober, the
//! upstream lists, the mirror of other instances' member settings, and the idle-connection
//! sweeper.

#![forbid(unsafe_code)]

pub mod accounting;
pub mod admin;
pub mod admit;
pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod error;
pub mod fast_map;
pub mod feedback;
pub mod health;
pub mod intercept;
pub mod limits;
pub mod metrics;
pub mod outcome;
pub mod password;
pub mod per_thread;
pub mod pool;
pub mod probe;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod sources;
pub mod state;
pub mod store;
pub mod store_url;
pub mod target;
pub mod upstream;
pub mod workers;
