//! Pinned host memory owned by the engine: chunk buffers that pageable copies are staged
//! through, small-upload slots, and whole buffers for deferred device-to-host copies.
//!
//! Upload chunks are used in turn, so the host memcpy into one overlaps the DMA out of the
//! one before; a buffer is refilled only after the event recorded behind its last DMA.
//! Download chunks are held until their bytes are copied out to the caller, oldest first.
//! Uploads of at most `slot_bytes` take slots of their own, so a decode step's position or
//! token never waits for a chunk that a model load is still streaming.

use std::collections::HashMap;

use super::device::{CopyDevice, DeviceResult, EventId};

/// One pinned buffer with the event recorded behind the last DMA that used it.
pub struct Chunk {
    pub ptr: *mut u8,
    pub event: EventId,
    pub pending: bool,
}

// SAFETY: the buffer is plain host memory owned by the engine, used under its lock.
unsafe impl Send for Chunk {}

impl Chunk {
    fn new<D: CopyDevice + ?Sized>(dev: &D, nbytes: usize) -> DeviceResult<Self> {
        let ptr = dev.host_alloc(nbytes)?;
        match dev.event_create() {
            Ok(event) => Ok(Self {
                ptr,
                event,
                pending: false,
            }),
            Err(e) => {
                // SAFETY: just allocated, never used.
                unsafe { dev.host_free(ptr) };
                Err(e)
            }
        }
    }

    /// Waits until the last DMA through this buffer has run.
    pub fn settle<D: CopyDevice + ?Sized>(&mut self, dev: &D) -> DeviceResult<()> {
        if self.pending {
            dev.event_synchronize(self.event)?;
            self.pending = false;
        }
        Ok(())
    }

    /// # Safety
    /// No copy in flight uses the buffer (settle first).
    unsafe fn free<D: CopyDevice + ?Sized>(&self, dev: &D) {
        dev.event_destroy(self.event);
        dev.host_free(self.ptr);
    }
}

/// Buffers of one size used round robin, allocated on first use.
pub struct Ring {
    pub bytes: usize,
    limit: usize,
    chunks: Vec<Chunk>,
    next: usize,
}

impl Ring {
    pub fn new(bytes: usize, limit: usize) -> Self {
        Self {
            bytes,
            limit: limit.max(1),
            chunks: Vec::new(),
            next: 0,
        }
    }

    /// The index of the next buffer in turn, once its last DMA has run.
    pub fn take<D: CopyDevice + ?Sized>(&mut self, dev: &D) -> DeviceResult<usize> {
        if self.chunks.len() < self.limit && self.next == self.chunks.len() {
            self.chunks.push(Chunk::new(dev, self.bytes)?);
        }
        let i = self.next;
        self.next = (self.next + 1) % self.limit;
        self.chunks[i].settle(dev)?;
        Ok(i)
    }

    pub fn chunk(&mut self, i: usize) -> &mut Chunk {
        &mut self.chunks[i]
    }

    pub fn allocated(&self) -> usize {
        self.chunks.len()
    }

    /// Waits for every DMA through the ring, then frees it.
    pub fn release<D: CopyDevice + ?Sized>(&mut self, dev: &D) {
        for c in &mut self.chunks {
            let _ = c.settle(dev);
            // SAFETY: settled above (or the device is gone, and so is the DMA).
            unsafe { c.free(dev) };
        }
        self.chunks.clear();
        self.next = 0;
    }
}

/// A download chunk waiting to be copied out to the caller's memory.
pub struct Held {
    pub chunk: usize,
    pub dst: usize,
    pub len: usize,
    pub job: u64,
}

/// Pinned buffers by power-of-two size class for deferred downloads, kept for reuse up to
/// `cache_bytes` in all: allocating pinned memory costs far more than a small copy.
pub struct PinnedCache {
    free: HashMap<usize, Vec<usize>>,
    cached: usize,
    cache_bytes: usize,
}

pub const MIN_CLASS: usize = 256;

pub fn size_class(nbytes: usize) -> usize {
    nbytes.max(MIN_CLASS).next_power_of_two()
}

impl PinnedCache {
    pub fn new(cache_bytes: usize) -> Self {
        Self {
            free: HashMap::new(),
            cached: 0,
            cache_bytes,
        }
    }

    /// A buffer of at least `nbytes`, and its class.
    pub fn take<D: CopyDevice + ?Sized>(
        &mut self,
        dev: &D,
        nbytes: usize,
    ) -> DeviceResult<(usize, usize)> {
        let class = size_class(nbytes);
        if let Some(p) = self.free.get_mut(&class).and_then(Vec::pop) {
            self.cached -= class;
            return Ok((p, class));
        }
        Ok((dev.host_alloc(class)? as usize, class))
    }

    /// Takes back a buffer no copy uses any more.
    pub fn give<D: CopyDevice + ?Sized>(&mut self, dev: &D, ptr: usize, class: usize) {
        if self.cached + class > self.cache_bytes {
            // SAFETY: the caller's copy has finished.
            unsafe { dev.host_free(ptr as *mut u8) };
            return;
        }
        self.cached += class;
        self.free.entry(class).or_default().push(ptr);
    }

    pub fn cached_bytes(&self) -> usize {
        self.cached
    }

    pub fn release<D: CopyDevice + ?Sized>(&mut self, dev: &D) {
        for (_, ptrs) in self.free.drain() {
            for p in ptrs {
                // SAFETY: only finished buffers are cached.
                unsafe { dev.host_free(p as *mut u8) };
            }
        }
        self.cached = 0;
    }
}

/// Copies `n` bytes between host buffers, split over up to `threads` threads for large
/// copies: one core's memcpy is slower than the DMA it feeds.
///
/// # Safety
/// Both ranges are valid for `n` bytes and do not overlap.
pub unsafe fn host_copy(dst: *mut u8, src: *const u8, n: usize, threads: usize) {
    const PER_THREAD_MIN: usize = 1 << 20;
    let parts = threads.min(n / PER_THREAD_MIN).max(1);
    if parts == 1 {
        std::ptr::copy_nonoverlapping(src, dst, n);
        return;
    }
    let step = n.div_ceil(parts);
    let (d, s) = (dst as usize, src as usize);
    std::thread::scope(|scope| {
        for k in 1..parts {
            let off = k * step;
            let len = step.min(n - off);
            // SAFETY: disjoint sub-ranges of the caller's ranges.
            scope.spawn(move || unsafe {
                std::ptr::copy_nonoverlapping((s + off) as *const u8, (d + off) as *mut u8, len)
            });
        }
        std::ptr::copy_nonoverlapping(src, dst, step.min(n));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_powers_of_two_at_least_the_minimum() {
        assert_eq!(size_class(0), MIN_CLASS);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(4096), 4096);
    }

    #[test]
    fn host_copy_splits_large_copies_exactly() {
        let n = (3 << 20) + 12345;
        let src: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; n];
        // SAFETY: both vectors hold n bytes.
        unsafe { host_copy(dst.as_mut_ptr(), src.as_ptr(), n, 4) };
        assert_eq!(dst, src);
    }
}
