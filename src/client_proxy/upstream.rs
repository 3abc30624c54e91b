//! The client proxy's way upstream: two pooled hyper clients that both
//! connect to the configured upstream (the accelerator, or any HTTP server
//! or proxy), one sending origin-form targets (gateway requests) and one
//! absolute-form (forward-proxy requests, so the accelerator can refuse a
//! host it does not front instead of serving its own origin's bytes under
//! a foreign URL).
//!
//! Also remembers, per upstream, what its `Hsync-Accept` advertised, in a
//! table whose entries expire (an upgraded accelerator is noticed within
//! the TTL).
//!
//! Main types: [`Upstream`], [`Advertised`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::expiring::ExpiringMap;
use crate::http::HSYNC_ACCEPT;
use crate::server::ProxyBody;

/// How long an upstream's `Hsync-Accept` is believed without being seen
/// again.
pub const ADVERTISED_TTL: Duration = Duration::from_secs(3600);

/// What an upstream said it supports in `Hsync-Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertised {
    /// Largest basis signature it accepts (bytes, decoded).
    pub max_signature: usize,
}

impl Advertised {
    /// Parses `v=1, max-signature=N`; `None` when version 1 is not offered.
    pub fn parse(value: &http::HeaderValue) -> Option<Advertised> {
        let text = value.to_str().ok()?;
        let mut version_1 = false;
        let mut max_signature = None;
        for item in text.split([',', ';']) {
            let Some((name, value)) = item.split_once('=') else {
                continue;
            };
            match name.trim() {
                "v" => version_1 |= value.trim() == "1",
                "max-signature" => max_signature = value.trim().parse().ok(),
                _ => {}
            }
        }
        Some(Advertised {
            max_signature: max_signature?,
        })
        .filter(|_| version_1)
    }
}

/// The pooled clients and what the upstream advertised.
pub struct Upstream {
    authority: Authority,
    gateway: Client<HttpConnector, ProxyBody>,
    forward: Client<UpstreamConnector, ProxyBody>,
    advertised: Mutex<ExpiringMap<Authority, Advertised>>,
}

impl Upstream {
    /// Clients for the upstream at `authority` (`host:port`, plain HTTP).
    pub fn new(authority: Authority, connect_timeout: Duration) -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let gateway = Client::builder(TokioExecutor::new()).build(connector);
        let forward = Client::builder(TokioExecutor::new())
            // Host is set by the caller from the absolute target.
            .set_host(false)
            .build(UpstreamConnector {
                authority: authority.clone(),
                connect_timeout,
            });
        Upstream {
            authority,
            gateway,
            forward,
            advertised: Mutex::new(ExpiringMap::new(ADVERTISED_TTL)),
        }
    }

    /// The upstream's `host:port`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends `request`: a URI whose authority is the upstream's goes in
    /// origin-form, any other in absolute-form to the upstream.
    ///
    /// # Errors
    /// The client's error: connect failure, reset, malformed response.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
        forward: bool,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        let response = if forward {
            self.forward.request(request).await?
        } else {
            self.gateway.request(request).await?
        };
        if let Some(advertised) = response
            .headers()
            .get(HSYNC_ACCEPT)
            .and_then(Advertised::parse)
        {
            self.advertised
                .lock()
                .expect("no panics under this lock")
                .insert(self.authority.clone(), advertised, Instant::now());
        }
        Ok(response)
    }

    /// What the upstream advertised last, if it is still believed.
    pub fn advertised(&self) -> Option<Advertised> {
        self.advertised
            .lock()
            .expect("no panics under this lock")
            .get(&self.authority, Instant::now())
            .copied()
    }
}

/// Connects every request, whatever its URI, to the upstream, and marks the
/// connection as proxied so hyper writes absolute-form targets.
#[derive(Clone)]
pub struct UpstreamConnector {
    authority: Authority,
    connect_timeout: Duration,
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = ProxiedStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<ProxiedStream>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _target: Uri) -> Self::Future {
        let authority = self.authority.clone();
        let timeout = self.connect_timeout;
        Box::pin(async move {
            let port = authority.port_u16().unwrap_or(80);
            let connect = TcpStream::connect((authority.host(), port));
            let stream = tokio::time::timeout(timeout, connect).await.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connect to {authority} timed out"),
                )
            })??;
            stream.set_nodelay(true)?;
            Ok(ProxiedStream(TokioIo::new(stream)))
        })
    }
}

/// A TCP stream to the upstream proxy.
pub struct ProxiedStream(TokioIo<TcpStream>);

impl Connection for ProxiedStream {
    fn connected(&self) -> Connected {
        Connected::new().proxy(true)
    }
}

impl hyper::rt::Read for ProxiedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for ProxiedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsync_accept_is_read_only_for_version_1_with_a_size() {
        let parse = |s: &str| Advertised::parse(&http::HeaderValue::from_str(s).unwrap());
        assert_eq!(
            parse("v=1, max-signature=24576"),
            Some(Advertised {
                max_signature: 24576
            })
        );
        assert_eq!(parse("v=2, max-signature=24576"), None);
        assert_eq!(parse("v=1"), None);
        assert_eq!(parse("v=1, max-signature=lots"), None);
        assert_eq!(parse("garbage"), None);
        assert_eq!(
            parse("v=1, codecs=2;3, max-signature=100, future"),
            Some(Advertised { max_signature: 100 }),
            "unknown members are skipped"
        );
    }
}
