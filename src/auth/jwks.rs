//! The issuer's public keys: a JWKS fetched at first need (from `jwks_url`,
//! or from the `jwks_uri` of the issuer's metadata), kept, and fetched again
//! only when a token names a key the set lacks — at most once per
//! `refetch_min_secs`, one fetch shared by every request that missed
//! meanwhile, and the old set kept when the new fetch fails. A set older
//! than `refresh_secs` is fetched again behind the request that found it
//! old, so a key the issuer removed (rotated out, or compromised) stops
//! verifying without any request waiting for the fetch.
//!
//! It owns the key set and when to fetch it; it does not verify signatures
//! or look at claims ([`super::jwt`] does), and never fetches at start-up:
//! a proxy whose issuer is down still starts, and requests that need no key
//! never wait for one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use http::Uri;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use super::fetch::{FetchError, Fetcher};

/// With no key set at all, how long after a failed fetch the next request
/// may try again: short, since nothing can be verified meanwhile, but not
/// zero, so that a burst of requests is not a burst of fetches.
const RETRY_EMPTY: Duration = Duration::from_secs(1);

/// The kinds of public key a JWT may be verified with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Rsa,
    EcP256,
    EcP384,
    Ed25519,
}

impl KeyKind {
    /// Whether a signature of `alg` can be made with a key of this kind.
    /// jsonwebtoken's verify must never see a key of another family: given
    /// an RSA key from a JWK's components and a non-RSA algorithm, version
    /// 9 reaches an `unreachable!()` (a panic a token could trigger).
    pub fn fits(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            KeyKind::Rsa => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            KeyKind::EcP256 => alg == ES256,
            KeyKind::EcP384 => alg == ES384,
            KeyKind::Ed25519 => alg == EdDSA,
        }
    }
}

pub struct Key {
    pub kid: Option<String>,
    pub kind: KeyKind,
    /// The JWK's own `alg`, when it names one: a token must use that one.
    pub alg: Option<String>,
    pub decoding: DecodingKey,
}

pub struct KeySet {
    pub keys: Vec<Arc<Key>>,
    /// When it was fetched.
    pub fetched: Instant,
}

impl KeySet {
    /// The usable signing keys of a JWKS document. Keys of other kinds or
    /// uses (encryption keys, symmetric `oct` keys, unknown curves) are
    /// skipped, not fatal: a set may hold more than this proxy needs.
    pub fn parse(doc: &Value) -> Result<Self, String> {
        let Some(keys) = doc.get("keys").and_then(Value::as_array) else {
            return Err("the key set has no `keys` array".into());
        };
        let keys: Vec<_> = keys.iter().filter_map(parse_key).map(Arc::new).collect();
        if keys.is_empty() {
            return Err("the key set holds no usable signing key".into());
        }
        Ok(Self {
            keys,
            fetched: Instant::now(),
        })
    }

    /// The key a token names, or with no `kid` the set's only key.
    pub fn find(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .find(|k| k.kid.as_deref() == Some(kid))
                .cloned(),
            None if self.keys.len() == 1 => self.keys.first().cloned(),
            None => None,
        }
    }
}

fn parse_key(jwk: &Value) -> Option<Key> {
    let text = |name: &str| jwk.get(name).and_then(Value::as_str);
    if text("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let (kind, decoding) = match (text("kty")?, text("crv")) {
        ("RSA", _) => (
            KeyKind::Rsa,
            DecodingKey::from_rsa_components(text("n")?, text("e")?).ok()?,
        ),
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let kind = if crv == "P-256" {
                KeyKind::EcP256
            } else {
                KeyKind::EcP384
            };
            let key = DecodingKey::from_ec_components(text("x")?, text("y")?).ok()?;
            (kind, key)
        }
        ("OKP", Some("Ed25519")) => (
            KeyKind::Ed25519,
            DecodingKey::from_ed_components(text("x")?).ok()?,
        ),
        _ => return None,
    };
    Some(Key {
        kid: text("kid").map(str::to_owned),
        kind,
        alg: text("alg").map(str::to_owned),
        decoding,
    })
}

/// Why no key was found.
#[derive(Debug, PartialEq, Eq)]
pub enum Miss {
    /// The set (fetched, or fetched too recently to ask again) lacks it.
    Unknown,
    /// The set cannot be had: the last fetch failed (or none finished yet).
    Unavailable(String),
}

pub struct KeySource {
    fetcher: Arc<Fetcher>,
    issuer: String,
    jwks_url: Option<Uri>,
    refetch_min: Duration,
    refresh: Duration,
    current: RwLock<Option<Arc<KeySet>>>,
    /// Bumped when a fetch finishes, so that requests that waited for it
    /// take its outcome instead of fetching again.
    generation: AtomicU64,
    /// Held for the length of a fetch: the singleflight.
    fetch: Arc<tokio::sync::Mutex<FetchState>>,
}

#[derive(Default)]
struct FetchState {
    /// When the last fetch finished (set only then: a fetch abandoned by a
    /// cancelled request leaves no trace and the next request tries again).
    finished: Option<Instant>,
    error: Option<String>,
    /// The `jwks_uri` found in the issuer's metadata.
    discovered: Option<Uri>,
}

impl KeySource {
    pub fn new(
        fetcher: Arc<Fetcher>,
        issuer: String,
        jwks_url: Option<Uri>,
        refetch_min: Duration,
        refresh: Duration,
    ) -> Self {
        Self {
            fetcher,
            issuer,
            jwks_url,
            refetch_min,
            refresh,
            current: RwLock::new(None),
            generation: AtomicU64::new(0),
            fetch: Arc::default(),
        }
    }

    /// The key a token names: from the cached set, else from a fetch when
    /// one is due.
    pub async fn key(self: &Arc<Self>, kid: Option<&str>) -> Result<Arc<Key>, Miss> {
        if let Some((key, fetched)) = self.cached_with_age(kid) {
            if fetched.elapsed() >= self.refresh {
                self.refresh_behind();
            }
            return Ok(key);
        }
        let seen = self.generation.load(Ordering::Acquire);
        let mut state = self.fetch.lock().await;
        if self.generation.load(Ordering::Acquire) != seen {
            // A fetch finished while this request waited for it.
            return self.cached(kid).ok_or_else(|| self.miss(&state));
        }
        let pause = if self.has_set() {
            self.refetch_min
        } else {
            RETRY_EMPTY
        };
        if state.finished.is_some_and(|t| t.elapsed() < pause) {
            return self.cached(kid).ok_or_else(|| self.miss(&state));
        }
        self.fetch_into(&mut state).await;
        self.cached(kid).ok_or_else(|| self.miss(&state))
    }

    /// Starts a fetch of the set behind the request, unless one is running
    /// or the last one finished less than `refetch_min` ago (so that an
    /// issuer that is down is not asked on every request).
    fn refresh_behind(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut state) = self.fetch.clone().try_lock_owned() else {
            return;
        };
        if state
            .finished
            .is_some_and(|t| t.elapsed() < self.refetch_min)
        {
            return;
        }
        let this = self.clone();
        runtime.spawn(async move { this.fetch_into(&mut state).await });
    }

    /// One fetch; its outcome replaces the set, or is kept as the error
    /// while the old set stays.
    async fn fetch_into(&self, state: &mut FetchState) {
        let fetched = self.download(state).await;
        state.finished = Some(Instant::now());
        match fetched {
            Ok(set) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(set));
                state.error = None;
            }
            Err(e) => state.error = Some(e.0),
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn cached(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        self.cached_with_age(kid).map(|(key, _)| key)
    }

    /// The key and when its set was fetched.
    fn cached_with_age(&self, kid: Option<&str>) -> Option<(Arc<Key>, Instant)> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        let set = current.as_ref()?;
        Some((set.find(kid)?, set.fetched))
    }

    fn has_set(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn miss(&self, state: &FetchState) -> Miss {
        match (&state.error, self.has_set()) {
            (Some(e), _) => Miss::Unavailable(e.clone()),
            (None, true) => Miss::Unknown,
            (None, false) => Miss::Unavailable("the key set was not fetched yet".into()),
        }
    }

    async fn download(&self, state: &mut FetchState) -> Result<KeySet, FetchError> {
        let url = match (&self.jwks_url, &state.discovered) {
            (Some(url), _) | (None, Some(url)) => url.clone(),
            (None, None) => {
                let url = self.discover().await?;
                state.discovered = Some(url.clone());
                url
            }
        };
        let doc = self.fetcher.get_json(&url).await?;
        KeySet::parse(&doc).map_err(|e| FetchError(format!("GET {url}: {e}")))
    }

    /// `jwks_uri` from the issuer's metadata: RFC 8414's well-known path
    /// first, then OpenID Connect's. The metadata must name this issuer
    /// (RFC 8414 section 3.3), or it speaks for someone else.
    async fn discover(&self) -> Result<Uri, FetchError> {
        let mut failures = Vec::new();
        for url in metadata_urls(&self.issuer) {
            let doc = match self.fetcher.get_json(&url).await {
                Ok(doc) => doc,
                Err(e) => {
                    failures.push(e.0);
                    continue;
                }
            };
            match jwks_uri_of(&doc, &self.issuer) {
                Ok(uri) => return Ok(uri),
                Err(e) => failures.push(format!("GET {url}: {e}")),
            }
        }
        Err(FetchError(format!(
            "no key set from the issuer's metadata: {}",
            failures.join("; ")
        )))
    }
}

/// Where an issuer's metadata may be: RFC 8414 inserts the well-known
/// segment between the host and the issuer's path; OpenID Connect appends
/// it to the issuer.
pub fn metadata_urls(issuer: &str) -> Vec<Uri> {
    let mut urls = Vec::new();
    if let Ok(uri) = issuer.parse::<Uri>() {
        if let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) {
            let path = uri.path().trim_end_matches('/');
            let text =
                format!("{scheme}://{authority}/.well-known/oauth-authorization-server{path}");
            urls.extend(text.parse().ok());
        }
    }
    let oidc = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    urls.extend(oidc.parse().ok());
    urls
}

fn jwks_uri_of(doc: &Value, issuer: &str) -> Result<Uri, String> {
    let named = doc.get("issuer").and_then(Value::as_str);
    if named != Some(issuer) {
        return Err(format!(
            "the metadata names issuer {named:?}, not {issuer:?}"
        ));
    }
    let text = doc
        .get("jwks_uri")
        .and_then(Value::as_str)
        .ok_or("the metadata has no jwks_uri")?;
    match text.parse::<Uri>() {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) => Ok(uri),
        _ => Err(format!("jwks_uri {text:?} is not an http(s) URL")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_is_looked_for_where_rfc_8414_then_oidc_put_it() {
        let urls = metadata_urls("https://as.example/tenant/");
        let urls: Vec<_> = urls.iter().map(Uri::to_string).collect();
        assert_eq!(
            urls,
            [
                "https://as.example/.well-known/oauth-authorization-server/tenant",
                "https://as.example/tenant/.well-known/openid-configuration",
            ]
        );
        let root = metadata_urls("http://127.0.0.1:9/");
        assert_eq!(
            root[0].to_string(),
            "http://127.0.0.1:9/.well-known/oauth-authorization-server"
        );
    }

    #[test]
    fn metadata_of_another_issuer_is_not_taken() {
        let doc = json!({"issuer": "https://evil", "jwks_uri": "https://evil/jwks"});
        assert!(jwks_uri_of(&doc, "https://as").is_err());
        let doc = json!({"issuer": "https://as", "jwks_uri": "https://as/jwks"});
        assert_eq!(jwks_uri_of(&doc, "https://as").unwrap(), "https://as/jwks");
    }

    #[test]
    fn only_public_signing_keys_are_kept() {
        let doc = json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
            {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "ed"},
            {"kty": "OKP", "crv": "X25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "x"},
            {"kty": "OKP", "crv": "Ed25519", "use": "enc", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "enc"},
        ]});
        let set = KeySet::parse(&doc).unwrap();
        assert_eq!(set.keys.len(), 1);
        let key = set.find(Some("ed")).unwrap();
        assert_eq!(key.kind, KeyKind::Ed25519);
        assert!(set.find(Some("hmac")).is_none());
        assert!(
            set.find(None).is_some(),
            "the only key answers a token without kid"
        );
        assert!(KeySet::parse(&json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]})).is_err());
    }

    #[test]
    fn a_key_fits_only_its_own_algorithms() {
        assert!(KeyKind::Rsa.fits(Algorithm::PS256));
        assert!(!KeyKind::Rsa.fits(Algorithm::HS256));
        assert!(!KeyKind::EcP256.fits(Algorithm::ES384));
        assert!(!KeyKind::Ed25519.fits(Algorithm::RS256));
    }
}
