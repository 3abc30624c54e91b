//! The accept loop and per-connection HTTP/1.1 serving both roles share.
//! Per-connection code takes any `AsyncRead + AsyncWrite` (a TCP stream, or
//! inetd's stdin/stdout: [`crate::http::inetd`]), and a role is a [`Handler`].
//!
//! Over TLS ([`serve_tls`]), ALPN picks HTTP/2 or HTTP/1.1.
//!
//! This file is the map; every public item is re-exported here, so callers
//! name `rproxy::http::server::*` whichever file holds it:
//! - `accept.rs`: binding, the accept loop and its connection limit
//!   ([`bind`], [`serve`], [`serve_tls`]);
//! - `connection.rs`: one connection: the service (early refusals, then the
//!   role), HTTP/1.1 with its raw 400/408, TLS with HTTP/2
//!   ([`serve_connection`]);
//! - `io.rs`: the I/O wrappers under hyper: the framing guard (with the
//!   minimum upload rate of request bodies) and the idle watch;
//! - `upload_rate.rs`: that rate's arithmetic, sans-IO, and the timer
//!   both its readers use;
//! - `request_body.rs`: the request body a role reads ([`RequestBody`]),
//!   which holds an HTTP/2 stream's body to the minimum upload rate;
//! - `interim.rs`: 1xx heads forwarded ahead of a final response
//!   ([`InterimSender`], [`forward_interim`]);
//! - `refusal.rs`: what is refused before a role sees a request;
//! - `limits.rs`: [`ConnectionLimits`], the upstream pools' bounds, the
//!   open-file limit;
//! - `handler.rs`: the role's contract ([`Handler`]) and what travels in
//!   extensions;
//! - `body.rs`: the body types every role answers with, and [`counted`];
//! - `reloadable.rs`: a role swapped for a reconfigured one while it
//!   serves ([`Reloadable`]).

mod accept;
mod body;
mod connection;
mod handler;
mod interim;
mod io;
mod limits;
mod refusal;
mod reloadable;
mod request_body;
mod upload_rate;

pub use accept::{bind, serve, serve_tls};
pub(crate) use body::ReceiverStream;
pub use body::{BodyError, ProxyBody, counted, with_length};
pub use connection::serve_connection;
pub use handler::{ConnectionNumber, Handler, HoldConnection, KeepConnection, Peer};
pub use interim::{InterimSender, forward_interim};
pub use limits::{
    ConnectionLimits, IDLE_UPSTREAM_CONNECTIONS, IDLE_UPSTREAM_TIMEOUT, LiveLimits,
    raise_open_file_limit, upstream_client_builder, web_client_builder,
};
pub use refusal::{
    MalformedRequestBody, bad_request_body, malformed_request_body, slow_request_body, via_hops,
};
pub use reloadable::Reloadable;
pub use request_body::RequestBody;

/// Kept here for the roles that still choose their statuses themselves
/// (the client proxy, until it speaks
/// [`ProxyError`](crate::http::error::ProxyError)).
pub use crate::http::error::{json_response, text_response};
