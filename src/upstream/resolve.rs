//! The replicas of a `resolve = "each"` upstream: every address its host
//! resolves to (the pods behind a Kubernetes headless Service), looked up
//! at start and again every `resolve_every_ms`, so that a new address
//! becomes a replica and one that vanished is a replica its sessions leave.
//! A look-up that fails or finds nothing keeps the set as it was, and says
//! so in the log: a resolver that hiccups must not empty the upstream.
//!
//! This owns the looking up and the names (an address and port, as
//! `10.1.2.3:8080` or `[fd00::5]:8080`: stable while the pod lives); which
//! replica takes a request is `replicas.rs`'s, and how one is reached (a
//! connection pinned to its address, the URL's host kept) `http.rs`'s.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Weak;
use std::time::Duration;

use http::Uri;
use tokio_util::sync::CancellationToken;

use super::replicas::{Endpoint, Replicas};
use crate::config::Lookup;

/// The host and port a URL's connections go to.
pub fn host_and_port(url: &Uri) -> Result<(String, u16), String> {
    let authority = url
        .authority()
        .ok_or_else(|| format!("upstream url {url} has no host"))?;
    let https = url.scheme_str() == Some("https");
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    // An IPv6 literal is written in brackets, which no resolver takes.
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    Ok((host.to_owned(), port))
}

/// One look-up's addresses, each once, in a stable order (so that ties
/// take turns the same way whatever order the resolver answered in).
fn tidy(mut addrs: Vec<SocketAddr>) -> Vec<(String, SocketAddr)> {
    addrs.sort();
    addrs.dedup();
    addrs.into_iter().map(|a| (a.to_string(), a)).collect()
}

/// What the table holds for `host`, as the system's resolver would answer.
fn in_table(lookup: &Lookup, host: &str, port: u16) -> Option<io::Result<Vec<SocketAddr>>> {
    let Lookup::Table(table) = lookup else {
        return None;
    };
    let table = table.lock().unwrap_or_else(|p| p.into_inner());
    Some(match table.get(host) {
        Some(ips) => Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect()),
        None => Err(io::Error::new(io::ErrorKind::NotFound, "no such host")),
    })
}

/// Looks `host` up now, blocking (at start, and when a reload builds the
/// upstream anew): the addresses with their names, never none.
pub fn lookup_now(lookup: &Lookup, host: &str, port: u16) -> io::Result<Vec<(String, SocketAddr)>> {
    let found = match in_table(lookup, host, port) {
        Some(found) => found,
        None => (host, port).to_socket_addrs().map(Iterator::collect),
    };
    nonempty(found)
}

/// Looks `host` up without blocking the runtime.
async fn lookup(lookup: &Lookup, host: &str, port: u16) -> io::Result<Vec<(String, SocketAddr)>> {
    let found = match in_table(lookup, host, port) {
        Some(found) => found,
        None => tokio::net::lookup_host((host, port))
            .await
            .map(Iterator::collect),
    };
    nonempty(found)
}

fn nonempty(found: io::Result<Vec<SocketAddr>>) -> io::Result<Vec<(String, SocketAddr)>> {
    let found = tidy(found?);
    if found.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no address"));
    }
    Ok(found)
}

/// Looks `host` up every `every` and makes the replicas follow what it
/// finds, `make` making each new one, until `stop` or until the replicas
/// are dropped (the upstream was replaced by a reload).
pub async fn follow<C>(
    replicas: Weak<Replicas<C>>,
    how: Lookup,
    (host, port): (String, u16),
    every: Duration,
    mut make: impl FnMut(&str, SocketAddr) -> Endpoint<C>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the set was looked up a moment ago.
    ticks.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let found = lookup(&how, &host, port).await;
        let Some(replicas) = replicas.upgrade() else {
            return;
        };
        match found {
            Ok(found) => replicas.follow(found, &mut make),
            Err(e) => tracing::warn!(
                host = %host,
                error = %e,
                replicas = replicas.len(),
                "cannot resolve the upstream's host; its replicas stay as they were"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_and_port_are_the_url_s_with_the_scheme_s_default() {
        let of = |u: &str| host_and_port(&u.parse().unwrap()).unwrap();
        assert_eq!(
            of("http://mcp.default.svc/mcp"),
            ("mcp.default.svc".into(), 80)
        );
        assert_eq!(of("https://mcp:8443/mcp"), ("mcp".into(), 8443));
        assert_eq!(of("https://mcp/mcp"), ("mcp".into(), 443));
        assert_eq!(of("http://[::1]:9/mcp"), ("::1".into(), 9));
    }

    #[test]
    fn addresses_are_named_by_address_and_port_each_once_in_order() {
        let a: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let b: SocketAddr = "[fd00::1]:80".parse().unwrap();
        let c: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let names: Vec<String> = tidy(vec![a, b, c, a]).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["10.0.0.1:80", "10.0.0.2:80", "[fd00::1]:80"]);
    }

    #[test]
    fn localhost_resolves_through_the_system_resolver_to_loopback() {
        let found = lookup_now(&Lookup::System, "localhost", 8080).unwrap();
        assert!(found.iter().all(|(_, a)| a.ip().is_loopback()), "{found:?}");
        assert!(found.iter().all(|(_, a)| a.port() == 8080), "{found:?}");
    }

    #[test]
    fn a_name_that_resolves_to_nothing_is_an_error() {
        let table = Lookup::Table(Default::default());
        let e = lookup_now(&table, "gone.example", 80).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let unknown = lookup_now(&Lookup::System, "no-such-host.invalid", 80);
        assert!(unknown.is_err(), "{unknown:?}");
    }
}
