//! Which way a request goes upstream: the first route whose hosts match
//! the URL's host — to an upstream proxy (an accelerator, a parent, or
//! another client proxy) in absolute-form, or direct to the URL's own host
//! as any forward proxy goes. A direct route still offers hsync, so an
//! origin fronted by an accelerator answers with deltas and any other
//! answers normally.
//!
//! `--upstream URL` alone is the one-route shorthand: every host goes to
//! that upstream, and an origin-form (gateway) request is for the
//! upstream's own URLs, as before routes existed. With `[[route]]` tables a
//! gateway request is routed by its `Host` like any other.
//!
//! A CONNECT is routed by its host the same way ([`Routes::for_host`]):
//! tunnelled direct, or through the route's upstream proxy as a CONNECT
//! to it (`tunnel.rs`).
//!
//! Leaves out the trip itself ([`super::upstream`]) and the tunnel's.
//!
//! Main types: [`RouteConfig`], [`Routes`].

use std::sync::Arc;

use http::header;
use http::uri::{Authority, Scheme};
use http::{Request, Uri};

use super::upstream::Upstream;
use crate::http::address_policy::AddressPolicy;
use crate::http::error::ProxyError;
use crate::http::host_pattern::HostPattern;

/// One route, validated.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// The hosts it takes.
    pub hosts: RouteHosts,
    /// Where they go.
    pub to: RouteTo,
}

/// The hosts a route takes.
#[derive(Debug, Clone)]
pub enum RouteHosts {
    /// `--upstream URL` alone: every host, and gateway requests are for
    /// the upstream's own URLs.
    Shorthand,
    /// A `[[route]]`'s `hosts`.
    Listed(Vec<HostPattern>),
}

/// Where a route's requests go.
#[derive(Debug, Clone)]
pub enum RouteTo {
    /// An upstream proxy, `http://host[:port]` or `https://host[:port]`.
    Upstream(Uri),
    /// The URL's own host, at addresses the policy permits.
    Direct(AddressPolicy),
}

impl RouteConfig {
    /// The `--upstream URL` shorthand.
    pub fn upstream(url: Uri) -> RouteConfig {
        RouteConfig {
            hosts: RouteHosts::Shorthand,
            to: RouteTo::Upstream(url),
        }
    }
}

/// Why routes cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The upstream URL is not `http(s)://host[:port]`.
    #[error("upstream {0} must be http://host[:port] or https://host[:port] (no path)")]
    BadUpstream(String),
    /// An `https://` upstream without a TLS configuration.
    #[error("an https:// upstream needs a TLS configuration")]
    NoTls,
    /// The upstream host cannot be a TLS server name.
    #[error("{0}")]
    TlsName(String),
    /// No route at all.
    #[error("no route: give --upstream or [[route]] tables")]
    NoRoute,
}

/// The routes, each with its pooled connections.
pub(super) struct Routes {
    routes: Vec<(RouteHosts, Arc<Upstream>)>,
}

/// Where one request goes.
pub(super) struct Target {
    /// The absolute URL (the cache key's source).
    pub url: Uri,
    /// Sent in absolute-form to an upstream proxy; else origin-form (to
    /// the upstream itself as a gateway, or to the URL's own host).
    pub forward: bool,
    /// The way there.
    pub upstream: Arc<Upstream>,
}

impl Routes {
    /// Builds a pool per route.
    ///
    /// # Errors
    /// A bad upstream URL, or an `https://` one without `tls`.
    pub fn new(
        configs: &[RouteConfig],
        tls: Option<&Arc<rustls::ClientConfig>>,
        connect_timeout: std::time::Duration,
    ) -> Result<Routes, RouteError> {
        if configs.is_empty() {
            return Err(RouteError::NoRoute);
        }
        let mut routes = Vec::with_capacity(configs.len());
        for config in configs {
            let upstream = match &config.to {
                RouteTo::Upstream(url) => {
                    let bad = || RouteError::BadUpstream(url.to_string());
                    let scheme = url.scheme().cloned().ok_or_else(bad)?;
                    if !(scheme == Scheme::HTTP || scheme == Scheme::HTTPS)
                        || url.path_and_query().is_some_and(|p| p.as_str() != "/")
                    {
                        return Err(bad());
                    }
                    let authority = url.authority().cloned().ok_or_else(bad)?;
                    let tls = match (scheme == Scheme::HTTPS, tls) {
                        (true, Some(tls)) => Some(tls.clone()),
                        (true, None) => return Err(RouteError::NoTls),
                        (false, _) => None,
                    };
                    Upstream::new(authority, tls, connect_timeout).map_err(RouteError::TlsName)?
                }
                RouteTo::Direct(policy) => Upstream::direct(policy.clone(), connect_timeout),
            };
            routes.push((config.hosts.clone(), Arc::new(upstream)));
        }
        Ok(Routes { routes })
    }

    /// The target of `request`: its absolute URL and the way there.
    ///
    /// # Errors
    /// A target that is not an `http://` URL or a path (400), a host no
    /// route takes (403).
    pub fn target<B>(&self, request: &Request<B>) -> Result<Target, ProxyError> {
        let uri = request.uri();
        let (url, gateway) = if let Some(authority) = uri.authority() {
            if uri.scheme() != Some(&Scheme::HTTP) {
                return Err(ProxyError::bad_request(format!(
                    "only http:// URLs can be proxied, not {uri}"
                )));
            }
            (absolute(authority, uri)?, false)
        } else {
            match uri.path_and_query() {
                Some(path) if path.as_str().starts_with('/') => (None, true),
                _ => {
                    return Err(ProxyError::bad_request(format!(
                        "request target {uri} is neither a path nor a URL"
                    )));
                }
            }
        };
        if gateway && let Some((_, upstream)) = self.shorthand() {
            // The upstream's own URLs, as a gateway in front of it.
            let (scheme, authority) = upstream.fixed().expect("a shorthand has an upstream");
            let url = with_path(scheme.clone(), authority.clone(), uri)?;
            return Ok(Target {
                url,
                forward: false,
                upstream: upstream.clone(),
            });
        }
        let url = match url {
            Some(url) => url,
            None => {
                let host = request
                    .headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .and_then(|h| h.parse::<Authority>().ok())
                    .filter(|a| !a.as_str().contains('@'))
                    .ok_or_else(|| ProxyError::bad_request("no usable Host: which site?"))?;
                absolute(&host, uri)?.expect("built from a host")
            }
        };
        let upstream = self.for_host(url.host().unwrap_or(""))?;
        let port = url.port_u16().unwrap_or(80);
        if upstream.is_direct() && !direct_port(port) {
            return Err(ProxyError::forbidden(format!(
                "port {port}: a direct route goes to 80, 443 and ports from 1024 only"
            )));
        }
        Ok(Target {
            url,
            forward: !upstream.is_direct(),
            upstream,
        })
    }

    /// The way to `host` (as a URL's authority writes it: an IPv6 literal
    /// in brackets): the first route whose hosts match, as for a request's
    /// URL; a CONNECT's tunnel is routed by it too.
    ///
    /// # Errors
    /// A host no route takes (403).
    pub fn for_host(&self, host: &str) -> Result<Arc<Upstream>, ProxyError> {
        self.routes
            .iter()
            .find(|(hosts, _)| match hosts {
                RouteHosts::Shorthand => true,
                RouteHosts::Listed(patterns) => HostPattern::any_matches(patterns, host),
            })
            .map(|(_, upstream)| upstream.clone())
            .ok_or_else(|| ProxyError::forbidden(format!("no route for {host}")))
    }

    /// The upstream proxy a CONNECT for `host` goes through, or `None` to
    /// tunnel direct: on a direct route, and under the `--upstream`
    /// shorthand, whose upstream is the accelerator of a site (which does
    /// not tunnel); `[[route]]` tables send it where they send the host.
    ///
    /// # Errors
    /// A host no route takes (403).
    pub fn tunnel_via(&self, host: &str) -> Result<Option<Arc<Upstream>>, ProxyError> {
        if self.shorthand().is_some() {
            return Ok(None);
        }
        let upstream = self.for_host(host)?;
        Ok((!upstream.is_direct()).then_some(upstream))
    }

    fn shorthand(&self) -> Option<&(RouteHosts, Arc<Upstream>)> {
        self.routes
            .first()
            .filter(|(hosts, _)| matches!(hosts, RouteHosts::Shorthand))
    }
}

/// Whether a direct route may fetch from `port`: the web's 80 and 443, and
/// the unprivileged ports where test and application servers listen, but
/// not the other well-known services (mail, ssh, …), which an `http://`
/// URL must not be used to talk to (as Squid's `Safe_ports`).
fn direct_port(port: u16) -> bool {
    port == 80 || port == 443 || port >= 1024
}

/// `http://{authority}{path of uri}`, refusing userinfo (P-12).
fn absolute(authority: &Authority, uri: &Uri) -> Result<Option<Uri>, ProxyError> {
    if authority.as_str().contains('@') {
        return Err(ProxyError::bad_request("a URL with userinfo is refused"));
    }
    with_path(Scheme::HTTP, authority.clone(), uri).map(Some)
}

fn with_path(scheme: Scheme, authority: Authority, uri: &Uri) -> Result<Uri, ProxyError> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| ProxyError::bad_request(format!("bad URL {uri}: {e}")))
}
