//! The HTTP layer both roles share: how a request arrives and is checked,
//! the header rules every hop follows, and how a body travels. A role is a
//! [`server::Handler`]; nothing here knows about deltas, caches or queues.
//!
//! - [`server`]: the accept loop, per-connection serving, limits, refusals.
//! - [`error`]: why a request was refused and who was at fault; the one
//!   place a refusal's status and log reason are chosen.
//! - [`inetd`]: the one connection on stdin/stdout.
//! - [`metrics`]: what both roles count alike: upstream latency, saved bytes.
//! - [`head_guard`], [`upstream_guard`]: HTTP/1.1 framing checked on the raw
//!   bytes, of requests and of upstream responses.
//! - [`headers`]: pure functions over header maps (hsync names, hop-by-hop,
//!   `Via` read and written in one place, `Max-Forwards`).
//! - [`auth`]: the users file and the gate in front of a role.
//! - [`tls`]: rustls configurations for both ends of the hsync link.
//! - [`dial`]: opening a connection upstream (resolve, the
//!   [`address_policy`], connect, TLS); [`host_pattern`]: the host names a
//!   site or a route answers to; [`forwarded`]: telling the origin who
//!   asked; [`health`]: whether an origin or upstream proxy is marked
//!   down after failing.
//! - [`body_pipe`]: the pipe a streamed body goes through (upstream reader,
//!   channels, slices to the reader, a spool for a stalled one), around
//!   each role's own work on the bytes.
//! - [`spool`], [`transfer_memory`]: a body parked on disk for a reader that
//!   stopped reading, and the budget streamed codings share.
//! - [`tunnel`]: a CONNECT's destination, and the byte relay of a tunnel
//!   either role opened.
//! - [`upstream_wait`]: how long an upstream may keep a request waiting
//!   for its head (from the last byte of the body it took).

pub mod access_log;
pub mod address_policy;
pub mod auth;
pub mod body_pipe;
pub mod dial;
pub mod error;
pub mod forwarded;
pub mod head_guard;
pub mod headers;
pub mod health;
pub mod host_pattern;
pub mod inetd;
pub mod metrics;
pub mod server;
pub mod spool;
pub mod tls;
pub mod transfer_memory;
pub mod tunnel;
pub mod upstream_guard;
pub mod upstream_wait;
