//! Which addresses a proxy that fetches from the whole web may connect to
//! (the SSRF guard, A-7): public unicast addresses, and of the others
//! (loopback, link-local such as a cloud's metadata service at
//! 169.254.169.254, private, shared, unspecified, multicast, documentation
//! and reserved ranges, also when an IPv6 address carries one through
//! NAT64 or 6to4) only those the operator listed.
//!
//! It is applied to the addresses a name resolved to, just before
//! connecting and to the same list the connection is made from, so a
//! name that resolves to a public address when checked and a private one
//! when used (DNS rebinding) cannot get past it.
//!
//! Leaves out names (which hosts may be asked for is the allow-list of
//! [`super::host_pattern`]) and ports.
//!
//! Main type: [`AddressPolicy`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The addresses a connection may go to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Non-public ranges that are allowed all the same.
    pub allowed: Vec<IpNet>,
}

impl AddressPolicy {
    /// Public addresses only, plus `allowed`.
    pub fn new(allowed: Vec<IpNet>) -> AddressPolicy {
        AddressPolicy { allowed }
    }

    /// Whether a connection may go to `address`.
    pub fn permits(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        let listed = |address: &IpAddr| self.allowed.iter().any(|net| net.contains(address));
        if listed(&address) {
            return true;
        }
        // An IPv6 address that carries an IPv4 one (NAT64, 6to4) reaches
        // that address: it is judged as that address too.
        match embedded_ipv4(address) {
            Some(v4) => (is_public_v4(v4) && is_public(address)) || listed(&IpAddr::V4(v4)),
            None => is_public(address),
        }
    }
}

/// `address`, with an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) as the
/// IPv4 address it is.
pub fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The IPv4 address an IPv6 one leads to through a translator: NAT64's
/// `64:ff9b::/96` and `64:ff9b:1::/48` (RFC 6052, 8215), 6to4's `2002::/16`
/// (RFC 3056), and IPv4-translated `::ffff:0:a.b.c.d` (RFC 2765).
fn embedded_ipv4(address: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = address else {
        return None;
    };
    let s = v6.segments();
    let ipv4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(ipv4(hi, lo)),
        [0x64, 0xff9b, 1, ..] => Some(ipv4(s[6], s[7])),
        [0x2002, hi, lo, ..] => Some(ipv4(hi, lo)),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => Some(ipv4(hi, lo)),
        _ => None,
    }
}

/// Whether `address` is a public unicast address.
fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(v4.is_unspecified()
        || v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_multicast()
        || v4.is_broadcast()
        || v4.is_documentation()
        || a == 0
        // Shared address space (carrier-grade NAT), 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments, 192.0.0.0/24.
        || (a == 192 && b == 0 && c == 0)
        // Benchmarking, 198.18.0.0/15.
        || (a == 198 && (18..20).contains(&b))
        // Reserved, 240.0.0.0/4.
        || a >= 240)
}

fn is_public_v6(v6: Ipv6Addr) -> bool {
    let first = v6.segments()[0];
    !(v6.is_unspecified()
        || v6.is_loopback()
        || v6.is_multicast()
        // Unique local, fc00::/7.
        || (first & 0xfe00) == 0xfc00
        // Link-local, fe80::/10.
        || (first & 0xffc0) == 0xfe80
        // Documentation, 2001:db8::/32.
        || (first == 0x2001 && v6.segments()[1] == 0x0db8)
        // IPv4-compatible and other addresses under ::/96 (mapped ones
        // were turned into IPv4 by the caller).
        || v6.segments()[..6].iter().all(|s| *s == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_public_addresses_by_default() {
        let policy = AddressPolicy::default();
        for public in ["93.184.215.14", "2606:4700::1111", "8.8.8.8"] {
            assert!(policy.permits(ip(public)), "{public}");
        }
        for inner in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::7f00:1",
            "64:ff9b::a00:5",
            "64:ff9b::7f00:1",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "::ffff:0:a00:1",
        ] {
            assert!(!policy.permits(ip(inner)), "{inner}");
        }
    }

    #[test]
    fn translated_public_ipv4_addresses_stay_public() {
        let policy = AddressPolicy::default();
        assert!(policy.permits(ip("64:ff9b::808:808")));
        assert!(policy.permits(ip("2002:808:808::1")));
        let listed = AddressPolicy::new(vec!["10.0.0.0/8".parse().unwrap()]);
        assert!(listed.permits(ip("64:ff9b::a00:5")));
    }

    #[test]
    fn listed_ranges_are_allowed() {
        let policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
        assert!(policy.permits(ip("127.0.0.2")));
        assert!(policy.permits(ip("::ffff:127.0.0.1")));
        assert!(!policy.permits(ip("10.0.0.1")));
        assert!(!policy.permits(ip("::1")));
    }
}
