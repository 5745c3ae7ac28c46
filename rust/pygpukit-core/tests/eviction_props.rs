//! Property tests of LRU eviction: random operations on tracked storages
//! against a model, with a fake copier over simulated memory.
mod common;

use std::collections::HashMap;

use common::FakeSource;
use proptest::prelude::*;
use pygpukit_core::pool::{
    block_size, Copier, EvictError, Evictor, Forgotten, Handle, Pool, PoolConfig, PoolError,
    GRANULE,
};

const KIB: u64 = 1 << 10;

/// Simulated memory, one tag per granule: copying moves tags, so a block that
/// was overwritten (reused while its data should have been on the host) shows
/// up as a wrong tag when it is read back.
#[derive(Default)]
struct TagMemory {
    tags: HashMap<u64, u64>,
}

impl TagMemory {
    fn write(&mut self, addr: u64, bytes: u64, tag: u64) {
        for g in 0..block_size(bytes).unwrap() / GRANULE {
            self.tags.insert(addr + g * GRANULE, tag);
        }
    }

    fn holds(&self, addr: u64, bytes: u64, tag: u64) -> bool {
        (0..block_size(bytes).unwrap() / GRANULE)
            .all(|g| self.tags.get(&(addr + g * GRANULE)) == Some(&tag))
    }
}

impl Copier for TagMemory {
    type Host = Vec<Option<u64>>;
    type Error = ();

    fn copy_out(&mut self, addr: u64, bytes: u64) -> Result<Self::Host, ()> {
        let granules = block_size(bytes).unwrap() / GRANULE;
        Ok((0..granules)
            .map(|g| self.tags.get(&(addr + g * GRANULE)).copied())
            .collect())
    }

    fn copy_in(&mut self, host: &Self::Host, addr: u64) -> Result<(), ()> {
        for (g, tag) in host.iter().enumerate() {
            let at = addr + g as u64 * GRANULE;
            match tag {
                Some(t) => self.tags.insert(at, *t),
                None => self.tags.remove(&at),
            };
        }
        Ok(())
    }
}

type Ev = Evictor<Vec<Option<u64>>>;

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    /// Another user of the pool: an untracked block, freed later.
    AllocUntracked(u64),
    FreeUntracked(usize),
    Touch(usize),
    Pin(usize),
    Unpin(usize),
    Forget(usize),
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0u64..=4 * KIB, 3 => 4 * KIB..=64 * KIB, 1 => 64 * KIB..=300 * KIB]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => size().prop_map(Op::Alloc),
        1 => size().prop_map(Op::AllocUntracked),
        1 => any::<usize>().prop_map(Op::FreeUntracked),
        5 => any::<usize>().prop_map(Op::Touch),
        2 => any::<usize>().prop_map(Op::Pin),
        2 => any::<usize>().prop_map(Op::Unpin),
        2 => any::<usize>().prop_map(Op::Forget),
    ]
}

struct Model {
    bytes: u64,
    tag: u64,
    pins: u32,
    /// The address it was pinned at, while pinned.
    pinned_at: Option<u64>,
}

fn pick<T: Copy>(keys: &[T], i: usize) -> Option<T> {
    (!keys.is_empty()).then(|| keys[i % keys.len()])
}

fn is_oom<E>(r: &Result<u64, EvictError<E>>) -> bool {
    matches!(r, Err(EvictError::Pool(PoolError::OutOfMemory(_))))
}

/// After every operation: both structures whole, pinned entries in place,
/// resident bytes the sum of resident entries.
fn check(
    p: &Pool<FakeSource>,
    ev: &Ev,
    model: &HashMap<Handle, Model>,
) -> Result<(), TestCaseError> {
    p.validate().map_err(TestCaseError::fail)?;
    ev.validate(p).map_err(TestCaseError::fail)?;
    let mut resident = 0;
    for (&h, m) in model {
        let addr = ev.addr(h).expect("tracked");
        if let Some(at) = m.pinned_at {
            prop_assert_eq!(addr, Some(at), "pinned entry {} moved", h);
        }
        if addr.is_some() {
            resident += m.bytes;
        }
    }
    prop_assert_eq!(ev.stats().resident_bytes, resident);
    if let Some(q) = p.config().quota_bytes {
        prop_assert!(p.stats().reserved_bytes <= q);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_use_keeps_content_pins_and_counts(
        arena in prop_oneof![Just(64 * KIB), Just(256 * KIB), (1u64..16).prop_map(|k| k * 40_000)],
        quota in 256 * KIB..2048 * KIB,
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let cfg = PoolConfig { arena_bytes: arena, quota_bytes: Some(quota) };
        let mut p = Pool::new(cfg, FakeSource::new());
        let (mut mem, mut ev) = (TagMemory::default(), Ev::new());
        let mut model: HashMap<Handle, Model> = HashMap::new();
        let mut untracked: Vec<u64> = Vec::new();
        let mut next_tag = 1;
        for op in ops {
            let mut keys: Vec<Handle> = model.keys().copied().collect();
            keys.sort_unstable();
            match op {
                Op::Alloc(n) | Op::AllocUntracked(n) => {
                    let need = block_size(n).unwrap();
                    let room = quota - p.stats().in_use_bytes + ev.evictable_bytes();
                    let before = ev.stats().evictions;
                    let res = ev.alloc(&mut p, &mut mem, n);
                    if need > room {
                        prop_assert!(is_oom(&res), "an impossible request succeeded");
                        prop_assert_eq!(ev.stats().evictions, before, "it evicted anyway");
                    }
                    match res {
                        Ok(addr) if matches!(op, Op::Alloc(_)) => {
                            let h = ev.track(addr, n);
                            mem.write(addr, n, next_tag);
                            model.insert(h, Model { bytes: n, tag: next_tag, pins: 0, pinned_at: None });
                            next_tag += 1;
                        }
                        Ok(addr) => untracked.push(addr),
                        Err(_) => prop_assert!(is_oom(&res), "not the pool's OOM"),
                    }
                }
                Op::FreeUntracked(i) => {
                    if let Some(addr) = pick(&untracked, i) {
                        untracked.retain(|&a| a != addr);
                        p.free(addr).unwrap();
                    }
                }
                Op::Touch(i) | Op::Pin(i) => {
                    let Some(h) = pick(&keys, i) else { continue };
                    let res = if matches!(op, Op::Pin(_)) {
                        ev.pin(&mut p, &mut mem, h)
                    } else {
                        ev.touch(&mut p, &mut mem, h)
                    };
                    let m = model.get_mut(&h).unwrap();
                    match res {
                        Ok(addr) => {
                            prop_assert!(mem.holds(addr, m.bytes, m.tag), "entry {} lost its content", h);
                            if matches!(op, Op::Pin(_)) {
                                m.pins += 1;
                                m.pinned_at = Some(addr);
                            }
                        }
                        Err(_) => {
                            prop_assert!(is_oom(&res), "not the pool's OOM");
                            prop_assert_eq!(ev.addr(h), Some(None), "a failed restore left it resident");
                        }
                    }
                }
                Op::Unpin(i) => {
                    let Some(h) = pick(&keys, i) else { continue };
                    let m = model.get_mut(&h).unwrap();
                    let res = ev.unpin::<()>(h);
                    if m.pins == 0 {
                        prop_assert!(matches!(res, Err(EvictError::NotPinned(_))));
                    } else {
                        prop_assert!(res.is_ok());
                        m.pins -= 1;
                        if m.pins == 0 {
                            m.pinned_at = None;
                        }
                    }
                }
                Op::Forget(i) => {
                    let Some(h) = pick(&keys, i) else { continue };
                    let resident = ev.addr(h).unwrap().is_some();
                    match ev.forget::<_, ()>(&mut p, h) {
                        Ok(Forgotten::Freed) => prop_assert!(resident),
                        Ok(Forgotten::Host(_)) => prop_assert!(!resident),
                        Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
                    }
                    model.remove(&h);
                }
            }
            check(&p, &ev, &model)?;
        }
    }

    /// One block per arena, so nothing fragments: an allocation succeeds
    /// exactly when fewer than `slots` entries are pinned, and evicts exactly
    /// the least recently used unpinned entry when the pool is full.
    #[test]
    fn allocation_succeeds_exactly_when_unpinned_bytes_suffice(
        slots in 1u64..6,
        ops in prop::collection::vec((0u8..4, any::<usize>()), 1..80),
    ) {
        const SLOT: u64 = 64 * KIB;
        let cfg = PoolConfig { arena_bytes: SLOT, quota_bytes: Some(slots * SLOT) };
        let mut p = Pool::new(cfg, FakeSource::new());
        let (mut mem, mut ev) = (TagMemory::default(), Ev::new());
        // Resident handles, least recently used first, and the pin counts.
        let mut lru: Vec<Handle> = Vec::new();
        let mut pins: HashMap<Handle, u32> = HashMap::new();
        for (kind, i) in ops {
            let mut keys: Vec<Handle> = pins.keys().copied().collect();
            keys.sort_unstable();
            let pinned = pins.values().filter(|&&n| n > 0).count() as u64;
            // Which entry a full pool gives up for one more block.
            let victim = lru.iter().copied().find(|h| pins[h] == 0);
            let full = lru.len() as u64 == slots;
            let restoring = match kind {
                1 | 2 => pick(&keys, i).filter(|h| !lru.contains(h)),
                _ => None,
            };
            match kind {
                0 => {
                    let res = ev.alloc_tracked(&mut p, &mut mem, SLOT);
                    prop_assert_eq!(res.is_ok(), pinned < slots);
                    if let Ok((h, addr)) = res {
                        mem.write(addr, SLOT, h);
                        pins.insert(h, 0);
                        if full {
                            lru.retain(|&x| Some(x) != victim);
                        }
                        lru.push(h);
                    } else {
                        prop_assert!(matches!(res, Err(EvictError::Pool(PoolError::OutOfMemory(_)))));
                    }
                }
                1 | 2 => {
                    let Some(h) = pick(&keys, i) else { continue };
                    let res = if kind == 1 { ev.touch(&mut p, &mut mem, h) } else { ev.pin(&mut p, &mut mem, h) };
                    let ok = restoring.is_none() || pinned < slots;
                    prop_assert_eq!(res.is_ok(), ok);
                    if let Ok(addr) = res {
                        prop_assert!(mem.holds(addr, SLOT, h));
                        if restoring.is_some() && full {
                            lru.retain(|&x| Some(x) != victim);
                        }
                        lru.retain(|&x| x != h);
                        lru.push(h);
                        if kind == 2 {
                            *pins.get_mut(&h).unwrap() += 1;
                        }
                    }
                }
                _ => {
                    let Some(h) = pick(&keys, i) else { continue };
                    if pins[&h] > 0 {
                        ev.unpin::<()>(h).unwrap();
                        *pins.get_mut(&h).unwrap() -= 1;
                    } else {
                        prop_assert!(ev.forget::<_, ()>(&mut p, h).is_ok());
                        pins.remove(&h);
                        lru.retain(|&x| x != h);
                    }
                }
            }
            for (&h, _) in pins.iter() {
                prop_assert_eq!(ev.addr(h).unwrap().is_some(), lru.contains(&h), "entry {} placed wrongly", h);
            }
            p.validate().map_err(TestCaseError::fail)?;
            ev.validate(&p).map_err(TestCaseError::fail)?;
        }
    }
}
