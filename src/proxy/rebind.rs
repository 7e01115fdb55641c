//! A refreshed token on an existing session. With `principal = "token"` a
//! session answers to the credential that created it, and access tokens
//! are refreshed every few minutes while the calls this proxy exists for
//! run for longer. A request that names a session with another credential
//! may be its owner's new token or someone else's, and only the upstream
//! can tell: so the proxy asks it, on that upstream session with the new
//! credential (a `ping`), and re-binds the session only when it answers.
//! The proxy is then never laxer than the upstream, and a stock client
//! keeps its session across a refresh with no configuration. An upstream
//! that answers the same ping without any credential checks none, so its
//! yes proves nothing: such a session stays its creator's, as before.
//!
//! An upstream that checks tokens but does not bind its sessions to their
//! users accepts another user's valid token too. Where tokens are JWTs the
//! proxy tells people apart anyway: a session remembers the subject its
//! creating token named (unverified: it can only refuse), and a token that
//! names another is refused without asking. Opaque tokens name nobody; to
//! tell people apart in front of such a server, configure a verified
//! principal (`[auth]`).
//!
//! A stdio child checks no credential, so a stdio session is never
//! re-bound: there the proxy is the only gate. This module asks and
//! re-binds; it never answers the request itself.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use super::{Rejection, Route};
use crate::session::Session;
use crate::upstream::replicas::Binding;
use crate::upstream::UpstreamError;

/// How long the upstream has to answer the ping.
const ASK_WITHIN: Duration = Duration::from_secs(10);

/// The session, re-bound to `credential` if the upstream accepts it there;
/// 404 (exactly as for an unknown id) if it does not. An upstream that
/// cannot be reached ends nothing: the client is told to come back.
pub async fn ask_upstream(
    route: &Route,
    session: Arc<Session>,
    headers: &HeaderMap,
    credential: &str,
) -> Result<Arc<Session>, Rejection> {
    let Some(upstream) = route.http() else {
        return Err(Rejection::session_not_found());
    };
    // A session whose token named its subject takes only tokens that name
    // the same one; the upstream is not even asked about another's.
    if let Some(hint) = session.subject_hint() {
        if crate::auth::hint::subject_hint(headers).as_deref() != Some(hint.as_str()) {
            tracing::info!(session = %session.id, "a token naming another subject on a session; not re-bound");
            return Err(Rejection::session_not_found());
        }
    }
    let binding = Binding::of(&session);
    let version = session.protocol_version();
    let ask = |headers: HeaderMap| {
        let (binding, version) = (binding.clone(), version.clone());
        async move {
            let asked = upstream.accepts(&headers, &binding, version.as_deref());
            match tokio::time::timeout(ASK_WITHIN, asked).await {
                Ok(answer) => answer,
                Err(_) => Err(UpstreamError::TimedOut("no answer")),
            }
        }
    };
    let accepted = ask(headers.clone())
        .await
        .map_err(|e| unavailable(&session, e))?;
    // An upstream that also answers without any credential checks none: its
    // yes says nothing about who this is, and the session stays its owner's.
    let mut anonymous = headers.clone();
    anonymous.remove(route.shared.config.principal_header.as_str());
    let checks = accepted && !ask(anonymous).await.map_err(|e| unavailable(&session, e))?;
    if !checks {
        tracing::info!(session = %session.id, accepted, "another credential on a session; not re-bound");
        return Err(Rejection::session_not_found());
    }
    route.shared.sessions.rebind(&session, credential).await?;
    tracing::info!(session = %session.id, "session re-bound to a refreshed credential");
    Ok(session)
}

fn unavailable(session: &Session, e: UpstreamError) -> Rejection {
    tracing::warn!(session = %session.id, error = %e, "cannot ask the upstream about a refreshed credential");
    Rejection::unavailable("the upstream cannot be asked about this credential now; try again")
}
