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
//! - [`server`]: accept loop and per-connection hyper service.
//! - [`admit`]: target policy (ports, internal addresses).
//! - [`session`]: session key, pool and lifetime from headers and proxy usernames.
//! - [`proxy`]: the request path: [`proxy::forward`] (absolute-form), [`proxy::tunnel`]
//!   (CONNECT), [`proxy::headers`] (hygiene), [`proxy::observe`] (lease held while the body
//!   streams), [`proxy::pipe`] (the tunnel copy that knows who closed and who sent what).
//! - [`pool`]: pools, [`pool::select`] (which upstream), [`pool::rendezvous`] (sticky placement),
//!   [`pool::lease`].
//! - [`store`]: the [`store::Store`] interface and its backends.
//! - [`upstream`]: upstream URLs and ids, [`upstream::connect`] (http/https/socks5/direct),
//!   [`upstream::reuse`] (keep-alive), [`upstream::tls`].
//! - [`health`]: outcomes of exchanges.
//! - [`intercept`]: opt-in TLS interception on CONNECT: [`intercept::ca`] (the CA),
//!   [`intercept::certs`] (leaf certificates, LRU), [`intercept::relay`] (HTTP/1.1 relayed and
//!   classified inside the tunnel).
//! - [`feedback`]: `POST /feedback`, outcomes reported by clients of opaque tunnels.
//! - [`admin`]: `/status`, `/healthz`, `/feedback`, and the `poolgate status` client.
//! - [`error`]: the one error type and its one error → response function.
//!
//! # Request flow
//! `server → proxy::handle → admit → session → pool::select → store::acquire →
//! upstream::connect → proxy::{forward | tunnel [→ intercept::relay]} → health::classify →
//! store::release`

#![forbid(unsafe_code)]

pub mod admin;
pub mod admit;
pub mod app;
pub mod config;
pub mod error;
pub mod feedback;
pub mod health;
pub mod intercept;
pub mod pool;
pub mod proxy;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod state;
pub mod store;
pub mod target;
pub mod upstream;
