//! Opening a connection to a host and port, as every trip upstream does:
//! resolve the name, keep the addresses the [`AddressPolicy`] permits (when
//! there is one), connect to them in turn within one timeout, then TLS
//! when asked for ([`Dialer`]). [`OriginConnector`] is the same for hyper's
//! pooled client: it connects to wherever each request's URL points, over
//! TLS for `https://`, and checks HTTP/1.1 responses' framing
//! ([`FramedUpstream`]).
//!
//! Leaves out which hosts may be asked for (the role's sites and routes)
//! and what is sent on the connection.
//!
//! A test or a fuzz target may hand a [`Dialer`] its connections instead
//! ([`MemoryDial`]): the role's whole upstream path then runs over bytes
//! the harness controls, split and delayed as it likes (RELIABILITY F-6).
//!
//! Main types: [`Dialer`], [`Transport`], [`OriginConnector`],
//! [`AddressRefused`], [`MemoryDial`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use http::uri::Scheme;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::address_policy::AddressPolicy;
use super::upstream_guard::FramedUpstream;

/// A connection refused before it was made: every address the host
/// resolved to is one the policy does not permit.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to addresses this proxy may not connect to ({addresses})")]
pub struct AddressRefused {
    /// The host asked for.
    pub host: String,
    /// What it resolved to.
    pub addresses: String,
}

impl AddressRefused {
    /// The refusal somewhere in `error`'s chain of sources, if it is one.
    pub fn in_chain<'a>(
        error: &'a (dyn std::error::Error + 'static),
    ) -> Option<&'a AddressRefused> {
        let mut source = Some(error);
        while let Some(error) = source {
            if let Some(refused) = error.downcast_ref::<AddressRefused>() {
                return Some(refused);
            }
            if let Some(io) = error.downcast_ref::<io::Error>()
                && let Some(refused) = io
                    .get_ref()
                    .and_then(|e| e.downcast_ref::<AddressRefused>())
            {
                return Some(refused);
            }
            source = error.source();
        }
        None
    }
}

/// How connections are opened: the connect timeout, the addresses
/// allowed, the TLS settings for `https://`.
#[derive(Clone)]
pub struct Dialer {
    /// For resolving and connecting together.
    pub connect_timeout: Duration,
    /// `None`: any address (a host the operator configured by name).
    pub policy: Option<Arc<AddressPolicy>>,
    /// Trust roots and ALPN for TLS connections; `None` refuses them.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Not a setting: where a test hands the connections in memory.
    pub memory: Option<MemoryDial>,
}

/// A stream a [`MemoryDial`] hands out: any async byte stream.
pub trait MemoryIo: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> MemoryIo for T {}

/// What a test or a fuzz target gives a [`Dialer`] in place of the
/// network: each dial, whatever its host and port, takes the stream this
/// returns, with no resolving, address policy or TLS (so it never comes
/// from a configuration). An error is a failed connect.
#[derive(Clone)]
pub struct MemoryDial(pub Arc<dyn Fn() -> io::Result<Box<dyn MemoryIo>> + Send + Sync>);

impl std::fmt::Debug for MemoryDial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryDial(..)")
    }
}

impl Dialer {
    /// Connects to `host:port` (a name, an IPv4 literal or a bracketed or
    /// bare IPv6 literal), over TLS when `tls`.
    ///
    /// # Errors
    /// Resolution, an [`AddressRefused`] (as `PermissionDenied`), connect,
    /// TLS or the timeout.
    pub async fn dial(&self, host: &str, port: u16, tls: bool) -> io::Result<Transport> {
        if let Some(memory) = &self.memory {
            return (memory.0)().map(Transport::Memory);
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let connect = async {
            let addresses = self.addresses(host, port).await?;
            let stream = connect_any(&addresses).await?;
            stream.set_nodelay(true)?;
            if !tls {
                return Ok(Transport::Plain(stream));
            }
            let config = self.tls.clone().ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "TLS is not set up here")
            })?;
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let tls = TlsConnector::from(config).connect(name, stream).await?;
            Ok(Transport::Tls(Box::new(tls)))
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connect to {host}:{port} timed out"),
                )
            })?
    }

    /// What `host` resolves to, less what the policy refuses.
    async fn addresses(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
        let Some(policy) = &self.policy else {
            return Ok(resolved);
        };
        let permitted: Vec<SocketAddr> = resolved
            .iter()
            .copied()
            .filter(|address| policy.permits(address.ip()))
            .collect();
        if permitted.is_empty() {
            let addresses = resolved
                .iter()
                .map(|a| a.ip().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                AddressRefused {
                    host: host.to_owned(),
                    addresses,
                },
            ));
        }
        Ok(permitted)
    }
}

/// The first of `addresses` that accepts, or the last error.
async fn connect_any(addresses: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolved to nothing");
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// A connection upstream: plain TCP or TLS (or a test's, in memory).
pub enum Transport {
    /// Plain HTTP.
    Plain(TcpStream),
    /// TLS (boxed: its state is large).
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// What a [`MemoryDial`] handed out.
    Memory(Box<dyn MemoryIo>),
}

impl Transport {
    /// Whether TLS negotiated HTTP/2 by ALPN.
    pub fn is_h2(&self) -> bool {
        matches!(self, Transport::Tls(tls) if tls.get_ref().1.alpn_protocol() == Some(b"h2"))
    }
}

impl Connection for Transport {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Memory(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Memory(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Memory(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Memory(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Transport::Memory(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Tls(s) => s.is_write_vectored(),
            Transport::Memory(s) => s.is_write_vectored(),
        }
    }
}

/// hyper's connector to wherever a request's URL points (`http://` on port
/// 80, `https://` over TLS on 443 unless the URL names a port), HTTP/1.1
/// with its responses' framing checked. The accelerator's way to its
/// origins.
#[derive(Clone)]
pub struct OriginConnector(pub Dialer);

impl tower_service::Service<Uri> for OriginConnector {
    type Response = TokioIo<FramedUpstream<Transport>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, target: Uri) -> Self::Future {
        let dialer = self.0.clone();
        Box::pin(async move {
            let tls = target.scheme() == Some(&Scheme::HTTPS);
            let authority = target.authority().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{target}: no host"))
            })?;
            let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let transport = dialer.dial(authority.host(), port, tls).await?;
            Ok(TokioIo::new(FramedUpstream::http1(transport)))
        })
    }
}
