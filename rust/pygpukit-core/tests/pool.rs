mod common;

use common::FakeSource;
use pygpukit_core::pool::{
    HostArenaSource, Pool, PoolConfig, PoolError, GRANULE, LARGE_ARENA_ROUND,
};

const MIB: u64 = 1 << 20;

fn pool(arena: u64, quota: Option<u64>) -> Pool<FakeSource> {
    Pool::new(
        PoolConfig {
            arena_bytes: arena,
            quota_bytes: quota,
        },
        FakeSource::new(),
    )
}

#[test]
fn zero_and_tiny_requests_get_distinct_granules() {
    let mut p = pool(MIB, None);
    let a = p.alloc(0).unwrap();
    let b = p.alloc(0).unwrap();
    let c = p.alloc(1).unwrap();
    assert_ne!(a, b);
    assert_eq!(b - a, GRANULE);
    assert_eq!(p.size_of(a).unwrap(), GRANULE);
    assert_eq!(p.size_of(c).unwrap(), GRANULE);
    assert_eq!(p.stats().in_use_bytes, 3 * GRANULE);
    p.validate().unwrap();
}

#[test]
fn freed_space_is_reused_best_fit_and_coalesced() {
    let mut p = pool(MIB, None);
    let a = p.alloc(1000).unwrap();
    let b = p.alloc(5000).unwrap();
    let c = p.alloc(300).unwrap();
    let _d = p.alloc(100).unwrap();
    p.free(b).unwrap();
    p.free(c).unwrap();
    // b and c merged into one hole of 5120 + 512 bytes; a 5500-byte request fits only there.
    assert_eq!(p.alloc(5500).unwrap(), b);
    p.free(a).unwrap();
    // The 1024-byte hole at a is the best fit for a small request, not the arena tail.
    assert_eq!(p.alloc(700).unwrap(), a);
    p.validate().unwrap();
    assert_eq!(p.stats().arenas, 1);
}

#[test]
fn everything_freed_leaves_one_block_per_arena_and_release_returns_all() {
    let mut p = pool(MIB, None);
    let addrs: Vec<u64> = (0..64).map(|i| p.alloc(i * 37_000).unwrap()).collect();
    assert!(p.stats().arenas > 1);
    for &a in addrs.iter().rev().step_by(2).chain(addrs.iter().step_by(2)) {
        p.free(a).unwrap();
    }
    let s = p.stats();
    assert_eq!(s.in_use_bytes, 0);
    assert_eq!(s.free_blocks, s.arenas);
    let reserved = s.reserved_bytes;
    assert_eq!(p.release_cached(), reserved);
    assert_eq!(p.stats().reserved_bytes, 0);
    assert!(p.source().live.is_empty());
    assert_eq!(p.source().bad_frees, 0);
}

#[test]
fn oversized_request_gets_dedicated_rounded_arena() {
    let mut p = pool(MIB, None);
    let a = p.alloc(3 * MIB + 1).unwrap();
    let arenas = p.arenas();
    assert_eq!(arenas.len(), 1);
    assert_eq!(arenas[0].size, 4 * MIB);
    assert_eq!(arenas[0].size % LARGE_ARENA_ROUND, 0);
    assert_eq!(p.size_of(a).unwrap(), 3 * MIB + GRANULE);
}

#[test]
fn bad_frees_are_errors() {
    let mut p = pool(MIB, None);
    let a = p.alloc(512).unwrap();
    let _b = p.alloc(512).unwrap();
    p.free(a).unwrap();
    assert!(matches!(p.free(a), Err(PoolError::InvalidAddress { addr, .. }) if addr == a));
    assert!(matches!(
        p.free(a + 256),
        Err(PoolError::InvalidAddress { .. })
    ));
    assert!(matches!(
        p.free(12345),
        Err(PoolError::InvalidAddress { .. })
    ));
    assert!(p.size_of(a).is_err());
    let s = p.stats();
    assert_eq!((s.free_count, s.live_blocks), (1, 1));
    p.validate().unwrap();
}

#[test]
fn quota_releases_cached_arenas_then_fails_with_stats() {
    let mut p = pool(4 * MIB, Some(10 * MIB));
    let a = p.alloc(3 * MIB).unwrap();
    let b = p.alloc(3 * MIB).unwrap();
    assert_eq!(p.stats().reserved_bytes, 8 * MIB);
    p.free(b).unwrap();
    // 2 MiB of quota room is left; a 3 MiB request must drop the cached arena.
    let c = p.alloc(3 * MIB).unwrap();
    assert_eq!(p.stats().reserved_bytes, 8 * MIB);
    let before = p.stats();
    let err = p.alloc(5 * MIB).unwrap_err();
    let PoolError::OutOfMemory(oom) = &err else {
        panic!("expected OOM, got {err}");
    };
    assert_eq!(oom.requested_bytes, 5 * MIB);
    assert_eq!(oom.stats.in_use_bytes, 6 * MIB);
    assert_eq!(oom.stats.quota_bytes, Some(10 * MIB));
    assert!(err.to_string().contains("quota"), "{err}");
    let after = p.stats();
    assert_eq!(after.oom_count, 1);
    assert_eq!(after.reserved_bytes, before.reserved_bytes);
    assert_eq!(after.in_use_bytes, before.in_use_bytes);
    // Room left under the quota still serves a smaller request, in a shrunk arena.
    let d = p.alloc(MIB + 5).unwrap();
    assert!(p.stats().reserved_bytes <= 10 * MIB);
    for x in [a, c, d] {
        p.free(x).unwrap();
    }
    p.validate().unwrap();
}

#[test]
fn source_failure_releases_cache_and_retries() {
    let mut p = Pool::new(
        PoolConfig {
            arena_bytes: 4 * MIB,
            quota_bytes: None,
        },
        FakeSource::with_capacity(8 * MIB),
    );
    let a = p.alloc(MIB).unwrap();
    let big = p.alloc(4 * MIB).unwrap(); // fills the second arena
    p.free(big).unwrap();
    // The device is full; the second arena is idle and must be released first.
    let e = p.alloc(6 * MIB);
    assert!(e.is_err(), "8 MiB device cannot hold 4 + 6 MiB");
    assert_eq!(p.stats().arenas, 1);
    let b = p.alloc(4 * MIB).unwrap();
    p.free(a).unwrap();
    p.free(b).unwrap();
    let err = {
        p.source_mut().capacity = 0;
        p.release_cached();
        p.alloc(1).unwrap_err()
    };
    assert!(err.to_string().contains("fake device has no room"), "{err}");
    assert_eq!(p.stats().oom_count, 2);
}

#[test]
fn unusable_arenas_are_refused_and_given_back() {
    let mut p = pool(MIB, None);
    p.source_mut().next_base_override = Some(0x1000_0010);
    assert!(matches!(p.alloc(10), Err(PoolError::BadArena { .. })));
    assert!(p.source().live.is_empty());
    let a = p.alloc(10).unwrap();
    let base = p.arenas()[0].base;
    p.source_mut().next_base_override = Some(base + MIB / 2);
    assert!(matches!(p.alloc(2 * MIB), Err(PoolError::BadArena { .. })));
    assert_eq!(p.source().live.len(), 1);
    p.free(a).unwrap();
    p.validate().unwrap();
}

#[test]
fn overflowing_request_is_oom_not_panic() {
    let mut p = pool(MIB, None);
    assert!(matches!(p.alloc(u64::MAX), Err(PoolError::OutOfMemory(_))));
    assert!(matches!(
        p.alloc(u64::MAX - 3 * MIB),
        Err(PoolError::OutOfMemory(_))
    ));
}

#[test]
fn host_pool_memory_is_writable_and_disjoint() {
    let mut p = Pool::new(
        PoolConfig {
            arena_bytes: 2 * MIB,
            quota_bytes: None,
        },
        HostArenaSource::new(),
    );
    let blocks: Vec<(u64, u64)> = (1..40u64)
        .map(|i| {
            let n = i * 3001;
            (p.alloc(n).unwrap(), n)
        })
        .collect();
    for (i, &(addr, n)) in blocks.iter().enumerate() {
        // SAFETY: the block is live and at least n bytes long.
        unsafe { std::ptr::write_bytes(addr as *mut u8, i as u8, n as usize) };
    }
    for (i, &(addr, n)) in blocks.iter().enumerate() {
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts(addr as *const u8, n as usize) };
        assert!(s.iter().all(|&b| b == i as u8), "block {i} was overwritten");
    }
    for (addr, _) in blocks {
        p.free(addr).unwrap();
    }
    assert!(p.release_cached() > 0);
    assert_eq!(p.source().live_arenas(), 0);
}
