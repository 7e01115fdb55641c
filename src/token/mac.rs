//! HMAC-SHA256 for the sealed handles of `token/mod.rs`, with the key's
//! padded blocks hashed once, when the key is made.
//!
//! Every event id the proxy sends is two HMACs of a message that fits one
//! block. Through ring's `hmac`, the contexts it copies, pads and finishes
//! cost as much again as the hashing (a replay of 10,000 entries spent ~60 %
//! of its time making event ids; BENCHMARKS.md). RustCrypto's `hmac` keeps
//! the states after the padded key blocks in the key and is cloned per
//! message, so an id costs its four blocks and little else. The output is
//! HMAC-SHA256 bit for bit — the tests hold it to ring's — so handles sealed
//! before are the same handles.
//!
//! It signs and nothing else: what is signed, and how a handle is laid out
//! and sealed, is the token module's.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// An HMAC-SHA256 key, its padded blocks already hashed.
#[derive(Clone)]
pub struct Key(Hmac<Sha256>);

impl Key {
    pub fn new(key: &[u8; 32]) -> Self {
        // HMAC takes a key of any length: this cannot fail.
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
        Self(mac)
    }

    /// The MAC of the concatenation of `parts`.
    pub fn sign(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.0.clone();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
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
