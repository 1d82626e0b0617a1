//! `--listen`: what the user typed, as the socket addresses to try binding, best first.
//!
//! `ADDR:PORT` and `[V6]:PORT` are taken as they are; `HOST:PORT` is resolved (IPv4 first, so
//! `localhost:9479` is the 127.0.0.1 that most scrape configs name); `:PORT` is every interface,
//! as Go exporters read it: `[::]` (IPv6 and, unless the host sets `bindv6only`, IPv4 too), then
//! `0.0.0.0` where this host has no IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs as _};

use crate::error::UserError;

const EXAMPLES: &str = "write e.g. 127.0.0.1:9479, localhost:9479, [::1]:9479 or :9479 (every interface)";

/// The addresses `--listen TEXT` names, in the order to try them; never empty.
pub fn parse_listen(text: &str) -> Result<Vec<SocketAddr>, UserError> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(vec![address]);
    }
    let bad = |why: &str| UserError::new(format!("--listen {text:?} {why}: {EXAMPLES}"));
    let Some((host, port)) = text.rsplit_once(':') else { return Err(bad("has no :PORT")) };
    let port = crate::units::parse_port(port).map_err(|why| bad(&why))?;
    if host.is_empty() {
        return Ok(vec![
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        ]);
    }
    if host.contains(':') && !host.starts_with('[') {
        return Err(bad("is an IPv6 address without brackets"));
    }
    let mut addresses: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|_| bad(&format!("names a host that does not resolve ({host})")))?
        .collect();
    // Stable: among each family the resolver's order stays.
    addresses.sort_by_key(|a| a.is_ipv6());
    addresses.dedup();
    if addresses.is_empty() {
        return Err(bad(&format!("names a host without addresses ({host})")));
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line_quoting(text: &str) -> String {
        let error = parse_listen(text).unwrap_err().to_string();
        assert!(error.starts_with(&format!("--listen {text:?} ")), "{error}");
        assert!(!error.contains('\n') && error.contains(":9479"), "{error}");
        error
    }

    #[test]
    fn addresses_are_taken_as_they_are() {
        assert_eq!(parse_listen("127.0.0.1:9479").unwrap(), ["127.0.0.1:9479".parse().unwrap()]);
        assert_eq!(parse_listen("[::1]:1").unwrap(), ["[::1]:1".parse().unwrap()]);
        assert_eq!(parse_listen("0.0.0.0:0").unwrap(), ["0.0.0.0:0".parse().unwrap()]);
    }

    #[test]
    fn a_bare_port_is_every_interface_ipv6_first() {
        let addresses = parse_listen(":9479").unwrap();
        assert_eq!(addresses, ["[::]:9479".parse().unwrap(), "0.0.0.0:9479".parse().unwrap()]);
    }

    #[test]
    fn localhost_resolves_to_loopback_ipv4_first() {
        let addresses = parse_listen("localhost:9479").unwrap();
        assert!(addresses.iter().all(|a| a.ip().is_loopback() && a.port() == 9479), "{addresses:?}");
        assert!(addresses[0].is_ipv4(), "{addresses:?}");
    }

    #[test]
    fn bad_values_are_one_line_quoting_what_was_typed() {
        assert!(one_line_quoting("localhost").contains("has no :PORT"));
        assert!(one_line_quoting("127.0.0.1").contains("has no :PORT"));
        assert!(one_line_quoting("localhost:http").contains("no port number"));
        assert!(one_line_quoting(":99999").contains("port 99999, which is out of range (1-65535)"));
        assert!(one_line_quoting("::1:9479").contains("without brackets"));
        assert!(one_line_quoting("no-such-host.invalid:9479").contains("does not resolve"));
    }
}
