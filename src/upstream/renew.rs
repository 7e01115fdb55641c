//! A session whose upstream session is lost: its replica forgot it (it
//! restarted, or expired the session), or its replica stopped answering.
//! The proxy opens a new upstream session with the client's logged
//! `initialize` — on the same replica when it forgot, on another when it
//! cannot be reached — maps the client's session to it, and sends the
//! request again, once. The client keeps the session it holds and never sees
//! the upstream's 404 for it, nor the replica that went away.
//!
//! This owns only the renewal; what was in flight on the old upstream session
//! is the relays' business (their resumes are refused, and their streams end
//! with an error entry saying so). Which replica is fit is `replicas.rs`'s.

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use hyper::body::Incoming;

use super::http::HttpUpstream;
use super::replicas::Binding;
use super::UpstreamError;
use crate::session::{Session, Sessions};

/// Why a session needs a new upstream session.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Its replica answered that it does not know the session.
    Forgotten,
    /// Its replica is out, gone from the configuration, or unreachable.
    Left,
}

/// Sends a request on the session's upstream session; when its replica no
/// longer knows that session, or cannot take it, renews it and sends once
/// more.
pub async fn send(
    sessions: &Sessions,
    upstream: &HttpUpstream,
    session: &Session,
    method: Method,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Incoming>, UpstreamError> {
    let used = Binding::of(session);
    let bound = used.session.is_some() || used.replica.is_some();
    if bound && upstream.replicas().must_leave(&used) {
        let fresh = renew(sessions, upstream, session, &used, headers, Loss::Left).await?;
        return upstream.send(method, headers, body, &fresh).await;
    }
    let sent = upstream
        .send(method.clone(), headers, body.clone(), &used)
        .await;
    let loss = match &sent {
        Ok(res) if used.session.is_some() && res.status() == StatusCode::NOT_FOUND => {
            Loss::Forgotten
        }
        // Nothing reached the replica: another one can take the session.
        Err(UpstreamError::NoConnection(_)) if bound && upstream.replicas().len() > 1 => Loss::Left,
        _ => return sent,
    };
    let fresh = renew(sessions, upstream, session, &used, headers, loss).await?;
    upstream.send(method, headers, body, &fresh).await
}

/// Gives `session` a new upstream session in place of `stale`, unless a
/// concurrent request already did (one handshake per loss, however many
/// requests noticed it). Returns where the session's requests go now.
async fn renew(
    sessions: &Sessions,
    upstream: &HttpUpstream,
    session: &Session,
    stale: &Binding,
    headers: &HeaderMap,
    loss: Loss,
) -> Result<Binding, UpstreamError> {
    let _one_at_a_time = session.renewal().await;
    if sessions.shared() {
        // Another instance may have renewed it already: use theirs.
        if let Err(e) = sessions.refresh(session.id).await {
            tracing::warn!(session = %session.id, error = %e, "cannot re-read the session");
        }
    }
    let current = Binding::of(session);
    if current != *stale {
        return Ok(current);
    }
    let Some(initialize) = session.record().initialize else {
        return Err(UpstreamError::Broken(
            "the upstream lost the session and its initialize was not logged".into(),
        ));
    };
    let replicas = upstream.replicas();
    let at = match loss {
        Loss::Forgotten => replicas.route(stale),
        Loss::Left => replicas.least_busy(stale.replica.as_deref()),
    };
    let fresh = upstream
        .initialize(headers, Bytes::from(initialize), &at)
        .await?;
    match loss {
        Loss::Forgotten => {
            tracing::info!(session = %session.id, "the upstream lost the session; re-initialized it")
        }
        Loss::Left => tracing::info!(
            session = %session.id,
            from = stale.replica.as_deref().unwrap_or("-"),
            to = fresh.replica.as_deref().unwrap_or("-"),
            "the session's upstream replica is out; re-initialized it on another"
        ),
    }
    let update = sessions.update(session, |r| {
        r.upstream_session = fresh.session.clone();
        r.upstream_replica = fresh.replica.clone();
    });
    if let Err(e) = update.await {
        // Served from memory until the next restart, which then meets the
        // loss again and renews again: degraded, not broken.
        tracing::error!(session = %session.id, error = %e, "cannot persist the renewed upstream session");
    }
    Ok(fresh)
}
