//! Admission of new request streams: the per-session and per-principal caps
//! on live streams, and the log's disk quota. These only refuse new work —
//! a stream already open always runs to its end, so a full quota never cuts
//! or corrupts anything a client is waiting for.

use crate::config::LimitsConfig;
use crate::jsonrpc::RequestId;
use crate::session::{Session, Sessions};
use crate::store::Store;

use super::Rejection;

/// Whether `session` may open one more request stream now; `id` is the
/// request's, so that a refusal answers it.
pub fn admit(
    limits: &LimitsConfig,
    sessions: &Sessions,
    store: &dyn Store,
    session: &Session,
    id: impl FnOnce() -> Option<RequestId>,
) -> Result<(), Rejection> {
    if session.live_streams() >= limits.streams_per_session {
        return Err(Rejection::too_many_streams(
            id(),
            "this session",
            limits.streams_per_session,
        ));
    }
    let principal = session.principal();
    if sessions.by_principal.of(principal) >= limits.streams_per_principal {
        return Err(Rejection::too_many_streams(
            id(),
            "this client",
            limits.streams_per_principal,
        ));
    }
    if let Some(quota) = limits.max_log_bytes {
        let used = store.size_on_disk();
        if used >= quota {
            tracing::warn!(used, quota, "log quota reached; refusing new requests");
            return Err(Rejection::log_full(id()));
        }
    }
    Ok(())
}
