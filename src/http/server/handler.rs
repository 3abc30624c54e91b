//! What a role is to the server ([`Handler`]) and what the server tells it
//! about a request's connection, in the request's extensions
//! ([`ConnectionNumber`], [`Peer`]) or the role tells the server on a
//! response ([`HoldConnection`]). The contract only: serving is
//! `connection.rs`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::{Request, Response};

use super::body::ProxyBody;
use super::request_body::RequestBody;

/// A role: turns a request into a response. Errors become responses inside
/// the handler; an error in the body stream aborts the connection so a
/// client never mistakes a cut body for a whole one.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request.
    fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send;

    /// Called once a connection, numbered as in its requests'
    /// [`ConnectionNumber`], has ended.
    fn connection_closed(&self, number: ConnectionNumber) {
        let _ = number;
    }

    /// Called once the server has stopped (drained, or the drain timeout
    /// passed), before the process exits: the last chance to save state.
    fn stopped(&self) {}

    /// SIGUSR1: log files are opened again under their names (after
    /// logrotate moved them).
    fn reopen_logs(&self) {}
}

/// A process-wide number for each connection, in its requests'
/// extensions: lets a role tell a held connection from a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionNumber(pub u64);

impl ConnectionNumber {
    pub(super) fn next() -> ConnectionNumber {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ConnectionNumber(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Set by a role on a response after which the client is expected to stay
/// silent on the connection for a while, and come back on it (a queued
/// reply on a held connection, PARQ Sq or Active Queueing): the next
/// request head may take this much longer than the header timeout, and
/// the idle timeout is stretched as much, instead of closing the
/// connection and losing the client's place.
#[derive(Debug, Clone, Copy)]
pub struct HoldConnection(pub Duration);

/// The connection a request came on, in its extensions: whoever takes the
/// connection over (a CONNECT tunnel, after `hyper::upgrade::on`) keeps
/// this until it is done with it, and the connection keeps its place under
/// `max-connections` until then (HTTP/1.1; an HTTP/2 stream's tunnel ends
/// with its connection).
#[derive(Debug, Clone)]
pub struct KeepConnection {
    /// Dropped with the last copy: the connection's task then lets go.
    /// A oneshot sender shared rather than an mpsc sender cloned: every
    /// connection makes one, and an mpsc channel allocates a block of 32
    /// slots (over 500 bytes, kept while the connection idles; L-5).
    _held: Arc<tokio::sync::oneshot::Sender<()>>,
}

impl KeepConnection {
    pub(super) fn new(held: tokio::sync::oneshot::Sender<()>) -> KeepConnection {
        KeepConnection {
            _held: Arc::new(held),
        }
    }
}

/// The address of the peer a request came from, in its extensions (absent
/// on inetd pipes). Failed logins are counted per peer address.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);
