//! FxHash over machine words: the hasher of the native tables whose keys are a few words
//! hashed on every record (record.rs's specs, frames.rs's call sites).

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default)]
pub(crate) struct Fx(u64);

/// A HashMap's hasher of `Fx`.
pub(crate) type FxBuild = BuildHasherDefault<Fx>;

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
}
