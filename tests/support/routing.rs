//! Building an accelerator's sites and a client proxy's routes in tests:
//! host patterns, a site for an origin, a parent-mode site, a route to an
//! upstream or direct, each in one call.

use std::net::SocketAddr;

use rproxy::accelerator::{AcceleratorConfig, ParentPolicy, SiteConfig, SiteNames, SiteOrigin};
use rproxy::client_proxy::{RouteConfig, RouteHosts, RouteTo};
use rproxy::http::address_policy::AddressPolicy;
use rproxy::http::host_pattern::HostPattern;

use super::topology::accelerator_config;

/// Host patterns, as a config file writes them.
pub fn patterns(names: &[&str]) -> Vec<HostPattern> {
    names
        .iter()
        .map(|name| HostPattern::parse(name).unwrap())
        .collect()
}

/// An address policy allowing the ranges `allowed` beside public ones.
pub fn allowing(allowed: &[&str]) -> AddressPolicy {
    AddressPolicy::new(allowed.iter().map(|a| a.parse().unwrap()).collect())
}

/// A site answering to `names`, its origin `http://{origin}`.
pub fn site(names: &[&str], origin: SocketAddr) -> SiteConfig {
    SiteConfig {
        names: SiteNames::Listed(patterns(names)),
        origin: SiteOrigin::Server {
            url: format!("http://{origin}").parse().unwrap(),
            ca_file: None,
            health_path: None,
        },
    }
}

/// A parent-mode site for every name, fetching from `hosts` on `ports` at
/// public addresses and the `allowed` ranges.
pub fn parent_site(hosts: &[&str], ports: Vec<u16>, allowed: &[&str]) -> SiteConfig {
    SiteConfig {
        names: SiteNames::Listed(patterns(&["*"])),
        origin: SiteOrigin::Parent(ParentPolicy {
            hosts: patterns(hosts),
            ports,
            addresses: allowing(allowed),
            ca_file: None,
        }),
    }
}

/// The tests' accelerator settings with `sites`.
pub fn with_sites(sites: Vec<SiteConfig>) -> AcceleratorConfig {
    AcceleratorConfig {
        sites,
        ..accelerator_config("127.0.0.1:1".parse().unwrap())
    }
}

/// A route sending `hosts` to the upstream proxy at `upstream`.
pub fn upstream_route(hosts: &[&str], upstream: SocketAddr) -> RouteConfig {
    RouteConfig {
        hosts: RouteHosts::Listed(patterns(hosts)),
        to: RouteTo::Upstream(format!("http://{upstream}").parse().unwrap()),
        fallback: Vec::new(),
    }
}

/// A route sending `hosts` direct, the `allowed` ranges reachable.
pub fn direct_route(hosts: &[&str], allowed: &[&str]) -> RouteConfig {
    RouteConfig {
        hosts: RouteHosts::Listed(patterns(hosts)),
        to: RouteTo::Direct(allowing(allowed)),
        fallback: Vec::new(),
    }
}
