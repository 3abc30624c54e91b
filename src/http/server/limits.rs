//! How much the HTTP layer lets a connection, a pool or the process hold:
//! [`ConnectionLimits`] (heads, targets, timeouts, the upload rate, hops,
//! connections, streams), the bounds of the pools that go upstream
//! ([`upstream_client_builder`]), and the open-file limit raised to what
//! `max_connections` needs ([`raise_open_file_limit`]). The numbers and
//! their defaults; enforcing them is the serving code's job.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Connection limits a reload may change ([`LiveLimits::set`]): each new
/// connection takes the ones in force when it is accepted, and the drain
/// the ones in force at the stop; `max_connections` stays that of the
/// start (it sizes the accept loop's slots).
#[derive(Debug, Clone)]
pub struct LiveLimits(Arc<RwLock<ConnectionLimits>>);

impl LiveLimits {
    /// `limits`, until [`LiveLimits::set`] changes them.
    pub fn new(limits: ConnectionLimits) -> LiveLimits {
        LiveLimits(Arc::new(RwLock::new(limits)))
    }

    /// The limits in force.
    pub fn get(&self) -> ConnectionLimits {
        *self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `limits` in force for the connections accepted from now on.
    pub fn set(&self, limits: ConnectionLimits) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = limits;
    }
}

impl From<ConnectionLimits> for LiveLimits {
    fn from(limits: ConnectionLimits) -> LiveLimits {
        LiveLimits::new(limits)
    }
}

/// Limits of the HTTP/1.1 connection layer, the same for both roles and
/// under inetd.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Time a client has to send a whole request head: 408, then close.
    /// hyper starts it when the connection waits for a request, so it is
    /// also how long an idle keep-alive connection stays open (closed
    /// then without a 408: the client sent nothing to answer).
    pub header_read_timeout: Duration,
    /// Largest request head, request line included (bytes): 431.
    pub max_head_bytes: usize,
    /// Most header fields in a request head: 431.
    pub max_headers: usize,
    /// Longest request target (bytes): 414.
    pub max_target_bytes: usize,
    /// Time without a byte moving either way, once a request is under way
    /// (a stalled upload, a user agent that stopped reading, an origin
    /// that went quiet mid-body): the connection is closed, with a 408
    /// first when a request body stalled before its answer began.
    pub idle_timeout: Duration,
    /// Least average rate of a request body (bytes per second; 0: none),
    /// as mod_reqtimeout's `MinRate`: a body may be waited for
    /// `header_read_timeout`, plus one second per this many bytes it
    /// brought; past that, 408 and close (L-8; over HTTP/2, 408 or a
    /// reset of that stream only). Only time spent waiting for the
    /// client's bytes counts, not time the role spends not reading them
    /// (a slow origin, a queue).
    pub min_upload_bytes_per_sec: u64,
    /// Most `Via` entries a request may carry: 508 beyond (P-15).
    pub max_hops: usize,
    /// Connections served at once; further ones wait in the listen
    /// backlog.
    pub max_connections: usize,
    /// Requests served at once on one HTTP/2 connection (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with
    /// REFUSED_STREAM, for the client to retry. With `max_connections`
    /// it bounds the responses in flight, each of which may hold an
    /// encoder and its buffers while its reader does not read (L-13).
    pub max_streams: u32,
    /// After a stop (SIGTERM, SIGINT): how long requests under way may take
    /// to finish, once no new connection is accepted and idle ones are
    /// closed.
    pub drain_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            max_head_bytes: 64 << 10,
            max_headers: 100,
            max_target_bytes: 8 << 10,
            idle_timeout: Duration::from_secs(60),
            // Apache's mod_reqtimeout default: a trickle of a few bytes a
            // second no longer holds a connection for ever, while a slow
            // mobile link (tens of KB/s) is far above it.
            min_upload_bytes_per_sec: 500,
            max_hops: 10,
            max_connections: 16 << 10,
            max_streams: 128,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Whether the server is stopping: connections then finish what is under
/// way and close (hyper's graceful shutdown), and idle ones close at once.
#[derive(Debug, Clone, Default)]
pub struct Draining(Option<tokio::sync::watch::Receiver<bool>>);

impl Draining {
    /// Draining once `stopping` says true, or its sender is gone.
    pub fn on(stopping: tokio::sync::watch::Receiver<bool>) -> Draining {
        Draining(Some(stopping))
    }

    /// Resolves when draining begins; never for [`Draining::default`] (one
    /// inetd connection, which ends with its peer).
    pub async fn started(self) {
        match self.0 {
            None => std::future::pending().await,
            Some(mut stopping) => {
                let _ = stopping.wait_for(|stopping| *stopping).await;
            }
        }
    }
}

/// Idle connections kept per upstream host (the origin, the accelerator):
/// each keeps the read buffer it grew to (up to [`UPSTREAM_READ_BUFFER`];
/// hyper's own bound is about 400 KiB), so the thousand idle connections
/// a burst left behind held hundreds of MiB (L-13, L-14). More than this
/// are closed when they fall idle.
pub const IDLE_UPSTREAM_CONNECTIONS: usize = 32;

/// How long an idle upstream connection is kept.
pub const IDLE_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Idle connections kept per host where the hosts are the whole web's (a
/// parent-mode site, a direct route): fewer and shorter, since a client
/// choosing the hosts can leave idle connections behind at every one.
pub const IDLE_CONNECTIONS_PER_WEB_HOST: usize = 4;

/// How long an idle connection to one of the web's hosts is kept.
pub const IDLE_WEB_HOST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most an upstream connection's read buffer grows to, and so the
/// largest response head an upstream may send. hyper's default lets it
/// grow to about 400 KiB after a large body and keeps it while the
/// connection idles in the pool: the 32 idle origin connections a burst
/// left behind held 12 MiB, a quarter of the accelerator's growth under
/// 200 stalled readers (L-8). Reads of 64 KiB keep the streaming rate; a
/// head is allowed as much as a client's (`--max-head`'s default), more
/// than nginx's `proxy_buffer_size` (4 or 8 KiB).
pub const UPSTREAM_READ_BUFFER: usize = 64 << 10;

/// A client builder for trips upstream, with the pool's bounds above.
pub fn upstream_client_builder() -> hyper_util::client::legacy::Builder {
    pooled_client_builder(IDLE_UPSTREAM_CONNECTIONS, IDLE_UPSTREAM_TIMEOUT)
}

/// A client builder for trips to hosts a client names (parent mode,
/// direct routes), with the smaller pool above.
pub fn web_client_builder() -> hyper_util::client::legacy::Builder {
    pooled_client_builder(IDLE_CONNECTIONS_PER_WEB_HOST, IDLE_WEB_HOST_TIMEOUT)
}

fn pooled_client_builder(per_host: usize, idle: Duration) -> hyper_util::client::legacy::Builder {
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder
        .pool_max_idle_per_host(per_host)
        .pool_idle_timeout(idle)
        .pool_timer(TokioTimer::new())
        .http1_max_buf_size(UPSTREAM_READ_BUFFER);
    builder
}

/// Raises the soft limit on open files to what `max_connections` needs
/// (as far as the hard limit allows); warns when that is not enough.
pub fn raise_open_file_limit(max_connections: usize) {
    // Each connection is one descriptor here and usually one upstream;
    // plus cache files and the runtime's own.
    let wanted = (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(256);
    match rlimit::increase_nofile_limit(wanted) {
        Ok(got) if got < wanted => tracing::warn!(
            open_files = got,
            max_connections,
            "the open-file limit is below what --max-connections needs; \
             accept will back off when it runs out (raise ulimit -n)"
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
}
