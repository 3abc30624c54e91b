//! How both roles serve once configured: the one inetd connection on
//! stdin/stdout, or a listener (plain or TLS) until SIGTERM or SIGINT,
//! then draining what is under way.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

use crate::http::inetd::{Stdio, serve_stdio};
use crate::http::server::{
    ConnectionLimits, Handler, bind, raise_open_file_limit, serve, serve_tls,
};

/// Descriptor 0 when `--inetd` is given.
///
/// # Errors
/// When descriptor 0 is closed or cannot be duplicated.
pub(super) fn take_stdio(inetd: bool) -> anyhow::Result<Option<Stdio>> {
    inetd
        .then(Stdio::take)
        .transpose()
        .context("--inetd: cannot use descriptor 0")
}

/// Serves the one inetd connection on a single-threaded runtime (one
/// connection needs no more), then returns. Dropping the runtime waits for
/// blocking work still running, such as a cache commit.
pub(super) fn serve_one<H: Handler>(
    stdio: Stdio,
    handler: H,
    limits: ConnectionLimits,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime
        .block_on(async {
            survive_file_size_limit();
            serve_stdio(stdio, Arc::new(handler), limits).await
        })
        .context("cannot serve the connection on stdin")
}

/// Threads for blocking work (file I/O, coding steps, spooled pages),
/// beside one async worker per core: tokio's default of 512 let a thousand
/// readers that stopped reading, their pages written and read back, start
/// a hundred threads and more (L-13). Work past them queues; none of it
/// waits on other blocking work, so queueing cannot deadlock.
const BLOCKING_THREADS: usize = 64;

/// Listens on `listen` (over TLS with `tls`) and serves `handler` until
/// SIGTERM or SIGINT, then drains (`limits.drain_timeout`). `ready` runs once the listener is bound, inside the runtime,
/// with its address (to log, or to start the role's own tasks).
///
/// # Errors
/// The runtime cannot start or the address cannot be bound.
pub(super) fn serve_listener<H: Handler>(
    listen: SocketAddr,
    handler: H,
    limits: ConnectionLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    ready: impl FnOnce(SocketAddr, &H),
) -> anyhow::Result<()> {
    raise_open_file_limit(limits.max_connections);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        survive_file_size_limit();
        let listener = bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
        // Before "ready": a signal sent as soon as it is logged is ours.
        let stop = stop_signal()?;
        ready(listener.local_addr().unwrap_or(listen), &handler);
        let handler = Arc::new(handler);
        match tls {
            Some(tls) => serve_tls(listener, handler.clone(), limits, tls, stop).await,
            None => serve(listener, handler.clone(), limits, stop).await,
        }
        handler.stopped();
        tracing::info!("stopped");
        Ok(())
    })
}

/// Resolves at the first SIGTERM or SIGINT (the server then drains: see
/// [`serve`]). SIGHUP, which would end the process by default, is logged
/// and otherwise ignored until the configuration can be reloaded.
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::warn!(
                "SIGHUP: reloading the configuration is not supported yet; it stays as it was"
            );
        }
    });
    Ok(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(
            signal = name,
            "stopping: no new connections; requests under way may finish"
        );
    })
}

/// A write past the file-size limit (`ulimit -f`) raises SIGXFSZ, whose
/// default action kills the process. With a handler in place the write
/// fails with EFBIG instead, which the cache treats as a full disk
/// (responses pass through unstored).
fn survive_file_size_limit() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::from_raw(libc::SIGXFSZ)) {
        Ok(mut raised) => {
            tokio::spawn(async move {
                while raised.recv().await.is_some() {
                    tracing::debug!("SIGXFSZ: a write passed the file-size limit");
                }
            });
        }
        Err(error) => {
            tracing::warn!(%error, "cannot handle SIGXFSZ: a file-size limit will stop the process");
        }
    }
}
