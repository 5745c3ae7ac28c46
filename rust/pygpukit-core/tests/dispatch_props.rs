//! Property tests of the controller's state: the plan cache against a model
//! LRU, and the in-flight bound under random completions.

use std::collections::VecDeque;

use proptest::prelude::*;
use pygpukit_core::dispatch::{
    Controller, FakeAlloc, FakeLauncher, KernelLaunch, LaunchPlan, LruCache, Param,
};

#[derive(Clone, Debug)]
enum Op {
    Insert(u8),
    Get(u8),
    Remove(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any::<u8>().prop_map(|k| Op::Insert(k % 24)),
        any::<u8>().prop_map(|k| Op::Get(k % 24)),
        any::<u8>().prop_map(|k| Op::Remove(k % 24)),
    ]
}

proptest! {
    #[test]
    fn lru_matches_a_model(cap in 1usize..8, ops in proptest::collection::vec(op(), 0..200)) {
        let mut c = LruCache::new(cap);
        let mut model: VecDeque<(u8, u32)> = VecDeque::new(); // most recent first
        for (step, o) in ops.into_iter().enumerate() {
            let v = step as u32;
            match o {
                Op::Insert(k) => {
                    let evicted = c.insert(k, v);
                    let had = model.iter().position(|e| e.0 == k);
                    let mut expect = None;
                    if let Some(i) = had {
                        model.remove(i);
                    } else if model.len() >= cap {
                        expect = model.pop_back();
                    }
                    model.push_front((k, v));
                    prop_assert_eq!(evicted, expect);
                }
                Op::Get(k) => {
                    let got = c.get(&k).copied();
                    let i = model.iter().position(|e| e.0 == k);
                    let expect = i.map(|i| model.remove(i).unwrap());
                    if let Some(e) = expect {
                        model.push_front(e);
                    }
                    prop_assert_eq!(got, expect.map(|e| e.1));
                }
                Op::Remove(k) => {
                    let got = c.remove(&k);
                    let i = model.iter().position(|e| e.0 == k);
                    prop_assert_eq!(got, i.map(|i| model.remove(i).unwrap().1));
                }
            }
            prop_assert!(c.len() <= cap);
            let keys: Vec<u8> = model.iter().map(|e| e.0).collect();
            prop_assert_eq!(c.keys_by_recency(), keys);
        }
    }

    #[test]
    fn in_flight_stays_bounded(every in 1u64..5, max in 1usize..5,
                               runs in proptest::collection::vec((1usize..4, any::<bool>()), 1..80)) {
        let fake = FakeLauncher::new();
        let mut alloc = FakeAlloc::new(1 << 30);
        let mut c: Controller<u64, ()> = Controller::new(8, every, max);
        for n in 1..4u64 {
            let ks = (0..n).map(|_| KernelLaunch { func: 1, ctx: 1, grid: [1; 3], block: [1; 3],
                shared_mem: 0, pdl: false, params: vec![Param::Temp { index: 0, offset: 0 }] }).collect();
            c.insert(n, LaunchPlan::new(ks, 0, 0, &[512]).unwrap(), ());
        }
        let mut issued = 0u64;
        for (n, device_catches_up) in runs {
            prop_assert!(c.run(&fake, &mut alloc, n as u64, &[], &[], 3).unwrap());
            issued += n as u64;
            if device_catches_up {
                fake.complete_all();
            }
            let st = c.stats().in_flight;
            prop_assert_eq!(st.issued, issued);
            prop_assert!(st.completed <= st.issued);
            prop_assert!(st.markers <= max);
            prop_assert!(st.issued - st.completed <= c.inflight_bound(3));
            prop_assert_eq!(alloc.live_blocks(), 0);
        }
        c.drain(&fake).unwrap();
        prop_assert_eq!(c.stats().in_flight.completed, issued);
        c.destroy_events(&fake);
        prop_assert_eq!(fake.live_events(), 0);
    }
}
