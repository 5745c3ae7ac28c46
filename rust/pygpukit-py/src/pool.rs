//! `pygpukit._rust.Pool`: the memory pool behind every GPUArray.

use std::sync::Mutex;

use pygpukit_core::pool::{HostArenaSource, Pool, PoolConfig, PoolError, PoolStats};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::PyDict;

use crate::arena_source::{PySource, Source};
use crate::errors;
use crate::reentry::Owner;

/// A thread-safe memory pool. Without callables its arenas are host memory
/// (for the NumPy backend); with `alloc_arena(nbytes) -> address` and
/// `free_arena(address, nbytes)` they come from the caller (device memory).
/// `alloc(0)` returns a distinct 256-byte block, so every live allocation
/// has its own address.
#[pyclass(frozen, name = "Pool", module = "pygpukit._rust")]
pub struct PyPool {
    inner: Mutex<Pool<Source>>,
    owner: Owner,
    /// Frees requested from inside an arena callable on the thread holding
    /// the lock (a GC pass dropping arrays during cuMemAlloc); applied when
    /// that outer call finishes, so the blocks are never leaked.
    deferred: Mutex<Vec<u64>>,
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

fn non_negative(what: &str, v: i128) -> PyResult<u64> {
    u64::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("{what} must be in [0, 2**64), got {v}")))
}

impl PyPool {
    pub(crate) fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Pool<Source>) -> R,
    ) -> PyResult<R> {
        self.owner.check("Pool")?;
        let mut guard = self
            .inner
            .lock_py_attached(py)
            .map_err(|_| PyRuntimeError::new_err("Pool is poisoned by an earlier panic"))?;
        let _own = self.owner.claim();
        let out = f(&mut guard);
        self.apply_deferred(py, &mut guard);
        Ok(out)
    }

    fn apply_deferred(&self, py: Python<'_>, pool: &mut Pool<Source>) {
        let pending = match self.deferred.lock() {
            Ok(mut d) => std::mem::take(&mut *d),
            Err(_) => return,
        };
        for addr in pending {
            if let Err(e) = pool.free(addr) {
                PyValueError::new_err(e.to_string()).write_unraisable(py, None);
            }
        }
    }

    /// A free callable that raised inside an otherwise successful call is
    /// reported without failing that call (which may hold a fresh block).
    fn report_free_error(py: Python<'_>, pool: &mut Pool<Source>) {
        if let Some(e) = pool.source_mut().take_free_error() {
            e.write_unraisable(py, None);
        }
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
            inner: Mutex::new(Pool::new(cfg, source)),
            owner: Owner::default(),
            deferred: Mutex::new(Vec::new()),
        })
    }

    /// Returns the address of a block of at least `nbytes` bytes, 256-aligned.
    fn alloc(&self, py: Python<'_>, nbytes: i128) -> PyResult<u64> {
        let n = non_negative("nbytes", nbytes)?;
        self.with(py, |pool| {
            let res = pool.alloc(n);
            let source_err = pool.source_mut().take_alloc_error();
            Self::report_free_error(py, pool);
            match res {
                Ok(addr) => Ok(addr),
                Err(PoolError::OutOfMemory(oom)) => {
                    // A callable that raised something other than MemoryError
                    // has a bug; surface it as is rather than as an OOM.
                    if let Some(e) = &source_err {
                        if !e.is_instance_of::<PyMemoryError>(py) {
                            return Err(e.clone_ref(py));
                        }
                    }
                    let msg = PoolError::OutOfMemory(oom.clone()).to_string();
                    let err = errors::out_of_memory(py, msg, stats_dict(py, &oom.stats)?, n);
                    err.set_cause(py, source_err);
                    Err(err)
                }
                Err(e) => Err(PyValueError::new_err(e.to_string())),
            }
        })?
    }

    /// Frees a block; an address that is not live raises ValueError. Called
    /// from inside one of this pool's own arena callables, the free is
    /// applied (and checked) when the outer call returns.
    fn free(&self, py: Python<'_>, addr: i128) -> PyResult<()> {
        let addr = non_negative("addr", addr)?;
        if self.owner.is_mine() {
            if let Ok(mut d) = self.deferred.lock() {
                d.push(addr);
                return Ok(());
            }
        }
        self.with(py, |pool| pool.free(addr))?
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Usable size of the live block at `addr` (the request rounded up to 256).
    fn size_of(&self, py: Python<'_>, addr: i128) -> PyResult<u64> {
        let addr = non_negative("addr", addr)?;
        self.with(py, |pool| pool.size_of(addr))?
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Gives fully free arenas back to their source; returns the bytes released.
    fn release_cached(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |pool| {
            let got = pool.release_cached();
            match pool.source_mut().take_free_error() {
                Some(e) => Err(e),
                None => Ok(got),
            }
        })?
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |pool| pool.stats())?;
        stats_dict(py, &s)
    }

    /// (base, size, used_bytes) of every arena, by address.
    fn arenas(&self, py: Python<'_>) -> PyResult<Vec<(u64, u64, u64)>> {
        self.with(py, |pool| {
            pool.arenas()
                .into_iter()
                .map(|a| (a.base, a.size, a.used_bytes))
                .collect()
        })
    }

    #[getter]
    fn arena_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |pool| pool.config().arena_bytes)
    }

    #[getter]
    fn quota_bytes(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.with(py, |pool| pool.config().quota_bytes)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let s = self.with(py, |pool| pool.stats())?;
        Ok(format!("<pygpukit._rust.Pool {s}>"))
    }
}
