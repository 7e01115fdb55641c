//! HMAC-SHA256 (RFC 2104) over SHA-256's block function, for the sealed
//! handles of `token.rs`.
//!
//! Every event id the proxy sends is two HMACs of a message that fits one
//! block: four runs of the block function, since the key's padded blocks are
//! hashed once, here, when the key is made. Through ring's `hmac` the
//! contexts it copies, pads and finishes cost as much again as those four
//! blocks (a replay of 10,000 entries spent ~60 % of its time making event
//! ids, half of it around the hashing; BENCHMARKS.md). The output is
//! HMAC-SHA256 bit for bit — the tests hold it to ring's — so handles sealed
//! before are the same handles.

use sha2::digest::generic_array::GenericArray;

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

const BLOCK: usize = 64;

/// An HMAC-SHA256 key, as the states after its inner and outer padded
/// blocks.
#[derive(Clone)]
pub struct Key {
    inner: [u32; 8],
    outer: [u32; 8],
}

impl Key {
    /// A key of at most one block (the handles' keys are 32 bytes; a longer
    /// one would have to be hashed first, which no caller needs).
    pub fn new(key: &[u8; 32]) -> Self {
        let padded = |pad: u8| {
            let mut block = [pad; BLOCK];
            for (b, k) in block.iter_mut().zip(key) {
                *b ^= k;
            }
            let mut state = IV;
            compress(&mut state, &block);
            state
        };
        Self {
            inner: padded(0x36),
            outer: padded(0x5c),
        }
    }

    /// The MAC of the concatenation of `parts`.
    pub fn sign(&self, parts: &[&[u8]]) -> [u8; 32] {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= LAST_BLOCK_ROOM {
            // An event id's message: built in place as its one padded block,
            // with no buffering across parts.
            let mut block = [0u8; BLOCK];
            let mut at = 0;
            for part in parts {
                block[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            let digest = last_block(self.inner, block, len);
            let mut block = [0u8; BLOCK];
            block[..32].copy_from_slice(&digest);
            return last_block(self.outer, block, 32);
        }
        let mut inner = Hash::after_one_block(self.inner);
        for part in parts {
            inner.update(part);
        }
        let digest = inner.finish();
        let mut outer = Hash::after_one_block(self.outer);
        outer.update(&digest);
        outer.finish()
    }
}

/// The most message bytes one block holds with SHA-256's padding (a 1
/// bit and the 64-bit length).
const LAST_BLOCK_ROOM: usize = BLOCK - 1 - 8;

/// The digest of a message of `len` bytes (at most [`LAST_BLOCK_ROOM`]),
/// which `block` holds followed by zeros, hashed after one block (a padded
/// key) whose state is `state`.
fn last_block(mut state: [u32; 8], mut block: [u8; BLOCK], len: usize) -> [u8; 32] {
    block[len] = 0x80;
    let bits = (BLOCK + len) as u64 * 8;
    block[BLOCK - 8..].copy_from_slice(&bits.to_be_bytes());
    compress(&mut state, &block);
    digest(state)
}

fn digest(state: [u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(state) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// A SHA-256 computation that started from a state, not from its IV.
struct Hash {
    state: [u32; 8],
    block: [u8; BLOCK],
    /// Bytes in `block`.
    filled: usize,
    /// Bytes hashed in all, the padded key block included.
    total: u64,
}

impl Hash {
    /// Carries on from `state`, the state after one block (a padded key).
    fn after_one_block(state: [u32; 8]) -> Self {
        Self {
            state,
            block: [0; BLOCK],
            filled: 0,
            total: BLOCK as u64,
        }
    }

    fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        while !data.is_empty() {
            let take = (BLOCK - self.filled).min(data.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled == BLOCK {
                compress(&mut self.state, &self.block);
                self.filled = 0;
            }
        }
    }

    /// Pads (a 1 bit, zeros, the length in bits) and gives the digest.
    fn finish(mut self) -> [u8; 32] {
        let bits = self.total.wrapping_mul(8);
        self.block[self.filled] = 0x80;
        self.block[self.filled + 1..].fill(0);
        if self.filled >= BLOCK - 8 {
            compress(&mut self.state, &self.block);
            self.block = [0; BLOCK];
        }
        self.block[BLOCK - 8..].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &self.block);
        digest(self.state)
    }
}

fn compress(state: &mut [u32; 8], block: &[u8; BLOCK]) {
    sha2::compress256(state, std::slice::from_ref(GenericArray::from_slice(block)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ring::hmac;

    fn ring_mac(key: &[u8; 32], message: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), message)
            .as_ref()
            .to_vec()
    }

    #[test]
    fn the_rfc_4231_test_case_2_key_padded_to_32_bytes_matches_ring() {
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let message = b"what do ya want for nothing?";
        assert_eq!(
            Key::new(&key).sign(&[message]).to_vec(),
            ring_mac(&key, message)
        );
    }

    #[test]
    fn every_length_around_the_block_boundaries_matches_ring() {
        let key = [7u8; 32];
        let data: Vec<u8> = (0..=200u8).collect();
        for len in 0..=200 {
            let message = &data[..len];
            assert_eq!(
                Key::new(&key).sign(&[message]).to_vec(),
                ring_mac(&key, message),
                "length {len}"
            );
        }
    }

    proptest! {
        #[test]
        fn a_mac_of_parts_is_ring_s_mac_of_their_concatenation(
            key in any::<[u8; 32]>(),
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..6),
        ) {
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(Key::new(&key).sign(&slices).to_vec(), ring_mac(&key, &parts.concat()));
        }
    }
}
