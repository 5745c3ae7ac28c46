//! Where arenas come from: device memory (through the binding) or host memory.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;

use super::size_class::GRANULE;

/// Supplies and takes back whole arenas. The pool never touches the memory;
/// it only hands out addresses inside it.
pub trait ArenaSource {
    /// Returns the base address of `bytes` of fresh memory, aligned to
    /// GRANULE, or a message saying why there is none.
    fn alloc_arena(&mut self, bytes: u64) -> Result<u64, String>;
    /// Gives back an arena obtained from `alloc_arena` with the same size.
    fn free_arena(&mut self, base: u64, bytes: u64);
}

/// Host memory from the global allocator, for the NumPy backend, which wraps
/// arrays around these addresses; the memory stays valid until the arena is
/// freed (or the source is dropped).
#[derive(Default)]
pub struct HostArenaSource {
    live: HashMap<u64, Layout>,
}

impl HostArenaSource {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn live_arenas(&self) -> usize {
        self.live.len()
    }
}

impl ArenaSource for HostArenaSource {
    fn alloc_arena(&mut self, bytes: u64) -> Result<u64, String> {
        let size = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes exceeds usize"))?;
        let layout = Layout::from_size_align(size.max(1), GRANULE as usize)
            .map_err(|e| format!("bad arena layout for {bytes} bytes: {e}"))?;
        // SAFETY: layout has nonzero size. Zeroed so that stale data from
        // another arena never leaks into a fresh array; large zeroed
        // allocations are lazily-zeroed pages, so this costs little.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("host allocation of {bytes} bytes failed"));
        }
        let base = ptr as u64;
        self.live.insert(base, layout);
        Ok(base)
    }

    fn free_arena(&mut self, base: u64, bytes: u64) {
        // Only addresses this source handed out are ever deallocated, so a
        // bad call cannot corrupt the heap.
        if let Some(layout) = self.live.remove(&base) {
            debug_assert_eq!(layout.size() as u64, bytes.max(1));
            // SAFETY: ptr and layout are exactly those of alloc_zeroed above.
            unsafe { dealloc(base as *mut u8, layout) };
        }
    }
}

impl Drop for HostArenaSource {
    fn drop(&mut self) {
        for (base, layout) in self.live.drain() {
            // SAFETY: as in free_arena.
            unsafe { dealloc(base as *mut u8, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_real_and_aligned() {
        let mut src = HostArenaSource::new();
        let base = src.alloc_arena(1 << 20).unwrap();
        assert_eq!(base % GRANULE, 0);
        // SAFETY: the arena is 1 MiB of live memory owned by `src`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, 1 << 20) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[12345] = 7;
        assert_eq!(bytes[12345], 7);
        src.free_arena(base, 1 << 20);
        assert_eq!(src.live_arenas(), 0);
        // A second free of the same base is ignored rather than UB.
        src.free_arena(base, 1 << 20);
    }
}
