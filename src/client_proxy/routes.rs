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
//! A route may name fallbacks: its **ways**, tried in order. A request
//! takes the first way not marked down ([`crate::http::health`]: each
//! upstream proxy has one health, shared by every route naming it; a
//! direct way has none, its hosts being whoever the URLs name), so that
//! while the first is down even a POST goes to the next without trying
//! it. A GET or HEAD without a body whose way failed before answering
//! anything goes on to the next way ([`Target::next`]; the fetch and
//! pass paths decide, since only they know the request is safe to
//! repeat); a POST never does. A direct way keeps its address guard and
//! port rule: a URL on a port it refuses skips it.
//!
//! A CONNECT is routed by its host the same way ([`Routes::tunnel_via`]):
//! tunnelled direct, or through the first way not marked down, as a
//! CONNECT to that proxy (`tunnel.rs`); it is not tried again elsewhere.
//!
//! Leaves out the trip itself ([`super::upstream`]) and the tunnel's.
//!
//! Main types: [`RouteConfig`], [`Routes`], [`Target`].

use std::collections::HashMap;
use std::sync::Arc;

use http::header;
use http::uri::{Authority, Scheme};
use http::{Request, Uri};
use tokio::time::Instant;

use super::upstream::Upstream;
use crate::http::address_policy::AddressPolicy;
use crate::http::dial::Dialer;
use crate::http::error::ProxyError;
use crate::http::health::{Health, HealthPolicy, HealthView};
use crate::http::host_pattern::HostPattern;

/// One route, validated.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// The hosts it takes.
    pub hosts: RouteHosts,
    /// Where they go.
    pub to: RouteTo,
    /// Where they go, in order, when `to` (or the fallback before) is
    /// marked down or cannot be reached.
    pub fallback: Vec<RouteTo>,
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
            fallback: Vec::new(),
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
    routes: Vec<Route>,
}

struct Route {
    hosts: RouteHosts,
    /// Its upstream (or direct), then its fallbacks.
    ways: Arc<[Arc<Upstream>]>,
}

/// Where one request goes.
#[derive(Clone)]
pub(super) struct Target {
    /// The absolute URL (the cache key's source).
    pub url: Uri,
    /// Sent in absolute-form to an upstream proxy; else origin-form (to
    /// the upstream itself as a gateway, or to the URL's own host).
    pub forward: bool,
    /// The way there.
    pub upstream: Arc<Upstream>,
    /// The route's ways, `upstream` the one at `at`.
    ways: Arc<[Arc<Upstream>]>,
    at: usize,
}

impl Routes {
    /// Builds a pool per upstream proxy (routes naming the same one share
    /// it, and its health under `policy`, carried over from `previous`,
    /// the routes a reload replaces) and per direct way.
    ///
    /// # Errors
    /// A bad upstream URL, or an `https://` one without `tls`.
    pub fn new(
        configs: &[RouteConfig],
        tls: Option<&Arc<rustls::ClientConfig>>,
        dialer: &Dialer,
        policy: HealthPolicy,
        previous: Option<&Routes>,
    ) -> Result<Routes, RouteError> {
        if configs.is_empty() {
            return Err(RouteError::NoRoute);
        }
        let mut proxies: HashMap<String, Arc<Upstream>> = HashMap::new();
        let mut routes = Vec::with_capacity(configs.len());
        for config in configs {
            let mut ways = Vec::with_capacity(1 + config.fallback.len());
            for to in std::iter::once(&config.to).chain(&config.fallback) {
                let way = match to {
                    RouteTo::Upstream(url) => {
                        let bad = || RouteError::BadUpstream(url.to_string());
                        let scheme = url.scheme().cloned().ok_or_else(bad)?;
                        if !(scheme == Scheme::HTTP || scheme == Scheme::HTTPS)
                            || url.path_and_query().is_some_and(|p| p.as_str() != "/")
                        {
                            return Err(bad());
                        }
                        let authority = url.authority().cloned().ok_or_else(bad)?;
                        let name = format!("{scheme}://{authority}");
                        if let Some(known) = proxies.get(&name) {
                            known.clone()
                        } else {
                            let tls = match (scheme == Scheme::HTTPS, tls) {
                                (true, Some(tls)) => Some(tls.clone()),
                                (true, None) => return Err(RouteError::NoTls),
                                (false, _) => None,
                            };
                            let health = match previous.and_then(|routes| routes.health_of(&name)) {
                                Some(known) => Health::continuing(known, policy),
                                None => Health::new(name.clone(), policy),
                            };
                            let upstream = Upstream::new(authority, tls, dialer, health)
                                .map_err(RouteError::TlsName)?;
                            let upstream = Arc::new(upstream);
                            proxies.insert(name, upstream.clone());
                            upstream
                        }
                    }
                    RouteTo::Direct(addresses) => {
                        Arc::new(Upstream::direct(addresses.clone(), dialer))
                    }
                };
                ways.push(way);
            }
            routes.push(Route {
                hosts: config.hosts.clone(),
                ways: ways.into(),
            });
        }
        Ok(Routes { routes })
    }

    /// Every upstream proxy's health, once each, in the order the routes
    /// name them.
    fn healths(&self) -> impl Iterator<Item = &Health> {
        let mut seen: Vec<*const Upstream> = Vec::new();
        self.routes
            .iter()
            .flat_map(|route| route.ways.iter())
            .filter(move |way| {
                let new = !seen.contains(&Arc::as_ptr(way));
                seen.push(Arc::as_ptr(way));
                new
            })
            .filter_map(|way| way.health())
    }

    fn health_of(&self, name: &str) -> Option<&Health> {
        self.healths().find(|health| health.name() == name)
    }

    /// Each upstream proxy's health now (direct ways have none).
    pub fn health_views(&self, now: Instant) -> Vec<HealthView> {
        self.healths().map(|health| health.view(now)).collect()
    }

    /// The target of `request`: its absolute URL and the way there, the
    /// first of its route's that takes the URL and is not marked down
    /// (else the first that takes it, which will refuse it).
    ///
    /// # Errors
    /// A target that is not an `http://` URL or a path (400), a host no
    /// route takes, or a port no way of its route goes to (403).
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
        if gateway && let Some(route) = self.shorthand() {
            // The upstream's own URLs, as a gateway in front of it.
            let upstream = &route.ways[0];
            let (scheme, authority) = upstream.fixed().expect("a shorthand has an upstream");
            let url = with_path(scheme.clone(), authority.clone(), uri)?;
            return Ok(Target {
                url,
                forward: false,
                upstream: upstream.clone(),
                ways: route.ways.clone(),
                at: 0,
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
        let route = self.route_for(url.host().unwrap_or(""))?;
        let mut taking = (0..route.ways.len()).filter(|&at| takes(&route.ways[at], &url));
        let Some(first) = taking.next() else {
            let port = url.port_u16().unwrap_or(80);
            return Err(ProxyError::forbidden(format!(
                "port {port}: a direct route goes to 80, 443 and ports from 1024 only"
            )));
        };
        let now = Instant::now();
        let at = std::iter::once(first)
            .chain(taking)
            .find(|&at| !route.ways[at].is_down(now))
            .unwrap_or(first);
        Ok(Target::on(url, route.ways.clone(), at))
    }

    /// The route of `host` (as a URL's authority writes it: an IPv6
    /// literal in brackets): the first whose hosts match.
    ///
    /// # Errors
    /// A host no route takes (403).
    fn route_for(&self, host: &str) -> Result<&Route, ProxyError> {
        self.routes
            .iter()
            .find(|route| match &route.hosts {
                RouteHosts::Shorthand => true,
                RouteHosts::Listed(patterns) => HostPattern::any_matches(patterns, host),
            })
            .ok_or_else(|| ProxyError::forbidden(format!("no route for {host}")))
    }

    /// The upstream proxy a CONNECT for `host` goes through, or `None` to
    /// tunnel direct: when the first way of its route not marked down is
    /// direct, and under the `--upstream` shorthand, whose upstream is the
    /// accelerator of a site (which does not tunnel); `[[route]]` tables
    /// send it where they send the host.
    ///
    /// # Errors
    /// A host no route takes (403).
    pub fn tunnel_via(&self, host: &str) -> Result<Option<Arc<Upstream>>, ProxyError> {
        if self.shorthand().is_some() {
            return Ok(None);
        }
        let ways = &self.route_for(host)?.ways;
        let now = Instant::now();
        let upstream = ways
            .iter()
            .find(|way| !way.is_down(now))
            .unwrap_or(&ways[0]);
        Ok((!upstream.is_direct()).then(|| upstream.clone()))
    }

    fn shorthand(&self) -> Option<&Route> {
        self.routes
            .first()
            .filter(|route| matches!(route.hosts, RouteHosts::Shorthand))
    }
}

impl Target {
    /// `url` by the way at `at` of `ways`.
    fn on(url: Uri, ways: Arc<[Arc<Upstream>]>, at: usize) -> Target {
        let upstream = ways[at].clone();
        Target {
            url,
            forward: !upstream.is_direct(),
            upstream,
            ways,
            at,
        }
    }

    /// The way after this one, for a request safe to repeat that this one
    /// could not reach: the next of the route's ways that takes the URL
    /// and is not marked down, if any.
    pub fn next(&self) -> Option<Target> {
        let now = Instant::now();
        (self.at + 1..self.ways.len())
            .find(|&at| takes(&self.ways[at], &self.url) && !self.ways[at].is_down(now))
            .map(|at| Target::on(self.url.clone(), self.ways.clone(), at))
    }
}

/// Whether `way` goes to `url`: an upstream proxy takes any; a direct way
/// only the ports [`direct_port`] allows.
fn takes(way: &Upstream, url: &Uri) -> bool {
    !way.is_direct() || direct_port(url.port_u16().unwrap_or(80))
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
