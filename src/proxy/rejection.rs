//! The request path's one error type: why the proxy refuses a request, as an
//! HTTP status plus a JSON-RPC error (code, message, and the id it answers,
//! if any), turned into a response in exactly one place
//! ([`Rejection::into_response`]). Handlers return `Result<_, Rejection>` and
//! use `?`; none of them builds an error reply inline.

use http::{header, HeaderValue, Response, StatusCode};

use crate::dialect::Refusal;
use crate::jsonrpc::{self, code, ParseError, RequestId};
use crate::reply::{self, Body};
use crate::session::Full;
use crate::store::StoreError;
use crate::upstream::UpstreamError;

#[derive(Debug)]
pub struct Rejection {
    status: StatusCode,
    id: Option<RequestId>,
    code: i64,
    message: String,
    /// The one header a refusal may add.
    told: Option<Told>,
    /// The error's `data` (raw JSON), when it has one.
    data: Option<String>,
}

/// What a refusal tells besides its body.
#[derive(Debug)]
enum Told {
    /// `Allow`, for 405.
    Allow(&'static str),
    /// `Retry-After` in seconds, for a refusal that passes.
    RetryAfter(u64),
    /// `WWW-Authenticate`, for a 401.
    Challenge(&'static str),
}

impl Rejection {
    fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Self {
        Self {
            status,
            id: None,
            code,
            message: message.into(),
            told: None,
            data: None,
        }
    }

    /// A transport-level "Bad Request: …" as SDK servers word it.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code::SERVER_ERROR, message)
    }

    pub fn session_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            code::SESSION_NOT_FOUND,
            "Session not found",
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code::SERVER_ERROR,
            "Unsupported Media Type: Content-Type must be application/json",
        )
    }

    pub fn not_acceptable() -> Self {
        Self::new(
            StatusCode::NOT_ACCEPTABLE,
            code::SERVER_ERROR,
            "Not Acceptable: Accept must include text/event-stream",
        )
    }

    pub fn method_not_allowed() -> Self {
        Self {
            told: Some(Told::Allow("GET, POST, DELETE")),
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                code::SERVER_ERROR,
                "Method Not Allowed: use POST, GET or DELETE",
            )
        }
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::INVALID_REQUEST,
            format!("Payload Too Large: request bodies are limited to {limit} bytes"),
        )
    }

    /// The body did not arrive in time (a stalled or trickling client).
    pub fn body_timeout(within: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            code::INVALID_REQUEST,
            format!(
                "Request Timeout: the request body must arrive within {} ms",
                within.as_millis()
            ),
        )
    }

    pub fn unreadable_body(e: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            format!("Bad Request: cannot read body: {e}"),
        )
    }

    pub fn unknown_event_id() -> Self {
        Self::bad_request("Bad Request: unknown or expired Last-Event-ID")
    }

    /// A request id the session already used for another call.
    pub fn reused_id(id: Option<RequestId>) -> Self {
        Self {
            id,
            ..Self::new(
                StatusCode::OK,
                code::INVALID_REQUEST,
                "Invalid Request: this id belongs to another request of this session; use a new id",
            )
        }
    }

    /// Too many live requests for `whom` (429: retry once some finish).
    pub fn too_many_streams(id: Option<RequestId>, whom: &str, cap: usize) -> Self {
        Self {
            id,
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                code::SERVER_ERROR,
                format!(
                    "Too Many Requests: {whom} has {cap} requests in progress, the most allowed; retry when one finishes"
                ),
            )
        }
    }

    /// The log reached its disk quota: no new request until space is freed.
    pub fn log_full(id: Option<RequestId>) -> Self {
        Self {
            id,
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::SERVER_ERROR,
                "Service Unavailable: the proxy's log is full; requests already in progress continue",
            )
        }
    }

    /// Something the answer depends on cannot be reached now (503 with
    /// `Retry-After`): nothing the client holds is lost.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            told: Some(Told::RetryAfter(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::INTERNAL_ERROR,
                message,
            )
        }
    }

    /// An `initialize` past a bound on open sessions: 429 past the
    /// principal's (its own sessions hold the places: end one with DELETE),
    /// 503 past the instance's; either says when to retry — the next sweep,
    /// the soonest an expiry frees a place by itself.
    pub fn no_session_place(id: Option<RequestId>, full: Full, retry_after_secs: u64) -> Self {
        let (status, message) = match full {
            Full::Principal(cap) => (
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "Too Many Requests: this client has {cap} sessions open, the most allowed; \
                     end one it no longer uses (DELETE) or retry later"
                ),
            ),
            Full::Total(cap) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "Service Unavailable: the proxy has {cap} sessions open, the most it \
                     allows; retry later"
                ),
            ),
        };
        Self {
            id,
            told: Some(Told::RetryAfter(retry_after_secs.max(1))),
            ..Self::new(status, code::SERVER_ERROR, message)
        }
    }

    /// The upstream answered something the proxy cannot pass on.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, code::SERVER_ERROR, message)
    }

    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, code::SERVER_ERROR, "Not Found")
    }

    pub fn forbidden(what: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            code::SERVER_ERROR,
            format!("Forbidden: {what} not allowed"),
        )
    }

    /// A task no task handle of the caller's names: unknown, expired, or
    /// another principal's — one answer for all three, so none can be told
    /// apart. HTTP statuses of the tasks errors follow the 2026-07-28
    /// revision's mapping, as SDK servers answer them.
    pub fn task_not_found(id: RequestId) -> Self {
        Self {
            id: Some(id),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                code::INVALID_PARAMS,
                "Task not found",
            )
        }
    }

    /// A method this proxy does not answer (here: `tasks/*` methods the
    /// extension removed or never had).
    pub fn method_not_found(id: RequestId, method: &str) -> Self {
        Self {
            id: Some(id),
            data: Some(serde_json::Value::String(method.to_owned()).to_string()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                code::METHOD_NOT_FOUND,
                "Method not found",
            )
        }
    }

    /// A tasks request (or a task-only tool) from a request that did not
    /// declare the extension.
    pub fn tasks_not_declared(id: Option<RequestId>) -> Self {
        Self {
            id,
            data: Some(crate::task::modern::missing_capability_data()),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                crate::task::modern::code::MISSING_CAPABILITY,
                "This request targets the tasks extension (io.modelcontextprotocol/tasks); \
                 the client did not declare it for this request",
            )
        }
    }

    /// A routing header that disagrees with the request body.
    pub fn header_mismatch(id: Option<RequestId>, header: &str, param: &str) -> Self {
        Self {
            id,
            ..Self::new(
                StatusCode::BAD_REQUEST,
                crate::task::modern::code::HEADER_MISMATCH,
                format!("{header} header does not match the request body's {param}"),
            )
        }
    }

    /// Invalid params of a method the proxy answers itself.
    pub fn invalid_params(id: RequestId, message: impl Into<String>) -> Self {
        Self {
            id: Some(id),
            ..Self::new(StatusCode::BAD_REQUEST, code::INVALID_PARAMS, message)
        }
    }

    /// The one place a refusal becomes a response.
    pub fn into_response(self) -> Response<Body> {
        crate::access::note_error(self.code);
        let body = jsonrpc::error_response_with_data(
            self.id.as_ref(),
            self.code,
            &self.message,
            self.data.as_deref(),
        );
        let mut res = reply::json(self.status, body);
        let h = res.headers_mut();
        match self.told {
            Some(Told::Allow(allow)) => {
                h.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            Some(Told::RetryAfter(secs)) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            Some(Told::Challenge(challenge)) => {
                h.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
                res.extensions_mut().insert(OwnChallenge);
            }
            None => {}
        }
        res
    }
}

/// A credential that does not verify (401 with its challenge), or a
/// verifier that cannot be reached (503).
impl From<crate::auth::Refusal> for Rejection {
    fn from(refusal: crate::auth::Refusal) -> Self {
        match refusal.challenge() {
            Some(challenge) => Self {
                told: Some(Told::Challenge(challenge)),
                ..Self::new(StatusCode::UNAUTHORIZED, code::SERVER_ERROR, "Unauthorized")
            },
            None => Self::unavailable("the credential cannot be verified now; try again"),
        }
    }
}

/// Marks a `401` the proxy made itself: the edge adds the
/// `resource_metadata` that tells the client where to authorize.
#[derive(Clone, Copy, Debug)]
pub struct OwnChallenge;

impl From<ParseError> for Rejection {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::Json(_) => Self::new(
                StatusCode::BAD_REQUEST,
                code::PARSE_ERROR,
                format!("Parse error: {e}"),
            ),
            ParseError::Shape(_) => Self::new(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!("Invalid Request: {e}"),
            ),
        }
    }
}

/// The log failed: nothing can be promised to the client.
impl From<StoreError> for Rejection {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "log failure");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::INTERNAL_ERROR,
            "the proxy's log is unavailable",
        )
    }
}

/// The upstream could not be reached at all.
impl From<UpstreamError> for Rejection {
    fn from(e: UpstreamError) -> Self {
        let status = match e {
            UpstreamError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            UpstreamError::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        };
        Self::new(status, code::SERVER_ERROR, e.to_string())
    }
}

/// A dialect's refusal: a JSON-RPC error answering the command's id (HTTP
/// 200, as a method's error is), or a malformed batch (400).
impl From<Refusal> for Rejection {
    fn from(r: Refusal) -> Self {
        let code = r.code();
        match r {
            Refusal::InvalidParams { id, message } => Self {
                id: Some(id),
                ..Self::new(StatusCode::OK, code, message)
            },
            Refusal::Batched => Self::new(
                StatusCode::BAD_REQUEST,
                code,
                "Invalid Request: requests/* and stream/* methods cannot be sent in a batch",
            ),
            Refusal::UnknownEventId => Self::unknown_event_id(),
            Refusal::Busy(id) => Self {
                id: Some(id),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code,
                    "too many tasks/result requests are waiting here; poll tasks/get and ask again",
                )
            },
            Refusal::Store(e) => e.into(),
        }
    }
}
