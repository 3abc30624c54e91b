//! Targeted cache control (RFC 9213): `CDN-Cache-Control` is for the
//! caches a site runs as its CDN. A client proxy in front of a site as its
//! gateway is one: there, a response's `CDN-Cache-Control` replaces its
//! `Cache-Control` and `Expires` in every caching decision, while the
//! user agent still gets the headers as the origin sent them. As a forward
//! proxy it is the users' cache, not the site's, and ignores the field.
//! [`TargetedCacheControl`] says which (a setting).
//!
//! Where a response has no `CDN-Cache-Control`, its older cousin
//! `Surrogate-Control` (the Edge Architecture Specification 1.0) is read
//! the same way: its `max-age` and `no-store`, those targeted at us
//! (`;rproxy`, the token our requests announce in `Surrogate-Capability`)
//! over those for every surrogate, and none targeted at another.
//!
//! Main items: [`TargetedCacheControl`], [`caching_view`],
//! [`SURROGATE_CAPABILITY`].

use std::borrow::Cow;

use http::header::{self, HeaderName};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};

/// `CDN-Cache-Control` (RFC 9213 §3.1).
pub const CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");

/// `Surrogate-Control` (Edge Architecture Specification 1.0).
pub const SURROGATE_CONTROL: HeaderName = HeaderName::from_static("surrogate-control");

/// `Surrogate-Capability`, on requests we send as a site's gateway: the
/// device token a `Surrogate-Control` directive targets us with.
pub const SURROGATE_CAPABILITY: (HeaderName, &str) = (
    HeaderName::from_static("surrogate-capability"),
    "rproxy=\"Surrogate/1.0\"",
);

/// Our device token in `Surrogate-Control` (`max-age=60;rproxy`).
const SURROGATE_TOKEN: &str = "rproxy";

/// When `CDN-Cache-Control` is honoured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TargetedCacheControl {
    /// For requests that come as to a gateway (origin-form): the proxy is
    /// then the site's CDN.
    #[default]
    Gateway,
    /// For every request.
    Always,
    /// Never.
    Never,
}

impl TargetedCacheControl {
    /// Whether it applies to the request `parts`.
    pub fn applies(self, parts: &Parts) -> bool {
        match self {
            TargetedCacheControl::Gateway => parts.uri.authority().is_none(),
            TargetedCacheControl::Always => true,
            TargetedCacheControl::Never => false,
        }
    }
}

/// The response headers the caching rules read for `parts`: `headers`
/// themselves, or, where `CDN-Cache-Control` applies and is present, a
/// copy whose `Cache-Control` is its value and without `Expires` (RFC
/// 9213 §2.1: a cache that uses the targeted field ignores the others).
pub fn caching_view<'a>(
    mode: TargetedCacheControl,
    parts: &Parts,
    headers: &'a HeaderMap,
) -> Cow<'a, HeaderMap> {
    if !mode.applies(parts) {
        return Cow::Borrowed(headers);
    }
    let targeted: Vec<HeaderValue> = if headers.contains_key(&CDN_CACHE_CONTROL) {
        headers
            .get_all(&CDN_CACHE_CONTROL)
            .iter()
            .cloned()
            .collect()
    } else {
        match surrogate_directives(headers) {
            Some(directives) => vec![directives],
            None => return Cow::Borrowed(headers),
        }
    };
    let mut view = headers.clone();
    view.remove(header::CACHE_CONTROL);
    view.remove(header::EXPIRES);
    for value in targeted {
        view.append(header::CACHE_CONTROL, value);
    }
    Cow::Owned(view)
}

/// The `Surrogate-Control` directives meant for us, as a `Cache-Control`
/// value: `max-age=N` (a `+M` extension is left out) and `no-store`, from
/// the members targeted at us if any, else from the untargeted ones.
/// `None` when none is meant for us.
fn surrogate_directives(headers: &HeaderMap) -> Option<HeaderValue> {
    let members: Vec<(String, Option<String>)> = headers
        .get_all(&SURROGATE_CONTROL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|member| match member.split_once(';') {
            Some((directive, target)) => {
                (directive.trim().to_owned(), Some(target.trim().to_owned()))
            }
            None => (member.trim().to_owned(), None),
        })
        .collect();
    let ours = |target: &Option<String>| {
        target
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case(SURROGATE_TOKEN))
    };
    let targeted = members.iter().any(|(_, target)| ours(target));
    let kept: Vec<String> = members
        .iter()
        .filter(|(_, target)| {
            if targeted {
                ours(target)
            } else {
                target.is_none()
            }
        })
        .filter_map(|(directive, _)| {
            let lower = directive.to_ascii_lowercase();
            if lower == "no-store" {
                return Some(lower);
            }
            let seconds = lower.strip_prefix("max-age=")?;
            let seconds = seconds.split_once('+').map_or(seconds, |(n, _)| n);
            (!seconds.is_empty() && seconds.bytes().all(|b| b.is_ascii_digit()))
                .then(|| format!("max-age={seconds}"))
        })
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(", ")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        http::Request::get(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn rfc9213_2_1_the_targeted_field_replaces_cache_control_and_expires_at_a_gateway() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(header::EXPIRES, HeaderValue::from_static("0"));
        headers.insert(CDN_CACHE_CONTROL, HeaderValue::from_static("max-age=600"));
        let gateway = parts("/app.js");
        let view = caching_view(TargetedCacheControl::Gateway, &gateway, &headers);
        assert_eq!(view[header::CACHE_CONTROL], "max-age=600");
        assert!(view.get(header::EXPIRES).is_none());
        let forward = parts("http://example.com/app.js");
        let view = caching_view(TargetedCacheControl::Gateway, &forward, &headers);
        assert_eq!(
            view[header::CACHE_CONTROL],
            "no-store",
            "a forward proxy ignores it"
        );
        let view = caching_view(TargetedCacheControl::Always, &forward, &headers);
        assert_eq!(view[header::CACHE_CONTROL], "max-age=600");
        let view = caching_view(TargetedCacheControl::Never, &gateway, &headers);
        assert_eq!(view[header::CACHE_CONTROL], "no-store");
    }

    fn surrogate(values: &[&str], cache_control: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(cc) = cache_control {
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_str(cc).unwrap());
        }
        for value in values {
            headers.append(SURROGATE_CONTROL, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn surrogate_control_meant_for_us_replaces_cache_control_at_a_gateway() {
        let gateway = parts("/app.js");
        let view = |headers: &HeaderMap| {
            caching_view(TargetedCacheControl::Gateway, &gateway, headers)
                .get(header::CACHE_CONTROL)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let for_all = surrogate(&["foobar, MaX-aGe=3600+60"], Some("no-store"));
        assert_eq!(view(&for_all).as_deref(), Some("max-age=3600"));
        let for_us = surrogate(&["max-age=10, no-store;rproxy"], Some("max-age=600"));
        assert_eq!(view(&for_us).as_deref(), Some("no-store"));
        let for_another = surrogate(&["max-age=3600;not-for-you"], Some("max-age=5"));
        assert_eq!(view(&for_another).as_deref(), Some("max-age=5"));
        let malformed = surrogate(&["max-age =100"], Some("max-age=1"));
        assert_eq!(view(&malformed).as_deref(), Some("max-age=1"));
        let forward = parts("http://example.com/app.js");
        let ignored = caching_view(TargetedCacheControl::Gateway, &forward, &for_all);
        assert_eq!(ignored[header::CACHE_CONTROL], "no-store");
    }
}
