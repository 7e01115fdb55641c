//! The HTTPS client the proxy reaches other servers with — MCP upstreams
//! and authorization servers alike: a hyper connector on rustls (HTTP/1.1
//! and HTTP/2 by ALPN, plain http allowed, Nagle off, a connect timeout),
//! and a failed request worded on one line. Which roots are trusted is
//! [`crate::tls`]'s; what is sent is the callers'.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

pub type Connector = hyper_rustls::HttpsConnector<HttpConnector<Dns>>;

/// Where a connector finds the address of a URL's host: the system's
/// resolver, or one address fixed in advance — a replica of an upstream
/// whose name resolves to several (`resolve = "each"`), reached at its own
/// address while the request keeps the URL's host (the `Host` header, the
/// HTTP/2 `:authority`, the TLS server name and certificate check).
#[derive(Clone)]
pub enum Dns {
    System(GaiResolver),
    Pinned(SocketAddr),
}

type Addrs = std::vec::IntoIter<SocketAddr>;

impl Service<Name> for Dns {
    type Response = Addrs;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Addrs>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        match self {
            Dns::System(gai) => {
                let found = gai.call(name);
                Box::pin(async move { Ok(found.await?.collect::<Vec<_>>().into_iter()) })
            }
            Dns::Pinned(addr) => {
                let addr = *addr;
                Box::pin(async move { Ok(vec![addr].into_iter()) })
            }
        }
    }
}

/// A connector trusting `tls`'s roots, giving up on a connection after
/// `connect_timeout`.
pub fn connector(tls: rustls::ClientConfig, connect_timeout: Duration) -> Connector {
    connector_via(Dns::System(GaiResolver::new()), tls, connect_timeout)
}

/// A connector that reaches every host at `addr` (see [`Dns`]).
pub fn pinned_connector(
    addr: SocketAddr,
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
) -> Connector {
    connector_via(Dns::Pinned(addr), tls, connect_timeout)
}

fn connector_via(dns: Dns, tls: rustls::ClientConfig, connect_timeout: Duration) -> Connector {
    let mut http = HttpConnector::new_with_resolver(dns);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http)
}

/// An error and its sources on one line: hyper's own message is often
/// just "client error (Connect)".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
