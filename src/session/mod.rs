//! Legacy sessions: the proxy's own `Mcp-Session-Id` mapped to the upstream's,
//! with the client principal, the negotiated protocol version and the
//! original `initialize`; plus the protocol era of a request.
//!
//! The record lives in the store (it must survive a restart); this module
//! keeps a cache of live sessions with what only exists in this process: the
//! in-flight requests (to route `notifications/cancelled`, and upstream
//! messages that arrived on another stream than their own), the standalone
//! stream being pumped, and a cancellation token that stops the session's
//! background tasks when it ends. It does not talk to upstreams.
//!
//! [`places`] bounds how many sessions are open: a session takes its place
//! when it is minted, before anything is opened upstream, and frees it when
//! it ends, closes or turns out gone; a session that made no request since
//! `initialize` is ended after `limits.unused_session_secs`.
//!
//! [`stray`] hands an upstream message that arrived on another stream of
//! the session over to its own stream's relay: the session keeps an outlet
//! per open stream, the relay reads the inlet. [`queue`] is the hand-over
//! queue under strays and under a relay's feed, here because the session is
//! the lowest of its users.

mod places;
pub mod queue;
pub mod stray;
mod table;

use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dashmap::{DashMap, DashSet};
use http::HeaderMap;
use tokio_util::sync::CancellationToken;

pub use self::places::Full;
use self::places::Places;
use self::stray::{Inlet, Outlet, Stray};
use self::table::Table;
use crate::config::LimitsConfig;
use crate::id::{IdDashMap, IdHasher, SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::{now_ms, Result, SessionNews, SessionRecord, SharedStore, StreamMeta};
use crate::tls::CertificatePrincipal;

/// Protocol revisions that use `initialize`, sessions and SSE resumability.
pub const LEGACY_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The first revision that sends priming events (id + empty data).
const PRIMING_SINCE: &str = "2025-11-25";

/// How often `last_seen` is written back to the store.
const TOUCH_EVERY_MS: u64 = 60_000;

/// Which generation of the protocol a request speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// 2025-03-26 … 2025-11-25: sessions, GET streams, Last-Event-ID.
    Legacy,
    /// 2026-07-28 and later: stateless POSTs; closing the stream cancels.
    Modern,
}

impl Era {
    /// Decided per request from `MCP-Protocol-Version`: absent means
    /// 2025-03-26 (as the spec says), a dated revision after the legacy ones
    /// means modern.
    pub fn of(headers: &HeaderMap) -> Era {
        match headers
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
        {
            Some(v) if !LEGACY_VERSIONS.contains(&v) && v > "2025-11-25" => Era::Modern,
            _ => Era::Legacy,
        }
    }
}

/// Whether a client at `version` understands a priming event.
pub fn wants_priming(version: Option<&str>) -> bool {
    version.is_some_and(|v| v >= PRIMING_SINCE)
}

/// The principal of the client certificate the request's connection was
/// verified with (mutual TLS): it is the request's principal, whatever its
/// headers say. It carries a prefix, so it never equals a credential's.
pub fn certificate_principal(request: &http::request::Parts) -> Option<&str> {
    request
        .extensions
        .get::<CertificatePrincipal>()
        .map(CertificatePrincipal::as_str)
}

/// What a session id names for one caller.
pub enum Lookup {
    Found(Arc<Session>),
    /// This route's open session, answering to another credential.
    OtherCredential(Arc<Session>),
    Absent,
}

/// A live session.
pub struct Session {
    pub id: SessionId,
    /// Whom the session belongs to: fixed when it is created (also in its
    /// record), and read on every call, so kept outside the record's lock.
    principal: Box<str>,
    record: Mutex<SessionRecord>,
    /// Client request id → the stream carrying its answer.
    in_flight: Table<RequestId, StreamId>,
    /// Progress token of a request in flight → its stream: progress naming
    /// any other token is dropped (seed 004: only tokens of active requests).
    progress: Table<Arc<str>, StreamId>,
    /// The same, by stream, so a stream's end forgets its tokens without
    /// looking at everyone else's.
    tokens_of: Table<StreamId, Vec<Arc<str>>, ById>,
    /// The standalone GET stream currently fed by an upstream GET.
    standalone: Mutex<Option<StreamId>>,
    /// The end-to-end headers of the client's latest request, for what the
    /// proxy sends upstream on its own (a cancellation): the upstream may
    /// want the client's credentials. Kept in memory only, never logged.
    headers: Mutex<HeaderMap>,
    /// Told when `headers` change; made when a relay first waits for a
    /// change (rarely: a watch channel is some 300 bytes, and every idle
    /// session would carry one). A change before anyone waited is one no
    /// waiter could have seen either.
    new_headers: OnceLock<tokio::sync::watch::Sender<()>>,
    /// Cancelled when the session ends: stops its relays.
    pub ended: CancellationToken,
    /// Orders writes of the record, so an older snapshot never overwrites a
    /// newer one in the store.
    write: tokio::sync::Mutex<()>,
    /// Held while the upstream session is renewed (see `upstream::renew`).
    renewing: tokio::sync::Mutex<()>,
    /// The request streams tracked now (the per-session cap counts them).
    streams: Table<StreamId, (), ById>,
    /// Where a relay of this process takes messages of its stream that
    /// arrived on another stream of the session (an upstream replaying the
    /// whole session on a resume), so that each lands on its own stream.
    inlets: Table<StreamId, Outlet, ById>,
    /// Task legs being read as the answer of a `tasks/result` (2025-11-25
    /// tasks), by stream: a resume of one (GET with `Last-Event-ID`) is
    /// shown the same way. This process's memory only.
    read_as: Table<StreamId, ReadAs, ById>,
    /// Ids of the upstream's requests the client has answered (its
    /// responses pass through the proxy): a `tasks/result` asked again does
    /// not ask them again. This process's memory only; made at first need
    /// (a set shared with the tasks dialect, and sharded: a session that
    /// never answers the upstream should not pay for one).
    answered: OnceLock<Arc<DashSet<RequestId>>>,
    /// The same, counted per principal across sessions.
    by_principal: Arc<PrincipalStreams>,
}

/// The hasher of maps keyed by ids the proxy made (random already).
type ById = BuildHasherDefault<IdHasher>;

/// How a task's leg is shown: as the answer of the `tasks/result` request
/// `client`, of the task `handle` names.
#[derive(Clone, Debug)]
pub struct ReadAs {
    pub client: RequestId,
    pub handle: String,
}

/// Live request streams per principal, across every session of this
/// process: what the per-principal cap counts.
#[derive(Default)]
pub struct PrincipalStreams(DashMap<String, usize>);

impl PrincipalStreams {
    pub fn of(&self, principal: &str) -> usize {
        self.0.get(principal).map_or(0, |n| *n)
    }

    fn add(&self, principal: &str) {
        // Looked up first: the key is copied only for a principal's first
        // live stream, not for every call.
        if let Some(mut count) = self.0.get_mut(principal) {
            *count += 1;
            return;
        }
        *self.0.entry(principal.to_owned()).or_default() += 1;
    }

    fn remove(&self, principal: &str, n: usize) {
        if n == 0 {
            return;
        }
        self.0.remove_if_mut(principal, |_, count| {
            *count = count.saturating_sub(n);
            *count == 0
        });
    }
}

impl Session {
    fn new(record: SessionRecord, by_principal: Arc<PrincipalStreams>) -> Arc<Self> {
        Arc::new(Self {
            id: record.id,
            principal: record.principal.as_str().into(),
            record: Mutex::new(record),
            in_flight: Table::default(),
            progress: Table::default(),
            tokens_of: Table::default(),
            standalone: Mutex::new(None),
            headers: Mutex::new(HeaderMap::new()),
            new_headers: OnceLock::new(),
            ended: CancellationToken::new(),
            write: tokio::sync::Mutex::new(()),
            renewing: tokio::sync::Mutex::new(()),
            streams: Table::default(),
            inlets: Table::default(),
            read_as: Table::default(),
            answered: OnceLock::new(),
            by_principal,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SessionRecord> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn record(&self) -> SessionRecord {
        self.lock().clone()
    }

    /// Takes in what another instance stored for this session, keeping the
    /// later of the two last-seen times.
    fn adopt(&self, stored: SessionRecord) {
        let mut r = self.lock();
        let last_seen_ms = r.last_seen_ms.max(stored.last_seen_ms);
        // Once used, always used: a stale copy does not make it unused.
        let unused = r.unused && stored.unused;
        *r = SessionRecord {
            last_seen_ms,
            unused,
            ..stored
        };
    }

    /// Notes the subject the creating token names (before the record is
    /// first persisted).
    pub fn note_subject_hint(&self, hint: Option<String>) {
        self.lock().subject_hint = hint;
    }

    pub fn subject_hint(&self) -> Option<String> {
        self.lock().subject_hint.clone()
    }

    /// Reads the record in place, for what must be read together.
    pub fn read<T>(&self, f: impl FnOnce(&SessionRecord) -> T) -> T {
        f(&self.lock())
    }

    pub fn upstream_session(&self) -> Option<String> {
        self.lock().upstream_session.clone()
    }

    /// Waits for, and holds, the right to renew the upstream session.
    pub async fn renewal(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.renewing.lock().await
    }

    pub fn protocol_version(&self) -> Option<String> {
        self.lock().protocol_version.clone()
    }

    /// Tracks the requests (and their progress tokens) a stream answers.
    pub fn track(&self, stream: &StreamMeta) {
        if self.streams.insert(stream.id, ()).is_none() {
            self.by_principal.add(&self.principal);
        }
        for id in &stream.origin_ids {
            self.in_flight.insert(id.clone(), stream.id);
        }
        for token in &stream.progress {
            self.progress.insert(token.clone(), stream.id);
        }
        if !stream.progress.is_empty() {
            self.tokens_of.insert(stream.id, stream.progress.clone());
        }
    }

    /// Opens the inlet through which messages of `stream` that arrived on
    /// another stream of the session reach its relay; closed by `release`.
    pub fn open_inlet(&self, stream: StreamId) -> Inlet {
        let (inlet, outlet) = stray::inlet();
        self.inlets.insert(stream, outlet);
        inlet
    }

    /// Hands a message that arrived on another stream to the relay of the
    /// live stream it belongs to. `false` when none takes it here (no relay
    /// of this process, or one too far behind): the caller drops it.
    pub fn redirect(&self, to: StreamId, stray: Stray) -> bool {
        self.inlets
            .read(&to, |outlet| outlet.hand_over(stray))
            .unwrap_or(false)
    }

    /// Forgets what was tracked for a stream that ended (or was refused).
    pub fn release(&self, stream: &StreamMeta) {
        self.inlets.remove(&stream.id);
        if self.streams.remove(&stream.id).is_some() {
            self.by_principal.remove(&self.principal, 1);
        }
        for id in &stream.origin_ids {
            self.in_flight.remove_if(id, |s| *s == stream.id);
        }
        if let Some(tokens) = self.tokens_of.remove(&stream.id) {
            for token in tokens {
                self.progress.remove_if(&token, |s| *s == stream.id);
            }
        }
    }

    /// How many request streams are tracked now.
    pub fn live_streams(&self) -> usize {
        self.streams.len()
    }

    /// Forgets every tracked stream's count: the session is over. Counts
    /// what it removes, so a `track` racing with it is never lost.
    fn release_all(&self) {
        let n = self.streams.clear();
        self.by_principal.remove(&self.principal, n);
    }

    /// The live request stream a progress token belongs to.
    pub fn progress_stream(&self, token: &str) -> Option<StreamId> {
        self.progress.get(token)
    }

    pub fn remember_headers(&self, headers: &HeaderMap) {
        let mut remembered = self.headers.lock().unwrap_or_else(|p| p.into_inner());
        // A client sends the same headers call after call: comparing them
        // is cheaper than copying them each time.
        if *remembered != *headers {
            *remembered = detached(headers);
            drop(remembered);
            if let Some(waiters) = self.new_headers.get() {
                waiters.send_replace(());
            }
        }
    }

    /// Remembers `headers` if their `credential` header differs from the
    /// remembered one's: what a relay waiting to resume needs, without a
    /// copy per request of a client that alternates GETs and POSTs.
    pub fn remember_credential(&self, headers: &HeaderMap, credential: &str) {
        let same = {
            let remembered = self.headers.lock().unwrap_or_else(|p| p.into_inner());
            remembered.get(credential) == headers.get(credential) && !remembered.is_empty()
        };
        if !same {
            self.remember_headers(headers);
        }
    }

    /// Resolves when the client sends headers other than the ones
    /// remembered now (a relay the upstream refused for want of a
    /// credential waits on it: a proxy restart forgets credentials, and
    /// tokens expire while calls run).
    pub fn headers_changed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut changed = self
            .new_headers
            .get_or_init(|| tokio::sync::watch::Sender::new(()))
            .subscribe();
        async move {
            let _ = changed.changed().await;
        }
    }

    pub fn remembered_headers(&self) -> HeaderMap {
        self.headers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the names of the dialects the session negotiated (under the
    /// session's lock: asked on every call, they are not copied).
    pub fn with_dialects<R>(&self, read: impl FnOnce(&[String]) -> R) -> R {
        read(&self.lock().dialects)
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }

    pub fn stream_of(&self, id: &RequestId) -> Option<StreamId> {
        self.in_flight.get(id)
    }

    /// Remembers that `stream` is being read as `read_as`.
    pub fn read_as(&self, stream: StreamId, read_as: ReadAs) {
        self.read_as.insert(stream, read_as);
    }

    /// Notes the upstream's requests the client just answered.
    pub fn client_answered(&self, ids: Vec<RequestId>) {
        let answered = self.answered_by_client();
        for id in ids {
            answered.insert(id);
        }
    }

    /// The upstream's requests the client has answered so far.
    pub fn answered_by_client(&self) -> Arc<DashSet<RequestId>> {
        self.answered.get_or_init(Arc::default).clone()
    }

    /// How `stream` is being read, if as a `tasks/result`.
    pub fn reading_as(&self, stream: StreamId) -> Option<ReadAs> {
        self.read_as.get(&stream)
    }

    pub fn standalone(&self) -> Option<StreamId> {
        *self.standalone.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_standalone(&self, stream: Option<StreamId>) {
        *self.standalone.lock().unwrap_or_else(|p| p.into_inner()) = stream;
    }

    /// Clears the standalone stream only if it is still `stream`.
    pub fn clear_standalone(&self, stream: StreamId) {
        let mut current = self.standalone.lock().unwrap_or_else(|p| p.into_inner());
        if *current == Some(stream) {
            *current = None;
        }
    }
}

/// What an upstream's `initialize` result leaves of the dialects a session
/// negotiated (drops those the answer rules out). Decided by the dialects
/// and handed down, so an upstream carries the answer without knowing them.
pub type Settle = fn(&[u8], &mut Vec<String>);

/// Every session of this process, backed by the store.
pub struct Sessions {
    store: SharedStore,
    live: IdDashMap<SessionId, Arc<Session>>,
    /// Live request streams per principal (the per-principal cap).
    pub by_principal: Arc<PrincipalStreams>,
    /// The open sessions this instance counts against its bounds.
    places: Places,
    /// How long a session may stay unused.
    unused_ms: AtomicU64,
}

impl Sessions {
    /// Sessions under the default `[limits]`.
    pub fn new(store: SharedStore) -> Arc<Self> {
        Self::with_limits(store, &LimitsConfig::default())
    }

    pub fn with_limits(store: SharedStore, limits: &LimitsConfig) -> Arc<Self> {
        let sessions = Arc::new(Self {
            store,
            live: IdDashMap::default(),
            by_principal: Arc::default(),
            places: Places::new(limits),
            unused_ms: AtomicU64::new(limits.unused_session_secs.saturating_mul(1000)),
        });
        sessions.follow_changes();
        sessions
    }

    /// New bounds from a reloaded `[limits]`: for the sessions opened, and
    /// the unused ones swept, from now on.
    pub fn set_limits(&self, limits: &LimitsConfig) {
        self.places.set_bounds(limits);
        let unused_ms = limits.unused_session_secs.saturating_mul(1000);
        self.unused_ms.store(unused_ms, Ordering::Relaxed);
    }

    /// With a shared log, keeps the cached sessions in step with what other
    /// instances store (a renewed upstream session, a close, a delete).
    fn follow_changes(self: &Arc<Self>) {
        let Some(mut changes) = self.store.session_changes() else {
            return;
        };
        let sessions = Arc::downgrade(self);
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let changed = changes.recv().await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                let ids: Vec<SessionId> = match changed {
                    Ok(SessionNews::Changed(id)) => vec![id],
                    // Fell behind, or changes were missed: every cached
                    // session may be stale.
                    Ok(SessionNews::Unknown) | Err(RecvError::Lagged(_)) => {
                        sessions.live.iter().map(|s| s.id).collect()
                    }
                    Err(RecvError::Closed) => return,
                };
                for id in ids {
                    if let Err(e) = sessions.refresh(id).await {
                        tracing::warn!(session = %id, error = %e, "cannot refresh a session another instance changed");
                    }
                }
            }
        });
    }

    /// Re-reads a cached session from the store: adopts what another
    /// instance stored, or forgets a session it deleted.
    pub async fn refresh(&self, id: SessionId) -> Result<()> {
        let Some(session) = self.cached(id) else {
            return Ok(());
        };
        // Ordered with this process's own writes of the record: a stored
        // copy never replaces a newer local update.
        let _ordered = session.write.lock().await;
        match self.store.get_session(id).await? {
            Some(record) if record.closed_ms.is_some() => {
                session.adopt(record);
                self.places.free(id);
            }
            Some(record) => {
                if !record.unused {
                    self.places.used(id);
                }
                session.adopt(record);
            }
            None => {
                drop(_ordered);
                self.discard(id);
            }
        }
        Ok(())
    }

    /// Whether other instances may change sessions behind this cache.
    pub fn shared(&self) -> bool {
        self.store.shared()
    }

    /// Mints a session for an `initialize` request, in a place of its own
    /// unless `principal` or this instance holds as many as allowed. Not
    /// persisted until [`Sessions::persist`]: the upstream may still refuse
    /// it (and [`Sessions::discard`] frees its place).
    pub fn mint(
        &self,
        route: &str,
        principal: String,
        initialize: &[u8],
        dialects: Vec<String>,
    ) -> std::result::Result<Arc<Session>, Full> {
        let now = now_ms();
        let id = SessionId::random();
        self.places.take(id, bounded(&principal), now)?;
        let session = Session::new(
            SessionRecord {
                protocol_version: crate::jsonrpc::protocol_version(initialize),
                initialize: Some(String::from_utf8_lossy(initialize).into_owned()),
                dialects,
                unused: true,
                ..SessionRecord::new(id, route, principal, now)
            },
            self.by_principal.clone(),
        );
        self.live.insert(session.id, session.clone());
        Ok(session)
    }

    pub async fn persist(&self, session: &Session) -> Result<()> {
        let _ordered = session.write.lock().await;
        if session.ended.is_cancelled() {
            return Ok(()); // see `update`
        }
        let record = session.record();
        self.store.put_session(&record).await
    }

    /// Records what the upstream said about the session and persists it.
    pub async fn update(
        &self,
        session: &Session,
        change: impl FnOnce(&mut SessionRecord),
    ) -> Result<()> {
        let _ordered = session.write.lock().await;
        if session.ended.is_cancelled() {
            // Ended (deleted, expired) while this waited: writing its
            // record would bring a deleted session back.
            return Ok(());
        }
        let record = {
            let mut r = session.lock();
            change(&mut r);
            r.clone()
        };
        self.store.put_session(&record).await
    }

    /// Records what an `initialize` result settled: the protocol version it
    /// negotiated, and the dialects the session keeps (`settle` drops those
    /// the upstream's answer rules out).
    pub async fn learn_initialize(
        &self,
        session: &Session,
        initialize_result: &[u8],
        settle: Settle,
    ) {
        let Some(version) = crate::jsonrpc::protocol_version(initialize_result) else {
            return;
        };
        let update = self.update(session, |r| {
            r.protocol_version = Some(version);
            settle(initialize_result, &mut r.dialects);
        });
        if let Err(e) = update.await {
            tracing::warn!(session = %session.id, error = %e, "cannot record protocol version");
        }
    }

    /// Closes a session whose upstream is gone for good (a stdio child that
    /// exited): it answers 404 from now on, while its finished streams stay
    /// readable until the sweeper deletes them with the session.
    pub async fn close(&self, id: SessionId) -> Result<()> {
        // A closed session is open no more, whether or not the record of
        // its close is written.
        self.places.free(id);
        if let Some(session) = self.cached(id) {
            return self
                .update(&session, |r| r.closed_ms = Some(now_ms()))
                .await;
        }
        match self.store.get_session(id).await? {
            Some(mut record) if record.closed_ms.is_none() => {
                record.closed_ms = Some(now_ms());
                self.store.put_session(&record).await
            }
            _ => Ok(()),
        }
    }

    /// The session `id` on `route` as seen by a caller whose principal is
    /// `principal`: [`Lookup::Found`] when the session answers to it,
    /// [`Lookup::OtherCredential`] when it is this route's open session
    /// but answers to another credential (a refreshed token, or someone
    /// else's: only the upstream can tell), absent otherwise.
    pub async fn lookup(&self, id: SessionId, route: &str, principal: &str) -> Result<Lookup> {
        let Some(session) = self.load(id).await? else {
            return Ok(Lookup::Absent);
        };
        let stale = {
            let mut r = session.lock();
            if r.route != route || r.closed_ms.is_some() {
                return Ok(Lookup::Absent);
            }
            if r.credential.as_deref().unwrap_or(&session.principal) != principal {
                return Ok(Lookup::OtherCredential(session.clone()));
            }
            let now = now_ms();
            let stale = now.saturating_sub(r.last_seen_ms) >= TOUCH_EVERY_MS;
            r.last_seen_ms = now;
            stale
        };
        if stale {
            if self.shared() {
                // Another instance may have changed the record since this
                // cache last heard: touch what is stored, not a stale copy.
                self.refresh(id).await?;
                if self.cached(id).is_none() {
                    return Ok(Lookup::Absent); // deleted elsewhere
                }
            }
            self.persist(&session).await?;
        }
        Ok(Lookup::Found(session))
    }

    /// The session `id` on `route` if it answers to `principal`.
    pub async fn get(
        &self,
        id: SessionId,
        route: &str,
        principal: &str,
    ) -> Result<Option<Arc<Session>>> {
        Ok(match self.lookup(id, route, principal).await? {
            Lookup::Found(session) => Some(session),
            Lookup::OtherCredential(_) | Lookup::Absent => None,
        })
    }

    /// Makes `session` answer to `credential` from now on (and no longer
    /// to the one before): the upstream accepted it on that session.
    pub async fn rebind(&self, session: &Session, credential: &str) -> Result<()> {
        let owner = session.principal.to_string();
        self.update(session, |r| {
            r.credential = (credential != owner).then(|| credential.to_owned());
            r.last_seen_ms = now_ms();
        })
        .await
    }

    /// Notes that the client used `session` (a request, or a GET stream),
    /// persisted before the request goes on, so neither a restart nor
    /// another instance ends it as unused. `false` when it was ended as
    /// unused just now: the caller answers as for an unknown session.
    pub async fn mark_used(&self, session: &Session) -> Result<bool> {
        if !session.lock().unused {
            return Ok(true); // every request but a session's first
        }
        // Ordered with the sweep's check (`expire_unused`): either this
        // write comes first and the session lives, or the sweep ended it.
        let _ordered = session.write.lock().await;
        if session.ended.is_cancelled() {
            return Ok(false);
        }
        let record = {
            let mut r = session.lock();
            r.unused = false;
            r.clone()
        };
        self.store.put_session(&record).await?;
        self.places.used(session.id);
        Ok(true)
    }

    /// Sessions unused for `limits.unused_session_secs` at `now_ms`: the
    /// sweep's candidates for [`Sessions::expire_unused`].
    pub fn unused_long(&self, now_ms: u64) -> Vec<SessionId> {
        let unused_ms = self.unused_ms.load(Ordering::Relaxed);
        self.places.unused_by(now_ms.saturating_sub(unused_ms))
    }

    /// Ends the session `id` if it is still unused (and open): `true` when
    /// it did. The session is brought into the cache first, so a request
    /// of its client and this check take turns on its write lock.
    pub async fn expire_unused(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        if self.shared() {
            // Another instance may have served its first request.
            self.refresh(id).await?;
        }
        let Some(session) = self.load(id).await? else {
            self.discard(id);
            return Ok(None);
        };
        let ordered = session.write.lock().await;
        let (unused, closed) = {
            let r = session.lock();
            (r.unused, r.closed_ms.is_some())
        };
        if closed {
            self.places.free(id);
        } else if !unused {
            self.places.used(id);
        }
        if closed || !unused {
            return Ok(None);
        }
        let record = session.record();
        // Cancelled under the lock: a request waiting for it sees the end.
        self.discard(id);
        drop(ordered);
        self.store.delete_session(id).await?;
        Ok(Some(record))
    }

    /// The session `id` for the proxy's own work on it (resuming its
    /// streams after a restart): no route or principal to check, and not a
    /// sign of client activity. `None` when it is gone or closed.
    pub async fn restore(&self, id: SessionId) -> Result<Option<Arc<Session>>> {
        let Some(session) = self.load(id).await? else {
            return Ok(None);
        };
        let closed = session.lock().closed_ms.is_some();
        Ok((!closed).then_some(session))
    }

    /// The cached session, or the stored one brought into the cache.
    async fn load(&self, id: SessionId) -> Result<Option<Arc<Session>>> {
        if let Some(s) = self.live.get(&id) {
            return Ok(Some(s.clone()));
        }
        Ok(self.store.get_session(id).await?.map(|record| {
            self.live
                .entry(id)
                .or_insert_with(|| Session::new(record, self.by_principal.clone()))
                .clone()
        }))
    }

    /// Ends a session: stops its tasks, forgets it, deletes its streams.
    pub async fn end(&self, id: SessionId) -> Result<()> {
        self.discard(id);
        self.store.delete_session(id).await
    }

    /// Forgets a session here (a minted one the upstream refused, or one
    /// that ends): stops its tasks, releases its stream counts and frees
    /// its place (also when it was counted at start and never loaded).
    pub fn discard(&self, id: SessionId) {
        self.places.free(id);
        if let Some((_, session)) = self.live.remove(&id) {
            session.ended.cancel();
            session.release_all();
        }
    }

    /// Ends a minted session whose `initialize` was refused on the way (the
    /// client never learns its id): forgotten here, and deleted from the
    /// store if it was persisted already.
    pub async fn unmint(&self, id: SessionId) -> Result<()> {
        self.discard(id);
        if self.store.get_session(id).await?.is_some() {
            self.store.delete_session(id).await?;
        }
        Ok(())
    }

    /// Open sessions this instance counts against `limits.max_sessions`
    /// (the metrics' `sessions_open`).
    pub fn open(&self) -> usize {
        self.places.open()
    }

    /// Counts a session found in the log at start: open ones take their
    /// place (with a log of this process only: a shared log's sessions are
    /// every instance's), and unused ones are watched for early expiry.
    pub fn recovered(&self, record: &SessionRecord) {
        if record.closed_ms.is_some() {
            return;
        }
        if !self.shared() {
            self.places.count(record.id, bounded(&record.principal));
        }
        if record.unused {
            self.places.unused_since(record.id, record.created_ms);
        }
    }

    /// The cached session, if this process knows it.
    pub fn cached(&self, id: SessionId) -> Option<Arc<Session>> {
        self.live.get(&id).map(|s| s.clone())
    }
}

/// A copy of `headers` that owns its bytes. A value hyper parsed is a slice
/// of its connection's read buffer, and a clone of it keeps that buffer
/// (8 KiB at first) alive for as long as the session remembers it, long
/// after the connection closed or moved on: 7 KiB per idle session when
/// sessions came one after another on one connection, 12 KiB when each
/// came on a connection of its own (BENCHMARKS.md, session 20). Copied
/// only when the client's headers change.
fn detached(headers: &HeaderMap) -> HeaderMap {
    let mut copy = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let owned = match http::HeaderValue::from_bytes(value.as_bytes()) {
            Ok(mut owned) => {
                owned.set_sensitive(value.is_sensitive());
                owned
            }
            // Never: the bytes were a header value already.
            Err(_) => value.clone(),
        };
        copy.append(name.clone(), owned);
    }
    copy
}

/// The principal a session is bounded under: none for a request without a
/// credential, whose principal every such client shares (see
/// [`crate::auth::NO_CREDENTIAL`]); its sessions count only in all.
fn bounded(principal: &str) -> Option<&str> {
    (principal != crate::auth::NO_CREDENTIAL).then_some(principal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn era_follows_the_protocol_version_header() {
        assert_eq!(Era::of(&headers(&[])), Era::Legacy);
        for v in LEGACY_VERSIONS {
            let mut h = HeaderMap::new();
            h.insert("mcp-protocol-version", v.parse().unwrap());
            assert_eq!(Era::of(&h), Era::Legacy, "{v}");
        }
        let modern = headers(&[("mcp-protocol-version", "2026-07-28")]);
        assert_eq!(Era::of(&modern), Era::Modern);
    }

    fn session() -> Arc<Session> {
        Session::new(
            SessionRecord::new(SessionId::random(), "r", "p", 0),
            Arc::default(),
        )
    }

    #[test]
    fn the_latest_client_headers_are_remembered_whether_or_not_they_changed() {
        let s = session();
        let a = headers(&[("authorization", "Bearer a")]);
        let b = headers(&[("authorization", "Bearer b")]);
        s.remember_headers(&a);
        s.remember_headers(&a);
        assert_eq!(s.remembered_headers(), a);
        s.remember_headers(&b);
        assert_eq!(s.remembered_headers(), b);
    }

    #[test]
    fn remembered_headers_own_their_bytes() {
        let buffer = bytes::Bytes::from_static(b"Bearer a, and the rest of a read buffer");
        let value = http::HeaderValue::from_maybe_shared(buffer.slice(..8)).unwrap();
        let mut h = HeaderMap::new();
        h.insert("authorization", value);
        let s = session();
        s.remember_headers(&h);
        let remembered = s.remembered_headers();
        assert_eq!(remembered, h);
        let kept = remembered["authorization"].as_bytes().as_ptr();
        assert_ne!(kept, h["authorization"].as_bytes().as_ptr(), "a copy");
    }

    #[test]
    fn priming_starts_with_2025_11_25() {
        assert!(!wants_priming(None));
        assert!(!wants_priming(Some("2025-06-18")));
        assert!(wants_priming(Some("2025-11-25")));
    }

    fn request(pairs: &[(&'static str, &'static str)]) -> http::request::Parts {
        let mut req = http::Request::new(());
        *req.headers_mut() = headers(pairs);
        req.into_parts().0
    }

    #[test]
    fn a_client_certificate_is_the_principal_whatever_the_header() {
        let cert = CertificatePrincipal::of_leaf(&vec![7u8; 16].into());
        let mut a = request(&[("authorization", "Bearer a")]);
        a.extensions.insert(cert.clone());
        let mut b = request(&[("authorization", "Bearer b")]);
        b.extensions.insert(cert.clone());
        assert_eq!(certificate_principal(&a), Some(cert.as_str()));
        assert_eq!(certificate_principal(&a), certificate_principal(&b));
        assert_eq!(certificate_principal(&request(&[])), None);
    }
}
