//! poolgate: an HTTP forward-proxy gateway that pools upstream proxies.
//!
//! Clients point `HTTP_PROXY`/`HTTPS_PROXY` at the gateway; for every request it leases an
//! upstream from a pool (sticky per session when asked), forwards through it, records the outcome,
//! and shows it all on an admin listener.
//!
//! # Layout
//! Modules sit in layers and import only from layers below their own; the table is in
//! `docs/architecture.md` and `tests/architecture.rs` holds the code to it. Bottom up:
//! - foundation: [`body`], [`outcome`] (what happened to an exchange), [`target`] (canonical
//!   hosts), [`upstream`] (URLs and ids), [`session`] (header and username grammar),
//!   [`intercept`] (the interception CA and leaf certificates), [`socks5`] (the SOCKS5
//!   handshake's wire format), [`limits`], [`per_thread`],
//!   [`password`], [`store_url`], [`fast_map`], [`shutdown`].
//! - [`config`]: the TOML file → a validated [`config::Config`].
//! - domain: [`upstream::connect`] (http/https/socks5/direct), [`upstream::reuse`] (keep-alive),
//!   [`upstream::tls`]; [`store`] ([`store::memory`] embedded, [`store::redis`] shared, one Lua
//!   script of `lua/` per decision); [`health`] ([`health::classify`], [`health::state`] the
//!   per-upstream state machine, [`health::blame`] per-target stats and incidents,
//!   [`health::exit`] members grouped by measured exit IP,
//!   [`health::engine`]); [`ratelimit`]; [`auth`]; [`accounting`]; [`meter`] (bytes per member, pool, user);
//!   [`access_log`] (a line per request, written off the request path); [`history`] (the last
//!   hour in 10-second buckets); [`metrics`]; [`probe`]
//!   ([`mod@probe::check`], [`probe::status`]); [`sources`] ([`sources::list`],
//!   [`sources::fetch`]).
//! - decisions: [`error`] (the one error type, no HTTP), [`admit`] (client allowlist, target
//!   policy), [`pool`] ([`pool::ring`] sticky placement, [`pool::lease`]).
//! - [`state`]: `Gateway`, the shared handles; nothing below names it.
//! - pipeline: [`server`] (accept loops, connection limits), [`proxy`] ([`proxy::forward`],
//!   [`proxy::tunnel`], [`proxy::socks`] the SOCKS5 front door, [`proxy::inspect`],
//!   [`proxy::framing`], [`proxy::headers`], [`proxy::observe`], [`proxy::pipe`] (and
//!   `proxy::splice` on Linux),
//!   [`proxy::ledger`] (the access log's entry and byte counting on the request path),
//!   [`proxy::respond`] errors → responses),
//!   [`pool::select`].
//! - jobs: [`probe::prober`], [`sources::watch`], [`reload`].
//! - surfaces: [`admin`] (`/status`, `/metrics`, `/dashboard`, actions, the `poolgate status`
//!   client), [`feedback`].
//! - wiring: [`app`] (builds the state, binds listeners, owns shutdown), [`workers`].
//!
//! # Request flow
//! `server (limits) → proxy::handle (framing) → admit (client) → session → auth → admit
//! (target) → pool::select (ratelimit) → store::acquire → upstream::connect (resolved-address policy) →
//! proxy::{forward | tunnel [→ proxy::inspect]} → health::classify → pool::lease → store::release`,
//! and an error anywhere → `proxy::respond`. The SOCKS5 port: `server (limits) → proxy::socks
//! (handshake, login) → proxy::route_ask → … → proxy::tunnel::Carry`, the same from routing on.
//!
//! Background tasks (each cancelled on shutdown): the health tick (cool-downs), the prober, the
//! upstream lists, the mirror of other instances' member settings, and the idle-connection
//! sweeper.

#![forbid(unsafe_code)]

pub mod access_log;
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
pub mod history;
pub mod intercept;
pub mod limits;
pub mod meter;
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
pub mod socks5;
pub mod sources;
pub mod state;
pub mod store;
pub mod store_url;
pub mod target;
pub mod upstream;
pub mod workers;
