//! Sealing and opening the opaque handles the proxy gives to clients.
//!
//! An event id names `(stream, seq)` and is bound to the session it was issued
//! in: it carries an HMAC-SHA256 tag over the version byte, the session, the
//! stream and the sequence number, so an id that was edited, forged, or
//! presented in another session opens to nothing — exactly like an unknown one.
//! Ids are deterministic (a replayed entry carries the id it had live) and
//! visible ASCII (base64url), as `Last-Event-ID` header values must be.
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
const EVENT_ID_LEN: usize = 1 + 16 + 8 + TAG_LEN;
const KEY_FILE: &str = "token.key";

/// The secret every handle is sealed with.
#[derive(Clone)]
pub struct Keyring {
    key: hmac::Key,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Keyring {
    pub fn from_secret(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
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
        let mut raw = [0u8; EVENT_ID_LEN];
        raw[0] = EVENT_ID_V1;
        raw[1..17].copy_from_slice(stream.as_bytes());
        raw[17..25].copy_from_slice(&seq.to_be_bytes());
        let tag = self.tag(session, &raw[..25]);
        raw[25..].copy_from_slice(&tag.as_ref()[..TAG_LEN]);
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
        let expected = self.tag(session, &raw[..25]);
        // Constant-time comparison: a timing side channel must not let a
        // client discover a valid tag byte by byte.
        if !constant_time_eq(&expected.as_ref()[..TAG_LEN], &raw[25..]) {
            return None;
        }
        let stream = StreamId(raw[1..17].try_into().ok()?);
        let seq = u64::from_be_bytes(raw[17..25].try_into().ok()?);
        Some((stream, seq))
    }

    fn tag(&self, session: SessionId, body: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"mcp-resume-proxy/event-id");
        ctx.update(session.as_bytes());
        ctx.update(body);
        ctx.sign()
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
