//! LRU eviction to host: the blocks of tracked storages that nothing pins are
//! copied out (by a `Copier`) and freed when an allocation fails, least
//! recently used first, and copied back into a fresh block on their next use.
//!
//! The evictor owns no memory and no copies' format: the host copy is whatever
//! the copier returns (`Copier::Host`), so the binding can keep Python objects
//! and the tests plain vectors. Every call that may move memory takes the pool
//! and the copier, so the one lock that guards the pool guards this too.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use super::size_class::block_size;
use super::source::ArenaSource;
use super::{Pool, PoolError};

/// Names one tracked storage for its whole life; never reused.
pub type Handle = u64;

/// Moves block contents between the pool's memory and the host.
pub trait Copier {
    /// A host copy of one block.
    type Host;
    type Error;
    /// Returns a copy of `bytes` bytes at `addr`.
    fn copy_out(&mut self, addr: u64, bytes: u64) -> Result<Self::Host, Self::Error>;
    /// Writes `host` (made by copy_out) to the block at `addr`.
    fn copy_in(&mut self, host: &Self::Host, addr: u64) -> Result<(), Self::Error>;
}

#[derive(Debug)]
pub enum EvictError<E> {
    /// The pool's own error: out of memory even after evicting what could go.
    Pool(PoolError),
    /// The copier failed; nothing it was copying changed state.
    Copy(E),
    UnknownHandle(Handle),
    /// unpin() of an entry whose pins are all released.
    NotPinned(Handle),
}

impl<E: fmt::Display> fmt::Display for EvictError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvictError::Pool(e) => e.fmt(f),
            EvictError::Copy(e) => write!(f, "copy to or from host failed: {e}"),
            EvictError::UnknownHandle(h) => write!(f, "storage handle {h} is not tracked"),
            EvictError::NotPinned(h) => {
                write!(f, "unpin() of storage handle {h}, which is not pinned")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for EvictError<E> {}

impl<E> From<PoolError> for EvictError<E> {
    fn from(e: PoolError) -> Self {
        EvictError::Pool(e)
    }
}

/// Handles are sequential integers: one multiply by an odd constant spreads
/// them over the table; SipHash's resistance to chosen keys buys nothing here
/// and costs as much as the rest of a touch().
#[derive(Default)]
struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

enum Place<H> {
    Resident { addr: u64, last_use: u64 },
    Evicted(H),
}

struct Entry<H> {
    /// The storage's size as requested; its block is `block_size(bytes)`.
    bytes: u64,
    pins: u32,
    place: Place<H>,
}

/// Counters since the evictor was made, and what it holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictionStats {
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub restores: u64,
    pub restored_bytes: u64,
    /// Tracked storages whose blocks are in the pool.
    pub resident: usize,
    pub resident_bytes: u64,
    /// Tracked storages held on the host now.
    pub evicted_now: usize,
    pub evicted_now_bytes: u64,
}

/// What forget() leaves to the caller: the host copy of an evicted entry,
/// dropped where the caller chooses (a Python object's destructor may run
/// arbitrary code, which must not happen under the pool's lock).
pub enum Forgotten<H> {
    /// The block went back to the pool.
    Freed,
    Host(H),
}

pub struct Evictor<H> {
    entries: HashMap<Handle, Entry<H>, BuildHasherDefault<HandleHasher>>,
    /// Resident entries by last use, oldest first; pinned ones included (and
    /// skipped when choosing victims), so a pin never reorders anything.
    order: BTreeMap<u64, Handle>,
    clock: u64,
    next_handle: Handle,
    stats: EvictionStats,
}

impl<H> Default for Evictor<H> {
    fn default() -> Self {
        Self {
            entries: HashMap::default(),
            order: BTreeMap::new(),
            clock: 0,
            next_handle: 1,
            stats: EvictionStats::default(),
        }
    }
}

fn block_of(bytes: u64) -> u64 {
    block_size(bytes).unwrap_or(u64::MAX)
}

impl<H> Evictor<H> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocates `nbytes`, evicting on out-of-memory; the block is not tracked.
    ///
    /// Nothing moves when the request cannot fit even with every unpinned
    /// block out of a quota-bounded pool. Otherwise victims are evicted least
    /// recently used first, in batches that add up to the request, and the
    /// allocation retried after each batch (a batch may free blocks that are
    /// not adjacent); the pool's last error is returned when none are left.
    pub fn alloc<S, C>(
        &mut self,
        pool: &mut Pool<S>,
        copier: &mut C,
        nbytes: u64,
    ) -> Result<u64, EvictError<C::Error>>
    where
        S: ArenaSource,
        C: Copier<Host = H>,
    {
        let mut err = match pool.alloc(nbytes) {
            Ok(addr) => return Ok(addr),
            Err(e @ PoolError::OutOfMemory(_)) => e,
            Err(e) => return Err(e.into()),
        };
        let Some(need) = block_size(nbytes) else {
            return Err(err.into());
        };
        if let Some(quota) = pool.config().quota_bytes {
            let in_use = pool.stats().in_use_bytes;
            let room = quota
                .saturating_sub(in_use)
                .saturating_add(self.evictable_bytes());
            if need > room {
                return Err(err.into());
            }
        }
        loop {
            let victims = self.victims(need);
            if victims.is_empty() {
                return Err(err.into());
            }
            for h in victims {
                self.evict(pool, copier, h)?;
            }
            match pool.alloc(nbytes) {
                Ok(addr) => return Ok(addr),
                Err(e @ PoolError::OutOfMemory(_)) => err = e,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Allocates `nbytes` as alloc() does and tracks the block as the most
    /// recently used entry; returns its handle and address.
    pub fn alloc_tracked<S, C>(
        &mut self,
        pool: &mut Pool<S>,
        copier: &mut C,
        nbytes: u64,
    ) -> Result<(Handle, u64), EvictError<C::Error>>
    where
        S: ArenaSource,
        C: Copier<Host = H>,
    {
        let addr = self.alloc(pool, copier, nbytes)?;
        Ok((self.track(addr, nbytes), addr))
    }

    /// Tracks a live block of the pool (allocated for `bytes`) as the most
    /// recently used entry.
    pub fn track(&mut self, addr: u64, bytes: u64) -> Handle {
        let h = self.next_handle;
        self.next_handle += 1;
        let last_use = self.tick();
        self.order.insert(last_use, h);
        self.entries.insert(
            h,
            Entry {
                bytes,
                pins: 0,
                place: Place::Resident { addr, last_use },
            },
        );
        self.stats.resident += 1;
        self.stats.resident_bytes += bytes;
        h
    }

    /// The entry's address now, restoring it first if it was evicted (which
    /// may evict others); marks it the most recently used.
    pub fn touch<S, C>(
        &mut self,
        pool: &mut Pool<S>,
        copier: &mut C,
        h: Handle,
    ) -> Result<u64, EvictError<C::Error>>
    where
        S: ArenaSource,
        C: Copier<Host = H>,
    {
        let clock = self.clock;
        let entry = self
            .entries
            .get_mut(&h)
            .ok_or(EvictError::UnknownHandle(h))?;
        match &mut entry.place {
            // Already the most recently used (a storage read again and again).
            Place::Resident { addr, last_use } if *last_use == clock => Ok(*addr),
            Place::Resident { addr, last_use } => {
                let now = clock + 1;
                self.clock = now;
                self.order.remove(last_use);
                *last_use = now;
                self.order.insert(now, h);
                Ok(*addr)
            }
            Place::Evicted(_) => self.restore(pool, copier, h),
        }
    }

    /// Keeps the entry resident at a fixed address until the matching
    /// unpin(); restores it first if needed. Returns the address.
    pub fn pin<S, C>(
        &mut self,
        pool: &mut Pool<S>,
        copier: &mut C,
        h: Handle,
    ) -> Result<u64, EvictError<C::Error>>
    where
        S: ArenaSource,
        C: Copier<Host = H>,
    {
        let addr = self.touch(pool, copier, h)?;
        let entry = self.entries.get_mut(&h).expect("touched above");
        entry.pins += 1;
        Ok(addr)
    }

    pub fn unpin<E>(&mut self, h: Handle) -> Result<(), EvictError<E>> {
        let entry = self
            .entries
            .get_mut(&h)
            .ok_or(EvictError::UnknownHandle(h))?;
        if entry.pins == 0 {
            return Err(EvictError::NotPinned(h));
        }
        entry.pins -= 1;
        Ok(())
    }

    /// Stops tracking the entry: a resident block goes back to the pool, an
    /// evicted entry's host copy is returned for the caller to drop.
    pub fn forget<S: ArenaSource, E>(
        &mut self,
        pool: &mut Pool<S>,
        h: Handle,
    ) -> Result<Forgotten<H>, EvictError<E>> {
        let entry = self
            .entries
            .remove(&h)
            .ok_or(EvictError::UnknownHandle(h))?;
        match entry.place {
            Place::Resident { addr, last_use } => {
                self.order.remove(&last_use);
                self.stats.resident -= 1;
                self.stats.resident_bytes -= entry.bytes;
                pool.free(addr)?;
                Ok(Forgotten::Freed)
            }
            Place::Evicted(host) => {
                self.stats.evicted_now -= 1;
                self.stats.evicted_now_bytes -= entry.bytes;
                Ok(Forgotten::Host(host))
            }
        }
    }

    /// The entry's address, or None while it is evicted (no side effects).
    pub fn addr(&self, h: Handle) -> Option<Option<u64>> {
        self.entries.get(&h).map(|e| match e.place {
            Place::Resident { addr, .. } => Some(addr),
            Place::Evicted(_) => None,
        })
    }

    /// The size the entry was allocated for.
    pub fn bytes(&self, h: Handle) -> Option<u64> {
        self.entries.get(&h).map(|e| e.bytes)
    }

    pub fn pins(&self, h: Handle) -> Option<u32> {
        self.entries.get(&h).map(|e| e.pins)
    }

    pub fn is_tracked(&self, h: Handle) -> bool {
        self.entries.contains_key(&h)
    }

    pub fn stats(&self) -> EvictionStats {
        self.stats.clone()
    }

    /// Bytes that eviction could give back now: resident and unpinned.
    pub fn evictable_bytes(&self) -> u64 {
        self.order
            .values()
            .map(|h| &self.entries[h])
            .filter(|e| e.pins == 0)
            .map(|e| block_of(e.bytes))
            .fold(0u64, u64::saturating_add)
    }

    /// Checks the entries against the order, the counters and the pool; for
    /// tests and debugging.
    pub fn validate<S: ArenaSource>(&self, pool: &Pool<S>) -> Result<(), String> {
        let mut want = EvictionStats {
            evictions: self.stats.evictions,
            evicted_bytes: self.stats.evicted_bytes,
            restores: self.stats.restores,
            restored_bytes: self.stats.restored_bytes,
            ..EvictionStats::default()
        };
        for (&h, e) in &self.entries {
            match e.place {
                Place::Resident { addr, last_use } => {
                    want.resident += 1;
                    want.resident_bytes += e.bytes;
                    if self.order.get(&last_use) != Some(&h) {
                        return Err(format!("resident entry {h} is missing from the order"));
                    }
                    match pool.size_of(addr) {
                        Ok(size) if size == block_of(e.bytes) => {}
                        _ => return Err(format!("entry {h} at {addr:#x} is not its live block")),
                    }
                }
                Place::Evicted(_) => {
                    want.evicted_now += 1;
                    want.evicted_now_bytes += e.bytes;
                    if e.pins > 0 {
                        return Err(format!("pinned entry {h} is evicted"));
                    }
                }
            }
        }
        if self.order.len() != want.resident {
            return Err("the order holds entries that are not resident".into());
        }
        if want != self.stats {
            return Err(format!(
                "counters {:?} disagree with entries {want:?}",
                self.stats
            ));
        }
        Ok(())
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Least recently used unpinned entries whose blocks add up to `need`
    /// (all of them if they do not).
    fn victims(&self, need: u64) -> Vec<Handle> {
        let mut out = Vec::new();
        let mut got = 0u64;
        for h in self.order.values() {
            let e = &self.entries[h];
            if e.pins > 0 {
                continue;
            }
            out.push(*h);
            got = got.saturating_add(block_of(e.bytes));
            if got >= need {
                break;
            }
        }
        out
    }

    fn evict<S, C>(
        &mut self,
        pool: &mut Pool<S>,
        copier: &mut C,
        h: Handle,
    ) -> Result<(), EvictError<C::Error>>
    where
        S: ArenaSource,
        C: Copier<Host = H>,
    {
        let entry = self.entries.get_mut(&h).expect("victims are tracked");
        let Place::Resident { addr, last_use } = entry.place else {
            unreachable!("victims are resident");
        };
        let host = copier
            .copy_out(addr, entry.bytes)
            .map_err(EvictError::Copy)?;
        pool.free(addr)?;
        entry.place = Place::Evicted(host);
        self.order.remove(&last_use);
        let s = &mut self.stats;
        s.evictions += 1;
        s.evicted_bytes += entry.bytes;
        s.resident -= 1;
        s.resident_bytes -= entry.bytes;
        s.evicted_now += 1;
        s.evicted_now_bytes += entry.bytes;
        Ok(())
    }

    fn restore<S, C>(
        &mut self,
        pool: &mut Pool<S>,
        copier: &mut C,
        h: Handle,
    ) -> Result<u64, EvictError<C::Error>>
    where
        S: ArenaSource,
        C: Copier<Host = H>,
    {
        // Evicted, so not in the order: the allocation cannot choose it.
        let bytes = self.entries[&h].bytes;
        let addr = self.alloc(pool, copier, bytes)?;
        let entry = self.entries.get_mut(&h).expect("checked by the caller");
        let Place::Evicted(host) = &entry.place else {
            unreachable!("checked by the caller");
        };
        if let Err(e) = copier.copy_in(host, addr) {
            // The entry stays evicted with its host copy; the block goes back.
            pool.free(addr)?;
            return Err(EvictError::Copy(e));
        }
        let now = self.tick();
        let entry = self.entries.get_mut(&h).expect("checked by the caller");
        entry.place = Place::Resident {
            addr,
            last_use: now,
        };
        self.order.insert(now, h);
        let s = &mut self.stats;
        s.restores += 1;
        s.restored_bytes += bytes;
        s.resident += 1;
        s.resident_bytes += bytes;
        s.evicted_now -= 1;
        s.evicted_now_bytes -= bytes;
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{HostArenaSource, PoolConfig};

    const KIB: u64 = 1 << 10;
    const BLOCK: u64 = 64 * KIB;

    /// Copies real host memory (the pool's arenas come from the heap).
    #[derive(Default)]
    struct MemCopier {
        fail_out: bool,
        fail_in: bool,
    }

    impl Copier for MemCopier {
        type Host = Vec<u8>;
        type Error = &'static str;

        fn copy_out(&mut self, addr: u64, bytes: u64) -> Result<Vec<u8>, &'static str> {
            if self.fail_out {
                return Err("copy_out failed");
            }
            // SAFETY: `addr` is a live block of at least `bytes` in a host arena.
            Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, bytes as usize) }.to_vec())
        }

        fn copy_in(&mut self, host: &Vec<u8>, addr: u64) -> Result<(), &'static str> {
            if self.fail_in {
                return Err("copy_in failed");
            }
            // SAFETY: `addr` is a fresh block of at least host.len() bytes.
            unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), addr as *mut u8, host.len()) };
            Ok(())
        }
    }

    /// Room for `blocks` blocks of BLOCK bytes, one per arena.
    fn pool(blocks: u64) -> Pool<HostArenaSource> {
        let cfg = PoolConfig {
            arena_bytes: BLOCK,
            quota_bytes: Some(blocks * BLOCK),
        };
        Pool::new(cfg, HostArenaSource::new())
    }

    fn fill(addr: u64, seed: u8) {
        // SAFETY: a live block of BLOCK bytes.
        let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, BLOCK as usize) };
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
    }

    fn holds(addr: u64, seed: u8) -> bool {
        // SAFETY: a live block of BLOCK bytes.
        let b = unsafe { std::slice::from_raw_parts(addr as *const u8, BLOCK as usize) };
        b.iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u8).wrapping_mul(31).wrapping_add(seed))
    }

    type Ev = Evictor<Vec<u8>>;

    #[test]
    fn evicts_least_recently_used_and_restores_content() {
        let (mut p, mut c, mut ev) = (pool(4), MemCopier::default(), Ev::new());
        let mut hs = Vec::new();
        for seed in 0..4u8 {
            let (h, addr) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
            fill(addr, seed);
            hs.push(h);
        }
        ev.touch(&mut p, &mut c, hs[0]).unwrap(); // hs[1] is now the oldest
        let (h4, a4) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        fill(a4, 4);
        hs.push(h4);
        assert_eq!(ev.addr(hs[1]), Some(None));
        assert!(ev.addr(hs[0]).unwrap().is_some());
        let s = ev.stats();
        assert_eq!((s.evictions, s.evicted_bytes, s.evicted_now), (1, BLOCK, 1));
        ev.validate(&p).unwrap();
        // Reading every entry restores each evicted one, evicting another each time.
        for (seed, &h) in hs.iter().enumerate() {
            let addr = ev.touch(&mut p, &mut c, h).unwrap();
            assert!(holds(addr, seed as u8), "entry {seed} lost its content");
            ev.validate(&p).unwrap();
        }
        let s = ev.stats();
        assert!(s.restores >= 1 && s.restored_bytes == s.restores * BLOCK);
        assert_eq!(s.resident_bytes, 4 * BLOCK);
        assert_eq!(p.stats().in_use_bytes, 4 * BLOCK);
    }

    #[test]
    fn pinned_entries_stay_and_impossible_requests_move_nothing() {
        let (mut p, mut c, mut ev) = (pool(3), MemCopier::default(), Ev::new());
        let (a, addr_a) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        let (b, _) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        let (_, _) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        assert_eq!(ev.pin(&mut p, &mut c, a).unwrap(), addr_a);
        // Larger than the quota less the pinned block: nothing is evicted.
        match ev.alloc(&mut p, &mut c, 3 * BLOCK) {
            Err(EvictError::Pool(PoolError::OutOfMemory(_))) => {}
            other => panic!("expected the pool's OOM, got {:?}", other.map(|_| ())),
        }
        assert_eq!(ev.stats().evictions, 0);
        // Two blocks fit once both unpinned entries go; the pinned one stays.
        let big = ev
            .alloc(&mut p, &mut c, 2 * BLOCK)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ev.addr(a), Some(Some(addr_a)));
        assert_eq!(ev.stats().evictions, 2);
        p.free(big).unwrap();
        // With every resident entry pinned, nothing can move.
        ev.pin(&mut p, &mut c, b).unwrap();
        let (d, _) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        ev.pin(&mut p, &mut c, d).unwrap();
        assert!(matches!(
            ev.alloc(&mut p, &mut c, BLOCK),
            Err(EvictError::Pool(PoolError::OutOfMemory(_)))
        ));
        ev.unpin::<()>(d).unwrap();
        assert!(ev.alloc(&mut p, &mut c, BLOCK).is_ok());
        assert_eq!(ev.addr(d), Some(None));
        assert!(matches!(ev.unpin::<()>(d), Err(EvictError::NotPinned(_))));
        ev.validate(&p).unwrap();
    }

    #[test]
    fn failed_copies_leave_state_whole() {
        let (mut p, mut c, mut ev) = (pool(2), MemCopier::default(), Ev::new());
        let (a, addr_a) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        fill(addr_a, 9);
        let (_, _) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        c.fail_out = true;
        assert!(matches!(
            ev.alloc(&mut p, &mut c, BLOCK),
            Err(EvictError::Copy("copy_out failed"))
        ));
        assert_eq!(ev.addr(a), Some(Some(addr_a)));
        ev.validate(&p).unwrap();
        c.fail_out = false;
        let x = ev.alloc(&mut p, &mut c, BLOCK).unwrap();
        assert_eq!(ev.addr(a), Some(None));
        p.free(x).unwrap();
        c.fail_in = true;
        let in_use = p.stats().in_use_bytes;
        assert!(matches!(
            ev.touch(&mut p, &mut c, a),
            Err(EvictError::Copy("copy_in failed"))
        ));
        assert_eq!(ev.addr(a), Some(None));
        assert_eq!(p.stats().in_use_bytes, in_use);
        ev.validate(&p).unwrap();
        c.fail_in = false;
        let addr = ev.touch(&mut p, &mut c, a).unwrap();
        assert!(holds(addr, 9));
        ev.validate(&p).unwrap();
    }

    #[test]
    fn forget_frees_resident_blocks_and_hands_back_host_copies() {
        let (mut p, mut c, mut ev) = (pool(1), MemCopier::default(), Ev::new());
        let (a, _) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        let (b, _) = ev.alloc_tracked(&mut p, &mut c, BLOCK).unwrap();
        assert_eq!(ev.addr(a), Some(None));
        match ev.forget::<_, ()>(&mut p, a) {
            Ok(Forgotten::Host(host)) => assert_eq!(host.len() as u64, BLOCK),
            _ => panic!("an evicted entry hands back its host copy"),
        }
        assert!(matches!(
            ev.forget::<_, ()>(&mut p, b),
            Ok(Forgotten::Freed)
        ));
        assert!(matches!(
            ev.forget::<_, ()>(&mut p, b),
            Err(EvictError::UnknownHandle(_))
        ));
        assert_eq!(p.stats().in_use_bytes, 0);
        assert_eq!(ev.stats().resident + ev.stats().evicted_now, 0);
        ev.validate(&p).unwrap();
    }
}
