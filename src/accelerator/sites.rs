//! Which site a request is for, and where it goes: the first site whose
//! names match the host the client asked for (the absolute-form target's
//! authority, else `Host`) serves it, from its origin server or, for a
//! parent-mode site, from the URL's own host once the allow-list agrees.
//! A CONNECT is routed the same way, by its `host:port`, and only a
//! parent-mode site tunnels, within the same allow-list ([`Sites::tunnel`]).
//! A request no site answers to is refused here, before any connection
//! is made (P-12, A-7): an absolute-form target with 400, an unknown
//! `Host` with 421, a destination outside a parent's allow-list with 403.
//!
//! Each origin server has a [`Health`] (sites with the same origin share
//! one) that the trip there feeds, and that the active checks of a
//! `health-path` feed too ([`Sites::checks`]); a reload carries it over
//! by the origin's URL. A parent-mode site has none: its hosts are
//! whoever the URLs name, and one failing says nothing of the others.
//!
//! Leaves out what is sent (the rewrite is `origin.rs`'s) and the check of
//! the addresses a name resolves to, which happens where the connection
//! is made ([`crate::http::dial`]), so that what was checked is what is
//! connected to.
//!
//! Main types: [`Sites`], [`Route`], [`Tunnel`].

use std::collections::HashMap;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Uri};
use hyper_util::client::legacy::Client;

use super::checks::Check;
use super::config::{ConfigError, ParentPolicy, SiteConfig, SiteNames, SiteOrigin};
use crate::http::dial::{Dialer, OriginConnector};
use crate::http::error::ProxyError;
use crate::http::health::{Health, HealthPolicy, HealthView};
use crate::http::host_pattern::HostPattern;
use crate::http::server::ProxyBody;
use crate::http::tls::{TlsSession, origin_client_config};
use crate::http::tunnel::Destination;

/// A pooled HTTP/1.1 client to origins.
pub(super) type OriginClient = Client<OriginConnector, ProxyBody>;

/// The sites, ready to route.
pub(super) struct Sites {
    sites: Vec<Site>,
}

struct Site {
    names: SiteNames,
    origin: Origin,
    client: OriginClient,
    /// How the site's connections are opened (a parent's tunnels too).
    dialer: Dialer,
    /// The origin server's; `None` for a parent.
    health: Option<Arc<Health>>,
}

enum Origin {
    Server {
        scheme: Scheme,
        authority: Authority,
        health_path: Option<PathAndQuery>,
    },
    Parent(ParentPolicy),
}

/// Where one request goes.
pub(super) struct Route {
    /// The absolute URL fetched (hyper writes it in origin-form).
    pub url: Uri,
    /// The `Host` the origin is sent.
    pub host: HeaderValue,
    /// The host the client asked for, for `Forwarded` and the logs.
    pub asked: Option<String>,
    /// The pool the request goes through.
    pub client: OriginClient,
    /// The origin server's health; `None` for a parent-mode site.
    pub health: Option<Arc<Health>>,
    /// The site's own origin (not a parent's whole web): its changes may
    /// go in the change feed.
    pub in_feed: bool,
}

/// Where one CONNECT goes: a parent-mode site's tunnel.
pub(super) struct Tunnel {
    /// What it asked for, within the parent's allow-list.
    pub destination: Destination,
    /// Dials it at addresses the parent's policy permits.
    pub dialer: Dialer,
}

/// The host a request asked for: the authority of an absolute-form
/// target, else the `Host` header.
struct Asked {
    authority: Authority,
    /// From an absolute-form target (or an HTTP/2 `:authority` that does
    /// not name us).
    absolute: bool,
    scheme: Scheme,
}

impl Sites {
    /// Connects nothing yet; builds a pool per site, and a [`Health`] per
    /// origin server under `policy`, carrying over what `previous` (the
    /// sites a reload replaces) knew of the same origin.
    ///
    /// # Errors
    /// A bad origin URL, no site, or TLS settings that cannot be loaded.
    pub fn new(
        configs: &[SiteConfig],
        connect_timeout: std::time::Duration,
        policy: HealthPolicy,
        previous: Option<&Sites>,
    ) -> Result<Sites, ConfigError> {
        if configs.is_empty() {
            return Err(ConfigError::NoSite);
        }
        let mut sites = Vec::with_capacity(configs.len());
        let mut healths: HashMap<String, Arc<Health>> = HashMap::new();
        for config in configs {
            let (origin, dialer) = match &config.origin {
                SiteOrigin::Server {
                    url,
                    ca_file,
                    health_path,
                } => {
                    let bad = || ConfigError::BadOrigin {
                        origin: url.to_string(),
                    };
                    let scheme = url.scheme().cloned().ok_or_else(bad)?;
                    let authority = url.authority().cloned().ok_or_else(bad)?;
                    let tls = match scheme.as_str() {
                        "http" => None,
                        "https" => Some(origin_client_config(ca_file.as_deref())?),
                        _ => return Err(bad()),
                    };
                    if url.path_and_query().is_some_and(|p| p.as_str() != "/") {
                        return Err(bad());
                    }
                    let dialer = Dialer {
                        connect_timeout,
                        policy: None,
                        tls,
                        memory: None,
                    };
                    let origin = Origin::Server {
                        scheme,
                        authority,
                        health_path: health_path.clone(),
                    };
                    (origin, dialer)
                }
                SiteOrigin::Parent(policy) => {
                    // Without roots, `https://` URLs fail one by one;
                    // `http://` ones still work.
                    let tls = match origin_client_config(policy.ca_file.as_deref()) {
                        Ok(tls) => Some(tls),
                        Err(error) if policy.ca_file.is_none() => {
                            tracing::warn!(%error, "parent mode: https:// URLs cannot be fetched");
                            None
                        }
                        Err(error) => return Err(error.into()),
                    };
                    let dialer = Dialer {
                        connect_timeout,
                        policy: Some(Arc::new(policy.addresses.clone())),
                        tls,
                        memory: None,
                    };
                    (Origin::Parent(policy.clone()), dialer)
                }
            };
            let builder = match origin {
                Origin::Server { .. } => crate::http::server::upstream_client_builder(),
                Origin::Parent(_) => crate::http::server::web_client_builder(),
            };
            let client = builder.build(OriginConnector(dialer.clone()));
            let health = origin.name().map(|name| {
                healths
                    .entry(name.clone())
                    .or_insert_with(|| {
                        Arc::new(match previous.and_then(|sites| sites.health_of(&name)) {
                            Some(known) => Health::continuing(known, policy),
                            None => Health::new(name, policy),
                        })
                    })
                    .clone()
            });
            sites.push(Site {
                names: config.names.clone(),
                origin,
                client,
                dialer,
                health,
            });
        }
        Ok(Sites { sites })
    }

    /// The health of the origin server named `name`, if one is ours.
    fn health_of(&self, name: &str) -> Option<&Health> {
        self.sites
            .iter()
            .filter_map(|site| site.health.as_deref())
            .find(|health| health.name() == name)
    }

    /// Each origin server's health now, once per origin, in the order of
    /// the sites.
    pub fn health_views(&self, now: tokio::time::Instant) -> Vec<HealthView> {
        let mut views: Vec<HealthView> = Vec::new();
        for health in self.sites.iter().filter_map(|site| site.health.as_deref()) {
            if !views.iter().any(|view| view.name == health.name()) {
                views.push(health.view(now));
            }
        }
        views
    }

    /// The active checks: one per site whose origin has a `health-path`,
    /// through the site's own pool, with the site's first exact name as
    /// `Host` (a virtual host answers to it), else the origin's own.
    pub fn checks(&self) -> Vec<Check> {
        self.sites
            .iter()
            .filter_map(|site| {
                let Origin::Server {
                    scheme,
                    authority,
                    health_path: Some(path),
                } = &site.origin
                else {
                    return None;
                };
                let url = Uri::builder()
                    .scheme(scheme.clone())
                    .authority(authority.clone())
                    .path_and_query(path.clone())
                    .build()
                    .expect("a scheme, an authority and a path make a URL");
                let name = match &site.names {
                    SiteNames::Listed(names) => names.iter().find_map(|name| match name {
                        HostPattern::Exactly(name) => Some(name.as_str()),
                        _ => None,
                    }),
                    SiteNames::AnyHost => None,
                };
                let host = HeaderValue::from_str(name.unwrap_or(authority.as_str()))
                    .expect("a host name or an authority is a valid header value");
                Some(Check {
                    url,
                    host,
                    client: site.client.clone(),
                    health: Arc::downgrade(site.health.as_ref()?),
                })
            })
            .collect()
    }

    /// The route of `request` whose target (origin-form, or `*` for
    /// OPTIONS) is `target`.
    ///
    /// # Errors
    /// Why the request is not ours to forward.
    pub fn route<B>(&self, request: &Request<B>) -> Result<Route, ProxyError> {
        if request.method() == Method::CONNECT {
            return Err(ProxyError::bad_request(
                "the accelerator does not tunnel (CONNECT)",
            ));
        }
        let uri = request.uri();
        let target = match uri.path_and_query() {
            Some(target) if target.as_str().starts_with('/') => target.clone(),
            _ if request.method() == Method::OPTIONS => PathAndQuery::from_static("*"),
            _ => {
                return Err(ProxyError::bad_request(format!(
                    "request target {uri} is not a path"
                )));
            }
        };
        let asked = asked(request)?;
        for site in &self.sites {
            if !site.answers(asked.as_ref()) {
                continue;
            }
            return site.route(asked.as_ref(), target);
        }
        Err(match asked {
            Some(asked) if asked.absolute => ProxyError::bad_request(format!(
                "this accelerator serves no site at {uri}; it is elsewhere"
            )),
            Some(asked) => ProxyError::misdirected(format!(
                "this accelerator serves no site named {}",
                asked.authority.host()
            )),
            None => ProxyError::bad_request("no Host: which site?"),
        })
    }

    /// The tunnel a CONNECT asks for: the first site whose names match
    /// its host takes it, as it would a request for the host, and only a
    /// parent-mode site tunnels, within its allow-list of hosts, ports and
    /// (for an address literal; a name's addresses are checked when
    /// dialling) addresses.
    ///
    /// # Errors
    /// A target that is not `host:port`, or no parent-mode site for it
    /// (400, as any CONNECT was before parents tunnelled); a destination
    /// outside the parent's allow-list (403).
    pub fn tunnel<B>(&self, request: &Request<B>) -> Result<Tunnel, ProxyError> {
        let destination =
            Destination::from_target(request.uri()).map_err(ProxyError::bad_request)?;
        let host = destination.bracketed_host();
        let site = self.sites.iter().find(|site| match &site.names {
            SiteNames::AnyHost => true,
            SiteNames::Listed(names) => HostPattern::any_matches(names, &host),
        });
        match site {
            Some(Site {
                origin: Origin::Parent(policy),
                dialer,
                ..
            }) => {
                permitted(policy, &host, destination.port)?;
                Ok(Tunnel {
                    destination,
                    dialer: Dialer {
                        tls: None,
                        ..dialer.clone()
                    },
                })
            }
            _ => Err(ProxyError::bad_request(format!(
                "CONNECT {destination}: the accelerator tunnels for parent-mode sites only"
            ))),
        }
    }
}

/// What `request` asked for, if it says.
fn asked<B>(request: &Request<B>) -> Result<Option<Asked>, ProxyError> {
    let uri = request.uri();
    if let Some(authority) = uri.authority().filter(|a| !names_us(request, a)) {
        if authority.as_str().contains('@') {
            return Err(ProxyError::bad_request(format!(
                "{uri}: user information in a URL is not forwarded"
            )));
        }
        let scheme = match uri.scheme_str() {
            Some("https") => Scheme::HTTPS,
            Some("http") | None => Scheme::HTTP,
            Some(other) => {
                return Err(ProxyError::bad_request(format!(
                    "{uri}: the scheme {other} is not fetched here"
                )));
            }
        };
        return Ok(Some(Asked {
            authority: authority.clone(),
            absolute: true,
            scheme,
        }));
    }
    let authority = match request.headers().get(header::HOST) {
        Some(host) => host
            .to_str()
            .ok()
            .and_then(|h| h.parse::<Authority>().ok())
            .filter(|a| !a.as_str().contains('@'))
            .ok_or_else(|| ProxyError::bad_request("Host is not a host[:port]"))?,
        // HTTP/2 has no Host: its `:authority`, naming us, says which site
        // (a browser reaching a site's name on our TLS listener).
        None => match uri.authority() {
            Some(authority) if !authority.as_str().contains('@') => authority.clone(),
            _ => return Ok(None),
        },
    };
    Ok(Some(Asked {
        authority,
        absolute: false,
        scheme: Scheme::HTTP,
    }))
}

/// An HTTP/2 target always carries an authority: naming us (as the client
/// reached us) it is what origin-form is on HTTP/1.1.
pub(super) fn names_us<B>(request: &Request<B>, authority: &Authority) -> bool {
    request.version() == http::Version::HTTP_2
        && request
            .extensions()
            .get::<TlsSession>()
            .is_some_and(|tls| tls.names_us(authority))
}

fn default_port(scheme: &Scheme) -> u16 {
    if *scheme == Scheme::HTTPS { 443 } else { 80 }
}

impl Origin {
    /// An origin server's URL, `scheme://authority`, as its health is
    /// named; `None` for a parent.
    fn name(&self) -> Option<String> {
        match self {
            Origin::Server {
                scheme, authority, ..
            } => Some(format!("{scheme}://{authority}")),
            Origin::Parent(_) => None,
        }
    }
}

impl Site {
    /// Whether this site serves what the request asked for.
    fn answers(&self, asked: Option<&Asked>) -> bool {
        match (&self.names, asked) {
            (SiteNames::AnyHost, Some(asked)) if asked.absolute => {
                // The shorthand serves its origin's bytes under its origin's
                // URL only (P-12).
                let Origin::Server {
                    scheme, authority, ..
                } = &self.origin
                else {
                    return true;
                };
                asked
                    .authority
                    .host()
                    .eq_ignore_ascii_case(authority.host())
                    && asked
                        .authority
                        .port_u16()
                        .unwrap_or(default_port(&asked.scheme))
                        == authority.port_u16().unwrap_or(default_port(scheme))
            }
            (SiteNames::AnyHost, _) => true,
            (SiteNames::Listed(names), Some(asked)) => {
                HostPattern::any_matches(names, asked.authority.host())
            }
            (SiteNames::Listed(_), None) => false,
        }
    }

    fn route(&self, asked: Option<&Asked>, target: PathAndQuery) -> Result<Route, ProxyError> {
        let (scheme, authority, host) = match &self.origin {
            Origin::Server {
                scheme, authority, ..
            } => {
                let host = match (&self.names, asked) {
                    (SiteNames::Listed(_), Some(asked)) => asked.authority.clone(),
                    _ => authority.clone(),
                };
                (scheme.clone(), authority.clone(), host)
            }
            Origin::Parent(policy) => {
                let asked = asked.ok_or_else(|| ProxyError::bad_request("no Host: which site?"))?;
                let port = asked
                    .authority
                    .port_u16()
                    .unwrap_or(default_port(&asked.scheme));
                permitted(policy, asked.authority.host(), port)?;
                (
                    asked.scheme.clone(),
                    asked.authority.clone(),
                    asked.authority.clone(),
                )
            }
        };
        let url = Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query(target)
            .build()
            .map_err(|e| ProxyError::bad_request(format!("target: {e}")))?;
        Ok(Route {
            url,
            host: HeaderValue::from_str(host.as_str())
                .expect("an authority is a valid header value"),
            asked: asked.map(|a| a.authority.to_string()),
            client: self.client.clone(),
            health: self.health.clone(),
            in_feed: matches!(self.origin, Origin::Server { .. }),
        })
    }
}

/// Whether a parent-mode site may fetch from (or tunnel to) `host` (as
/// an authority writes it) and `port`: both in the allow-list, and an
/// address literal one the policy permits (a name's addresses are checked
/// when connecting).
fn permitted(policy: &ParentPolicy, host: &str, port: u16) -> Result<(), ProxyError> {
    if !HostPattern::any_matches(&policy.hosts, host) {
        return Err(ProxyError::forbidden(format!(
            "{host} is not among the hosts this parent fetches from"
        )));
    }
    if !policy.ports.contains(&port) {
        return Err(ProxyError::forbidden(format!(
            "port {port} is not among the ports this parent fetches from"
        )));
    }
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(address) = literal.parse::<std::net::IpAddr>()
        && !policy.addresses.permits(address)
    {
        return Err(ProxyError::forbidden(format!(
            "{address} is not an address this parent may connect to"
        )));
    }
    Ok(())
}
