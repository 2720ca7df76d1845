//! Which addresses are public, and the one form grants compare an address
//! in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// True for an address anyone on the internet could reach: not loopback,
/// private (RFC 1918, IPv6 unique local), shared (CGNAT `100.64.0.0/10`),
/// link-local, unspecified, multicast, broadcast, documentation or
/// benchmarking, reserved, or an IPv4-mapped, NAT64 or 6to4 form of one of
/// those. IPv6 outside `2000::/3` (the global unicast block) is not public.
pub fn is_public(ip: IpAddr) -> bool {
    address_class(ip).is_none()
}

/// What kind of non-public address `ip` is (`"loopback"`, `"private"`,
/// ...), or `None` for a public one. See [`is_public`].
pub fn address_class(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(ip) => ipv4_class(ip),
        IpAddr::V6(ip) => ipv6_class(ip),
    }
}

fn ipv4_class(ip: Ipv4Addr) -> Option<&'static str> {
    // (network, prefix length, class), after the IANA IPv4 special-purpose
    // address registry; the ranges it marks globally reachable are left
    // out as too small to matter.
    const NON_PUBLIC: [([u8; 4], u8, &str); 16] = [
        ([0, 0, 0, 0], 8, "unspecified (\"this network\")"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "shared (carrier-grade NAT)"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "protocol-assignment"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "reserved (6to4 relay)"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved"),
        ([255, 255, 255, 255], 32, "broadcast"),
    ];
    let bits = u32::from(ip);
    // The broadcast address is inside 240/4; name it for what it is.
    if ip == Ipv4Addr::BROADCAST {
        return Some("broadcast");
    }
    NON_PUBLIC.iter().find_map(|&(net, len, class)| {
        let mask = u32::MAX << (32 - u32::from(len));
        (bits & mask == u32::from(Ipv4Addr::from(net))).then_some(class)
    })
}

fn ipv6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    let within = |net: u128, len: u32| bits & (u128::MAX << (128 - len)) == net;
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // Forms that carry an IPv4 address: judge the address they lead to.
    if within(0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
        // NAT64 well-known prefix: the gateway connects to the embedded
        // IPv4 address.
        return ipv4_class(Ipv4Addr::from(bits as u32));
    }
    if within(0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
        // 6to4: the relay forwards to the IPv4 address in bits 16..48.
        return ipv4_class(Ipv4Addr::from((bits >> 80) as u32));
    }
    if within(0xfc00 << 112, 7) {
        return Some("private (unique local)");
    }
    if within(0xfe80 << 112, 10) {
        return Some("link-local");
    }
    if within(0xff00 << 112, 8) {
        return Some("multicast");
    }
    if within(0x2001_0db8 << 96, 32) || within(0x3fff << 112, 20) {
        return Some("documentation");
    }
    if within(0x2001 << 112, 23) {
        // IETF protocol assignments: Teredo, benchmarking, ORCHID, ...
        return Some("protocol-assignment");
    }
    if within(0x5f00 << 112, 16) {
        return Some("segment-routing");
    }
    if !within(0x2000 << 112, 3) {
        // IPv4-compatible, NAT64 local-use, discard-only, site-local, and
        // everything IANA has not allocated for global unicast.
        return Some("reserved");
    }
    None
}

/// The address as grants compare it: an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) is its IPv4 address, so neither form slips past a
/// grant or a rule written for the other.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::tests::ip;

    #[test]
    fn public_and_non_public_addresses() {
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip(public)), "{public} should be public");
        }
        for (non_public, class) in [
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("10.0.0.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.255", "carrier-grade NAT"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "link-local"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.0.0.8", "protocol-assignment"),
            ("192.0.2.1", "documentation"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("224.0.0.251", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::127.0.0.1", "reserved"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a00:1", "private"),
            ("64:ff9b:1::1", "reserved"),
            ("2002:7f00:0001::1", "loopback"),
            ("2002:c0a8:0101::1", "private"),
            ("fc00::1", "unique local"),
            ("fd12:3456::1", "unique local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "reserved"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "protocol-assignment"),
            ("2001:2::1", "protocol-assignment"),
            ("5f00::1", "segment-routing"),
            ("100::1", "reserved"),
        ] {
            let found = address_class(ip(non_public));
            assert!(
                found.is_some_and(|c| c.contains(class)),
                "{non_public}: expected {class}, got {found:?}"
            );
        }
    }
}
