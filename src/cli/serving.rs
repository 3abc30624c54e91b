//! How both roles serve once configured: the one inetd connection on
//! stdin/stdout, or a listener (plain or TLS) until SIGTERM or SIGINT,
//! then draining what is under way. On SIGHUP the listener's role is
//! rebuilt from the configuration file ([`Reload`]) and swapped in for
//! new requests.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

use super::auth::authenticator;
use super::systemd;
use crate::config::{self, AuthSettings, LogSettings, Settings};
use crate::http::access_log::{AccessLog, Logged};
use crate::http::auth::{AuthGate, Authenticator};
use crate::http::inetd::{Stdio, serve_stdio};
use crate::http::server::{
    ConnectionLimits, Handler, LiveLimits, Reloadable, bind, raise_open_file_limit, serve,
    serve_tls,
};

/// How a role is rebuilt on SIGHUP: from the one serving, a new one and
/// the connection limits with the configuration file read again, or an
/// error saying why the file was refused (the running configuration then
/// stays).
pub(super) type Reload<H> = Box<dyn Fn(&H) -> anyhow::Result<(H, ConnectionLimits)> + Send + Sync>;

/// The layers a role is served in, read from its settings at start and
/// at each reload: the access log outside, the users check inside.
pub(super) struct Layers {
    log: AccessLog,
    auth: Option<Authenticator>,
}

impl Layers {
    /// Opens the access log and reads the users file.
    ///
    /// # Errors
    /// A log file that cannot be opened, a bad level, a bad users file.
    pub(super) fn open(log: &LogSettings, auth: &AuthSettings) -> anyhow::Result<Layers> {
        Ok(Layers {
            log: log.open(quiet())?,
            auth: authenticator(auth)?,
        })
    }

    /// `role` in its layers, with the diagnostic level of `log` set.
    ///
    /// # Errors
    /// A bad level.
    pub(super) fn around<R: Handler>(
        self,
        role: R,
        log: &LogSettings,
    ) -> anyhow::Result<Logged<AuthGate<R>>> {
        crate::logging::set_level(&log.log_level)?;
        Ok(Logged::new(
            AuthGate::new(role, self.auth),
            Arc::new(self.log),
        ))
    }
}

/// Names in the log each key whose change a reload cannot apply.
pub(super) fn warn_restart_needed<S: Settings>(running: &S, reloaded: &S) {
    for key in config::restart_needed(running, reloaded) {
        tracing::warn!(key, "SIGHUP: changed, but applies only at the next start");
    }
}

/// Whether nothing may be written to stderr: under inetd it may be the
/// connection itself.
pub(super) fn quiet() -> bool {
    crate::http::inetd::stderr_is_the_connection()
}

/// The address that names us (in Via, by default): the listener's, or
/// under inetd the connection's own local address, else `listen`.
pub(super) fn bound_address(
    listening: Option<&Listening>,
    stdio: Option<&Stdio>,
    listen: SocketAddr,
) -> SocketAddr {
    listening
        .map(Listening::address)
        .or_else(|| stdio.and_then(Stdio::local_addr))
        .unwrap_or(listen)
}

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

/// A listener bound, with the runtime that serves it: bound before the
/// role is built, so that the role knows the address it really has (a
/// port 0 becomes the one the kernel chose, which names us in Via).
pub(super) struct Listening {
    runtime: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    address: SocketAddr,
}

impl Listening {
    /// Starts the runtime and binds `listen` (or takes the socket systemd
    /// passed), with the open-file limit raised for
    /// `limits.max_connections`.
    ///
    /// # Errors
    /// The runtime cannot start or the address cannot be bound.
    pub(super) fn bind(listen: SocketAddr, limits: &ConnectionLimits) -> anyhow::Result<Listening> {
        raise_open_file_limit(limits.max_connections);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .max_blocking_threads(BLOCKING_THREADS)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let listener = {
            let _inside = runtime.enter();
            match systemd::activated_listener() {
                Some(passed) => {
                    passed.set_nonblocking(true)?;
                    let listener = tokio::net::TcpListener::from_std(passed)?;
                    tracing::info!(
                        listen = ?listener.local_addr().ok(),
                        "serving the socket systemd passed (socket activation); the listen setting is not used"
                    );
                    listener
                }
                None => bind(listen).with_context(|| format!("cannot listen on {listen}"))?,
            }
        };
        let address = listener.local_addr().unwrap_or(listen);
        Ok(Listening {
            runtime,
            listener,
            address,
        })
    }

    /// The address bound.
    pub(super) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves `handler` (over TLS with `tls`) until SIGTERM or SIGINT,
    /// then drains (`limits.drain_timeout`); on SIGHUP, `reload` rebuilds
    /// the handler for the requests that come next; on SIGUSR1 the access
    /// log is reopened. `ready` runs once the signals are handled, inside
    /// the runtime, with the address and the role as reloads replace it
    /// (to log, or to start the role's own tasks).
    ///
    /// # Errors
    /// A signal handler cannot be installed.
    pub(super) fn serve<H: Handler>(
        self,
        handler: H,
        limits: ConnectionLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
        reload: Reload<H>,
        ready: impl FnOnce(SocketAddr, &Arc<Reloadable<H>>),
    ) -> anyhow::Result<()> {
        let Listening {
            runtime,
            listener,
            address,
        } = self;
        runtime.block_on(async {
            survive_file_size_limit();
            // Before "ready": a signal sent as soon as it is logged is ours.
            let stop = stop_signal()?;
            let handler = Arc::new(Reloadable::new(handler));
            let limits = LiveLimits::new(limits);
            reload_on_hangup(handler.clone(), limits.clone(), reload)?;
            reopen_logs_on_usr1(handler.clone())?;
            ready(address, &handler);
            systemd::ready(&format!("serving on {address}"));
            match tls {
                Some(tls) => serve_tls(listener, handler.clone(), limits, tls, stop).await,
                None => serve(listener, handler.clone(), limits, stop).await,
            }
            handler.stopped();
            tracing::info!("stopped");
            Ok(())
        })
    }
}

/// On each SIGHUP, rebuilds the role with `reload` and swaps it in for
/// new requests, and its connection limits in for new connections;
/// requests under way finish with the role they started with. A
/// configuration that does not validate is logged and the running one
/// stays.
fn reload_on_hangup<H: Handler>(
    handler: Arc<Reloadable<H>>,
    limits: LiveLimits,
    reload: Reload<H>,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let reload = Arc::new(reload);
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            systemd::reloading();
            let (handler, limits, reload) = (handler.clone(), limits.clone(), reload.clone());
            // Reading files and building TLS clients: off the async workers.
            let rebuilt = tokio::task::spawn_blocking(move || {
                reload(&handler.current()).map(|(role, connection_limits)| {
                    handler.replace(role);
                    limits.set(connection_limits);
                })
            })
            .await;
            match rebuilt {
                Ok(Ok(())) => tracing::info!("SIGHUP: configuration reloaded; new requests use it"),
                Ok(Err(error)) => tracing::error!(
                    error = format!("{error:#}"),
                    "SIGHUP: configuration refused; the running one stays"
                ),
                Err(error) => {
                    tracing::error!(%error, "SIGHUP: the reload failed; the running configuration stays")
                }
            }
            systemd::ready("serving");
        }
    });
    Ok(())
}

/// On each SIGUSR1, the access log file is opened again under its name
/// (logrotate moved the old one away).
fn reopen_logs_on_usr1<H: Handler>(handler: Arc<H>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut usr1 = signal(SignalKind::user_defined1()).context("cannot handle SIGUSR1")?;
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            let handler = handler.clone();
            let _ = tokio::task::spawn_blocking(move || handler.reopen_logs()).await;
            tracing::info!("SIGUSR1: log files reopened");
        }
    });
    Ok(())
}

/// Resolves at the first SIGTERM or SIGINT (the server then drains: see
/// [`serve`]).
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(
            signal = name,
            "stopping: no new connections; requests under way may finish"
        );
        systemd::stopping();
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
