//! Signing keys of the test authorization server, made with ring (ES256 and
//! EdDSA generated per test; RS256 from a fixed test-only key, since ring
//! cannot generate RSA keys), their JWKs, and tokens signed with them —
//! including the bad ones (`alg: none`, an HMAC keyed with a public key).

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;
use serde_json::{json, Value};

const RSA_PEM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/auth/test-only-rsa-2048.pem"
);

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

enum Signer {
    Es256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Rs256(RsaKeyPair),
}

pub struct TestKey {
    pub kid: String,
    signer: Signer,
}

impl TestKey {
    pub fn es256(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("P-256 key");
        Self::with(kid, Signer::Es256(pair))
    }

    pub fn ed25519(kid: &str) -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("Ed25519 key");
        Self::with(kid, Signer::Ed25519(pair))
    }

    pub fn rs256(kid: &str) -> Self {
        let der = PrivatePkcs8KeyDer::from_pem_file(RSA_PEM).expect("the test RSA key");
        let pair = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).expect("an RSA key");
        Self::with(kid, Signer::Rs256(pair))
    }

    fn with(kid: &str, signer: Signer) -> Self {
        Self {
            kid: kid.into(),
            signer,
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.signer {
            Signer::Es256(_) => "ES256",
            Signer::Ed25519(_) => "EdDSA",
            Signer::Rs256(_) => "RS256",
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Value {
        match &self.signer {
            Signer::Es256(pair) => {
                // An uncompressed point: 0x04, x, y.
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig",
                       "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Signer::Ed25519(pair) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid,
                       "x": b64(pair.public_key().as_ref())})
            }
            Signer::Rs256(pair) => {
                let public: signature::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
                json!({"kty": "RSA", "kid": self.kid, "alg": "RS256",
                       "n": b64(&public.n), "e": b64(&public.e)})
            }
        }
    }

    /// The RSA public key's DER, what an attacker would key an HMAC with.
    pub fn public_der(&self) -> Vec<u8> {
        match &self.signer {
            Signer::Rs256(pair) => pair.public().as_ref().to_vec(),
            Signer::Es256(pair) => pair.public_key().as_ref().to_vec(),
            Signer::Ed25519(pair) => pair.public_key().as_ref().to_vec(),
        }
    }

    /// A token with this key's alg and kid.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with(
            &json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    /// A token with the header given, signed with this key.
    pub fn sign_with(&self, header: &Value, claims: &Value) -> String {
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let signature = match &self.signer {
            Signer::Es256(pair) => pair
                .sign(&rng, signed.as_bytes())
                .expect("signs")
                .as_ref()
                .to_vec(),
            Signer::Ed25519(pair) => pair.sign(signed.as_bytes()).as_ref().to_vec(),
            Signer::Rs256(pair) => {
                let mut out = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut out,
                )
                .expect("signs");
                out
            }
        };
        format!("{signed}.{}", b64(&signature))
    }
}

/// An unsigned token (`alg: none`).
pub fn unsigned(claims: &Value) -> String {
    let header = json!({"alg": "none", "typ": "JWT"});
    format!(
        "{}.{}.",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

/// An HS256 token whose HMAC key is `key` (the confusion attack: a
/// verifier that took the public key as an HMAC secret would accept it).
pub fn hs256(kid: &str, key: &[u8], claims: &Value) -> String {
    let header = json!({"alg": "HS256", "kid": kid, "typ": "JWT"});
    let signed = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        signed.as_bytes(),
    );
    format!("{signed}.{}", b64(mac.as_ref()))
}
