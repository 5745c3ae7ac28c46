//! `pygpukit._rust.Pool`: the memory pool behind every GPUArray, and its LRU
//! eviction to host (`enable_eviction`): the alloc path itself evicts on
//! out-of-memory, calling the copy callables from here, and keeps their host
//! copies as the Python objects they return.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pygpukit_core::pool::{
    Copier, EvictError, EvictionStats, Evictor, Forgotten, Handle, HostArenaSource, Pool,
    PoolConfig, PoolError, PoolStats,
};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::PyDict;

use crate::arena_source::{PySource, Source};
use crate::errors;
use crate::reentry::Owner;

/// `copy_out(addr, nbytes) -> host` and `copy_in(host, addr)` from Python.
struct PyCopier<'a, 'py> {
    py: Python<'py>,
    out: &'a Py<PyAny>,
    back: &'a Py<PyAny>,
}

impl Copier for PyCopier<'_, '_> {
    type Host = Py<PyAny>;
    type Error = PyErr;

    fn copy_out(&mut self, addr: u64, bytes: u64) -> PyResult<Py<PyAny>> {
        self.out.call1(self.py, (addr, bytes))
    }

    fn copy_in(&mut self, host: &Py<PyAny>, addr: u64) -> PyResult<()> {
        self.back
            .call1(self.py, (host.clone_ref(self.py), addr))
            .map(drop)
    }
}

struct Eviction {
    lru: Evictor<Py<PyAny>>,
    copy_out: Py<PyAny>,
    copy_in: Py<PyAny>,
}

/// Everything the pool's lock guards.
pub(crate) struct State {
    pub(crate) pool: Pool<Source>,
    eviction: Option<Eviction>,
}

/// A pool call made from inside one of the pool's own callables (a GC pass
/// releasing storages during a copy or cuMemAlloc): applied when the outer
/// call finishes, so no block is leaked and no pin is lost.
enum Deferred {
    Free(u64),
    Forget(Handle),
    Unpin(Handle),
}

type EvictResult<T> = Result<T, EvictError<PyErr>>;

/// A thread-safe memory pool. Without callables its arenas are host memory
/// (for the NumPy backend); with `alloc_arena(nbytes) -> address` and
/// `free_arena(address, nbytes)` they come from the caller (device memory).
/// `alloc(0)` returns a distinct 256-byte block, so every live allocation
/// has its own address.
#[pyclass(frozen, name = "Pool", module = "pygpukit._rust")]
pub struct PyPool {
    inner: Mutex<State>,
    owner: Owner,
    /// Calls made from inside a callable on the thread holding the lock.
    deferred: Mutex<Vec<Deferred>>,
    /// Whether `deferred` may hold something: every call checks, few find any.
    pending: AtomicBool,
}

fn stats_dict<'py>(py: Python<'py>, s: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("arenas", s.arenas)?;
    d.set_item("reserved_bytes", s.reserved_bytes)?;
    d.set_item("in_use_bytes", s.in_use_bytes)?;
    d.set_item("peak_in_use_bytes", s.peak_in_use_bytes)?;
    d.set_item("live_blocks", s.live_blocks)?;
    d.set_item("free_blocks", s.free_blocks)?;
    d.set_item("largest_free_block", s.largest_free_block)?;
    d.set_item("alloc_count", s.alloc_count)?;
    d.set_item("free_count", s.free_count)?;
    d.set_item("quota_bytes", s.quota_bytes)?;
    d.set_item("oom_count", s.oom_count)?;
    d.set_item("arena_bytes", s.arena_bytes)?;
    Ok(d)
}

fn eviction_dict<'py>(py: Python<'py>, s: &EvictionStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("evictions", s.evictions)?;
    d.set_item("evicted_bytes", s.evicted_bytes)?;
    d.set_item("restores", s.restores)?;
    d.set_item("restored_bytes", s.restored_bytes)?;
    d.set_item("tracked", s.resident)?;
    d.set_item("resident_bytes", s.resident_bytes)?;
    d.set_item("evicted_now", s.evicted_now)?;
    d.set_item("evicted_now_bytes", s.evicted_now_bytes)?;
    Ok(d)
}

fn no_eviction() -> PyErr {
    PyValueError::new_err("this pool does not evict: call enable_eviction() first")
}

/// Runs `f` on the evictor with the pool and a copier over the callables. On
/// a pool that does not evict it fails with a ValueError, carried as the
/// Python error to raise (as a copy callable's own error is).
fn evicting<R>(
    py: Python<'_>,
    st: &mut State,
    f: impl FnOnce(&mut Evictor<Py<PyAny>>, &mut Pool<Source>, &mut PyCopier<'_, '_>) -> EvictResult<R>,
) -> EvictResult<R> {
    let State { pool, eviction } = st;
    let Some(ev) = eviction else {
        return Err(EvictError::Copy(no_eviction()));
    };
    let mut copier = PyCopier {
        py,
        out: &ev.copy_out,
        back: &ev.copy_in,
    };
    f(&mut ev.lru, pool, &mut copier)
}

fn non_negative(what: &str, v: i128) -> PyResult<u64> {
    u64::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("{what} must be in [0, 2**64), got {v}")))
}

impl PyPool {
    fn bytes_of(st: &State, h: Handle) -> u64 {
        st.eviction
            .as_ref()
            .and_then(|ev| ev.lru.bytes(h))
            .unwrap_or(0)
    }

    pub(crate) fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut State) -> R) -> PyResult<R> {
        self.owner.check("Pool")?;
        // Host copies of storages released meanwhile: dropped once the lock is
        // let go, since a Python destructor may call back into the pool.
        let mut dropped = Vec::new();
        let out = {
            let mut guard = self
                .inner
                .lock_py_attached(py)
                .map_err(|_| PyRuntimeError::new_err("Pool is poisoned by an earlier panic"))?;
            let _own = self.owner.claim();
            let out = f(&mut guard);
            self.apply_deferred(py, &mut guard, &mut dropped);
            out
        };
        drop(dropped);
        Ok(out)
    }

    /// Defers `op` when this thread holds the lock (it is inside one of the
    /// pool's callables); false when the caller must apply it now.
    fn defer(&self, op: Deferred) -> bool {
        if !self.owner.is_mine() {
            return false;
        }
        match self.deferred.lock() {
            Ok(mut d) => {
                d.push(op);
                self.pending.store(true, Ordering::Release);
                true
            }
            Err(_) => false,
        }
    }

    fn apply_deferred(&self, py: Python<'_>, st: &mut State, dropped: &mut Vec<Py<PyAny>>) {
        // Only this thread (the lock holder) pushes while the lock is held.
        if !self.pending.swap(false, Ordering::Acquire) {
            return;
        }
        let pending = match self.deferred.lock() {
            Ok(mut d) => std::mem::take(&mut *d),
            Err(_) => return,
        };
        for op in pending {
            let res = match op {
                Deferred::Free(addr) => st.pool.free(addr).map_err(|e| e.to_string()),
                Deferred::Forget(h) => match Self::forget_in(st, h) {
                    Ok(Some(host)) => {
                        dropped.push(host);
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e.to_string()),
                },
                Deferred::Unpin(h) => match &mut st.eviction {
                    Some(ev) => ev.lru.unpin::<PyErr>(h).map_err(|e| e.to_string()),
                    None => Err("unpin: this pool does not evict".into()),
                },
            };
            if let Err(msg) = res {
                PyValueError::new_err(msg).write_unraisable(py, None);
            }
        }
    }

    /// Stops tracking `h`; returns an evicted entry's host copy to drop.
    fn forget_in(st: &mut State, h: Handle) -> EvictResult<Option<Py<PyAny>>> {
        let State { pool, eviction } = st;
        let Some(ev) = eviction else {
            return Err(EvictError::Copy(no_eviction()));
        };
        match ev.lru.forget(pool, h)? {
            Forgotten::Freed => Ok(None),
            Forgotten::Host(host) => Ok(Some(host)),
        }
    }

    /// A free callable that raised inside an otherwise successful call is
    /// reported without failing that call (which may hold a fresh block).
    fn report_free_error(py: Python<'_>, pool: &mut Pool<Source>) {
        if let Some(e) = pool.source_mut().take_free_error() {
            e.write_unraisable(py, None);
        }
    }

    /// The Python error for a failed pool or eviction call that asked for
    /// `requested` bytes: the copy callable's own exception, the arena
    /// callable's when it raised something other than MemoryError, else
    /// OutOfMemoryError with the pool's stats (chained to the callable's).
    fn finish<T>(
        py: Python<'_>,
        pool: &mut Pool<Source>,
        res: EvictResult<T>,
        requested: u64,
    ) -> PyResult<T> {
        let source_err = pool.source_mut().take_alloc_error();
        Self::report_free_error(py, pool);
        match res {
            Ok(v) => Ok(v),
            Err(EvictError::Pool(PoolError::OutOfMemory(oom))) => {
                if let Some(e) = &source_err {
                    if !e.is_instance_of::<PyMemoryError>(py) {
                        return Err(e.clone_ref(py));
                    }
                }
                let msg = PoolError::OutOfMemory(oom.clone()).to_string();
                let err = errors::out_of_memory(py, msg, stats_dict(py, &oom.stats)?, requested);
                err.set_cause(py, source_err);
                Err(err)
            }
            Err(EvictError::Copy(e)) => Err(e),
            Err(e) => Err(PyValueError::new_err(e.to_string())),
        }
    }

    /// Runs an eviction call that may allocate `requested` bytes and turns
    /// its error into the Python one.
    fn evict_call<R>(
        &self,
        py: Python<'_>,
        requested: impl FnOnce(&State) -> u64,
        f: impl FnOnce(
            &mut Evictor<Py<PyAny>>,
            &mut Pool<Source>,
            &mut PyCopier<'_, '_>,
        ) -> EvictResult<R>,
    ) -> PyResult<R> {
        self.with(py, |st| {
            let n = requested(st);
            let res = evicting(py, st, f);
            Self::finish(py, &mut st.pool, res, n)
        })?
    }
}

#[pymethods]
impl PyPool {
    #[new]
    #[pyo3(signature = (arena_bytes = 64 << 20, quota_bytes = None, alloc_arena = None, free_arena = None))]
    fn new(
        arena_bytes: i128,
        quota_bytes: Option<i128>,
        alloc_arena: Option<Py<PyAny>>,
        free_arena: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let arena_bytes = non_negative("arena_bytes", arena_bytes)?;
        if arena_bytes == 0 {
            return Err(PyValueError::new_err("arena_bytes must be positive"));
        }
        let quota_bytes = quota_bytes
            .map(|q| non_negative("quota_bytes", q))
            .transpose()?;
        let source = match (alloc_arena, free_arena) {
            (None, None) => Source::Host(HostArenaSource::new()),
            (Some(a), Some(f)) => Source::Py(PySource::new(a, f)),
            _ => {
                return Err(PyValueError::new_err(
                    "alloc_arena and free_arena must be given together",
                ))
            }
        };
        let cfg = PoolConfig {
            arena_bytes,
            quota_bytes,
        };
        Ok(Self {
            inner: Mutex::new(State {
                pool: Pool::new(cfg, source),
                eviction: None,
            }),
            owner: Owner::default(),
            deferred: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
        })
    }

    /// Returns the address of a block of at least `nbytes` bytes, 256-aligned.
    /// On a pool that evicts, an allocation that does not fit evicts least
    /// recently used unpinned storages first (the block is not tracked).
    fn alloc(&self, py: Python<'_>, nbytes: i128) -> PyResult<u64> {
        let n = non_negative("nbytes", nbytes)?;
        self.with(py, |st| {
            let res = match &st.eviction {
                Some(_) => evicting(py, st, |lru, pool, c| lru.alloc(pool, c, n)),
                None => st.pool.alloc(n).map_err(EvictError::Pool),
            };
            Self::finish(py, &mut st.pool, res, n)
        })?
    }

    /// Frees a block; an address that is not live raises ValueError. Called
    /// from inside one of this pool's own callables, the free is applied
    /// (and checked) when the outer call returns.
    pub(crate) fn free(&self, py: Python<'_>, addr: i128) -> PyResult<()> {
        let addr = non_negative("addr", addr)?;
        if self.defer(Deferred::Free(addr)) {
            return Ok(());
        }
        self.with(py, |st| st.pool.free(addr))?
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Makes the storages allocated from now on (`alloc_storage`) evictable:
    /// `copy_out(addr, nbytes)` returns a host copy of a block, `copy_in(host,
    /// addr)` writes one back. Called again, it replaces the callables.
    fn enable_eviction(
        &self,
        py: Python<'_>,
        copy_out: Py<PyAny>,
        copy_in: Py<PyAny>,
    ) -> PyResult<()> {
        self.with(py, |st| match &mut st.eviction {
            Some(ev) => {
                ev.copy_out = copy_out;
                ev.copy_in = copy_in;
            }
            None => {
                st.eviction = Some(Eviction {
                    lru: Evictor::new(),
                    copy_out,
                    copy_in,
                })
            }
        })
    }

    /// Whether enable_eviction() was called.
    #[getter]
    fn evicts(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |st| st.eviction.is_some())
    }

    /// `(address, handle)` of a new block of `nbytes`: tracked for eviction
    /// (handle an int) on a pool that evicts, else untracked (handle None).
    pub(crate) fn alloc_storage(
        &self,
        py: Python<'_>,
        nbytes: i128,
    ) -> PyResult<(u64, Option<Handle>)> {
        let n = non_negative("nbytes", nbytes)?;
        self.with(py, |st| {
            let res = match &st.eviction {
                Some(_) => evicting(py, st, |lru, pool, c| lru.alloc_tracked(pool, c, n))
                    .map(|(h, addr)| (addr, Some(h))),
                None => st
                    .pool
                    .alloc(n)
                    .map(|a| (a, None))
                    .map_err(EvictError::Pool),
            };
            Self::finish(py, &mut st.pool, res, n)
        })?
    }

    /// The tracked storage's address now: restored first if it was evicted
    /// (which may evict others); marks it the most recently used.
    pub(crate) fn touch(&self, py: Python<'_>, handle: Handle) -> PyResult<u64> {
        self.evict_call(
            py,
            |st| Self::bytes_of(st, handle),
            |lru, pool, c| lru.touch(pool, c, handle),
        )
    }

    /// Keeps the tracked storage resident at a fixed address until the
    /// matching unpin(); returns that address.
    fn pin(&self, py: Python<'_>, handle: Handle) -> PyResult<u64> {
        self.evict_call(
            py,
            |st| Self::bytes_of(st, handle),
            |lru, pool, c| lru.pin(pool, c, handle),
        )
    }

    /// Releases one pin(); deferred when called from inside a callable.
    fn unpin(&self, py: Python<'_>, handle: Handle) -> PyResult<()> {
        if self.defer(Deferred::Unpin(handle)) {
            return Ok(());
        }
        self.evict_call(py, |_| 0, |lru, _, _| lru.unpin(handle))
    }

    /// Stops tracking a storage: frees its block, or drops its host copy.
    /// Deferred when called from inside a callable (a GC pass).
    pub(crate) fn forget(&self, py: Python<'_>, handle: Handle) -> PyResult<()> {
        if self.defer(Deferred::Forget(handle)) {
            return Ok(());
        }
        let host = self.with(py, |st| {
            let res = Self::forget_in(st, handle);
            Self::finish(py, &mut st.pool, res, 0)
        })??;
        drop(host); // after the lock is let go: its destructor may call back in
        Ok(())
    }

    /// Whether the tracked storage is held on the host now.
    fn is_evicted(&self, py: Python<'_>, handle: Handle) -> PyResult<bool> {
        self.with(py, |st| {
            let ev = st.eviction.as_ref().ok_or_else(no_eviction)?;
            match ev.lru.addr(handle) {
                Some(addr) => Ok(addr.is_none()),
                None => Err(PyValueError::new_err(format!(
                    "storage handle {handle} is not tracked"
                ))),
            }
        })?
    }

    /// The tracked storage's pin count.
    fn pins(&self, py: Python<'_>, handle: Handle) -> PyResult<u32> {
        self.with(py, |st| {
            let ev = st.eviction.as_ref().ok_or_else(no_eviction)?;
            ev.lru.pins(handle).ok_or_else(|| {
                PyValueError::new_err(format!("storage handle {handle} is not tracked"))
            })
        })?
    }

    /// Evictions so far (0 on a pool that does not evict): a compiled call
    /// compares it around reading addresses to see whether a block moved.
    #[getter]
    pub(crate) fn evictions(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |st| {
            st.eviction
                .as_ref()
                .map_or(0, |ev| ev.lru.stats().evictions)
        })
    }

    /// Eviction counters and what is resident and evicted now; None on a
    /// pool that does not evict.
    fn eviction_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let s = self.with(py, |st| st.eviction.as_ref().map(|ev| ev.lru.stats()))?;
        s.map(|s| eviction_dict(py, &s)).transpose()
    }

    /// Usable size of the live block at `addr` (the request rounded up to 256).
    fn size_of(&self, py: Python<'_>, addr: i128) -> PyResult<u64> {
        let addr = non_negative("addr", addr)?;
        self.with(py, |st| st.pool.size_of(addr))?
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Gives fully free arenas back to their source; returns the bytes released.
    fn release_cached(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |st| {
            let got = st.pool.release_cached();
            match st.pool.source_mut().take_free_error() {
                Some(e) => Err(e),
                None => Ok(got),
            }
        })?
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |st| st.pool.stats())?;
        stats_dict(py, &s)
    }

    /// (base, size, used_bytes) of every arena, by address.
    fn arenas(&self, py: Python<'_>) -> PyResult<Vec<(u64, u64, u64)>> {
        self.with(py, |st| {
            st.pool
                .arenas()
                .into_iter()
                .map(|a| (a.base, a.size, a.used_bytes))
                .collect()
        })
    }

    #[getter]
    fn arena_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |st| st.pool.config().arena_bytes)
    }

    #[getter]
    fn quota_bytes(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.with(py, |st| st.pool.config().quota_bytes)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let s = self.with(py, |st| st.pool.stats())?;
        Ok(format!("<pygpukit._rust.Pool {s}>"))
    }
}
