//! A cheap hasher for keys that are already well spread (delivery tags, sequences, type
//! ids), for the runtime's and transports' own maps: SipHash's protection against chosen
//! keys is not needed for keys a broker or ruststream numbers.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplies by a large odd constant (Fibonacci hashing): sequential integers land in
/// well-spread buckets and the top bits hashbrown uses for its tags vary.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpreadHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for SpreadHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`SpreadHasher`].
pub type SpreadMap<K, V> = HashMap<K, V, BuildHasherDefault<SpreadHasher>>;
