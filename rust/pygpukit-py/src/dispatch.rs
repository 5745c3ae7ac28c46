//! `pygpukit._rust.Dispatcher`: the dispatch controller (pygpukit_core::dispatch)
//! over the native module's launch C ABI, and `register_launch_capi`.
//!
//! Python records a plan once per (schedule, input layouts) and hands it in
//! with `insert`; later realizes of that schedule call `run` once: the
//! temporaries come from the pool, the parameters are packed and every kernel
//! is launched here, with no return to Python per kernel.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use pygpukit_core::dispatch::{
    Controller, DispatchError, FakeLauncher, KernelLaunch, LaunchPlan, Launcher, Param, TempAlloc,
};
use pygpukit_core::pool::Handle;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict};

use crate::pool::PyPool;

const CAPI_VERSION: u32 = 1;
const CAPI_NAME: &CStr = c"pygpukit._native.launch_capi";
const NOT_READY: i32 = 600;

/// The layout of native/src/capi_launch.h's PgkLaunchCapi.
#[repr(C)]
struct LaunchCapi {
    version: u32,
    size: u32,
    launch: unsafe extern "C" fn(
        u64,
        u64,
        *const u32,
        *const u32,
        u32,
        u64,
        i32,
        *mut *mut c_void,
    ) -> i32,
    event_create: unsafe extern "C" fn(u64, *mut u64) -> i32,
    event_record: unsafe extern "C" fn(u64, u64) -> i32,
    event_query: unsafe extern "C" fn(u64) -> i32,
    event_synchronize: unsafe extern "C" fn(u64) -> i32,
    event_destroy: unsafe extern "C" fn(u64) -> i32,
    error_string: unsafe extern "C" fn(i32) -> *const c_char,
    graph_launch: unsafe extern "C" fn(u64, u64) -> i32,
}

/// Set once by register_launch_capi; the table is static in the native module.
static CAPI: AtomicPtr<LaunchCapi> = AtomicPtr::new(std::ptr::null_mut());

/// Takes the native module's launch table (`_native.launch_capi()`); checked
/// by capsule name, version and size. Registering again replaces it.
#[pyfunction]
pub fn register_launch_capi(capsule: &Bound<'_, PyCapsule>) -> PyResult<()> {
    let ptr = capsule.pointer_checked(Some(CAPI_NAME))?.as_ptr() as *mut LaunchCapi;
    // SAFETY: the capsule's name says it holds a PgkLaunchCapi, static in _native.
    let table = unsafe { &*ptr };
    if table.version != CAPI_VERSION || (table.size as usize) < std::mem::size_of::<LaunchCapi>() {
        return Err(PyValueError::new_err(format!(
            "launch C ABI version {} (size {}) is not the one this module speaks ({CAPI_VERSION}); \
             rebuild pygpukit._native and pygpukit._rust together",
            table.version, table.size
        )));
    }
    CAPI.store(ptr, Ordering::Release);
    Ok(())
}

/// cuGraphLaunch of the instantiated graph `exec` into `stream` through the launch C ABI:
/// the driver's code (0: launched), or None when no table is registered (no GPU).
pub(crate) fn graph_launch(exec: u64, stream: u64) -> Option<i32> {
    let ptr = CAPI.load(Ordering::Acquire);
    if ptr.is_null() {
        return None;
    }
    // SAFETY: registered from a checked capsule; the table is static. The caller holds the
    // replay object that owns `exec`.
    Some(unsafe { ((*ptr).graph_launch)(exec, stream) })
}

struct Capi(&'static LaunchCapi);

impl Capi {
    fn err(&self, code: i32) -> (i32, String) {
        // SAFETY: error_string returns a static NUL-terminated string.
        let msg = unsafe { CStr::from_ptr((self.0.error_string)(code)) };
        (code, msg.to_string_lossy().into_owned())
    }

    fn check(&self, code: i32) -> Result<(), (i32, String)> {
        if code == 0 {
            Ok(())
        } else {
            Err(self.err(code))
        }
    }
}

impl Launcher for Capi {
    type Event = u64;

    fn launch(
        &self,
        l: &KernelLaunch,
        stream: u64,
        params: &mut [*mut c_void],
    ) -> Result<(), (i32, String)> {
        let p = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: the function handle is kept alive by the plan (its Function object);
        // params point at 8-byte slots that outlive the call.
        let rc = unsafe {
            (self.0.launch)(
                l.ctx,
                l.func,
                l.grid.as_ptr(),
                l.block.as_ptr(),
                l.shared_mem,
                stream,
                l.pdl as i32,
                p,
            )
        };
        self.check(rc)
    }

    fn event_create(&self, ctx: u64) -> Result<u64, (i32, String)> {
        let mut e = 0u64;
        // SAFETY: plain driver call writing one handle.
        self.check(unsafe { (self.0.event_create)(ctx, &mut e) })?;
        Ok(e)
    }

    fn event_record(&self, e: &u64, stream: u64) -> Result<(), (i32, String)> {
        // SAFETY: e was created by event_create and not destroyed.
        self.check(unsafe { (self.0.event_record)(*e, stream) })
    }

    fn event_done(&self, e: &u64) -> Result<bool, (i32, String)> {
        // SAFETY: as above.
        match unsafe { (self.0.event_query)(*e) } {
            0 => Ok(true),
            NOT_READY => Ok(false),
            rc => Err(self.err(rc)),
        }
    }

    fn event_wait(&self, e: &u64) -> Result<(), (i32, String)> {
        // SAFETY: as above.
        self.check(unsafe { (self.0.event_synchronize)(*e) })
    }

    fn event_destroy(&self, e: u64) {
        // SAFETY: as above; a failure leaks one event handle at most.
        unsafe { (self.0.event_destroy)(e) };
    }
}

enum AnyLauncher<'a> {
    Capi(Capi),
    Fake(&'a FakeLauncher),
}

impl Launcher for AnyLauncher<'_> {
    type Event = u64;

    fn launch(
        &self,
        l: &KernelLaunch,
        stream: u64,
        params: &mut [*mut c_void],
    ) -> Result<(), (i32, String)> {
        match self {
            AnyLauncher::Capi(c) => c.launch(l, stream, params),
            AnyLauncher::Fake(f) => f.launch(l, stream, params),
        }
    }

    fn event_create(&self, ctx: u64) -> Result<u64, (i32, String)> {
        match self {
            AnyLauncher::Capi(c) => c.event_create(ctx),
            AnyLauncher::Fake(f) => f.event_create(ctx),
        }
    }

    fn event_record(&self, e: &u64, stream: u64) -> Result<(), (i32, String)> {
        match self {
            AnyLauncher::Capi(c) => c.event_record(e, stream),
            AnyLauncher::Fake(f) => f.event_record(e, stream),
        }
    }

    fn event_done(&self, e: &u64) -> Result<bool, (i32, String)> {
        match self {
            AnyLauncher::Capi(c) => c.event_done(e),
            AnyLauncher::Fake(f) => f.event_done(e),
        }
    }

    fn event_wait(&self, e: &u64) -> Result<(), (i32, String)> {
        match self {
            AnyLauncher::Capi(c) => c.event_wait(e),
            AnyLauncher::Fake(f) => f.event_wait(e),
        }
    }

    fn event_destroy(&self, e: u64) {
        match self {
            AnyLauncher::Capi(c) => c.event_destroy(e),
            AnyLauncher::Fake(f) => f.event_destroy(e),
        }
    }
}

/// Temporaries from a `_rust.Pool`; a failed allocation is None (the caller
/// falls back to its general path, which can evict).
struct PoolTemps<'a, 'py> {
    pool: &'a PyPool,
    py: Python<'py>,
    failed: Option<PyErr>,
}

impl TempAlloc for PoolTemps<'_, '_> {
    fn alloc(&mut self, nbytes: u64) -> Option<u64> {
        let got = self.pool.with(self.py, |st| {
            let p = &mut st.pool;
            let r = p.alloc(nbytes).ok();
            let _ = p.source_mut().take_alloc_error(); // an OOM: the fallback path reports it
            r
        });
        match got {
            Ok(r) => r,
            Err(e) => {
                self.failed = Some(e);
                None
            }
        }
    }

    fn free(&mut self, addr: u64) {
        if let Err(e) = self.pool.with(self.py, |st| st.pool.free(addr)) {
            self.failed.get_or_insert(e);
        }
    }
}

/// Cached launch plans by u64 key, replayed with one call.
///
/// `fake=True`: launches and events are logged (`fake_log()`), nothing
/// reaches a device: the controller's behaviour is testable without a GPU.
#[pyclass(frozen, name = "Dispatcher", module = "pygpukit._rust")]
pub struct PyDispatcher {
    inner: Mutex<Controller<u64, Vec<Py<PyAny>>>>,
    fake: Option<FakeLauncher>,
}

fn dispatch_err(e: DispatchError) -> PyErr {
    match e {
        DispatchError::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
        DispatchError::BadPlan(_) | DispatchError::BadCall(_) => {
            PyValueError::new_err(e.to_string())
        }
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

fn param(kind: u8, a: i128, offset: i64) -> PyResult<Param> {
    let index = || u32::try_from(a).map_err(|_| PyValueError::new_err(format!("bad index {a}")));
    Ok(match kind {
        0 => Param::Const(if a < 0 {
            a as i64 as u64
        } else {
            u64::try_from(a)
                .map_err(|_| PyValueError::new_err(format!("constant {a} does not fit 64 bits")))?
        }),
        1 => Param::Input {
            index: index()?,
            offset,
        },
        2 => Param::Output {
            index: index()?,
            offset,
        },
        3 => Param::Temp {
            index: index()?,
            offset,
        },
        _ => {
            return Err(PyValueError::new_err(format!(
                "parameter kind {kind} (0 const, 1 input, 2 output, 3 temporary)"
            )))
        }
    })
}

fn dims(v: &[u32], what: &str) -> PyResult<[u32; 3]> {
    if v.is_empty() || v.len() > 3 {
        return Err(PyValueError::new_err(format!(
            "{what} must have 1 to 3 dimensions"
        )));
    }
    let mut d = [1u32; 3];
    d[..v.len()].copy_from_slice(v);
    Ok(d)
}

/// A pool block as `alloc_storage` returns it: (address, handle if tracked).
pub(crate) type Block = (u64, Option<Handle>);

type LaunchSpec = (
    Py<PyAny>,
    u64,
    u64,
    Vec<u32>,
    Vec<u32>,
    u32,
    bool,
    Vec<(u8, i128, i64)>,
);

impl PyDispatcher {
    fn launcher(&self) -> PyResult<AnyLauncher<'_>> {
        if let Some(f) = &self.fake {
            return Ok(AnyLauncher::Fake(f));
        }
        let ptr = CAPI.load(Ordering::Acquire);
        if ptr.is_null() {
            return Err(PyRuntimeError::new_err(
                "no launch C ABI registered: call _rust.register_launch_capi(_native.launch_capi()) first",
            ));
        }
        // SAFETY: registered from a checked capsule; the table is static.
        Ok(AnyLauncher::Capi(Capi(unsafe { &*ptr })))
    }

    fn lock(
        &self,
        py: Python<'_>,
    ) -> PyResult<std::sync::MutexGuard<'_, Controller<u64, Vec<Py<PyAny>>>>> {
        self.inner
            .lock_py_attached(py)
            .map_err(|_| PyRuntimeError::new_err("Dispatcher is poisoned by an earlier panic"))
    }

    /// Runs the plan under `key` with temporaries from `pool`: Err when the launch
    /// ABI is missing or a temporary's allocation raised; otherwise the controller's
    /// answer (false: no plan under `key`).
    fn run_plan(
        &self,
        py: Python<'_>,
        pool: &PyPool,
        key: u64,
        inputs: &[u64],
        outputs: &[u64],
        stream: u64,
    ) -> PyResult<Result<bool, DispatchError>> {
        let launcher = self.launcher()?;
        let mut temps = PoolTemps {
            pool,
            py,
            failed: None,
        };
        let res = self
            .lock(py)?
            .run(&launcher, &mut temps, key, inputs, outputs, stream);
        match temps.failed {
            Some(e) => Err(e),
            None => Ok(res),
        }
    }

    /// run_alloc's work, for the Python method and the native eager hit (eager.rs).
    pub(crate) fn run_allocating(
        &self,
        py: Python<'_>,
        key: u64,
        inputs: &[Block],
        out_bytes: &[u64],
        stream: u64,
        pool: &PyPool,
    ) -> PyResult<Option<Vec<Block>>> {
        self.launcher()?; // no launch ABI: fail before touching or allocating anything
        let evictions = pool.evictions(py)?;
        let mut ptrs = Vec::with_capacity(inputs.len());
        for &(a, h) in inputs {
            ptrs.push(match h {
                Some(h) => pool.touch(py, h)? + a,
                None => a,
            });
        }
        let mut outs: Vec<Block> = Vec::with_capacity(out_bytes.len());
        let release = |outs: &[Block]| -> PyResult<()> {
            for &(addr, h) in outs {
                match h {
                    Some(h) => pool.forget(py, h)?,
                    None => pool.free(py, i128::from(addr))?,
                }
            }
            Ok(())
        };
        for &n in out_bytes {
            match pool.alloc_storage(py, i128::from(n)) {
                Ok(o) => outs.push(o),
                Err(e) => {
                    release(&outs)?;
                    return Err(e);
                }
            }
        }
        if pool.evictions(py)? != evictions {
            release(&outs)?;
            return Ok(None);
        }
        let addrs: Vec<u64> = outs.iter().map(|o| o.0).collect();
        let res = match self.run_plan(py, pool, key, &ptrs, &addrs, stream) {
            Ok(res) => res,
            Err(e) => {
                release(&outs)?;
                return Err(e);
            }
        };
        match res {
            Ok(true) => Ok(Some(outs)),
            Ok(false) | Err(DispatchError::OutOfMemory { .. }) => {
                release(&outs)?;
                Ok(None)
            }
            Err(e) => {
                release(&outs)?;
                Err(dispatch_err(e))
            }
        }
    }
}

#[pymethods]
impl PyDispatcher {
    /// capacity: plans kept (least recently used dropped first); every,
    /// max_markers: a completion marker per `every` launches on a stream, at
    /// most `max_markers` outstanding (the host waits for the oldest beyond).
    #[new]
    #[pyo3(signature = (capacity = 4096, every = 64, max_markers = 16, fake = false))]
    fn new(capacity: usize, every: u64, max_markers: usize, fake: bool) -> Self {
        Self {
            inner: Mutex::new(Controller::new(capacity, every, max_markers)),
            fake: fake.then(FakeLauncher::new),
        }
    }

    /// Adds (or replaces) the plan under `key`. launches: (function object
    /// kept alive, context handle, function handle, grid, block, shared_mem,
    /// pdl, params); each param is (kind, value, offset): kind 0 constant bits,
    /// 1 input index, 2 output index, 3 temporary index.
    fn insert(
        &self,
        py: Python<'_>,
        key: u64,
        launches: Vec<LaunchSpec>,
        n_inputs: usize,
        n_outputs: usize,
        temp_bytes: Vec<u64>,
    ) -> PyResult<()> {
        let mut keep = Vec::with_capacity(launches.len());
        let mut ks = Vec::with_capacity(launches.len());
        for (obj, ctx, func, grid, block, shared_mem, pdl, params) in launches {
            keep.push(obj);
            ks.push(KernelLaunch {
                func,
                ctx,
                grid: dims(&grid, "grid")?,
                block: dims(&block, "block")?,
                shared_mem,
                pdl,
                params: params
                    .into_iter()
                    .map(|(k, a, o)| param(k, a, o))
                    .collect::<PyResult<_>>()?,
            });
        }
        let plan = LaunchPlan::new(ks, n_inputs, n_outputs, &temp_bytes).map_err(dispatch_err)?;
        self.lock(py)?.insert(key, plan, keep);
        Ok(())
    }

    /// Runs the plan under `key` on `stream` (a CUstream handle, 0: legacy);
    /// False when there is none. inputs: data pointers; outputs: the caller's
    /// output blocks; temporaries come from `pool`. MemoryError: a temporary
    /// did not fit (nothing stays allocated; take the general path).
    fn run(
        &self,
        py: Python<'_>,
        key: u64,
        inputs: Vec<u64>,
        outputs: Vec<u64>,
        stream: u64,
        pool: &PyPool,
    ) -> PyResult<bool> {
        self.run_plan(py, pool, key, &inputs, &outputs, stream)?
            .map_err(dispatch_err)
    }

    /// One call of an eager op or a cached realize: each input is (address,
    /// None) or (byte offset, storage handle), a handle's block touched (so
    /// restored if evicted, and marked used) for its address now; a block of
    /// each of `out_bytes` is allocated from `pool` (as `alloc_storage`); then
    /// the plan runs. Returns the output blocks as (address, handle), or None
    /// to take the general path, with nothing left allocated: no plan under
    /// `key`, an eviction meanwhile (an input read before may have moved), a
    /// temporary that did not fit. One crossing for what the Python side did
    /// in five (touches, alloc, the eviction count twice, run).
    fn run_alloc(
        &self,
        py: Python<'_>,
        key: u64,
        inputs: Vec<Block>,
        out_bytes: Vec<u64>,
        stream: u64,
        pool: &PyPool,
    ) -> PyResult<Option<Vec<Block>>> {
        self.run_allocating(py, key, &inputs, &out_bytes, stream, pool)
    }

    fn __contains__(&self, py: Python<'_>, key: u64) -> PyResult<bool> {
        Ok(self.lock(py)?.contains(key))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.len())
    }

    /// Drops the plan under `key`; whether there was one.
    fn remove(&self, py: Python<'_>, key: u64) -> PyResult<bool> {
        Ok(self.lock(py)?.remove(key))
    }

    /// Drops every plan.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        self.lock(py)?.clear();
        Ok(())
    }

    /// Waits for every tracked launch (the caller may also have synchronised).
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let launcher = self.launcher()?;
        self.lock(py)?.drain(&launcher).map_err(dispatch_err)
    }

    /// hits, misses, inserted, launches, plans, capacity, evicted, and the
    /// in-flight counters (issued, completed, markers, waits).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.lock(py)?.stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("inserted", s.inserted)?;
        d.set_item("launches", s.launches)?;
        d.set_item("plans", s.plans)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("evicted", s.evicted)?;
        d.set_item("issued", s.in_flight.issued)?;
        d.set_item("completed", s.in_flight.completed)?;
        d.set_item("markers", s.in_flight.markers)?;
        d.set_item("waits", s.in_flight.waits)?;
        Ok(d)
    }

    /// fake=True only: the launches so far as (function, grid, block,
    /// shared_mem, pdl, stream, params as 64-bit slots), then forgotten.
    #[allow(clippy::type_complexity)]
    fn fake_log(&self) -> PyResult<Vec<(u64, [u32; 3], [u32; 3], u32, bool, u64, Vec<u64>)>> {
        let f = self
            .fake
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("not a fake Dispatcher"))?;
        Ok(f.take_log()
            .into_iter()
            .map(|l| {
                (
                    l.func,
                    l.grid,
                    l.block,
                    l.shared_mem,
                    l.pdl,
                    l.stream,
                    l.params,
                )
            })
            .collect())
    }

    /// fake=True only: the launch `n` from now fails (code 700).
    fn fake_fail_launch(&self, n: usize) -> PyResult<()> {
        let f = self
            .fake
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("not a fake Dispatcher"))?;
        f.fail_launch(n);
        Ok(())
    }
}

impl Drop for PyDispatcher {
    fn drop(&mut self) {
        let ctrl = match self.inner.get_mut() {
            Ok(c) => c,
            Err(_) => return,
        };
        if let Some(f) = &self.fake {
            let l = AnyLauncher::Fake(f);
            let _ = ctrl.drain(&l);
            ctrl.destroy_events(&l);
        } else {
            let ptr = CAPI.load(Ordering::Acquire);
            if !ptr.is_null() {
                // SAFETY: static table; events are waited for, then destroyed.
                let l = AnyLauncher::Capi(Capi(unsafe { &*ptr }));
                let _ = ctrl.drain(&l);
                ctrl.destroy_events(&l);
            }
        }
    }
}
