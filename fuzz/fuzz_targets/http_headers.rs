//! F-1: our own parsers of HTTP header values, on top of hyper's: Basic
//! credentials, Via hop counting, Hsync-Accept, Cache-Control, origin
//! digests, and the cache-key normaliser.
//!
//! Input: any bytes, used as one header value (when hyper would accept it
//! as one) and as a URL. Oracle: no panic; Basic credentials re-encode to
//! what was decoded; a normalised cache key normalises to itself.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use rproxy::http::auth::{basic_credentials, parse_basic};
use rproxy::cache::CacheKey;
use rproxy::client_proxy::transfer::OriginDigest;
use rproxy::client_proxy::upstream::Advertised;
use rproxy::cache::freshness::CacheControl;
use rproxy::http::server::via_hops;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = HeaderValue::from_bytes(data) {
        if let Some((user, password)) = parse_basic(&value) {
            let again = basic_credentials(&user, &password);
            assert_eq!(parse_basic(&again), Some((user, password)));
        }
        let _ = Advertised::parse(&value);
        let mut headers = HeaderMap::new();
        for name in ["via", "cache-control", "content-digest"] {
            headers.append(name, value.clone());
        }
        assert!(via_hops(&headers) <= data.len() + 1);
        let _ = CacheControl::parse(&headers);
        let _ = OriginDigest::parse_all(&headers, "content-digest");
    }
    if let Ok(url) = std::str::from_utf8(data)
        && let Ok(key) = CacheKey::parse(url)
    {
        let again = CacheKey::parse(key.url()).expect("a normalised key parses");
        assert_eq!(again.url(), key.url(), "normalisation is idempotent");
    }
});
