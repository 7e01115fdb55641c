//! The HTTPS client the proxy reaches other servers with — MCP upstreams
//! and authorization servers alike: a hyper connector on rustls (HTTP/1.1
//! and HTTP/2 by ALPN, plain http allowed, Nagle off, a connect timeout),
//! and a failed request worded on one line. Which roots are trusted is
//! [`crate::tls`]'s; what is sent is the callers'.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;

pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A connector trusting `tls`'s roots, giving up on a connection after
/// `connect_timeout`.
pub fn connector(tls: rustls::ClientConfig, connect_timeout: Duration) -> Connector {
    let mut http = HttpConnector::new();
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
