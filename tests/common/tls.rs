//! Test TLS: a throwaway PKI made with rcgen (a CA, a server certificate for
//! localhost and 127.0.0.1, client certificates), its PEM files in a temp
//! dir for the proxy's config, rustls client configs that trust it, and a
//! TLS-terminating relay that puts an https face on a plain upstream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use mcp_resume_proxy::config::TlsConfig;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and its key.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl Identity {
    pub fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key().into()
    }
}

pub struct Pki {
    pub dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM).
    pub ca_file: PathBuf,
    pub server: Identity,
    pub server_cert_file: PathBuf,
    pub server_key_file: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, "mcp-resume-proxy test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write ca.pem");

        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        // Client too: a Redis Cluster node presents it to the others on
        // its TLS bus, which always checks the peer's certificate.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &ca).expect("server certificate");
        let server_cert_file = dir.path().join("server.pem");
        let server_key_file = dir.path().join("server.key");
        std::fs::write(&server_cert_file, cert.pem()).expect("write server.pem");
        std::fs::write(&server_key_file, key.serialize_pem()).expect("write server.key");
        let server = Identity {
            cert: cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        };
        Pki {
            dir,
            ca,
            ca_file,
            server,
            server_cert_file,
            server_key_file,
        }
    }

    /// A client certificate the CA issued to `name`, and its key.
    fn issue_client(&self, name: &str) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().expect("client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.ca)
            .expect("client certificate");
        (cert, key)
    }

    /// A client certificate the CA issued to `name`, written as PEM files
    /// (certificate, key) into this PKI's directory.
    pub fn client_files(&self, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.issue_client(name);
        let (cert_file, key_file) = (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).expect("write the client certificate");
        std::fs::write(&key_file, key.serialize_pem()).expect("write the client key");
        (cert_file, key_file)
    }

    /// A client certificate the CA issued to `name`.
    pub fn client(&self, name: &str) -> Identity {
        let (cert, key) = self.issue_client(name);
        Identity {
            cert: cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }

    /// The proxy's `[tls]`: this PKI's server certificate, and with
    /// `mutual` client certificates from this CA required.
    pub fn proxy_tls(&self, mutual: bool) -> TlsConfig {
        TlsConfig {
            cert: self.server_cert_file.clone(),
            key: self.server_key_file.clone(),
            client_ca: mutual.then(|| self.ca_file.clone()),
        }
    }

    /// A client that trusts this CA, presenting `identity` if given.
    pub fn client_config(&self, identity: Option<&Identity>) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.der().clone()).expect("CA is a root");
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        match identity {
            Some(id) => builder
                .with_client_auth_cert(vec![id.cert.clone()], id.key())
                .expect("client identity"),
            None => builder.with_no_client_auth(),
        }
    }

    /// Serves https on a loopback port and relays each connection, once its
    /// TLS is off, to the plain HTTP server at `to`. Speaks HTTP/1.1 (ALPN).
    pub fn https_relay(&self, to: SocketAddr) -> SocketAddr {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![self.server.cert.clone()], self.server.key())
            .expect("server identity");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind relay");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("relay address");
        let listener = TcpListener::from_std(listener).expect("tokio listener");
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let Ok(mut plain) = TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        addr
    }
}
