//! The HTTP layer both roles share: how a request arrives and is checked,
//! the header rules every hop follows, and how a body travels. A role is a
//! [`server::Handler`]; nothing here knows about deltas, caches or queues.
//!
//! - [`headers`]: pure functions over header maps (hsync names, hop-by-hop,
//!   `Via` read and written in one place, `Max-Forwards`).

pub mod auth;
pub mod head_guard;
pub mod headers;
pub mod inetd;
pub mod server;
pub mod spool;
pub mod tls;
pub mod transfer_memory;
pub mod upstream_guard;
