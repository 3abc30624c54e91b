//! CONNECT tunnels as both roles open them: what a CONNECT asks for
//! ([`Destination`], authority form only), how a failed dial becomes a
//! refusal ([`dial_refusal`]), and the relay once the tunnel is answered
//! `2xx` ([`relay_upgraded`]): the user agent's connection, handed over by
//! hyper, and the connection to the target (or to the upstream proxy that
//! tunnels on) are copied both ways byte for byte until either side ends
//! or no byte has moved for the idle timeout ([`Relay`]), then one log
//! line is written and the role counts the bytes.
//!
//! Leaves out which tunnels may be opened and where they go (the client
//! proxy's routes and `connect-ports`, the accelerator's parent-mode
//! sites): each role checks and dials, then hands the two ends here.
//!
//! Main items: [`Destination`], [`Relay`], [`Upgrade`], [`relay_upgraded`].

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Uri};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::access_log::Note;
use super::dial::{AddressRefused, Transport};
use super::error::ProxyError;
use super::server::KeepConnection;

/// What a CONNECT asks for: `host:port`, the host without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// A name or an address literal (an IPv6 one without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.bracketed_host(), self.port)
    }
}

impl Destination {
    /// The destination of a CONNECT whose target is `uri`, or why it is
    /// not authority form (RFC 9112 §3.2.3): no scheme or path, no
    /// userinfo, a port.
    ///
    /// # Errors
    /// The message of the 400 the target deserves.
    pub fn from_target(uri: &Uri) -> Result<Destination, String> {
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

    /// The host as a URL's authority writes it (an IPv6 literal in
    /// brackets), as host patterns compare it.
    pub fn bracketed_host(&self) -> std::borrow::Cow<'_, str> {
        if self.host.contains(':') {
            format!("[{}]", self.host).into()
        } else {
            self.host.as_str().into()
        }
    }

    /// The host as an address, when it is a literal.
    pub fn address(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

/// A failed dial to `destination` as the refusal it becomes: a refused
/// address is the request's (403), a timeout and anything else the
/// target's (504, 502).
pub fn dial_refusal(destination: &Destination, error: &io::Error) -> ProxyError {
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

/// What the log line at a tunnel's end names besides its bytes.
#[derive(Debug, Clone)]
pub struct Opened {
    /// What the CONNECT asked for.
    pub destination: Destination,
    /// The address connected to, for a tunnel dialled here.
    pub address: Option<IpAddr>,
    /// The upstream proxy that tunnels on, when the tunnel goes through
    /// one (its `host:port`).
    pub via: Option<String>,
}

impl Opened {
    /// A tunnel dialled here, to `target`.
    pub fn direct(destination: Destination, target: &Transport) -> Opened {
        let address = match target {
            Transport::Plain(stream) => stream.peer_addr().ok().map(|a| a.ip()),
            Transport::Tls(tls) => tls.get_ref().0.peer_addr().ok().map(|a| a.ip()),
            Transport::Memory(_) => None,
        };
        Opened {
            destination,
            address,
            via: None,
        }
    }
}

/// A CONNECT's connection, to be handed over once it is answered `2xx`,
/// and its place under `max-connections`, kept until the tunnel ends.
pub struct Upgrade {
    on: OnUpgrade,
    keep: Option<KeepConnection>,
    /// The request's access log line, written once the tunnel ends.
    note: Option<Note>,
}

impl Upgrade {
    /// Takes the connection of `request` (a CONNECT about to be answered
    /// `2xx`) and its place.
    pub fn take<B>(request: &mut Request<B>) -> Upgrade {
        Upgrade {
            keep: request.extensions_mut().remove::<KeepConnection>(),
            note: request.extensions().get::<Note>().cloned(),
            on: hyper::upgrade::on(request),
        }
    }
}

/// Once hyper hands over the user agent's connection (the CONNECT was
/// answered `2xx`: `upgrade` is [`Upgrade::take`] of it), relays it
/// and `target` on a task of its own until either ends or both are quiet
/// for `idle_timeout`; then writes the tunnel's log line and calls
/// `at_end` with the bytes each way (from the user agent, from the
/// target).
pub fn relay_upgraded<T>(
    upgrade: Upgrade,
    target: T,
    opened: Opened,
    idle_timeout: Duration,
    at_end: impl FnOnce(u64, u64) + Send + 'static,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let started = Instant::now();
        // Held until the relay ends: the connection's place.
        let _keep = upgrade.keep;
        let user_agent = match upgrade.on.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(error) => {
                tracing::info!(destination = %opened.destination, %error, "tunnel: the user agent's connection was not handed over");
                at_end(0, 0);
                return;
            }
        };
        let relay = Relay::new(idle_timeout);
        let ended = relay.run(user_agent, target).await;
        let (up, down) = relay.bytes();
        at_end(up, down);
        if let Some(note) = upgrade.note {
            note.tunnelled(up, down);
        }
        log_end(&opened, up, down, started, &ended);
    });
}

/// The one line a tunnel writes when it ends.
fn log_end(
    opened: &Opened,
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
        target = %opened.destination,
        address = opened.address.map(|a| a.to_string()).unwrap_or_default(),
        via = opened.via.as_deref().unwrap_or("-"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Result<Destination, String> {
        Destination::from_target(&text.parse::<Uri>().unwrap())
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
        assert_eq!(v6.bracketed_host(), "[::1]");
        assert_eq!(v6.address(), Some("::1".parse().unwrap()));
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
