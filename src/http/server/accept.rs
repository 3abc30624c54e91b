//! The accept loop: binding a listener ([`bind`]), accepting on it until
//! shutdown, at most `max_connections` at once, and handing each connection
//! to its own task ([`serve`], [`serve_tls`]) with the limits in force
//! when it was accepted ([`LiveLimits`]). What happens on a
//! connection is `connection.rs`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use super::connection::{serve_connection_until, serve_tls_connection};
use super::handler::Handler;
use super::limits::{Draining, LiveLimits};

/// Accepts connections on `listener` until `shutdown` resolves, serving
/// each on its own task, at most `limits.max_connections` at once. Then
/// drains: no new connection is accepted, idle ones close, and requests
/// under way have `limits.drain_timeout` to finish before this returns.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: impl Into<LiveLimits>,
    shutdown: impl Future<Output = ()>,
) {
    accept_loop(listener, handler, limits.into(), None, shutdown).await;
}

/// [`serve`] over TLS with `config`: HTTP/2 or HTTP/1.1 by ALPN.
pub async fn serve_tls<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: impl Into<LiveLimits>,
    config: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(config);
    accept_loop(listener, handler, limits.into(), Some(acceptor), shutdown).await;
}

async fn accept_loop<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    live: LiveLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let max_connections = live.get().max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max_connections));
    let (stopping, draining) = tokio::sync::watch::channel(false);
    accept_until(
        &listener,
        &handler,
        &live,
        max_connections,
        &tls,
        &slots,
        &draining,
        shutdown,
    )
    .await;
    drop(listener);
    let _ = stopping.send(true);
    let everyone = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let open = max_connections - slots.available_permits();
    let drain_timeout = live.get().drain_timeout;
    if open > 0 {
        tracing::info!(connections = open, timeout = ?drain_timeout, "draining");
    }
    match tokio::time::timeout(drain_timeout, slots.acquire_many(everyone)).await {
        Ok(_) => tracing::info!("drained: every connection finished"),
        Err(_) => tracing::warn!(
            connections = max_connections - slots.available_permits(),
            "drain timeout: closing connections still open"
        ),
    }
}

#[allow(clippy::too_many_arguments)]
async fn accept_until<H: Handler>(
    listener: &TcpListener,
    handler: &Arc<H>,
    live: &LiveLimits,
    max_connections: usize,
    tls: &Option<TlsAcceptor>,
    slots: &Arc<Semaphore>,
    draining: &tokio::sync::watch::Receiver<bool>,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) {
    let mut failures = AcceptFailures::default();
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                tracing::warn!(
                    max = max_connections,
                    "connection limit reached; new connections wait in the backlog"
                );
                tokio::select! {
                    () = shutdown.as_mut() => return,
                    slot = slots.clone().acquire_owned() => slot.expect("never closed"),
                }
            }
        };
        tokio::select! {
            () = shutdown.as_mut() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    failures.succeeded();
                    let _ = stream.set_nodelay(true);
                    let limits = live.get();
                    let handler = handler.clone();
                    let draining = Draining::on(draining.clone());
                    let span = tracing::info_span!("conn", %peer);
                    // Each connection's future holds its slot. The two are
                    // spawned apart: a task reserves room for its whole
                    // future, and the TLS and HTTP/2 states are several
                    // KiB that a plain connection does not need.
                    match tls {
                        Some(acceptor) => tokio::spawn(
                            serve_tls_connection(
                                stream, peer, handler, limits, acceptor.clone(), draining, slot,
                            )
                            .instrument(span),
                        ),
                        None => tokio::spawn(
                            serve_connection_until(
                                stream, Some(peer), handler, limits, draining, Some(slot),
                            )
                            .instrument(span),
                        ),
                    };
                }
                Err(error) => {
                    // EMFILE and friends: back off rather than spin (L-6).
                    failures.failed(&error);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

/// How long the accept loop waits after a failed accept (EMFILE: no
/// descriptor left) before it tries again: the waiting connection keeps the
/// listener readable, so without a pause the loop would spin (Varnish's
/// `acceptor_sleep_max` is 50 ms too).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// While accept keeps failing, how often it is logged.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Failed accepts, logged when they start, then at most every
/// [`FAILURE_LOG_EVERY`] while they go on, and once when accept works
/// again: one line per retry would be twenty a second.
#[derive(Default)]
struct AcceptFailures {
    /// Failures since accept last worked.
    count: u64,
    /// Failures since the last line about them.
    unlogged: u64,
    last_logged: Option<Instant>,
}

impl AcceptFailures {
    fn failed(&mut self, error: &std::io::Error) {
        self.count += 1;
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= FAILURE_LOG_EVERY)
        {
            tracing::warn!(
                %error,
                failures = self.unlogged,
                "accept failed; retrying every 50 ms (\"Too many open files\": raise ulimit -n)"
            );
            self.unlogged = 0;
            self.last_logged = Some(now);
        }
    }

    fn succeeded(&mut self) {
        if self.count > 0 {
            tracing::info!(failures = self.count, "accept works again");
            *self = AcceptFailures::default();
        }
    }
}

/// Binds a listener with a backlog long enough for bursts of thousands of
/// connections (tokio's `bind` asks for 1,024; the kernel caps it at
/// `net.core.somaxconn`).
///
/// # Errors
/// The address cannot be bound.
pub fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Connections the kernel may queue before we accept them.
const LISTEN_BACKLOG: u32 = 4096;
