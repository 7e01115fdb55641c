//! Identifiers the proxy mints: sessions and streams, plus the position of an
//! entry inside a stream.
//!
//! Both ids are 128 random bits from the operating system's CSPRNG, so they are
//! unguessable on their own; tokens and event ids built on them are still
//! authenticated (see `token/`) because a client must never be able to point
//! at a stream by editing bytes. This module only mints, prints, parses and
//! hashes them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
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

/// 16 bytes for a secret key (the request index's hash key): the same OS
/// randomness ids are drawn from.
pub fn random_key() -> [u8; 16] {
    random_16()
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
    hex_into(bytes, &mut out);
    // Every byte is an ASCII hex digit; the buffer becomes the string.
    String::from_utf8(out).unwrap_or_default()
}

macro_rules! random_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        pub struct $name(pub [u8; 16]);

        impl Hash for $name {
            /// One word: the bits are uniform already (see [`IdHasher`]).
            fn hash<H: Hasher>(&self, state: &mut H) {
                state.write_u64(fold(&self.0));
            }
        }

        impl $name {
            pub fn random() -> Self {
                Self(random_16())
            }

            /// A fresh id that shares its first byte with `kin`: a stream
            /// minted for its session, or a leg for its task, lands in the
            /// partition of a spread log that its kin is in (the partition
            /// is read from that byte: `store/redis/spread.rs`). The other
            /// 120 bits are random, enough for an id a client cannot guess.
            pub fn random_beside(kin: &[u8; 16]) -> Self {
                let mut id = random_16();
                id[0] = kin[0];
                Self(id)
            }

            /// The byte a spread log picks this id's partition by.
            pub fn partition_byte(&self) -> u8 {
                self.0[0]
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

/// The two halves of an id folded into one word.
fn fold(id: &[u8; 16]) -> u64 {
    let (low, high) = id.split_at(8);
    let word = |half: &[u8]| half.try_into().map(u64::from_le_bytes).unwrap_or_default();
    word(low) ^ word(high)
}

/// A hasher for maps keyed by ids, where SipHash's protection buys nothing:
/// every id the proxy keeps is 128 bits from the CSPRNG or a SHA-256 output
/// (a client can name an id, never choose the one a map stores), so a
/// multiply is as even as SipHash and recovery hashes millions of them (SipHash
/// was ~11 % of its CPU). Keys with client-chosen parts (a JSON-RPC request
/// id, a string) must keep the default hasher: they could be made to collide.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write_u64(&mut self, word: u64) {
        // FxHash's step: enough to combine an enum's discriminant with an id.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_isize(&mut self, n: isize) {
        self.write_u64(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by ids (or things made of ids and small integers).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A set of ids.
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// A concurrent map keyed by ids (made with `IdDashMap::default()`).
pub type IdDashMap<K, V> = dashmap::DashMap<K, V, BuildHasherDefault<IdHasher>>;

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
    /// The id named by `parts` (each length-prefixed, then SHA-256), in
    /// `kin`'s partition (see `random_beside`): the same parts and kin
    /// always give the same id. Unguessable while one part is (a session
    /// id is).
    pub fn derived_beside(kin: &[u8; 16], parts: &[&[u8]]) -> Self {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for part in parts {
            context.update(&(part.len() as u64).to_be_bytes());
            context.update(part);
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&context.finish().as_ref()[..16]);
        id[0] = kin[0];
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
    fn an_id_minted_beside_another_shares_its_first_byte_and_nothing_else() {
        let session = SessionId::random();
        let streams: Vec<StreamId> = (0..64)
            .map(|_| StreamId::random_beside(session.as_bytes()))
            .collect();
        assert!(streams
            .iter()
            .all(|s| s.partition_byte() == session.partition_byte()));
        let rest: HashSet<[u8; 15]> = streams
            .iter()
            .map(|s| s.0[1..].try_into().unwrap())
            .collect();
        assert_eq!(rest.len(), 64);
        let task = TaskId::derived_beside(session.as_bytes(), &[b"7", b"digest"]);
        assert_eq!(task.partition_byte(), session.partition_byte());
        assert_eq!(
            task,
            TaskId::derived_beside(session.as_bytes(), &[b"7", b"digest"])
        );
    }

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

    #[test]
    fn id_hashes_spread_over_the_bits_a_hash_table_uses() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (0..4096)
            .map(|_| build.hash_one(StreamId::random()))
            .collect();
        // hashbrown picks the bucket from the low bits and the control byte
        // from the top seven: both must take (nearly) every value.
        let low: HashSet<u64> = hashes.iter().map(|h| h & 0x3ff).collect();
        let top: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 950, "{} of 1024 low values", low.len());
        assert_eq!(top.len(), 128);
    }

    #[test]
    fn ids_that_differ_in_either_half_hash_apart() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<IdHasher>::default();
        let a = StreamId([7; 16]);
        let mut b = a;
        b.0[15] ^= 1;
        let mut c = a;
        c.0[0] ^= 1;
        assert_ne!(build.hash_one(a), build.hash_one(b));
        assert_ne!(build.hash_one(a), build.hash_one(c));
    }
}
