//! CONNECT tunnels: how `https://` URLs (and anything else a user agent
//! wraps in CONNECT) go through the client proxy. A tunnel is checked
//! before anything is opened — the target in authority form `host:port`
//! (no userinfo, a port), the port in the allow-list, and the addresses
//! the host resolves to permitted by the [`AddressPolicy`] (public ones,
//! and of the others only those the operator listed: the SSRF guard,
//! then answered `200`, and the user agent's connection and the
//! target's are relayed byte for byte until either side ends or no byte
//! has moved for the idle timeout. One log line and the counters
//! (`tunnels`, `tunnel_bytes`) are written when it ends.
//!
//! Leaves out: anything inside the tunnel. The bytes are TLS end to end,
//! so nothing is cached, coded as a delta or even read; nor are tunnels
//! opened through the upstream (the accelerator refuses CONNECT, and the
//! upstream's pool has no raw connection to lend), so a tunnel goes
//! straight to its target. Authentication is the `AuthGate`'s, in front
//! of the role, as for any request.
//!
//! Main items: [`TunnelConfig`], [`ClientProxy::tunnel`](super::ClientProxy),
//! [`Relay`].

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::{ClientProxy, ClientStats, empty};
use crate::http::address_policy::AddressPolicy;
use crate::http::dial::{AddressRefused, Dialer, Transport};
use crate::http::error::ProxyError;
use crate::http::server::ProxyBody;

/// Where CONNECT tunnels may go, and how long one may stay quiet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelConfig {
    /// Ports a tunnel may be opened to (`connect-ports`; 443 by
    /// default). Empty: no tunnels.
    pub ports: Vec<u16>,
    /// Non-public ranges (loopback, private, link-local…) a tunnel may go
    /// to all the same (`connect-allow-addresses`; none by default).
    pub allow_addresses: Vec<IpNet>,
    /// Time without a byte moving either way before a tunnel is closed:
    /// the listener's `idle-timeout`.
    pub idle_timeout: Duration,
}

impl Default for TunnelConfig {
    fn default() -> Self {
        TunnelConfig {
            ports: vec![443],
            allow_addresses: Vec::new(),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What a CONNECT asks for: `host:port`, the host without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Destination {
    host: String,
    port: u16,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The destination of a CONNECT whose target is `uri`, or why it is not
/// authority form (RFC 9112 §3.2.3).
fn destination(uri: &Uri) -> Result<Destination, String> {
    let Some(authority) = uri.authority() else {
        return Err(format!("CONNECT {uri}: the target must be host:port"));
    };
    if uri.scheme().is_some() || uri.path_and_query().is_some_and(|p| !p.as_str().is_empty()) {
        return Err(format!(
            "CONNECT {uri}: the target must be host:port, not a URL"
        ));
    }
    if authority.as_str().contains('@') {
        return Err("CONNECT: a target with userinfo is refused".into());
    }
    let Some(port) = authority.port_u16() else {
        return Err(format!("CONNECT {authority}: the target needs a port"));
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("CONNECT {authority}: no host"));
    }
    Ok(Destination {
        host: host.to_owned(),
        port,
    })
}

/// A failed dial as the refusal it becomes: a refused address is the
/// request's (403), a timeout and anything else the target's (504, 502).
fn dial_refusal(destination: &Destination, error: &io::Error) -> ProxyError {
    if let Some(refused) = AddressRefused::in_chain(error) {
        return ProxyError::forbidden(format!("CONNECT {destination}: {refused}"));
    }
    match error.kind() {
        io::ErrorKind::TimedOut => {
            ProxyError::upstream_timeout(format!("CONNECT {destination}: {error}"))
        }
        _ => ProxyError::upstream_unreachable(format!("CONNECT {destination}: {error}")),
    }
}

impl ClientProxy {
    /// A CONNECT: checked, dialled, answered `200`, then relayed on a task
    /// of its own once hyper hands the connection over.
    pub(super) async fn tunnel(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let destination = match destination(request.uri()) {
            Ok(destination) => destination,
            Err(message) => return ProxyError::bad_request(message).log_and_respond(),
        };
        let config = &self.config.tunnel;
        if !config.ports.contains(&destination.port) {
            return ProxyError::forbidden(format!(
                "CONNECT {destination}: port {} is not one tunnels may go to",
                destination.port
            ))
            .log_and_respond();
        }
        let dialer = Dialer {
            connect_timeout: self.config.connect_timeout,
            policy: Some(policy(config)),
            tls: None,
        };
        let target = match dialer
            .dial(&destination.host, destination.port, false)
            .await
        {
            Ok(target) => target,
            Err(error) => return dial_refusal(&destination, &error).log_and_respond(),
        };
        let peer_address = match &target {
            Transport::Plain(stream) => stream.peer_addr().ok().map(|a| a.ip()),
            Transport::Tls(_) => None,
        };
        ClientStats::add(&self.stats.tunnels, 1);
        let stats = self.stats.clone();
        let idle_timeout = config.idle_timeout;
        let on_upgrade = hyper::upgrade::on(request);
        tokio::spawn(async move {
            let started = Instant::now();
            let user_agent = match on_upgrade.await {
                Ok(upgraded) => TokioIo::new(upgraded),
                Err(error) => {
                    tracing::info!(%destination, %error, "tunnel: the user agent's connection was not handed over");
                    return;
                }
            };
            let relay = Relay::new(idle_timeout);
            let ended = relay.run(user_agent, target).await;
            let (up, down) = relay.bytes();
            ClientStats::add(&stats.tunnel_bytes, up + down);
            log_end(&destination, peer_address, up, down, started, &ended);
        });
        let mut response = Response::new(empty());
        *response.status_mut() = StatusCode::OK;
        response
    }
}

/// The one line a tunnel writes when it ends.
fn log_end(
    destination: &Destination,
    address: Option<IpAddr>,
    up: u64,
    down: u64,
    started: Instant,
    ended: &Result<Ended, io::Error>,
) {
    let ended = match ended {
        Ok(Ended::Closed) => "closed".to_owned(),
        Ok(Ended::Idle) => "idle".to_owned(),
        Err(error) => format!("error: {error}"),
    };
    tracing::info!(
        target = %destination,
        address = address.map(|a| a.to_string()).unwrap_or_default(),
        up_bytes = up,
        down_bytes = down,
        secs = started.elapsed().as_secs_f64(),
        %ended,
        "tunnel"
    );
}

/// How a relay ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed.
    Closed,
    /// No byte moved either way for the idle timeout.
    Idle,
}

/// Relays two connections both ways until they end or go quiet, counting
/// the bytes each way. Any `AsyncRead + AsyncWrite` on both sides.
pub struct Relay {
    idle_timeout: Duration,
    /// Bytes read from the user agent (gone to the target).
    up: Arc<AtomicU64>,
    /// Bytes read from the target (gone to the user agent).
    down: Arc<AtomicU64>,
    /// When a byte last moved: milliseconds after `started`.
    moved_ms: Arc<AtomicU64>,
    started: Instant,
}

impl Relay {
    /// A relay that closes both sides once `idle_timeout` passes without a
    /// byte moving.
    pub fn new(idle_timeout: Duration) -> Relay {
        Relay {
            idle_timeout,
            up: Arc::default(),
            down: Arc::default(),
            moved_ms: Arc::default(),
            started: Instant::now(),
        }
    }

    /// Bytes relayed so far: from the user agent, from the target.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }

    /// Relays until both sides closed, one failed, or the idle timeout.
    ///
    /// # Errors
    /// A read or write on either side failed.
    pub async fn run<A, B>(&self, user_agent: A, target: B) -> io::Result<Ended>
    where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
    {
        let mut user_agent = self.metered(user_agent, &self.up);
        let mut target = self.metered(target, &self.down);
        let relay = tokio::io::copy_bidirectional(&mut user_agent, &mut target);
        tokio::pin!(relay);
        loop {
            let moved = self.started + Duration::from_millis(self.moved_ms.load(Ordering::Relaxed));
            tokio::select! {
                result = &mut relay => return result.map(|_| Ended::Closed),
                () = tokio::time::sleep_until(moved + self.idle_timeout) => {
                    let now_moved = Duration::from_millis(self.moved_ms.load(Ordering::Relaxed));
                    if self.started + now_moved == moved {
                        return Ok(Ended::Idle);
                    }
                }
            }
        }
    }

    fn metered<T>(&self, io: T, read: &Arc<AtomicU64>) -> Metered<T> {
        Metered {
            io,
            read: read.clone(),
            moved_ms: self.moved_ms.clone(),
            started: self.started,
        }
    }
}

/// One side of a relay: counts the bytes read from it and notes when any
/// moved.
struct Metered<T> {
    io: T,
    read: Arc<AtomicU64>,
    moved_ms: Arc<AtomicU64>,
    started: Instant,
}

impl<T> Metered<T> {
    fn moved(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.moved_ms.fetch_max(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            self.read.fetch_add(n, Ordering::Relaxed);
            self.moved();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The address policy of tunnels: public addresses, and those allowed.
fn policy(config: &TunnelConfig) -> Arc<AddressPolicy> {
    Arc::new(AddressPolicy::new(config.allow_addresses.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Result<Destination, String> {
        destination(&text.parse::<Uri>().unwrap())
    }

    #[test]
    fn only_authority_form_with_a_port_and_no_userinfo_is_a_destination() {
        assert_eq!(
            target("example.com:443").unwrap(),
            Destination {
                host: "example.com".into(),
                port: 443
            }
        );
        let v6 = target("[::1]:8443").unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.to_string(), "[::1]:8443");
        for bad in [
            "/path",
            "example.com",
            "a@b:443",
            "user:pw@example.com:443",
            "http://example.com:443/",
            "https://example.com:443",
        ] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_relay_ends_after_the_idle_timeout_and_counts_both_ways() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (user_agent, mut ua_far) = tokio::io::duplex(64);
        let (target, mut target_far) = tokio::io::duplex(64);
        let relay = Relay::new(Duration::from_secs(5));
        let run = async {
            ua_far.write_all(b"hello").await.unwrap();
            let mut got = [0; 5];
            target_far.read_exact(&mut got).await.unwrap();
            target_far.write_all(b"hi!").await.unwrap();
            ua_far.read_exact(&mut got[..3]).await.unwrap();
            // Quiet from here on, both ends still open.
            std::future::pending::<()>().await;
        };
        let ended = tokio::select! {
            ended = relay.run(user_agent, target) => ended.unwrap(),
            () = run => unreachable!(),
        };
        assert_eq!(ended, Ended::Idle);
        assert_eq!(relay.bytes(), (5, 3));
    }
}
