//! rproxy: an HTTP proxy pair that sends rsync deltas instead of whole
//! responses.
//!
//! ```text
//!  user agent ──► client proxy ══ hsync/1 ══► accelerator ──► origin
//!                 (cache, basis,              (diffs the fresh body
//!                  rebuild, verify)            against the client's
//!                                              basis signature)
//! ```
//!
//! The map, from the bottom up:
//!
//! - [`hsync`]: the wire codec, sans-IO (format, frames, signatures,
//!   matcher, [`hsync::Encoder`], [`hsync::Decoder`]).
//! - [`http`]: the HTTP layer both roles share: accept loop and connections,
//!   framing guards, headers (`Via` read and written once), proxy auth, TLS,
//!   inetd, connecting upstream under an address policy, host patterns,
//!   `Forwarded`, the body pipe, spooled bodies and the transfer memory
//!   budget.
//! - [`cache`]: the client proxy's disk store, keys, basis choice, and the
//!   RFC 9111 freshness rules (pure).
//! - [`queue`]: fair upload slots (PARQ, Active Queueing), sans-IO.
//! - [`accelerator`]: the role in front of origins: routes by site (or as
//!   a parent, to the whole web), encodes for clients offering hsync; its
//!   coder, basis store, pacing and upload slots.
//! - [`client_proxy`]: the role near users: serves from the cache, routes
//!   each host upstream or direct, offers a basis, rebuilds, verifies and
//!   stores; tunnels CONNECT; codes for client proxies behind it.
//! - [`admin`]: the admin listener: Prometheus metrics, a status page.
//! - [`config`]: each role's settings (TOML file and flags, one unit syntax).
//! - [`cli`]: the `rproxy` subcommands over the above.
//! - [`demo`]: `rproxy demo` and its static origin.
//! - [`expiring`]: a map whose entries expire by age, used by several layers.
//! - [`feed`]: the change feed (ANTACID-style CSNs): the accelerator's
//!   logs, pulls, pushes; a client proxy replicates zones from it.
//! - [`logging`]: the diagnostic log's set-up and level (the access log is
//!   [`http::access_log`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod accelerator;
pub mod admin;
pub mod cache;
pub mod cli;
pub mod client_proxy;
pub mod config;
pub mod demo;
pub mod expiring;
pub mod feed;
pub mod hsync;
pub mod http;
pub mod logging;
pub mod queue;
