//! `[telemetry] listen`: a `host:port` whose host is an IP address or a name, and the order in
//! which a name's addresses are tried when binding (the relay) and connecting (`sluice
//! status`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Where the telemetry server listens: `127.0.0.1:9464`, `[::1]:9464`, `localhost:9464`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// An IP literal (without brackets) or a host name.
    host: String,
    port: u16,
}

impl ListenAddr {
    /// Parses `host:port`; the error says what is missing or wrong, for `telemetry.listen`.
    pub fn parse(text: &str) -> Result<Self, String> {
        const EXAMPLE: &str = "expected host:port, e.g. \"127.0.0.1:9464\", \"localhost:9464\" \
                               or \"0.0.0.0:9464\" (every interface)";
        let text = text.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(Self {
                host: addr.ip().to_string(),
                port: addr.port(),
            });
        }
        if text.is_empty() {
            return Err(format!("is empty: {EXAMPLE}"));
        }
        if text.contains("://") {
            return Err(format!("{text:?} is a URL: {EXAMPLE}"));
        }
        match text.parse::<IpAddr>() {
            // `::1:9464` is an IPv6 address, not `::1` with a port.
            Ok(IpAddr::V6(_)) => {
                return Err(format!(
                    "{text:?} has no port: an IPv6 address with a port goes in brackets, e.g. \
                     \"[::1]:9464\""
                ));
            }
            Ok(IpAddr::V4(_)) => return Err(format!("{text:?} has no port: {EXAMPLE}")),
            Err(_) if text.starts_with('[') && text.ends_with(']') => {
                return Err(format!("{text:?} has no port: {EXAMPLE}"));
            }
            Err(_) => {}
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(format!("{text:?} has no port: {EXAMPLE}"));
        };
        if host.starts_with('[') || host.contains(':') {
            return Err(format!(
                "{text:?} is not an address: an IPv6 address goes in brackets, e.g. \
                 \"[::1]:9464\""
            ));
        }
        if host.is_empty() {
            return Err(format!("{text:?} has no host: {EXAMPLE}"));
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("{text:?}: the port {port:?} is not a number from 0 to 65535"))?;
        if !is_host_name(host) {
            return Err(format!(
                "{text:?}: {host:?} is neither an IP address nor a host name ({EXAMPLE})"
            ));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host's addresses with the port: the IP itself, or what the name resolves to
    /// (through the system resolver, `/etc/hosts` included), IPv4 first, without repeats.
    pub async fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect();
        if found.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{:?} resolves to no address", self.host),
            ));
        }
        Ok(in_order(found))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// IPv4 addresses before IPv6 ones (each in the resolver's order), repeats dropped: a name
/// like `localhost` that resolves to both is served, and asked, on IPv4 — what most probes
/// and scrapers configured with `127.0.0.1` expect.
fn in_order(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let mut ordered: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
    let (v4, v6): (Vec<_>, Vec<_>) = addrs.into_iter().partition(SocketAddr::is_ipv4);
    for addr in v4.into_iter().chain(v6) {
        if !ordered.contains(&addr) {
            ordered.push(addr);
        }
    }
    ordered
}

/// Where a client reaches a server listening on `addr`: a server on every interface
/// (`0.0.0.0`, `[::]`) answers on the loopback one.
pub(crate) fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

/// RFC 1123 host name: dot-separated labels of letters, digits and hyphens.
fn is_host_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_and_host_names_with_a_port_parse() {
        for (text, shown) in [
            ("127.0.0.1:9464", "127.0.0.1:9464"),
            ("0.0.0.0:9464", "0.0.0.0:9464"),
            ("[::1]:9464", "[::1]:9464"),
            ("localhost:9464", "localhost:9464"),
            (
                "sluice-0.sluice.svc.cluster.local:80",
                "sluice-0.sluice.svc.cluster.local:80",
            ),
        ] {
            let addr = ListenAddr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(addr.to_string(), shown);
        }
    }

    #[test]
    fn a_missing_port_a_bad_port_or_a_bad_host_is_named() {
        for (text, says) in [
            ("localhost", "has no port"),
            ("127.0.0.1", "has no port"),
            ("[::1]", "has no port"),
            ("::1", "has no port"),
            ("", "is empty"),
            (":9464", "has no host"),
            ("localhost:http", "not a number"),
            ("localhost:70000", "not a number"),
            ("::1:9464", "brackets"),
            ("my_host:9464", "neither an IP address nor a host name"),
            ("http://localhost:9464", "is a URL"),
        ] {
            let e = ListenAddr::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[tokio::test]
    async fn localhost_resolves_to_a_loopback_address() {
        let addr = ListenAddr::parse("localhost:9464").expect("parses");
        let found = addr.resolve().await.expect("localhost resolves");
        assert!(!found.is_empty());
        assert!(
            found
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 9464)
        );
    }

    #[tokio::test]
    async fn an_unresolvable_name_is_an_error() {
        // `.invalid` never resolves (RFC 2606).
        let addr = ListenAddr::parse("no-such-host.invalid:9464").expect("parses");
        assert!(addr.resolve().await.is_err());
    }

    #[test]
    fn ipv4_comes_first_and_repeats_are_dropped() {
        let v6: SocketAddr = "[::1]:1".parse().expect("v6");
        let v4: SocketAddr = "127.0.0.1:1".parse().expect("v4");
        assert_eq!(in_order(vec![v6, v4, v6, v4]), vec![v4, v6]);
    }

    #[test]
    fn every_interface_is_reached_on_loopback() {
        let any4: SocketAddr = "0.0.0.0:9".parse().expect("v4");
        let any6: SocketAddr = "[::]:9".parse().expect("v6");
        let one: SocketAddr = "10.0.0.1:9".parse().expect("ip");
        assert_eq!(reachable(any4).to_string(), "127.0.0.1:9");
        assert_eq!(reachable(any6).to_string(), "[::1]:9");
        assert_eq!(reachable(one), one);
    }
}
