//! Targeted cache control (RFC 9213): `CDN-Cache-Control` is for the
//! caches a site runs as its CDN. A client proxy in front of a site as its
//! gateway is one: there, a response's `CDN-Cache-Control` replaces its
//! `Cache-Control` and `Expires` in every caching decision, while the
//! user agent still gets the headers as the origin sent them. As a forward
//! proxy it is the users' cache, not the site's, and ignores the field.
//! [`TargetedCacheControl`] says which (a setting).
//!
//! Main items: [`TargetedCacheControl`], [`caching_view`].

use std::borrow::Cow;

use http::HeaderMap;
use http::header::{self, HeaderName};
use http::request::Parts;
use serde::{Deserialize, Serialize};

/// `CDN-Cache-Control` (RFC 9213 §3.1).
pub const CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");

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
    fn applies(self, parts: &Parts) -> bool {
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
    if !mode.applies(parts) || !headers.contains_key(&CDN_CACHE_CONTROL) {
        return Cow::Borrowed(headers);
    }
    let mut view = headers.clone();
    view.remove(header::CACHE_CONTROL);
    view.remove(header::EXPIRES);
    for value in headers.get_all(&CDN_CACHE_CONTROL) {
        view.append(header::CACHE_CONTROL, value.clone());
    }
    Cow::Owned(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

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
}
