//! An upstream that forgot a session (it restarted, or expired the session):
//! the proxy opens a new upstream session with the client's logged
//! `initialize`, maps the client's session to it, and sends the request again
//! — once. The client keeps the session it holds and never sees the upstream's
//! 404 for it.
//!
//! This owns only the renewal; what was in flight on the old upstream session
//! is the relays' business (their resumes are refused, and their streams end
//! with an error entry saying so).

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use hyper::body::Incoming;

use super::http::HttpUpstream;
use super::UpstreamError;
use crate::session::{Session, Sessions};

/// Sends a request on the session's upstream session; when the upstream says
/// it does not know that session, renews it and sends once more.
pub async fn send(
    sessions: &Sessions,
    upstream: &HttpUpstream,
    session: &Session,
    method: Method,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Incoming>, UpstreamError> {
    let used = session.upstream_session();
    let res = upstream
        .send(method.clone(), headers, body.clone(), used.as_deref())
        .await?;
    let Some(stale) = used.filter(|_| res.status() == StatusCode::NOT_FOUND) else {
        return Ok(res);
    };
    let fresh = renew(sessions, upstream, session, &stale, headers).await?;
    upstream.send(method, headers, body, fresh.as_deref()).await
}

/// Gives `session` a new upstream session in place of `stale`, unless a
/// concurrent request already did (one handshake per loss, however many
/// requests noticed it). Returns the upstream session to use now.
async fn renew(
    sessions: &Sessions,
    upstream: &HttpUpstream,
    session: &Session,
    stale: &str,
    headers: &HeaderMap,
) -> Result<Option<String>, UpstreamError> {
    let _one_at_a_time = session.renewal().await;
    if sessions.shared() {
        // Another instance may have renewed it already: use theirs.
        if let Err(e) = sessions.refresh(session.id).await {
            tracing::warn!(session = %session.id, error = %e, "cannot re-read the session");
        }
    }
    let current = session.upstream_session();
    if current.as_deref() != Some(stale) {
        return Ok(current);
    }
    let Some(initialize) = session.record().initialize else {
        return Err(UpstreamError::Broken(
            "the upstream lost the session and its initialize was not logged".into(),
        ));
    };
    let fresh = upstream
        .initialize(headers, Bytes::from(initialize))
        .await?;
    tracing::info!(session = %session.id, "the upstream lost the session; re-initialized it");
    let update = sessions.update(session, |r| r.upstream_session = fresh.clone());
    if let Err(e) = update.await {
        // Served from memory until the next restart, which then meets the
        // 404 again and renews again: degraded, not broken.
        tracing::error!(session = %session.id, error = %e, "cannot persist the renewed upstream session");
    }
    Ok(fresh)
}
