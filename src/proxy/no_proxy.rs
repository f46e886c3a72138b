//! `NO_PROXY`: the destinations reached directly, read as Go's `httpproxy` reads them.
//! Comma-separated entries, case-insensitive: `*` (everything); an IP address, with a
//! port or without (`10.0.0.7`, `10.0.0.7:6443`, `[fd00::7]:6443`); a CIDR block
//! (`10.0.0.0/8`, `fd00::/8`); a domain, with a port or without, which matches itself
//! and every name below it (`example.com` matches `example.com` and `a.example.com`);
//! `.example.com` and `*.example.com`, which match only the names below it. An entry with
//! a port matches that port only. Loopback and `localhost` are not special: a site that
//! wants them direct lists them.

use std::net::IpAddr;

/// A parsed `NO_PROXY` list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy {
    all: bool,
    ips: Vec<(IpAddr, Option<u16>)>,
    cidrs: Vec<(IpAddr, u8)>,
    /// `.example.com`, and whether `example.com` itself matches.
    domains: Vec<(String, Option<u16>, bool)>,
}

impl NoProxy {
    /// Reads a comma-separated list. Entries that name nothing (an empty host, a bad
    /// port) are skipped, as Go skips them.
    pub fn parse(list: &str) -> NoProxy {
        NoProxy::from_entries(list.split(','))
    }

    /// Reads one entry per item (the config file's `noProxy` list).
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = &'a str>) -> NoProxy {
        let mut out = NoProxy::default();
        for entry in entries {
            out.add(&entry.trim().to_ascii_lowercase());
        }
        out
    }

    fn add(&mut self, p: &str) {
        if p.is_empty() {
            return;
        }
        if p == "*" {
            self.all = true;
            return;
        }
        if let Some(cidr) = parse_cidr(p) {
            self.cidrs.push(cidr);
            return;
        }
        let (host, port) = match super::split_host_port(p) {
            Some((h, Some(port))) => match port.parse::<u16>() {
                Ok(port) => (h, Some(port)),
                Err(_) => return,
            },
            Some((h, None)) => (h, None),
            None => return,
        };
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.ips.push((ip.to_canonical(), port));
            return;
        }
        let host = host.strip_prefix('*').unwrap_or(host);
        if host.is_empty() || host == "." {
            return;
        }
        match host.strip_prefix('.') {
            Some(_) => self.domains.push((host.to_string(), port, false)),
            None => self.domains.push((format!(".{host}"), port, true)),
        }
    }

    /// Whether `host` (a name or an IP address, IPv6 with or without brackets) at
    /// `port` is reached directly.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.all {
            return true;
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let port_ok = |p: &Option<u16>| p.is_none_or(|p| p == port);
        if let Ok(ip) = host.parse::<IpAddr>() {
            let ip = ip.to_canonical();
            if self.ips.iter().any(|(i, p)| *i == ip && port_ok(p)) {
                return true;
            }
            if self.cidrs.iter().any(|&(net, bits)| in_cidr(ip, net, bits)) {
                return true;
            }
        }
        self.domains.iter().any(|(suffix, p, itself)| {
            (host.ends_with(suffix.as_str()) || (*itself && host == suffix[1..])) && port_ok(p)
        })
    }
}

fn parse_cidr(p: &str) -> Option<(IpAddr, u8)> {
    let (addr, bits) = p.split_once('/')?;
    let ip = addr.parse::<IpAddr>().ok()?.to_canonical();
    let bits = bits.parse::<u8>().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((ip, bits))
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_httpproxy_cases() {
        let n = NoProxy::parse(
            "foobar.com, .barbaz.net, *.wildcard.io, 192.168.1.1, 192.168.1.2:81, \
             192.168.3.0/24, [2001:db8::52:0:1]:443, 2001:db8::52:0:2, 2001:db8::/120, \
             ports.example:8443, ",
        );
        for (host, port, direct) in [
            ("foobar.com", 443, true),
            ("www.foobar.com", 443, true),
            ("xfoobar.com", 443, false),
            ("barbaz.net", 443, false),
            ("www.barbaz.net", 443, true),
            ("wildcard.io", 443, false),
            ("a.b.wildcard.io", 80, true),
            ("192.168.1.1", 6443, true),
            ("192.168.1.2", 81, true),
            ("192.168.1.2", 80, false),
            ("192.168.3.77", 5000, true),
            ("192.168.4.1", 5000, false),
            ("[2001:db8::52:0:1]", 443, true),
            ("2001:db8::52:0:1", 80, false),
            ("2001:db8::52:0:2", 1, true),
            ("2001:db8::ff", 1, true),
            ("2001:db8::1:0", 1, false),
            ("ports.example", 8443, true),
            ("ports.example", 443, false),
            ("WWW.FOOBAR.COM", 443, true),
            ("127.0.0.1", 6443, false),
            ("localhost", 6443, false),
        ] {
            assert_eq!(n.matches(host, port), direct, "{host}:{port}");
        }
    }

    #[test]
    fn star_matches_everything_and_nothing_matches_nothing() {
        assert!(NoProxy::parse("*").matches("anything", 1));
        assert!(NoProxy::parse("a, *").matches("127.0.0.1", 1));
        let none = NoProxy::parse("");
        assert!(!none.matches("example.com", 443));
        // Malformed entries are skipped.
        let bad = NoProxy::parse(".,*.,:80,host:notaport,10.0.0.0/99");
        assert!(!bad.matches("host", 80));
        assert!(!bad.matches("10.0.0.1", 80));
    }

    #[test]
    fn loopback_is_direct_only_when_listed() {
        let n = NoProxy::from_entries(["localhost", "127.0.0.0/8", "::1"]);
        assert!(n.matches("localhost", 6443));
        assert!(n.matches("127.0.0.1", 6443));
        assert!(n.matches("127.1.2.3", 1));
        assert!(n.matches("[::1]", 1));
        assert!(!n.matches("10.0.0.1", 1));
    }
}
