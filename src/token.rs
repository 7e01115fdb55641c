//! Sealing and opening the opaque handles the proxy gives to clients.
//!
//! An event id names `(stream, seq)` and is bound to the session it was issued
//! in. It is sealed with deterministic authenticated encryption in the SIV
//! style: a tag = HMAC-SHA256(session ‖ version ‖ stream ‖ seq), truncated,
//! doubles as the IV of a keystream HMAC-SHA256(tag) that hides stream and
//! seq. So an id reveals nothing (not even how far a stream got), and one that
//! was edited, forged, or presented in another session opens to nothing —
//! exactly like an unknown one. Ids are deterministic (a replayed entry carries
//! the id it had live) and visible ASCII (base64url), as `Last-Event-ID`
//! header values must be.
//!
//! The key is read from the config or generated once into the data directory,
//! so ids survive a restart; every instance of a cluster must share it. This
//! module knows nothing of HTTP or the log.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::id::{Seq, SessionId, StreamId};

const EVENT_ID_V1: u8 = 1;
const TAG_LEN: usize = 12;
const BODY_LEN: usize = 16 + 8;
const EVENT_ID_LEN: usize = 1 + TAG_LEN + BODY_LEN;
const KEY_FILE: &str = "token.key";

/// The secret every handle is sealed with.
#[derive(Clone)]
pub struct Keyring {
    /// Authenticates (and binds to a session).
    mac: hmac::Key,
    /// Derives the keystream that hides the body.
    enc: hmac::Key,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Keyring {
    pub fn from_secret(secret: &[u8]) -> Self {
        // Independent subkeys, so the tag and the keystream never share a key.
        let master = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let derive =
            |label: &[u8]| hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&master, label).as_ref());
        Self {
            mac: derive(b"mcp-resume-proxy/mac"),
            enc: derive(b"mcp-resume-proxy/enc"),
        }
    }

    /// Loads the key file from `dir`, creating it (mode 0600) with 32 random
    /// bytes on first start.
    pub fn load_or_create(dir: &Path) -> std::io::Result<Self> {
        let path = dir.join(KEY_FILE);
        match std::fs::read(&path) {
            Ok(secret) if secret.len() >= 32 => return Ok(Self::from_secret(&secret)),
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is shorter than 32 bytes", path.display()),
                ))
            }
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
        let mut body = [0u8; BODY_LEN];
        body[..16].copy_from_slice(stream.as_bytes());
        body[16..].copy_from_slice(&seq.to_be_bytes());
        let tag = self.tag(session, &body);
        let mut raw = [0u8; EVENT_ID_LEN];
        raw[0] = EVENT_ID_V1;
        raw[1..1 + TAG_LEN].copy_from_slice(&tag);
        raw[1 + TAG_LEN..].copy_from_slice(&body);
        self.apply_keystream(&tag, &mut raw[1 + TAG_LEN..]);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Opens an event id presented in `session`. `None` for anything that was
    /// not issued by this key in this session.
    pub fn open_event_id(&self, session: SessionId, text: &str) -> Option<(StreamId, Seq)> {
        if text.len() > 64 {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(text.trim()).ok()?;
        if raw.len() != EVENT_ID_LEN || raw[0] != EVENT_ID_V1 {
            return None;
        }
        let tag: [u8; TAG_LEN] = raw[1..1 + TAG_LEN].try_into().ok()?;
        let mut body: [u8; BODY_LEN] = raw[1 + TAG_LEN..].try_into().ok()?;
        self.apply_keystream(&tag, &mut body);
        // Constant-time comparison: a timing side channel must not let a
        // client discover a valid tag byte by byte.
        if !constant_time_eq(&self.tag(session, &body), &tag) {
            return None;
        }
        let stream = StreamId(body[..16].try_into().ok()?);
        let seq = u64::from_be_bytes(body[16..].try_into().ok()?);
        Some((stream, seq))
    }

    fn tag(&self, session: SessionId, body: &[u8; BODY_LEN]) -> [u8; TAG_LEN] {
        let mut ctx = hmac::Context::with_key(&self.mac);
        ctx.update(b"event-id");
        ctx.update(session.as_bytes());
        ctx.update(&[EVENT_ID_V1]);
        ctx.update(body);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&ctx.sign().as_ref()[..TAG_LEN]);
        tag
    }

    fn apply_keystream(&self, tag: &[u8; TAG_LEN], body: &mut [u8]) {
        let stream = hmac::sign(&self.enc, tag);
        for (b, k) in body.iter_mut().zip(stream.as_ref()) {
            *b ^= k;
        }
    }
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
    fn key_file_is_created_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Keyring::load_or_create(dir.path()).unwrap();
        let b = Keyring::load_or_create(dir.path()).unwrap();
        let (session, stream) = (SessionId::random(), StreamId::random());
        let id = a.event_id(session, stream, 9);
        assert_eq!(b.open_event_id(session, &id), Some((stream, 9)));
    }
}
