//! A launcher and an allocator that touch no device: they log what they are
//! asked, for the controller's tests (cargo, and Python's through the
//! `_rust.Dispatcher(fake=True)` binding).

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

use super::controller::{Launcher, TempAlloc};
use super::plan::KernelLaunch;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeLaunch {
    pub func: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub pdl: bool,
    pub stream: u64,
    /// Each parameter's 8-byte slot as it was handed to the driver.
    pub params: Vec<u64>,
}

#[derive(Default)]
struct FakeState {
    log: Vec<FakeLaunch>,
    next_event: u64,
    recorded: Vec<(u64, u64)>, // event -> sequence number of its record
    progress: u64,             // records up to this sequence have "completed"
    seq: u64,
    live_events: HashSet<u64>,
    fail_at: Option<usize>, // the launch (by count) that fails
}

/// Events complete only when waited for or when `complete_all` is called.
#[derive(Default)]
pub struct FakeLauncher {
    state: Mutex<FakeState>,
}

impl FakeLauncher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn log(&self) -> Vec<FakeLaunch> {
        self.state.lock().expect("fake state").log.clone()
    }

    pub fn take_log(&self) -> Vec<FakeLaunch> {
        std::mem::take(&mut self.state.lock().expect("fake state").log)
    }

    /// The `n`-th launch from now (0: the next) fails with code 700.
    pub fn fail_launch(&self, n: usize) {
        let mut s = self.state.lock().expect("fake state");
        s.fail_at = Some(s.log.len() + n);
    }

    /// The device catches up: every recorded event is complete.
    pub fn complete_all(&self) {
        let mut s = self.state.lock().expect("fake state");
        s.progress = s.seq;
    }

    pub fn live_events(&self) -> usize {
        self.state.lock().expect("fake state").live_events.len()
    }
}

impl Launcher for FakeLauncher {
    type Event = u64;

    fn launch(
        &self,
        l: &KernelLaunch,
        stream: u64,
        params: &mut [*mut c_void],
    ) -> Result<(), (i32, String)> {
        let mut s = self.state.lock().expect("fake state");
        if s.fail_at == Some(s.log.len()) {
            s.fail_at = None;
            return Err((700, "an illegal memory access was encountered".into()));
        }
        // SAFETY: the controller hands pointers at 8-byte slots it owns for the call.
        let params = params
            .iter()
            .map(|&p| unsafe { *(p as *const u64) })
            .collect();
        s.log.push(FakeLaunch {
            func: l.func,
            grid: l.grid,
            block: l.block,
            shared_mem: l.shared_mem,
            pdl: l.pdl,
            stream,
            params,
        });
        Ok(())
    }

    fn event_create(&self, _ctx: u64) -> Result<u64, (i32, String)> {
        let mut s = self.state.lock().expect("fake state");
        s.next_event += 1;
        let e = s.next_event;
        s.live_events.insert(e);
        Ok(e)
    }

    fn event_record(&self, e: &u64, _stream: u64) -> Result<(), (i32, String)> {
        let mut s = self.state.lock().expect("fake state");
        s.seq += 1;
        let seq = s.seq;
        s.recorded.retain(|(ev, _)| ev != e);
        s.recorded.push((*e, seq));
        Ok(())
    }

    fn event_done(&self, e: &u64) -> Result<bool, (i32, String)> {
        let s = self.state.lock().expect("fake state");
        let seq = s.recorded.iter().find(|(ev, _)| ev == e).map_or(0, |r| r.1);
        Ok(seq <= s.progress)
    }

    fn event_wait(&self, e: &u64) -> Result<(), (i32, String)> {
        let mut s = self.state.lock().expect("fake state");
        let seq = s.recorded.iter().find(|(ev, _)| ev == e).map_or(0, |r| r.1);
        s.progress = s.progress.max(seq);
        Ok(())
    }

    fn event_destroy(&self, e: u64) {
        let mut s = self.state.lock().expect("fake state");
        s.live_events.remove(&e);
        s.recorded.retain(|(ev, _)| *ev != e);
    }
}

/// A bump allocator of 256-byte-aligned addresses with a byte limit.
pub struct FakeAlloc {
    next: u64,
    limit: u64,
    live: std::collections::HashMap<u64, u64>,
    pub peak_live_bytes: u64,
    pub allocs: u64,
}

impl FakeAlloc {
    pub fn new(limit: u64) -> Self {
        Self {
            next: 0x1000_0000,
            limit,
            live: Default::default(),
            peak_live_bytes: 0,
            allocs: 0,
        }
    }

    pub fn live_bytes(&self) -> u64 {
        self.live.values().sum()
    }

    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }
}

impl TempAlloc for FakeAlloc {
    fn alloc(&mut self, nbytes: u64) -> Option<u64> {
        if self.live_bytes() + nbytes > self.limit {
            return None;
        }
        let addr = self.next;
        self.next += nbytes.div_ceil(256).max(1) * 256;
        self.live.insert(addr, nbytes);
        self.allocs += 1;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes());
        Some(addr)
    }

    fn free(&mut self, addr: u64) {
        assert!(
            self.live.remove(&addr).is_some(),
            "fake: free of {addr:#x} not live"
        );
    }
}
