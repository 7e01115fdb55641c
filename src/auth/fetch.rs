//! The HTTP client of the verifiers: GET a JSON document (issuer metadata, a
//! key set) and POST a form (introspection), over a hyper-util client with
//! rustls on ring trusting the webpki roots (plain http:// is allowed, for
//! an authorization server on loopback or in the same pod).
//!
//! Every exchange is bounded: a connect timeout, a deadline on the whole
//! exchange and a cap on the body, so a slow or hostile authorization server
//! costs a waiting request at most [`DEADLINE`]. It knows nothing of tokens,
//! caches or what the documents mean, and never logs what it sends (a
//! request may carry a token and a client secret).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::tls::outbound::{self, error_chain, Connector};

/// Largest document accepted from an authorization server.
pub const MAX_BODY: usize = 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one exchange (connect, send, read the whole body) may take.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A failed exchange, worded for the log; it never holds what was sent.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(pub String);

pub struct Fetcher {
    client: Client<Connector, Full<Bytes>>,
}

impl Fetcher {
    pub fn new() -> anyhow::Result<Self> {
        let tls = crate::tls::upstream_client("auth", None)?;
        let https = outbound::connector(tls, CONNECT_TIMEOUT);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(https);
        Ok(Self { client })
    }

    /// GETs `url` and parses its 2xx body as JSON.
    pub async fn get_json(&self, url: &Uri) -> Result<serde_json::Value, FetchError> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(url.clone())
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| FetchError(format!("GET {url}: {e}")))?;
        let (status, body) = self.exchange(req).await?;
        if !status.is_success() {
            return Err(FetchError(format!("GET {url}: status {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| FetchError(format!("GET {url}: not JSON: {e}")))
    }

    /// POSTs a form with the given `Authorization` (HTTP Basic client
    /// credentials) and parses its 2xx body as JSON; any other status is
    /// an error, but for a 4xx whose JSON body says `"active": false`:
    /// some servers (the TS SDK's demo among them) answer an unknown token
    /// that way, and it is an answer, not an outage.
    pub async fn post_form(
        &self,
        url: &Uri,
        authorization: &HeaderValue,
        form: String,
    ) -> Result<serde_json::Value, FetchError> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(url.clone())
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::AUTHORIZATION, authorization.clone())
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| FetchError(format!("POST {url}: {e}")))?;
        let (status, body) = self.exchange(req).await?;
        let answer = serde_json::from_slice::<serde_json::Value>(&body);
        if status.is_success() {
            return answer.map_err(|e| FetchError(format!("POST {url}: not JSON: {e}")));
        }
        match answer {
            Ok(answer)
                if status.is_client_error()
                    && answer.get("active") == Some(&serde_json::Value::Bool(false)) =>
            {
                Ok(answer)
            }
            _ => Err(FetchError(format!("POST {url}: status {status}"))),
        }
    }

    async fn exchange(&self, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), FetchError> {
        let what = format!("{} {}", req.method(), req.uri());
        let exchange = async {
            let res = self
                .client
                .request(req)
                .await
                .map_err(|e| FetchError(format!("{what}: {}", error_chain(&e))))?;
            let status = res.status();
            let body = Limited::new(res.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| FetchError(format!("{what}: body: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .map_err(|_| FetchError(format!("{what}: no answer within {DEADLINE:?}")))?
    }
}

/// `application/x-www-form-urlencoded` of one value: every byte but the
/// unreserved ones percent-encoded (RFC 6749 appendix B asks the same of
/// client credentials in HTTP Basic).
pub fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding_keeps_only_unreserved_bytes() {
        assert_eq!(form_encode("a.b-c_d~9"), "a.b-c_d~9");
        assert_eq!(form_encode("a b+c/=&é"), "a%20b%2Bc%2F%3D%26%C3%A9");
    }
}
