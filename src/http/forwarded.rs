//! Telling the next hop who asked: `Forwarded` (RFC 7239) and the older
//! `X-Forwarded-For` / `X-Forwarded-Proto` that most origins read. Each hop
//! appends its client to what a trusted previous hop sent; from anyone
//! else these fields are replaced, since a client can write whatever it
//! likes in them.
//!
//! Leaves out `X-Forwarded-Host` and `by=` (our own address is the
//! origin's business only when it asks), and reading these fields: rproxy
//! decides nothing by them.
//!
//! Main item: [`forward`].

use std::net::IpAddr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName, HeaderValue};
use ipnet::IpNet;

use super::address_policy::canonical;

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`: not written, but not passed on from an untrusted
/// client either.
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// One hop's view of the request it forwards.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The client's address (`None` when unknown, e.g. a Unix socket).
    pub client: Option<IpAddr>,
    /// Whether the client reached us over TLS.
    pub tls: bool,
    /// The host the client asked for, as it wrote it.
    pub host: Option<&'a str>,
}

/// Adds `hop` to `headers`' `Forwarded`, `X-Forwarded-For` and
/// `X-Forwarded-Proto`; what the client sent in them is kept only when its
/// address is in `trusted`.
pub fn forward(headers: &mut HeaderMap, hop: Hop<'_>, trusted: &[IpNet]) {
    // A dual-stack listener sees IPv4 peers as `::ffff:a.b.c.d`.
    let client = hop.client.map(canonical);
    let believed = client.is_some_and(|client| trusted.iter().any(|net| net.contains(&client)));
    if !believed {
        for name in [
            &FORWARDED,
            &X_FORWARDED_FOR,
            &X_FORWARDED_PROTO,
            &X_FORWARDED_HOST,
        ] {
            headers.remove(name);
        }
    }
    let proto = if hop.tls { "https" } else { "http" };
    let node = match client {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => format!("\"[{v6}]\""),
        None => "unknown".to_owned(),
    };
    let mut element = format!("for={node}");
    if let Some(host) = hop.host.filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    }) {
        element.push_str(&format!(";host=\"{host}\""));
    }
    element.push_str(&format!(";proto={proto}"));
    append_to_list(headers, &FORWARDED, &element);
    let address = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    append_to_list(headers, &X_FORWARDED_FOR, &address);
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
}

/// Appends `item` to the comma-separated list in `name`, joining the field
/// lines there into one (some origins read only the first line).
fn append_to_list(headers: &mut HeaderMap, name: &HeaderName, item: &str) {
    let mut list: Vec<String> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    list.push(item.to_owned());
    let joined = HeaderValue::from_str(&list.join(", ")).expect("visible ASCII");
    headers.insert(name, joined);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(client: &str) -> Hop<'static> {
        Hop {
            client: Some(client.parse().unwrap()),
            tls: false,
            host: Some("www.example.com"),
        }
    }

    fn header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> &'a str {
        headers.get(name).unwrap().to_str().unwrap()
    }

    #[test]
    fn an_untrusted_clients_claims_are_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(&FORWARDED, HeaderValue::from_static("for=10.9.9.9"));
        headers.insert(&X_FORWARDED_FOR, HeaderValue::from_static("10.9.9.9"));
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        forward(&mut headers, hop("192.0.2.7"), &[]);
        assert_eq!(
            header(&headers, &FORWARDED),
            "for=192.0.2.7;host=\"www.example.com\";proto=http"
        );
        assert_eq!(header(&headers, &X_FORWARDED_FOR), "192.0.2.7");
        assert_eq!(header(&headers, &X_FORWARDED_PROTO), "http");
    }

    #[test]
    fn a_trusted_hops_list_is_appended_to() {
        let mut headers = HeaderMap::new();
        headers.insert(
            &FORWARDED,
            HeaderValue::from_static("for=198.51.100.1;proto=https"),
        );
        headers.insert(&X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.1"));
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        let trusted = ["127.0.0.0/8".parse().unwrap()];
        forward(&mut headers, hop("127.0.0.1"), &trusted);
        assert_eq!(
            header(&headers, &FORWARDED),
            "for=198.51.100.1;proto=https, for=127.0.0.1;host=\"www.example.com\";proto=http"
        );
        assert_eq!(
            header(&headers, &X_FORWARDED_FOR),
            "198.51.100.1, 127.0.0.1"
        );
        assert_eq!(header(&headers, &X_FORWARDED_PROTO), "https");
    }

    #[test]
    fn a_mapped_ipv4_peer_is_matched_and_written_as_ipv4() {
        let mut headers = HeaderMap::new();
        headers.insert(&X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.1"));
        let trusted = ["10.0.0.0/8".parse().unwrap()];
        forward(&mut headers, hop("::ffff:10.1.2.3"), &trusted);
        assert_eq!(header(&headers, &X_FORWARDED_FOR), "198.51.100.1, 10.1.2.3");
        assert!(header(&headers, &FORWARDED).starts_with("for=10.1.2.3;"));
    }

    #[test]
    fn ipv6_clients_are_quoted() {
        let mut headers = HeaderMap::new();
        forward(&mut headers, hop("2001:db8::1"), &[]);
        assert!(header(&headers, &FORWARDED).starts_with("for=\"[2001:db8::1]\";"));
    }
}
