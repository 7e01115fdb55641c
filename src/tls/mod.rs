//! TLS: every rustls configuration the proxy builds — the listener's
//! (certificate chain, ALPN `h2` and `http/1.1`, and for mutual TLS the
//! verification of client certificates against `client_ca`) and the upstream
//! client's (which roots an https upstream must chain to) — and the principal
//! a verified client certificate stands for.
//!
//! It reads PEM files and builds configurations, always with the ring
//! provider (never the process default, which could be aws-lc). It does not
//! accept connections, bound handshakes or look at requests: the front door
//! does that with what this module builds.
//!
//! [`outbound`] is the other side: the HTTPS client that upstreams and
//! authorization servers are reached with, on the client configuration
//! built here.

pub mod outbound;

use std::path::Path;
use std::sync::Arc;

use ring::digest;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::{Config, TlsConfig};

/// A TLS configuration problem, worded for the operator (it names the key
/// and the file).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The listener's TLS from `[tls]`: its certificate, ALPN for both HTTP
/// versions the proxy serves, and — with `client_ca` — client certificates
/// required and verified.
pub fn acceptor(config: &TlsConfig) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates("tls.cert", &config.cert)?;
    let key = PrivateKeyDer::from_pem_file(&config.key)
        .map_err(|e| TlsError(format!("tls.key = {}: {e}", config.key.display())))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS setup: {e}")))?;
    let builder = match &config.client_ca {
        Some(ca) => {
            let roots = roots("tls.client_ca", ca, RootCertStore::empty())?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError(format!("tls.client_ca = {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut server = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError(format!("tls.cert and tls.key do not make a pair: {e}")))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(server)))
}

/// Reads every TLS file the configuration names — the listener's and each
/// upstream's `ca_file` — as the start will, so that a missing or bad file is
/// reported with the other configuration errors, before anything is bound
/// or opened.
pub fn check_files(config: &Config) -> Result<(), TlsError> {
    if let Some(tls) = &config.tls {
        acceptor(tls)?;
    }
    for up in config.upstream.iter().filter(|up| up.ca_file.is_some()) {
        upstream_client(&upstream_ca_key(&up.path), up.ca_file.as_deref())?;
    }
    Ok(())
}

/// How errors name an upstream's `ca_file`.
pub fn upstream_ca_key(path: &str) -> String {
    format!("ca_file of the upstream at {path}")
}

/// The client side of https upstreams: the built-in webpki roots, plus the
/// CA certificates of `ca_file` (`key` names it in errors). ALPN is left to
/// the connector, which offers what the client is built for.
pub fn upstream_client(key: &str, ca_file: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let mut store = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(file) = ca_file {
        store = roots(key, file, store)?;
    }
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS setup: {e}")))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// Every certificate of a PEM file, in order; at least one.
fn certificates(key: &str, file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let failed = |e: &dyn std::fmt::Display| TlsError(format!("{key} = {}: {e}", file.display()));
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| failed(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(&e))?;
    if certs.is_empty() {
        return Err(failed(&"no CERTIFICATE in the file"));
    }
    Ok(certs)
}

/// `store` with the certificates of a PEM file added as trust anchors.
fn roots(key: &str, file: &Path, mut store: RootCertStore) -> Result<RootCertStore, TlsError> {
    for cert in certificates(key, file)? {
        store
            .add(cert)
            .map_err(|e| TlsError(format!("{key} = {}: {e}", file.display())))?;
    }
    Ok(store)
}

/// The principal of a client that proved it holds a certificate the
/// `client_ca` issued: a digest of the leaf certificate's DER. It carries a
/// prefix, so it can never equal a principal derived from a header (a bare
/// hex digest). Set on each request of the connection as an extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificatePrincipal(Arc<str>);

impl CertificatePrincipal {
    const PREFIX: &'static str = "x509-sha256:";

    /// The principal of a finished handshake, if the client presented a
    /// certificate (rustls verified it before the handshake completed).
    pub fn of(connection: &ServerConnection) -> Option<Self> {
        let leaf = connection.peer_certificates()?.first()?;
        Some(Self::of_leaf(leaf))
    }

    pub fn of_leaf(leaf: &CertificateDer<'_>) -> Self {
        let d = digest::digest(&digest::SHA256, leaf.as_ref());
        let text = format!("{}{}", Self::PREFIX, crate::id::hex(d.as_ref()));
        Self(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_principals_are_prefixed_digests() {
        let a = CertificatePrincipal::of_leaf(&CertificateDer::from(vec![1, 2, 3]));
        let b = CertificatePrincipal::of_leaf(&CertificateDer::from(vec![1, 2, 4]));
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("x509-sha256:"), "{}", a.as_str());
        assert_eq!(a.as_str().len(), "x509-sha256:".len() + 64);
    }

    #[test]
    fn missing_files_name_their_key() {
        let config = TlsConfig {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            client_ca: None,
        };
        let Err(err) = acceptor(&config) else {
            panic!("an acceptor without its files")
        };
        assert!(err.to_string().contains("tls.cert"), "{err}");
        let err =
            upstream_client("upstream[0].ca_file", Some(Path::new("/nonexistent"))).unwrap_err();
        assert!(err.to_string().contains("upstream[0].ca_file"), "{err}");
    }
}
