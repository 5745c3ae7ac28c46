mod common;

use std::collections::BTreeMap;

use common::FakeSource;
use proptest::prelude::*;
use pygpukit_core::pool::{block_size, Pool, PoolConfig, PoolError, GRANULE};

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    /// Frees the live block at this index (mod the number of live blocks).
    Free(usize),
    /// Frees an address that is not live: a freed one, or an interior one.
    BadFree(usize),
    Release,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=4096,
        3 => 4096u64..=512 * 1024,
        2 => 512 * 1024u64..=6 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => size().prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::BadFree),
        1 => Just(Op::Release),
    ]
}

fn config() -> impl Strategy<Value = PoolConfig> {
    (
        prop_oneof![
            Just(MIB),
            Just(4 * MIB),
            (1u64..64).prop_map(|k| k * 40_000)
        ],
        prop_oneof![Just(None), (4 * MIB..40 * MIB).prop_map(Some),],
    )
        .prop_map(|(arena_bytes, quota_bytes)| PoolConfig {
            arena_bytes,
            quota_bytes,
        })
}

fn check(p: &Pool<FakeSource>, live: &BTreeMap<u64, u64>) -> Result<(), TestCaseError> {
    p.validate().map_err(TestCaseError::fail)?;
    let s = p.stats();
    prop_assert_eq!(s.in_use_bytes, live.values().sum::<u64>());
    prop_assert_eq!(s.live_blocks, live.len());
    prop_assert!(s.peak_in_use_bytes >= s.in_use_bytes);
    prop_assert!(s.in_use_bytes <= s.reserved_bytes);
    if let Some(q) = s.quota_bytes {
        prop_assert!(s.reserved_bytes <= q);
    }
    prop_assert_eq!(s.reserved_bytes, p.source().live_bytes());
    let arenas = p.arenas();
    prop_assert_eq!(arenas.len(), p.source().live.len());
    // Live blocks are disjoint and each lies inside one arena.
    let mut prev_end = 0;
    for (&addr, &len) in live {
        prop_assert!(
            addr >= prev_end,
            "block {:#x} overlaps the previous one",
            addr
        );
        prev_end = addr + len;
        prop_assert!(arenas
            .iter()
            .any(|a| addr >= a.base && addr + len <= a.base + a.size));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_alloc_free_keeps_the_pool_whole(cfg in config(), ops in prop::collection::vec(op(), 1..120)) {
        let mut p = Pool::new(cfg, FakeSource::new());
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut freed: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(n) => {
                    let want = block_size(n).unwrap();
                    match p.alloc(n) {
                        Ok(addr) => {
                            prop_assert_eq!(addr % GRANULE, 0);
                            prop_assert_eq!(p.size_of(addr).unwrap(), want);
                            prop_assert!(live.insert(addr, want).is_none());
                            freed.retain(|&f| f != addr);
                        }
                        Err(PoolError::OutOfMemory(oom)) => {
                            // Only a quota can refuse here (the fake device is unbounded),
                            // and only when no free block and no room under it holds the request.
                            let q = cfg.quota_bytes.expect("OOM without a quota");
                            prop_assert!(oom.stats.largest_free_block < want);
                            prop_assert!(q - oom.stats.reserved_bytes < want);
                            prop_assert_eq!(oom.requested_bytes, n);
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let addr = *live.keys().nth(i % live.len()).unwrap();
                    p.free(addr).unwrap();
                    live.remove(&addr);
                    freed.push(addr);
                }
                Op::Free(_) => {}
                Op::BadFree(i) => {
                    let before = p.stats();
                    let addr = if !freed.is_empty() && i % 2 == 0 {
                        freed[i % freed.len()]
                    } else if let Some((&a, _)) = live.iter().nth(i % live.len().max(1)) {
                        a + GRANULE / 2
                    } else {
                        1
                    };
                    if !live.contains_key(&addr) {
                        let is_invalid = matches!(p.free(addr), Err(PoolError::InvalidAddress { .. }));
                        prop_assert!(is_invalid);
                        prop_assert_eq!(p.stats(), before);
                    }
                }
                Op::Release => {
                    let before = p.stats();
                    let got = p.release_cached();
                    prop_assert_eq!(p.stats().reserved_bytes, before.reserved_bytes - got);
                    prop_assert!(p.arenas().iter().all(|a| a.used_bytes > 0));
                }
            }
            check(&p, &live)?;
        }
        for &addr in live.keys() {
            p.free(addr).unwrap();
        }
        live.clear();
        check(&p, &live)?;
        let s = p.stats();
        prop_assert_eq!(s.in_use_bytes, 0);
        prop_assert_eq!(s.free_blocks, s.arenas);
        for a in p.arenas() {
            prop_assert_eq!(a.used_bytes, 0);
        }
        prop_assert_eq!(p.release_cached(), s.reserved_bytes);
        prop_assert_eq!(p.stats().reserved_bytes, 0);
        prop_assert!(p.source().live.is_empty());
        prop_assert_eq!(p.source().bad_frees, 0);
    }
}
