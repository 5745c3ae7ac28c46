//! The controller: plans by key, replayed through a launcher.

use std::ffi::c_void;
use std::sync::Arc;

use super::cache::LruCache;
use super::error::DispatchError;
use super::inflight::{InFlight, InFlightStats};
use super::plan::{KernelLaunch, LaunchPlan, Param};

/// What launches kernels and tracks their completion: the native module's C
/// ABI table in production, `FakeLauncher` in tests. Errors are the driver's
/// (code, message).
pub trait Launcher {
    type Event;
    /// Queue `l` on `stream`; `params[i]` points at parameter i's bytes.
    fn launch(
        &self,
        l: &KernelLaunch,
        stream: u64,
        params: &mut [*mut c_void],
    ) -> Result<(), (i32, String)>;
    fn event_create(&self, ctx: u64) -> Result<Self::Event, (i32, String)>;
    fn event_record(&self, e: &Self::Event, stream: u64) -> Result<(), (i32, String)>;
    /// Whether the work before the event's record has finished.
    fn event_done(&self, e: &Self::Event) -> Result<bool, (i32, String)>;
    fn event_wait(&self, e: &Self::Event) -> Result<(), (i32, String)>;
    fn event_destroy(&self, e: Self::Event);
}

/// Where temporaries come from: the pool.
pub trait TempAlloc {
    /// A block of at least `nbytes`, or None when the pool cannot serve it
    /// (the caller then takes its general path, which can evict).
    fn alloc(&mut self, nbytes: u64) -> Option<u64>;
    fn free(&mut self, addr: u64);
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControllerStats {
    pub hits: u64,
    pub misses: u64,
    pub inserted: u64,
    pub launches: u64,
    pub plans: usize,
    pub capacity: usize,
    pub evicted: u64,
    pub in_flight: InFlightStats,
}

struct Entry<X> {
    plan: Arc<LaunchPlan>,
    _keep: X,
}

/// Cached plans (an LRU of `capacity` plans by u64 key) and per-stream
/// in-flight bounds. `X` is what a plan keeps alive (the kernels' modules).
pub struct Controller<E, X> {
    cache: LruCache<u64, Entry<X>>,
    inflight: InFlight<E>,
    hits: u64,
    misses: u64,
    inserted: u64,
    launches: u64,
}

const INLINE_PARAMS: usize = 32;

impl<E, X> Controller<E, X> {
    /// `every` launches per completion marker, at most `max_markers` markers
    /// outstanding per stream.
    pub fn new(capacity: usize, every: u64, max_markers: usize) -> Self {
        Self {
            cache: LruCache::new(capacity),
            inflight: InFlight::new(every, max_markers),
            hits: 0,
            misses: 0,
            inserted: 0,
            launches: 0,
        }
    }

    pub fn insert(&mut self, key: u64, plan: LaunchPlan, keep: X) {
        self.inserted += 1;
        self.cache.insert(
            key,
            Entry {
                plan: Arc::new(plan),
                _keep: keep,
            },
        );
    }

    pub fn contains(&self, key: u64) -> bool {
        self.cache.contains(&key)
    }

    pub fn remove(&mut self, key: u64) -> bool {
        self.cache.remove(&key).is_some()
    }

    pub fn clear(&mut self) {
        self.cache.clear();
    }

    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    pub fn stats(&self) -> ControllerStats {
        ControllerStats {
            hits: self.hits,
            misses: self.misses,
            inserted: self.inserted,
            launches: self.launches,
            plans: self.cache.len(),
            capacity: self.cache.capacity(),
            evicted: self.cache.evictions(),
            in_flight: self.inflight.stats(),
        }
    }

    /// See `InFlight::bound`.
    pub fn inflight_bound(&self, largest_run: u64) -> u64 {
        self.inflight.bound(largest_run)
    }

    /// Runs the plan under `key` on `stream`: Ok(false) when there is none
    /// (the caller records one). On an error no temporary stays allocated;
    /// launches before a failed one are queued.
    pub fn run<L: Launcher<Event = E>, A: TempAlloc>(
        &mut self,
        launcher: &L,
        alloc: &mut A,
        key: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
    ) -> Result<bool, DispatchError> {
        let plan = match self.cache.get(&key) {
            Some(e) => Arc::clone(&e.plan),
            None => {
                self.misses += 1;
                return Ok(false);
            }
        };
        self.hits += 1;
        if inputs.len() != plan.n_inputs || outputs.len() != plan.n_outputs {
            return Err(DispatchError::BadCall(format!(
                "the plan takes {} inputs and {} outputs, got {} and {}",
                plan.n_inputs,
                plan.n_outputs,
                inputs.len(),
                outputs.len()
            )));
        }
        let mut temps = vec![0u64; plan.temps.len()];
        let res = run_launches(launcher, alloc, &plan, inputs, outputs, &mut temps, stream);
        for t in temps.iter().filter(|&&a| a != 0) {
            alloc.free(*t); // what an error left allocated
        }
        let queued = res?;
        self.launches += queued as u64;
        if let Some(first) = plan.launches.first() {
            self.inflight
                .note(launcher, first.ctx, stream, queued as u64)?;
        }
        Ok(true)
    }

    /// Waits for all tracked work (before a shutdown or in tests).
    pub fn drain<L: Launcher<Event = E>>(&mut self, launcher: &L) -> Result<(), DispatchError> {
        self.inflight.drain(launcher)
    }

    pub fn destroy_events<L: Launcher<Event = E>>(&mut self, launcher: &L) {
        self.inflight.destroy_events(launcher)
    }
}

/// The launches of `plan`; temporaries allocated before their first user and
/// freed after their last (temps[k] is 0 when k is not allocated). Returns the
/// number queued.
fn run_launches<L: Launcher, A: TempAlloc>(
    launcher: &L,
    alloc: &mut A,
    plan: &LaunchPlan,
    inputs: &[u64],
    outputs: &[u64],
    temps: &mut [u64],
    stream: u64,
) -> Result<usize, DispatchError> {
    let mut inline_vals = [0u64; INLINE_PARAMS];
    let mut heap_vals: Vec<u64> = Vec::new();
    let mut inline_ptrs = [std::ptr::null_mut::<c_void>(); INLINE_PARAMS];
    let mut heap_ptrs: Vec<*mut c_void> = Vec::new();
    let (vals, ptrs): (&mut [u64], &mut [*mut c_void]) = if plan.max_params <= INLINE_PARAMS {
        (&mut inline_vals[..], &mut inline_ptrs[..])
    } else {
        heap_vals.resize(plan.max_params, 0);
        heap_ptrs.resize(plan.max_params, std::ptr::null_mut());
        (&mut heap_vals[..], &mut heap_ptrs[..])
    };
    for (k, l) in plan.launches.iter().enumerate() {
        for (t, life) in plan.temps.iter().enumerate() {
            if life.first == k {
                temps[t] = alloc.alloc(life.nbytes).ok_or(DispatchError::OutOfMemory {
                    nbytes: life.nbytes,
                })?;
            }
        }
        let n = l.params.len();
        for (i, p) in l.params.iter().enumerate() {
            vals[i] = match *p {
                Param::Const(bits) => bits,
                Param::Input { index, offset } => {
                    inputs[index as usize].wrapping_add(offset as u64)
                }
                Param::Output { index, offset } => {
                    outputs[index as usize].wrapping_add(offset as u64)
                }
                Param::Temp { index, offset } => temps[index as usize].wrapping_add(offset as u64),
            };
        }
        for i in 0..n {
            ptrs[i] = (&mut vals[i]) as *mut u64 as *mut c_void;
        }
        launcher
            .launch(l, stream, &mut ptrs[..n])
            .map_err(|(code, message)| DispatchError::Launch {
                kernel: k,
                code,
                message,
            })?;
        for (t, life) in plan.temps.iter().enumerate() {
            if life.last == k && temps[t] != 0 {
                alloc.free(temps[t]);
                temps[t] = 0;
            }
        }
    }
    Ok(plan.launches.len())
}
