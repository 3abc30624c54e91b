//! CONNECT tunnels: how `https://` URLs (and anything else a user agent
//! wraps in CONNECT) go through the client proxy. A tunnel is checked
//! before anything is opened — the target in authority form `host:port`
//! (no userinfo, a port), the port in `connect-ports`, a route that takes
//! the host — and then follows that route, as a request for the host
//! would:
//!
//! - a direct route dials the target itself, at addresses the tunnels'
//!   [`AddressPolicy`] permits (public ones, and of the others only those
//!   in `connect-allow-addresses`: the SSRF guard, A-7), whatever the
//!   route's own `allow-addresses` (those are for `http://` fetches; a
//!   tunnel carries any protocol to the port, so it has its own list);
//! - an upstream route opens a connection to that proxy (plain or TLS, as
//!   its URL says) and sends it a CONNECT for the same `host:port`, with
//!   our upstream credentials when configured; its `2xx` opens the tunnel
//!   (the upstream applies its own allow-list), anything else is a 502
//!   naming its status (a 407 saying our credentials are at fault).
//!
//! Then the user agent is answered `200`, and its connection and the
//! target's (or the upstream's) are relayed byte for byte by
//! [`crate::http::tunnel`] until either side ends or no byte has moved
//! for the idle timeout. One log line and the counters (`tunnels`,
//! `tunnel_bytes`) are written when it ends.
//!
//! Leaves out: anything inside the tunnel. The bytes are TLS end to end,
//! so nothing is cached, coded as a delta or even read. Authentication is
//! the `AuthGate`'s, in front of the role, as for any request.
//!
//! Main items: [`TunnelConfig`], [`ClientProxy::tunnel`](super::ClientProxy).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::Empty;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite};

use super::upstream::Upstream;
use super::{ClientProxy, ClientStats, empty};
use crate::http::address_policy::AddressPolicy;
use crate::http::dial::Dialer;
use crate::http::error::ProxyError;
use crate::http::headers::{add_via, via_names_hop};
use crate::http::server::{ProxyBody, RequestBody};
use crate::http::tunnel::{Destination, Opened, Upgrade, dial_refusal, relay_upgraded};

/// The most an upstream proxy's answer to our CONNECT may take before
/// the tunnel: its head, and whatever came with it (hyper's smallest read
/// buffer is 8 KiB).
const MAX_CONNECT_ANSWER: usize = 16 * 1024;

/// Where CONNECT tunnels may go, and how long one may stay quiet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelConfig {
    /// Ports a tunnel may be opened to (`connect-ports`; 443 by
    /// default), whichever route it takes. Empty: no tunnels.
    pub ports: Vec<u16>,
    /// Non-public ranges (loopback, private, link-local…) a tunnel on a
    /// direct route may go to all the same (`connect-allow-addresses`;
    /// none by default). The route's own `allow-addresses` are for
    /// `http://` fetches; a tunnel through an upstream proxy is checked
    /// by that proxy.
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

impl ClientProxy {
    /// A CONNECT: checked, routed, dialled (direct, or through the route's
    /// upstream proxy), answered `200`, then relayed on a task of its own
    /// once hyper hands the connection over.
    pub(super) async fn tunnel(
        self: Arc<Self>,
        mut request: Request<RequestBody>,
    ) -> Response<ProxyBody> {
        let destination = match Destination::from_target(request.uri()) {
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
        if via_names_hop(request.headers(), self.config.via_name.as_bytes()) {
            return ProxyError::loop_detected(format!(
                "CONNECT {destination} already passed {}",
                self.config.via_name.to_str().unwrap_or("us")
            ))
            .log_and_respond();
        }
        let via = match self.routes.tunnel_via(&destination.bracketed_host()) {
            Ok(via) => via,
            Err(refusal) => return refusal.log_and_respond(),
        };
        let upgrade = Upgrade::take(&mut request);
        let Some(upstream) = via else {
            let dialer = Dialer {
                connect_timeout: self.config.connect_timeout,
                policy: Some(policy(config)),
                tls: None,
                memory: None,
            };
            let target = match dialer
                .dial(&destination.host, destination.port, false)
                .await
            {
                Ok(target) => target,
                Err(error) => return dial_refusal(&destination, &error).log_and_respond(),
            };
            let opened = Opened::direct(destination, &target);
            return self.opened(upgrade, target, opened);
        };
        match self.connect_upstream(&upstream, &destination).await {
            Ok((target, via)) => {
                let opened = Opened {
                    destination,
                    address: None,
                    via: Some(via),
                };
                self.opened(upgrade, target, opened)
            }
            Err(refusal) => refusal.log_and_respond(),
        }
    }

    /// Counts the tunnel, hands both ends to the relay, and answers `200`.
    fn opened<T>(&self, upgrade: Upgrade, target: T, opened: Opened) -> Response<ProxyBody>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        ClientStats::add(&self.stats.tunnels, 1);
        let stats = self.stats.clone();
        relay_upgraded(
            upgrade,
            target,
            opened,
            self.config.tunnel.idle_timeout,
            move |up, down| ClientStats::add(&stats.tunnel_bytes, up + down),
        );
        let mut response = Response::new(empty());
        *response.status_mut() = StatusCode::OK;
        response
    }

    /// A tunnel to `destination` through `upstream`, a proxy: a CONNECT to
    /// it on a connection of our own, answered `2xx` within the upstream
    /// timeout. Returns the tunnel and the upstream's name.
    ///
    /// # Errors
    /// The refusal for the user agent: the upstream unreachable (502) or
    /// silent (504), or its answer anything but `2xx` (502).
    async fn connect_upstream(
        &self,
        upstream: &Upstream,
        destination: &Destination,
    ) -> Result<(TokioIo<Upgraded>, String), ProxyError> {
        let name = upstream
            .fixed()
            .map_or_else(|| "-".to_owned(), |(_, authority)| authority.to_string());
        let transport = match upstream.dial_raw().await {
            Ok(transport) => transport,
            Err(error) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                let message = format!("CONNECT {destination}: upstream {name}: {error}");
                return Err(if error.kind() == io::ErrorKind::TimedOut {
                    ProxyError::upstream_timeout(message)
                } else {
                    ProxyError::upstream_unreachable(message)
                });
            }
        };
        let request = self.upstream_connect(destination);
        let exchange = async {
            let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
                .max_buf_size(MAX_CONNECT_ANSWER)
                .handshake::<_, Empty<Bytes>>(TokioIo::new(transport))
                .await?;
            // Ends once the upgrade took the connection, or with it.
            tokio::spawn(async move {
                if let Err(error) = connection.with_upgrades().await {
                    tracing::debug!(%error, "CONNECT to the upstream: connection ended");
                }
            });
            let response = sender.send_request(request).await?;
            if !response.status().is_success() {
                return Ok(Err(response.status()));
            }
            hyper::upgrade::on(response).await.map(Ok)
        };
        match tokio::time::timeout(self.config.upstream_timeout, exchange).await {
            Ok(Ok(Ok(upgraded))) => Ok((TokioIo::new(upgraded), name)),
            Ok(Ok(Err(StatusCode::PROXY_AUTHENTICATION_REQUIRED))) => Err(self.challenged(&name)),
            Ok(Ok(Err(status))) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                Err(ProxyError::bad_upstream_response(format!(
                    "CONNECT {destination}: upstream {name} answered {status}"
                )))
            }
            Ok(Err(error)) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                Err(ProxyError::bad_upstream_response(format!(
                    "CONNECT {destination}: upstream {name}: {error}"
                )))
            }
            Err(_) => {
                ClientStats::add(&self.stats.upstream_errors, 1);
                Err(ProxyError::upstream_timeout(format!(
                    "CONNECT {destination}: upstream {name} sent no answer within {:?}",
                    self.config.upstream_timeout
                )))
            }
        }
    }

    /// The CONNECT sent to an upstream proxy for `destination`: `Host`,
    /// our `Via`, and our credentials when configured (an upstream route
    /// is always a proxy; a direct route never sends them).
    fn upstream_connect(&self, destination: &Destination) -> Request<Empty<Bytes>> {
        let target = destination.to_string();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::HOST,
            HeaderValue::from_str(&target).expect("an authority is a valid header"),
        );
        add_via(&mut headers, &self.config.via_name);
        if let Some(credentials) = &self.config.upstream_credentials {
            headers.insert(header::PROXY_AUTHORIZATION, credentials.clone());
        }
        let mut request = Request::new(Empty::new());
        *request.method_mut() = Method::CONNECT;
        *request.uri_mut() = Uri::try_from(target).expect("a destination is an authority");
        *request.headers_mut() = headers;
        request
    }
}

/// The address policy of tunnels: public addresses, and those allowed.
fn policy(config: &TunnelConfig) -> Arc<AddressPolicy> {
    Arc::new(AddressPolicy::new(config.allow_addresses.clone()))
}
