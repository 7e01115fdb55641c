//! Sealing and opening the opaque handles the proxy gives to clients.
//!
//! There are four kinds of handle, each a fixed-size body sealed for one
//! session:
//!
//! - an event id names `(stream, seq)`, bound to the session only, as it
//!   always was;
//! - a resume token (seed 002) names the stream of a resumable request;
//! - a stream handle (seed 003's `streamId`) names a stream in the streams
//!   dialect;
//! - a poll cursor is an opaque 24-byte position in `stream/poll/all`.
//!
//! The last three are also bound to the principal (a hex digest of the
//! client's credential), so a handle presented by another client opens to
//! nothing even in the right session.
//!
//! - a call token (seeds 000/001's `nextResumeToken`) names the stream of a
//!   long tool call, how far the client got, and when the token expires; it
//!   is also bound to the call's params digest, so a token presented with
//!   other params opens to nothing.
//!
//! Every kind is sealed the same way, with deterministic authenticated
//! encryption in the SIV style: a tag = HMAC-SHA256(label ‖ session ‖ kind ‖
//! key id ‖ principal ‖ body), truncated, doubles as the IV of a keystream
//! HMAC-SHA256(tag) that hides the body. The raw handle is kind ‖ key id ‖
//! tag ‖ hidden body, base64url. The kind byte leads the handle so the wrong kind is
//! turned away before any MAC work, and it is under the tag (with a label per
//! kind) so rewriting it fails authentication: a handle presented as another
//! kind opens exactly like garbage. So a handle reveals nothing (not even
//! how far a stream got), and one that was edited, forged, or presented in
//! another session or by another principal opens to nothing — exactly like an
//! unknown one. Handles are deterministic (a replayed entry carries the id it
//! had live) and visible ASCII (base64url), as `Last-Event-ID` header values
//! must be.
//!
//! The key id (derived from the key itself, so operators configure none)
//! says which key sealed a handle: keys can be rotated, with the previous key
//! still opening handles for a configured window. The key is read from a
//! file named by the config or generated once into the data directory, so
//! handles survive a restart; every instance of a cluster must share it. This
//! module knows nothing of HTTP or the log. Its HMAC-SHA256 is `mac.rs`'s.

mod mac;

use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::id::{Seq, SessionId, StreamId, TaskId};

/// One kind of sealed handle.
struct Kind {
    /// Leads the raw handle and is part of the MAC input.
    byte: u8,
    /// Starts the MAC input. No label is a prefix of another, so the MAC
    /// inputs of two kinds can never coincide; within a kind the label, the
    /// session, the kind byte and the body have fixed sizes, so the principal
    /// is whatever lies between them and needs no length prefix.
    label: &'static [u8],
}

const EVENT_ID: Kind = Kind {
    byte: 1,
    label: b"event-id",
};
const RESUME_TOKEN: Kind = Kind {
    byte: 2,
    label: b"resume-token",
};
const STREAM_HANDLE: Kind = Kind {
    byte: 3,
    label: b"stream-handle",
};
const POLL_CURSOR: Kind = Kind {
    byte: 4,
    label: b"poll-cursor",
};
const CALL_TOKEN: Kind = Kind {
    byte: 5,
    label: b"call-token",
};
const TASK_HANDLE: Kind = Kind {
    byte: 6,
    label: b"task-handle",
};

/// Kind and key id lead every handle.
const HEAD: usize = 2;

const TAG_LEN: usize = 12;
/// The keystream is one HMAC-SHA256 output, so no body may be longer.
const MAX_BODY_LEN: usize = 32;
/// Room for whitespace around a handle (a header value may carry some; opening
/// trims it).
const WHITESPACE_ALLOWANCE: usize = 14;
const KEY_FILE: &str = "token.key";

/// The length of the base64url text (no padding) of a handle with a body of
/// `body_len` bytes.
const fn text_len(body_len: usize) -> usize {
    (4 * (HEAD + TAG_LEN + body_len)).div_ceil(3)
}

/// The longest text worth decoding as a handle with a body of `body_len`
/// bytes; anything longer is turned away before any work.
const fn max_text_len(body_len: usize) -> usize {
    text_len(body_len) + WHITESPACE_ALLOWANCE
}

/// What a call token names: the call's stream, how far the client got, and
/// until when the token is valid. Opening does not check the expiry: the
/// caller compares it with its clock, so an expired token can be answered
/// exactly like an unknown one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallToken {
    pub stream: StreamId,
    pub cursor: Seq,
    pub expires_ms: u64,
}

/// One secret, as the two subkeys it is used through.
#[derive(Clone)]
struct Key {
    /// Names the key inside every handle it seals.
    id: u8,
    /// Authenticates (and binds to a kind, a session and a principal).
    mac: mac::Key,
    /// Derives the keystream that hides the body.
    enc: mac::Key,
}

impl Key {
    fn new(secret: &[u8]) -> Self {
        // Independent subkeys, so the tag and the keystream never share a key.
        let master = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let derive = |label: &[u8]| {
            let mut key = [0u8; 32];
            key.copy_from_slice(hmac::sign(&master, label).as_ref());
            mac::Key::new(&key)
        };
        Self {
            id: hmac::sign(&master, b"mcp-resume-proxy/key-id").as_ref()[0],
            mac: derive(b"mcp-resume-proxy/mac"),
            enc: derive(b"mcp-resume-proxy/enc"),
        }
    }
}

/// The keys handles are sealed and opened with: the current one, and the
/// previous one while a rotation's window lasts. Shared, not copied: every
/// SSE answer and resume-token call keeps one (by value it was 728 bytes, held
/// for as long as the answer stays open).
#[derive(Clone)]
pub struct Keyring(Arc<Keys>);

#[derive(Clone)]
struct Keys {
    current: Key,
    /// Opens (never seals) handles until the given unix time in ms.
    previous: Option<(Key, u64)>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Keyring {
    pub fn from_secret(secret: &[u8]) -> Self {
        Self(Arc::new(Keys {
            current: Key::new(secret),
            previous: None,
        }))
    }

    /// Also opens handles sealed with `previous` until `accepted_until_ms`
    /// (unix time): the window of a key rotation.
    pub fn with_previous(self, previous: &[u8], accepted_until_ms: u64) -> Self {
        let mut keys = Arc::unwrap_or_clone(self.0);
        keys.previous = Some((Key::new(previous), accepted_until_ms));
        Self(Arc::new(keys))
    }

    /// The current key from `key_file` (at least 32 bytes), or from
    /// `dir/token.key`, created on first start; plus the previous key file and
    /// until when it opens handles, if given.
    pub fn load(
        dir: &Path,
        key_file: Option<&Path>,
        previous: Option<(&Path, u64)>,
    ) -> std::io::Result<Self> {
        let keyring = match key_file {
            Some(file) => Self::from_secret(&read_key(file)?),
            None => Self::load_or_create(dir)?,
        };
        Ok(match previous {
            Some((file, until)) => keyring.with_previous(&read_key(file)?, until),
            None => keyring,
        })
    }

    /// Loads the key file from `dir`, creating it (mode 0600) with 32 random
    /// bytes on first start.
    pub fn load_or_create(dir: &Path) -> std::io::Result<Self> {
        let path = dir.join(KEY_FILE);
        match read_key(&path) {
            Ok(secret) => return Ok(Self::from_secret(&secret)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut secret = [0u8; 32];
        SystemRandom::new()
            .fill(&mut secret)
            .map_err(|_| std::io::Error::other("no randomness for the token key"))?;
        let tmp = dir.join(format!("{KEY_FILE}.tmp"));
        {
            use std::io::Write;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&tmp)?;
            file.write_all(&secret)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        Ok(Self::from_secret(&secret))
    }

    /// The event id of entry `seq` of `stream` in `session` (seq 0 is the
    /// priming position, before the first entry).
    pub fn event_id(&self, session: SessionId, stream: StreamId, seq: Seq) -> String {
        let mut text = String::with_capacity(text_len(16 + 8));
        self.push_event_id(&mut text, session, stream, seq);
        text
    }

    /// [`Keyring::event_id`], appended to `text`: a replay names every entry
    /// it sends, and a caller that reuses one `String` for all of them
    /// allocates nothing per id.
    pub fn push_event_id(&self, text: &mut String, session: SessionId, stream: StreamId, seq: Seq) {
        let mut body = [0u8; 16 + 8];
        body[..16].copy_from_slice(stream.as_bytes());
        body[16..].copy_from_slice(&seq.to_be_bytes());
        let (raw, len) = self.seal_raw(&EVENT_ID, session, b"", &body);
        URL_SAFE_NO_PAD.encode_string(&raw[..len], text);
    }

    /// Opens an event id presented in `session`. `None` for anything that was
    /// not issued by this key in this session.
    pub fn open_event_id(&self, session: SessionId, text: &str) -> Option<(StreamId, Seq)> {
        let body: [u8; 16 + 8] = self.open(&EVENT_ID, session, b"", text)?;
        let stream = StreamId(body[..16].try_into().ok()?);
        let seq = u64::from_be_bytes(body[16..].try_into().ok()?);
        Some((stream, seq))
    }

    /// A resume token of a resumable request (seed 002): names one stream.
    pub fn resume_token(&self, session: SessionId, principal: &str, stream: StreamId) -> String {
        self.seal(
            &RESUME_TOKEN,
            session,
            principal.as_bytes(),
            stream.as_bytes(),
        )
    }

    /// Opens a resume token presented in `session` by `principal`. `None` for
    /// anything that was not issued by this key to them as a resume token.
    pub fn open_resume_token(
        &self,
        session: SessionId,
        principal: &str,
        text: &str,
    ) -> Option<StreamId> {
        self.open(&RESUME_TOKEN, session, principal.as_bytes(), text)
            .map(StreamId)
    }

    /// A stream handle of the streams dialect (seed 003's `streamId`): names
    /// one stream.
    pub fn stream_handle(&self, session: SessionId, principal: &str, stream: StreamId) -> String {
        self.seal(
            &STREAM_HANDLE,
            session,
            principal.as_bytes(),
            stream.as_bytes(),
        )
    }

    /// Opens a stream handle presented in `session` by `principal`. `None` for
    /// anything that was not issued by this key to them as a stream handle.
    pub fn open_stream_handle(
        &self,
        session: SessionId,
        principal: &str,
        text: &str,
    ) -> Option<StreamId> {
        self.open(&STREAM_HANDLE, session, principal.as_bytes(), text)
            .map(StreamId)
    }

    /// A page cursor of `stream/poll/all`: an opaque 24-byte position.
    pub fn poll_cursor(&self, session: SessionId, principal: &str, position: &[u8; 24]) -> String {
        self.seal(&POLL_CURSOR, session, principal.as_bytes(), position)
    }

    /// Opens a poll cursor presented in `session` by `principal`. `None` for
    /// anything that was not issued by this key to them as a poll cursor.
    pub fn open_poll_cursor(
        &self,
        session: SessionId,
        principal: &str,
        text: &str,
    ) -> Option<[u8; 24]> {
        self.open(&POLL_CURSOR, session, principal.as_bytes(), text)
    }

    /// A task's `taskId` (modern tasks): names one task, bound to its
    /// principal and its route — tasks have no session.
    pub fn task_handle(&self, route: &str, principal: &str, task: TaskId) -> String {
        let binding = task_binding(route, principal);
        self.seal(&TASK_HANDLE, SessionId::TASKS, &binding, task.as_bytes())
    }

    /// Opens a `taskId` presented on `route` by `principal`. `None` for
    /// anything that was not issued by this key to them as a task handle.
    pub fn open_task_handle(&self, route: &str, principal: &str, text: &str) -> Option<TaskId> {
        let binding = task_binding(route, principal);
        self.open(&TASK_HANDLE, SessionId::TASKS, &binding, text)
            .map(TaskId)
    }

    /// A call token (seeds 000/001), bound to the call's params digest.
    pub fn call_token(
        &self,
        session: SessionId,
        principal: &str,
        params_digest: &[u8],
        token: &CallToken,
    ) -> String {
        let mut body = [0u8; 32];
        body[..16].copy_from_slice(token.stream.as_bytes());
        body[16..24].copy_from_slice(&token.cursor.to_be_bytes());
        body[24..].copy_from_slice(&token.expires_ms.to_be_bytes());
        self.seal(
            &CALL_TOKEN,
            session,
            &call_binding(principal, params_digest),
            &body,
        )
    }

    /// Opens a call token presented in `session` by `principal` with a call
    /// whose params digest is `params_digest`. `None` for anything that was
    /// not issued by this key to them, as a call token, for these params.
    /// The expiry is the caller's to check.
    pub fn open_call_token(
        &self,
        session: SessionId,
        principal: &str,
        params_digest: &[u8],
        text: &str,
    ) -> Option<CallToken> {
        let binding = call_binding(principal, params_digest);
        let body: [u8; 32] = self.open(&CALL_TOKEN, session, &binding, text)?;
        Some(CallToken {
            stream: StreamId(body[..16].try_into().ok()?),
            cursor: u64::from_be_bytes(body[16..24].try_into().ok()?),
            expires_ms: u64::from_be_bytes(body[24..].try_into().ok()?),
        })
    }

    /// Seals `body` as a handle of `kind` with the current key: kind ‖ key id
    /// ‖ tag ‖ hidden body, base64url.
    fn seal<const N: usize>(
        &self,
        kind: &Kind,
        session: SessionId,
        principal: &[u8],
        body: &[u8; N],
    ) -> String {
        let (raw, len) = self.seal_raw(kind, session, principal, body);
        URL_SAFE_NO_PAD.encode(&raw[..len])
    }

    /// The raw handle [`Keyring::seal`] encodes, on the stack (its first
    /// `len` bytes).
    fn seal_raw<const N: usize>(
        &self,
        kind: &Kind,
        session: SessionId,
        principal: &[u8],
        body: &[u8; N],
    ) -> ([u8; HEAD + TAG_LEN + MAX_BODY_LEN], usize) {
        const { assert!(N <= MAX_BODY_LEN) };
        let key = &self.0.current;
        let tag = tag(key, kind, session, principal, body);
        let mut raw = [0u8; HEAD + TAG_LEN + MAX_BODY_LEN];
        raw[0] = kind.byte;
        raw[1] = key.id;
        raw[HEAD..HEAD + TAG_LEN].copy_from_slice(&tag);
        let len = HEAD + TAG_LEN + N;
        raw[HEAD + TAG_LEN..len].copy_from_slice(body);
        apply_keystream(key, &tag, &mut raw[HEAD + TAG_LEN..len]);
        (raw, len)
    }

    /// The keys that may have sealed a handle naming key `id`: the current
    /// one, and the previous one while its window lasts.
    fn keys(&self, id: u8) -> impl Iterator<Item = &Key> {
        let now = crate::store::now_ms();
        let previous = self
            .0
            .previous
            .as_ref()
            .filter(|(_, until)| now < *until)
            .map(|(key, _)| key);
        std::iter::once(&self.0.current)
            .chain(previous)
            .filter(move |k| k.id == id)
    }

    /// Opens a handle of `kind` with a body of `N` bytes. `None` for anything
    /// that was not sealed by this key as that kind for this session and
    /// principal.
    fn open<const N: usize>(
        &self,
        kind: &Kind,
        session: SessionId,
        principal: &[u8],
        text: &str,
    ) -> Option<[u8; N]> {
        const { assert!(N <= MAX_BODY_LEN) };
        // Clients choose what they present: bound the work before decoding.
        if text.len() > max_text_len(N) {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(text.trim()).ok()?;
        if raw.len() != HEAD + TAG_LEN + N || raw[0] != kind.byte {
            return None;
        }
        let tag: [u8; TAG_LEN] = raw[HEAD..HEAD + TAG_LEN].try_into().ok()?;
        self.keys(raw[1]).find_map(|key| {
            let mut body: [u8; N] = raw[HEAD + TAG_LEN..].try_into().ok()?;
            apply_keystream(key, &tag, &mut body);
            // Constant-time comparison: a timing side channel must not let a
            // client discover a valid tag byte by byte.
            constant_time_eq(&self::tag(key, kind, session, principal, &body), &tag).then_some(body)
        })
    }
}

/// A call token's binding: the principal and the params digest. Both are hex,
/// so a NUL between them keeps every pair apart.
fn call_binding(principal: &str, params_digest: &[u8]) -> Vec<u8> {
    let mut binding = Vec::with_capacity(principal.len() + 1 + params_digest.len());
    binding.extend_from_slice(principal.as_bytes());
    binding.push(0);
    binding.extend_from_slice(params_digest);
    binding
}

/// A task handle's binding: the route, then the principal. A route path
/// holds no NUL, so the split is unambiguous.
fn task_binding(route: &str, principal: &str) -> Vec<u8> {
    let mut binding = Vec::with_capacity(route.len() + 1 + principal.len());
    binding.extend_from_slice(route.as_bytes());
    binding.push(0);
    binding.extend_from_slice(principal.as_bytes());
    binding
}

fn tag(key: &Key, kind: &Kind, session: SessionId, principal: &[u8], body: &[u8]) -> [u8; TAG_LEN] {
    let mac = key.mac.sign(&[
        kind.label,
        session.as_bytes(),
        &[kind.byte, key.id],
        principal,
        body,
    ]);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&mac[..TAG_LEN]);
    tag
}

fn apply_keystream(key: &Key, tag: &[u8; TAG_LEN], body: &mut [u8]) {
    let stream = key.enc.sign(&[tag]);
    for (b, k) in body.iter_mut().zip(stream) {
        *b ^= k;
    }
}

/// A key file's secret: at least 32 bytes.
fn read_key(path: &Path) -> std::io::Result<Vec<u8>> {
    let secret = std::fs::read(path)?;
    if secret.len() < 32 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is shorter than 32 bytes", path.display()),
        ));
    }
    Ok(secret)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        Keyring::from_secret(&[7u8; 32])
    }

    #[test]
    fn event_id_opens_to_its_stream_and_seq() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let id = keyring().event_id(session, stream, 42);
        assert_eq!(keyring().open_event_id(session, &id), Some((stream, 42)));
    }

    #[test]
    fn push_event_id_appends_the_id_event_id_gives() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let mut text = String::from("id: ");
        keyring().push_event_id(&mut text, session, stream, 7);
        assert_eq!(
            text,
            format!("id: {}", keyring().event_id(session, stream, 7))
        );
    }

    #[test]
    fn event_ids_hide_their_stream_and_position() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let a = URL_SAFE_NO_PAD
            .decode(keyring().event_id(session, stream, 1))
            .unwrap();
        let b = URL_SAFE_NO_PAD
            .decode(keyring().event_id(session, stream, 2))
            .unwrap();
        assert!(!a.windows(16).any(|w| w == stream.as_bytes()));
        let same = a.iter().zip(&b).skip(1).filter(|(x, y)| x == y).count();
        assert!(same < 8, "consecutive ids share {same} bytes");
    }

    #[test]
    fn event_id_from_another_session_is_unknown() {
        let stream = StreamId::random();
        let id = keyring().event_id(SessionId::random(), stream, 1);
        assert_eq!(keyring().open_event_id(SessionId::random(), &id), None);
    }

    #[test]
    fn tampered_event_id_is_unknown() {
        let session = SessionId::random();
        let id = keyring().event_id(session, StreamId::random(), 3);
        let mut raw = URL_SAFE_NO_PAD.decode(&id).unwrap();
        raw[20] ^= 1; // bump the seq
        let forged = URL_SAFE_NO_PAD.encode(raw);
        assert_eq!(keyring().open_event_id(session, &forged), None);
    }

    #[test]
    fn event_id_sealed_with_another_key_is_unknown() {
        let session = SessionId::random();
        let id = Keyring::from_secret(&[1u8; 32]).event_id(session, StreamId::random(), 1);
        assert_eq!(keyring().open_event_id(session, &id), None);
    }

    #[test]
    fn garbage_is_unknown() {
        let session = SessionId::random();
        for junk in ["", "x", "!!!!", &"A".repeat(50), &"A".repeat(500)] {
            assert_eq!(keyring().open_event_id(session, junk), None);
        }
    }

    #[test]
    fn event_id_wire_format_is_kind_key_id_tag_hidden_body() {
        // Computed outside this module (a Python script with hmac/hashlib)
        // from the format as documented above.
        let id = keyring().event_id(SessionId([1; 16]), StreamId([2; 16]), 42);
        assert_eq!(id, "AVaknOQb4tH1xBp7kP_J8DM5YnS1siyEKN7TsnRF4V4gsrJHUwg");
    }

    #[test]
    fn event_id_text_limit_leaves_room_for_whitespace_only() {
        assert_eq!(
            max_text_len(16 + 8),
            text_len(16 + 8) + WHITESPACE_ALLOWANCE
        );
        assert_eq!(text_len(16 + 8), 51);
    }

    fn call(stream: StreamId) -> CallToken {
        CallToken {
            stream,
            cursor: 17,
            expires_ms: 1_800_000_000_000,
        }
    }

    #[test]
    fn call_token_opens_to_its_stream_cursor_and_expiry() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let text = keyring().call_token(session, ALICE, b"d1", &call(stream));
        assert_eq!(
            keyring().open_call_token(session, ALICE, b"d1", &text),
            Some(call(stream))
        );
    }

    #[test]
    fn call_token_with_other_params_another_session_or_principal_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let text = keyring().call_token(session, ALICE, b"d1", &call(stream));
        let k = keyring();
        assert_eq!(k.open_call_token(session, ALICE, b"d2", &text), None);
        assert_eq!(k.open_call_token(session, BOB, b"d1", &text), None);
        assert_eq!(
            k.open_call_token(SessionId::random(), ALICE, b"d1", &text),
            None
        );
        // The binding cannot be shifted between principal and digest.
        let shifted = k.call_token(session, &ALICE[..63], b"1", &call(stream));
        assert_eq!(k.open_call_token(session, ALICE, b"", &shifted), None);
    }

    #[test]
    fn call_token_and_other_kinds_never_open_as_each_other() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let k = keyring();
        let text = k.call_token(session, ALICE, b"", &call(stream));
        assert_eq!(k.open_resume_token(session, ALICE, &text), None);
        assert_eq!(k.open_stream_handle(session, ALICE, &text), None);
        assert_eq!(k.open_poll_cursor(session, ALICE, &text), None);
        assert_eq!(k.open_event_id(session, &text), None);
        for (_, other) in one_of_each(session, ALICE, stream) {
            assert_eq!(k.open_call_token(session, ALICE, b"", &other), None);
        }
    }

    #[test]
    fn call_token_with_any_byte_flipped_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let raw = URL_SAFE_NO_PAD
            .decode(keyring().call_token(session, ALICE, b"d", &call(stream)))
            .unwrap();
        assert!(!raw.windows(16).any(|w| w == stream.as_bytes()));
        for i in 0..raw.len() {
            let mut forged = raw.clone();
            forged[i] ^= 0x40;
            let text = URL_SAFE_NO_PAD.encode(forged);
            assert_eq!(
                keyring().open_call_token(session, ALICE, b"d", &text),
                None,
                "byte {i}"
            );
        }
    }

    #[test]
    fn the_previous_key_opens_handles_while_its_window_lasts() {
        let old = Keyring::from_secret(&[1u8; 32]);
        let (session, stream) = (SessionId::random(), StreamId::random());
        let id = old.event_id(session, stream, 3);
        let now = crate::store::now_ms();
        let during = keyring().with_previous(&[1u8; 32], now + 60_000);
        assert_eq!(during.open_event_id(session, &id), Some((stream, 3)));
        let after = keyring().with_previous(&[1u8; 32], now - 1);
        assert_eq!(after.open_event_id(session, &id), None);
        // New handles are sealed with the current key only.
        let fresh = during.event_id(session, stream, 3);
        assert_eq!(keyring().open_event_id(session, &fresh), Some((stream, 3)));
        assert_eq!(old.open_event_id(session, &fresh), None);
    }

    #[test]
    fn a_handle_whose_key_id_was_edited_is_unknown() {
        let k = keyring().with_previous(&[1u8; 32], crate::store::now_ms() + 60_000);
        let session = SessionId::random();
        let mut raw = URL_SAFE_NO_PAD
            .decode(k.event_id(session, StreamId::random(), 1))
            .unwrap();
        let sealed_with = raw[1];
        for id in (0..=255u8).filter(|id| *id != sealed_with) {
            raw[1] = id;
            let text = URL_SAFE_NO_PAD.encode(&raw);
            assert_eq!(k.open_event_id(session, &text), None, "id {id}");
        }
    }

    #[test]
    fn keys_load_from_files_named_by_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let (current, previous, short) = (
            dir.path().join("k"),
            dir.path().join("old"),
            dir.path().join("short"),
        );
        std::fs::write(&current, [7u8; 32]).unwrap();
        std::fs::write(&previous, [1u8; 32]).unwrap();
        std::fs::write(&short, [1u8; 8]).unwrap();
        let session = SessionId::random();
        let stream = StreamId::random();
        let until = crate::store::now_ms() + 60_000;
        let k = Keyring::load(dir.path(), Some(&current), Some((&previous, until))).unwrap();
        let old_id = Keyring::from_secret(&[1u8; 32]).event_id(session, stream, 1);
        assert_eq!(k.open_event_id(session, &old_id), Some((stream, 1)));
        assert_eq!(
            keyring().open_event_id(session, &k.event_id(session, stream, 2)),
            Some((stream, 2))
        );
        assert!(!dir.path().join("token.key").exists(), "no key generated");
        let err = Keyring::load(dir.path(), Some(&short), None).unwrap_err();
        assert!(err.to_string().contains("short"), "{err}");
    }

    #[test]
    fn labels_are_prefix_free() {
        let labels = [
            EVENT_ID.label,
            RESUME_TOKEN.label,
            STREAM_HANDLE.label,
            POLL_CURSOR.label,
            CALL_TOKEN.label,
        ];
        for (i, a) in labels.iter().enumerate() {
            for (j, b) in labels.iter().enumerate() {
                assert!(i == j || !b.starts_with(a), "{a:?} is a prefix of {b:?}");
            }
        }
    }

    const ALICE: &str = "a3f1c09e5b7d2468a3f1c09e5b7d2468a3f1c09e5b7d2468a3f1c09e5b7d2468";
    const BOB: &str = "0b4e9d2c7a1f63580b4e9d2c7a1f63580b4e9d2c7a1f63580b4e9d2c7a1f6358";

    /// One handle of every kind, all naming `stream` (the cursor's position
    /// starts with its bytes), each with the name of its kind.
    fn one_of_each(
        session: SessionId,
        principal: &str,
        stream: StreamId,
    ) -> [(&'static str, String); 4] {
        let k = keyring();
        let mut position = [9u8; 24];
        position[..16].copy_from_slice(stream.as_bytes());
        [
            ("event id", k.event_id(session, stream, 7)),
            ("resume token", k.resume_token(session, principal, stream)),
            ("stream handle", k.stream_handle(session, principal, stream)),
            ("poll cursor", k.poll_cursor(session, principal, &position)),
        ]
    }

    /// The names of the kinds `text` opens as, in `session` for `principal`.
    fn opens_as(session: SessionId, principal: &str, text: &str) -> Vec<&'static str> {
        let k = keyring();
        let mut kinds = Vec::new();
        if k.open_event_id(session, text).is_some() {
            kinds.push("event id");
        }
        if k.open_resume_token(session, principal, text).is_some() {
            kinds.push("resume token");
        }
        if k.open_stream_handle(session, principal, text).is_some() {
            kinds.push("stream handle");
        }
        if k.open_poll_cursor(session, principal, text).is_some() {
            kinds.push("poll cursor");
        }
        kinds
    }

    #[test]
    fn resume_token_opens_to_its_stream() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let token = keyring().resume_token(session, ALICE, stream);
        assert_eq!(
            keyring().open_resume_token(session, ALICE, &token),
            Some(stream)
        );
    }

    #[test]
    fn stream_handle_opens_to_its_stream() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let handle = keyring().stream_handle(session, ALICE, stream);
        assert_eq!(
            keyring().open_stream_handle(session, ALICE, &handle),
            Some(stream)
        );
    }

    #[test]
    fn poll_cursor_opens_to_its_position() {
        let session = SessionId::random();
        let position: [u8; 24] = std::array::from_fn(|i| i as u8 * 11);
        let cursor = keyring().poll_cursor(session, ALICE, &position);
        assert_eq!(
            keyring().open_poll_cursor(session, ALICE, &cursor),
            Some(position)
        );
    }

    #[test]
    fn handles_are_deterministic() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        assert_eq!(
            one_of_each(session, ALICE, stream),
            one_of_each(session, ALICE, stream)
        );
    }

    #[test]
    fn each_handle_opens_only_as_its_own_kind() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            assert_eq!(opens_as(session, ALICE, &text), [kind], "{kind}");
        }
    }

    #[test]
    fn handle_with_its_kind_byte_rewritten_is_unknown() {
        // Resume tokens and stream handles have the same length, and so do
        // event ids and poll cursors: only the kind byte tells them apart, and
        // it is under the tag. An empty principal makes a cursor's MAC input
        // differ from an event id's in the label alone.
        let (session, stream) = (SessionId::random(), StreamId::random());
        for principal in [ALICE, ""] {
            for (kind, text) in one_of_each(session, principal, stream) {
                let raw = URL_SAFE_NO_PAD.decode(&text).unwrap();
                for byte in 0..=u8::MAX {
                    let mut relabelled = raw.clone();
                    relabelled[0] = byte;
                    let relabelled = URL_SAFE_NO_PAD.encode(relabelled);
                    let expected: &[&str] = if byte == raw[0] { &[kind] } else { &[] };
                    assert_eq!(
                        opens_as(session, principal, &relabelled),
                        expected,
                        "{kind} with kind byte {byte}"
                    );
                }
            }
        }
    }

    #[test]
    fn handle_from_another_session_is_unknown() {
        let stream = StreamId::random();
        for (kind, text) in one_of_each(SessionId::random(), ALICE, stream) {
            assert!(
                opens_as(SessionId::random(), ALICE, &text).is_empty(),
                "{kind}"
            );
        }
    }

    #[test]
    fn handle_presented_by_another_principal_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            if kind == "event id" {
                continue; // bound to the session only
            }
            for other in [BOB, "", &ALICE[1..], &format!("{ALICE}0")] {
                assert!(opens_as(session, other, &text).is_empty(), "{kind}");
            }
        }
    }

    #[test]
    fn handle_with_any_byte_flipped_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            let raw = URL_SAFE_NO_PAD.decode(&text).unwrap();
            for i in 0..raw.len() {
                for bit in 0..8 {
                    let mut forged = raw.clone();
                    forged[i] ^= 1 << bit;
                    let forged = URL_SAFE_NO_PAD.encode(forged);
                    assert!(
                        opens_as(session, ALICE, &forged).is_empty(),
                        "{kind} with bit {bit} of byte {i} flipped"
                    );
                }
            }
        }
    }

    #[test]
    fn truncated_or_extended_handle_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            let raw = URL_SAFE_NO_PAD.decode(&text).unwrap();
            let shorter = URL_SAFE_NO_PAD.encode(&raw[..raw.len() - 1]);
            let longer = URL_SAFE_NO_PAD.encode([&raw[..], &[0]].concat());
            for forged in [shorter, longer] {
                assert!(opens_as(session, ALICE, &forged).is_empty(), "{kind}");
            }
        }
    }

    #[test]
    fn garbage_is_unknown_as_every_kind() {
        let session = SessionId::random();
        for junk in [
            "",
            "x",
            "!!!!",
            "====",
            &"A".repeat(39),
            &"A".repeat(50),
            &"A".repeat(500),
            &"_".repeat(50),
        ] {
            for principal in [ALICE, ""] {
                assert!(opens_as(session, principal, junk).is_empty(), "{junk:?}");
            }
        }
    }

    #[test]
    fn handle_padded_past_its_limit_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            let padded = format!("{text}{}", " ".repeat(WHITESPACE_ALLOWANCE + 1));
            assert!(opens_as(session, ALICE, &padded).is_empty(), "{kind}");
        }
    }

    #[test]
    fn handle_with_surrounding_whitespace_opens() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            let padded = format!(" {text}\t");
            assert_eq!(opens_as(session, ALICE, &padded), [kind], "{kind}");
        }
    }

    #[test]
    fn handles_hide_their_stream() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        for (kind, text) in one_of_each(session, ALICE, stream) {
            let raw = URL_SAFE_NO_PAD.decode(&text).unwrap();
            assert!(!raw.windows(16).any(|w| w == stream.as_bytes()), "{kind}");
        }
    }

    #[test]
    fn resume_token_and_stream_handle_of_one_stream_are_unrelated() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let token = URL_SAFE_NO_PAD
            .decode(keyring().resume_token(session, ALICE, stream))
            .unwrap();
        let handle = URL_SAFE_NO_PAD
            .decode(keyring().stream_handle(session, ALICE, stream))
            .unwrap();
        let same = token
            .iter()
            .zip(&handle)
            .skip(1)
            .filter(|(x, y)| x == y)
            .count();
        assert!(same < 8, "token and handle share {same} bytes");
    }

    #[test]
    fn handle_sealed_with_another_key_is_unknown() {
        let (session, stream) = (SessionId::random(), StreamId::random());
        let other = Keyring::from_secret(&[1u8; 32]);
        let handles = [
            other.resume_token(session, ALICE, stream),
            other.stream_handle(session, ALICE, stream),
            other.poll_cursor(session, ALICE, &[0; 24]),
        ];
        for text in handles {
            assert!(opens_as(session, ALICE, &text).is_empty(), "{text}");
        }
    }

    #[test]
    fn key_file_is_created_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Keyring::load_or_create(dir.path()).unwrap();
        let b = Keyring::load_or_create(dir.path()).unwrap();
        let (session, stream) = (SessionId::random(), StreamId::random());
        let id = a.event_id(session, stream, 9);
        assert_eq!(b.open_event_id(session, &id), Some((stream, 9)));
    }

    #[test]
    fn a_task_handle_opens_to_its_task_for_its_principal_on_its_route_only() {
        let task = TaskId::random();
        let handle = keyring().task_handle("/mcp", "alice", task);
        assert_eq!(
            keyring().open_task_handle("/mcp", "alice", &handle),
            Some(task)
        );
        assert_eq!(keyring().open_task_handle("/mcp", "bob", &handle), None);
        assert_eq!(keyring().open_task_handle("/other", "alice", &handle), None);
        let stream = StreamId(*task.as_bytes());
        let not_a_task = keyring().stream_handle(SessionId::TASKS, "alice", stream);
        assert_eq!(
            keyring().open_task_handle("/mcp", "alice", &not_a_task),
            None
        );
    }
}
