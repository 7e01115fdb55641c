//! Identifiers the proxy mints: sessions and streams, plus the position of an
//! entry inside a stream.
//!
//! Both ids are 128 random bits from the operating system's CSPRNG, so they are
//! unguessable on their own; tokens and event ids built on them are still
//! authenticated (see `token.rs`) because a client must never be able to point
//! at a stream by editing bytes. This module only mints, prints and parses.

use std::fmt;
use std::str::FromStr;

use ring::rand::{SecureRandom, SystemRandom};

/// Position of an entry in its stream: the first entry is 1, there are no gaps,
/// and 0 means "before the first entry" (the cursor of a priming event).
pub type Seq = u64;

/// Random bytes drawn from the OS a page at a time, per thread: ids are
/// minted on every request, and a `getrandom` per id was a system call per
/// call. Every byte is the OS CSPRNG's own and is handed out once.
struct Pool {
    bytes: [u8; POOL_BYTES],
    used: usize,
}

const POOL_BYTES: usize = 4096;

thread_local! {
    static POOL: std::cell::RefCell<Pool> = const {
        std::cell::RefCell::new(Pool { bytes: [0; POOL_BYTES], used: POOL_BYTES })
    };
}

fn random_16() -> [u8; 16] {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.used + 16 > POOL_BYTES {
            // SystemRandom only fails when the OS has no entropy source at
            // all, in which case no id the proxy could mint would be safe.
            SystemRandom::new()
                .fill(&mut pool.bytes)
                .expect("the operating system's random number generator failed");
            pool.used = 0;
        }
        let at = pool.used;
        pool.used += 16;
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&pool.bytes[at..at + 16]);
        // What was handed out is not kept.
        pool.bytes[at..at + 16].fill(0);
        bytes
    })
}

/// Lowercase hex of `bytes`, written into `out` (twice as long). Ids are
/// printed on every response header, so this avoids `fmt` per byte.
pub fn hex_into<'a>(bytes: &[u8], out: &'a mut [u8]) -> &'a str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[(b >> 4) as usize];
        out[2 * i + 1] = DIGITS[(b & 0x0f) as usize];
    }
    let out = &out[..2 * bytes.len()];
    // Every byte written is an ASCII hex digit.
    std::str::from_utf8(out).unwrap_or_default()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; 2 * bytes.len()];
    hex_into(bytes, &mut out).to_owned()
}

macro_rules! random_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 16]);

        impl $name {
            pub fn random() -> Self {
                Self(random_16())
            }

            pub fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut out = [0u8; 32];
                f.write_str(hex_into(&self.0, &mut out))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({self})", stringify!($name))
            }
        }

        impl FromStr for $name {
            type Err = ();

            /// Parses the 32 lowercase-or-uppercase hex digits `Display` prints.
            fn from_str(s: &str) -> Result<Self, ()> {
                let s = s.as_bytes();
                if s.len() != 32 {
                    return Err(());
                }
                let mut out = [0u8; 16];
                for (i, pair) in s.chunks_exact(2).enumerate() {
                    out[i] = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
                }
                Ok(Self(out))
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse()
                    .map_err(|()| serde::de::Error::custom(concat!("invalid ", stringify!($name))))
            }
        }
    };
}

fn hex_digit(c: u8) -> Result<u8, ()> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(()),
    }
}

random_id!(
    /// The proxy's own session id, sent to clients as `Mcp-Session-Id`. It is
    /// never the upstream's id: the proxy maps one to the other.
    SessionId
);

random_id!(
    /// One ordered stream of upstream messages: the answer to one client POST,
    /// or a session's standalone GET stream.
    StreamId
);

random_id!(
    /// A modern (2026-07-28) task the proxy made of a long `tools/call`. It
    /// belongs to a principal, not a session; sealed on the wire.
    TaskId
);

impl TaskId {
    /// The id named by `parts` (each length-prefixed, then SHA-256): the same
    /// parts always give the same id. Unguessable while one part is (a
    /// session id is).
    pub fn derived(parts: &[&[u8]]) -> Self {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for part in parts {
            context.update(&(part.len() as u64).to_be_bytes());
            context.update(part);
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&context.finish().as_ref()[..16]);
        Self(id)
    }
}

impl SessionId {
    /// The session of task legs: tasks have none, and no legacy session can
    /// draw this id (ids are random), so a task leg never meets a session.
    pub const TASKS: SessionId = SessionId([0; 16]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_id_round_trips_through_its_header_form() {
        let id = SessionId::random();
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(text.parse::<SessionId>(), Ok(id));
    }

    #[test]
    fn ids_drawn_across_many_pool_refills_never_repeat() {
        let ids: std::collections::HashSet<_> = (0..3 * POOL_BYTES / 16)
            .map(|_| StreamId::random())
            .collect();
        assert_eq!(ids.len(), 3 * POOL_BYTES / 16);
        assert!(!ids.contains(&StreamId([0; 16])));
    }

    #[test]
    fn malformed_ids_are_rejected() {
        assert!("".parse::<StreamId>().is_err());
        assert!("zz".repeat(16).parse::<StreamId>().is_err());
        assert!("ab".repeat(17).parse::<StreamId>().is_err());
    }
}
