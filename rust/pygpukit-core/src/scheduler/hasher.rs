//! The hash of the scheduler's maps: task ids and partition names, hashed on
//! every submission, start and end. The standard library's SipHash resists
//! chosen keys, which these are not worth defending against (ids count up from
//! one; names are the caller's own), and costs more than the rest of a lookup:
//! this is the multiply-rotate hash rustc uses for its own tables.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A map hashed with [`FxHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A set hashed with [`FxHasher`].
pub type FastSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// Folds each word in with a rotate, xor and multiply.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut tail = [0u8; 8];
            tail[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(tail));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_keep_every_key_apart() {
        let mut m: FastMap<String, usize> = FastMap::default();
        let names: Vec<String> = (0..1000).map(|i| format!("p{i}")).collect();
        for (i, n) in names.iter().enumerate() {
            m.insert(n.clone(), i);
        }
        for (i, n) in names.iter().enumerate() {
            assert_eq!(m[n], i);
        }
        let mut s: FastSet<u64> = FastSet::default();
        for i in 0..1000u64 {
            assert!(s.insert(i * 7));
        }
        assert_eq!(s.len(), 1000);
        assert!(!s.contains(&3));
    }
}
