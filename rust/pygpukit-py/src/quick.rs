//! `pygpukit._rust.QuickCall`: the usual hit of a compiled program with one array in and
//! one fresh array out, in one native call: the output block from the pool, the argument's
//! address (a pool touch), the eviction count around both, and the hot graph's launch
//! through the launch C ABI (native/src/capi_launch.h). The CUDA backend's `quick_call`
//! makes it (pygpukit/backends/cuda/planned.py) where its Python closure did the same work;
//! anything it does not serve is None, having changed nothing the caller sees, and the
//! caller then takes `PlannedProgram.call`, which handles every case.
//!
//! It lives here, not in the native module, because it is an allocation and a dispatch
//! decision (the pool's calls are Rust calls from here, with no Python crossing); the one
//! launch it makes goes through the native module's table, as the Dispatcher's do.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyType};
use pyo3::{ffi, intern};
use pyo3::{PyTraverseError, PyVisit};

use crate::dispatch::graph_launch;
use crate::pool::PyPool;
use crate::slots::{StorageSlots, ValueSlots};

/// Whether `key` (a capture key from the program's hot or cold pair) is (token, out, arg).
fn key_is(key: &Bound<'_, PyAny>, token: i64, out: u64, arg: u64) -> bool {
    let Ok(t) = key.cast::<PyTuple>() else {
        return false;
    };
    if t.len() != 3 {
        return false;
    }
    let item = |i: usize| t.get_item(i).ok();
    matches!(item(0).map(|v| v.extract::<i64>()), Some(Ok(v)) if v == token)
        && matches!(item(1).map(|v| v.extract::<u64>()), Some(Ok(v)) if v == out)
        && matches!(item(2).map(|v| v.extract::<u64>()), Some(Ok(v)) if v == arg)
}

/// A backend's last stream object and its CUstream: `backend.stream` read per launch,
/// its handle asked of it once per stream object.
#[derive(Default)]
pub(crate) struct StreamCache(Mutex<Option<(Py<PyAny>, u64)>>);

impl StreamCache {
    /// The CUstream of `backend.stream` (None: the legacy stream, 0).
    pub(crate) fn handle(&self, backend: &Bound<'_, PyAny>) -> PyResult<u64> {
        let py = backend.py();
        let s = backend.getattr(intern!(py, "stream"))?;
        if s.is_none() {
            return Ok(0);
        }
        if let Ok(cache) = self.0.lock() {
            if let Some((obj, h)) = cache.as_ref() {
                if s.is(obj) {
                    return Ok(*h);
                }
            }
        }
        // An int handle or a Stream (its __int__ is the handle), as stream_handle() takes.
        // SAFETY: PyNumber_Long returns a new reference or null with an exception set.
        let h: u64 = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Long(s.as_ptr()))? }
            .extract()?;
        if let Ok(mut cache) = self.0.lock() {
            *cache = Some((s.unbind(), h));
        }
        Ok(h)
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(s) = self.0.lock() {
            if let Some((obj, _)) = s.as_ref() {
                visit.call(obj)?;
            }
        }
        Ok(())
    }
}

/// How a replay object is launched: its instantiated graph's handle, or None where its
/// `replay()` is called (not captured as a graph, a stand-in, no launch C ABI).
struct Launcher {
    replay: Py<PyAny>,
    exec: Option<u64>,
}

/// Cleared by the garbage collector (`__clear__`): it holds the program, whose `quick` it
/// is, and the replays, which hold the program's steps.
#[pyclass(name = "QuickCall", module = "pygpukit._rust")]
pub struct QuickCall {
    q: Option<Quick>,
}

pub(crate) struct Quick {
    prog: Py<PyAny>,
    pool: Py<PyPool>,
    evicts: bool,
    arena: Py<PyAny>,
    backend: Py<PyAny>,
    storage_type: Py<PyType>,
    value_type: Py<PyType>,
    /// The errors of an allocation or touch that mean "take the full path" (a tuple).
    catch: Py<PyAny>,
    /// replay -> its graph's handle or None (asked once per replay object).
    graph_of: Py<PyAny>,
    in_shape: Py<PyAny>,
    in_strides: Py<PyAny>,
    in_dtype: Py<PyAny>,
    in_size: u64,
    out_nbytes: u64,
    out_shape: Py<PyAny>,
    out_strides: Py<PyAny>,
    out_dtype: Py<PyAny>,
    token: i64,
    lo: u64,
    hi: u64,
    st: StorageSlots,
    dv: ValueSlots,
    /// The last replay objects seen (hot and cold alternate as the outputs do).
    launchers: Mutex<Vec<Launcher>>,
    stream: StreamCache,
}

type Layout = (Py<PyAny>, Py<PyAny>, Py<PyAny>, u64);
type Output = (u64, Py<PyAny>, Py<PyAny>, Py<PyAny>);

impl Quick {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for o in [
            &self.prog,
            &self.arena,
            &self.backend,
            &self.catch,
            &self.graph_of,
            &self.in_shape,
            &self.in_strides,
            &self.in_dtype,
            &self.out_shape,
            &self.out_strides,
            &self.out_dtype,
        ] {
            visit.call(o)?;
        }
        visit.call(&self.pool)?;
        visit.call(&self.storage_type)?;
        visit.call(&self.value_type)?;
        self.st.traverse(visit)?;
        self.dv.traverse(visit)?;
        if let Ok(ls) = self.launchers.lock() {
            for l in ls.iter() {
                visit.call(&l.replay)?;
            }
        }
        self.stream.traverse(visit)
    }

    /// The Storage of a block `alloc_storage` returned, as memory.adopt makes it.
    fn adopt<'py>(
        &self,
        py: Python<'py>,
        addr: u64,
        h: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.pool.bind(py).as_any();
        self.st
            .adopt(py, &self.storage_type, pool, self.out_nbytes, addr, h)
    }

    /// The new block's DeviceValue (contiguous, offset 0).
    fn value<'py>(
        &self,
        py: Python<'py>,
        storage: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (shape, strides) = (self.out_shape.bind(py), self.out_strides.bind(py));
        let dtype = self.out_dtype.bind(py);
        self.dv
            .make(py, &self.value_type, &storage, shape, strides, 0, dtype)
    }

    fn same(a: &Bound<'_, PyAny>, b: &Py<PyAny>) -> PyResult<bool> {
        Ok(a.is(b) || a.eq(b)?)
    }

    /// The graph handle to launch `replay` with, asked of graph_of once per replay object.
    fn exec_of(&self, py: Python<'_>, replay: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        if let Ok(ls) = self.launchers.lock() {
            if let Some(l) = ls.iter().find(|l| replay.is(&l.replay)) {
                return Ok(l.exec);
            }
        }
        let exec: Option<u64> = self.graph_of.bind(py).call1((replay,))?.extract()?;
        if let Ok(mut ls) = self.launchers.lock() {
            if ls.len() >= 2 {
                ls.remove(0);
            }
            ls.push(Launcher {
                replay: replay.clone().unbind(),
                exec,
            });
        }
        Ok(exec)
    }

    /// `replay.replay()`: its graph launched from here when it has one (counted in its
    /// `replays`, as CudaReplay.replay counts); else, or when the launch fails, replay()
    /// itself (which raises the driver's error where it fails again).
    fn launch(&self, py: Python<'_>, replay: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Some(exec) = self.exec_of(py, replay)? {
            let stream = self.stream.handle(self.backend.bind(py))?;
            if graph_launch(exec, stream) == Some(0) {
                let n = replay.getattr(intern!(py, "replays"))?.add(1)?;
                return replay.setattr(intern!(py, "replays"), n);
            }
        }
        replay.call_method0(intern!(py, "replay")).map(drop)
    }

    fn catchable(&self, py: Python<'_>, e: &PyErr) -> bool {
        e.is_instance(py, self.catch.bind(py))
    }

    /// The quick call on the argument's value: its output value, or None for the full path.
    pub(crate) fn run<'py>(
        &self,
        py: Python<'py>,
        v: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self
            .arena
            .bind(py)
            .getattr(intern!(py, "freed"))?
            .is_truthy()?
        {
            return Ok(None);
        }
        let pool = self.pool.get();
        let evictions = if self.evicts { pool.evictions(py)? } else { 0 };
        let dv = &self.dv;
        if !v.get_type().is(&self.value_type)
            || !Self::same(&dv.strides.get(v)?, &self.in_strides)?
            || !Self::same(&dv.shape.get(v)?, &self.in_shape)?
            || !Self::same(&dv.dtype.get(v)?, &self.in_dtype)?
        {
            return Ok(None); // place() would refuse it: copied into its slot
        }
        let st = dv.storage.get(v)?;
        if !st.is_instance(self.storage_type.bind(py))? {
            return Ok(None);
        }
        // Allocated before the argument's address is read: an allocation may move blocks.
        let (addr, h) = match pool.alloc_storage(py, i128::from(self.out_nbytes)) {
            Ok(b) => b,
            Err(e) if self.catchable(py, &e) => return Ok(None),
            Err(e) => return Err(e),
        };
        // From here a dropped `new` gives its block back (Storage.__del__).
        let new = self.value(py, self.adopt(py, addr, h)?)?;
        let sh = self.st.h.get(&st)?;
        let st_addr: u64 = self.st.addr.get(&st)?.extract()?;
        let at = if sh.is_none() {
            st_addr
        } else {
            // As Storage.addr: restored if evicted, marked used.
            match pool.touch(py, sh.extract()?) {
                Ok(a) => a,
                Err(e) if self.catchable(py, &e) => return Ok(None), // a freed block
                Err(e) => return Err(e),
            }
        };
        if at != st_addr || (self.evicts && pool.evictions(py)? != evictions) {
            return Ok(None); // it moved: Storage.addr records that on the full path
        }
        let offset: u64 = dv.offset.get(v)?.extract()?;
        let at = at + offset * self.in_size;
        if self.lo <= at && at < self.hi {
            return Ok(None); // in this arena: a static output fed back
        }
        let prog = self.prog.bind(py);
        let hot = prog.getattr(intern!(py, "_hot"))?;
        let hot = hot.cast::<PyTuple>()?;
        if key_is(&hot.get_item(0)?, self.token, addr, at) {
            self.launch(py, &hot.get_item(1)?)?;
            return Ok(Some(new));
        }
        let cold = prog.getattr(intern!(py, "_cold"))?;
        let cold = cold.cast::<PyTuple>()?;
        let key = cold.get_item(0)?;
        if key_is(&key, self.token, addr, at) {
            // PlannedProgram.replay_quick's swap: the outputs alternate between two blocks.
            let replay = cold.get_item(1)?;
            prog.setattr(intern!(py, "_hot"), cold)?;
            prog.setattr(intern!(py, "_cold"), hot)?;
            prog.setattr(intern!(py, "_last_key"), key)?;
            prog.setattr(intern!(py, "_replay"), &replay)?;
            self.launch(py, &replay)?;
            return Ok(Some(new));
        }
        let key = PyTuple::new(
            py,
            [
                self.token.into_pyobject(py)?.into_any(),
                addr.into_pyobject(py)?.into_any(),
                at.into_pyobject(py)?.into_any(),
            ],
        )?;
        let args = PyList::new(py, [v])?;
        let news = PyList::new(py, [&new])?;
        prog.call_method1(intern!(py, "replay_quick"), (key, args, news))?;
        Ok(Some(new))
    }
}

#[pymethods]
impl QuickCall {
    /// prog: the PlannedProgram; pool: its backend's `_rust.Pool`; arena: the program's
    /// arena Storage; backend: read for `stream` at each launch; storage_type,
    /// value_type: memory.Storage and DeviceValue; catch: the exception types of an
    /// allocation or touch that send the call to the full path; graph_of(replay): its
    /// instantiated graph's handle or None; arg: (shape, strides, dtype, itemsize) of the
    /// argument bound by address; out: (nbytes, shape, strides, dtype) of the fresh
    /// output; token: the binding's token; span: the arena's (lo, hi) addresses.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        prog: Py<PyAny>,
        pool: Py<PyPool>,
        evicts: bool,
        arena: Py<PyAny>,
        backend: Py<PyAny>,
        storage_type: Py<PyType>,
        value_type: Py<PyType>,
        catch: Py<PyAny>,
        graph_of: Py<PyAny>,
        arg: Layout,
        out: Output,
        token: i64,
        span: (u64, u64),
    ) -> PyResult<Self> {
        let (in_shape, in_strides, in_dtype, in_size) = arg;
        let (out_nbytes, out_shape, out_strides, out_dtype) = out;
        let (st, dv) = Python::attach(|py| {
            PyResult::Ok((
                StorageSlots::of(storage_type.bind(py))?,
                ValueSlots::of(value_type.bind(py))?,
            ))
        })?;
        let q = Quick {
            prog,
            pool,
            evicts,
            arena,
            backend,
            storage_type,
            value_type,
            catch,
            graph_of,
            in_shape,
            in_strides,
            in_dtype,
            in_size,
            out_nbytes,
            out_shape,
            out_strides,
            out_dtype,
            token,
            lo: span.0,
            hi: span.1,
            st,
            dv,
            launchers: Mutex::new(Vec::new()),
            stream: StreamCache::default(),
        };
        Ok(Self { q: Some(q) })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.q {
            Some(q) => q.traverse(&visit),
            None => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        self.q = None;
    }

    /// `[output value]` for `[argument value]`, or None: the caller takes prog.call.
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyList>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let Some(q) = &self.q else {
            return Ok(None);
        };
        if values.len() != 1 {
            return Ok(None);
        }
        match q.run(py, &values.get_item(0)?)? {
            Some(new) => Ok(Some(PyList::new(py, [new])?)),
            None => Ok(None),
        }
    }
}

impl QuickCall {
    /// The quick call on the argument's value (CompiledHit runs it without a crossing).
    pub(crate) fn run<'py>(
        &self,
        py: Python<'py>,
        v: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.q {
            Some(q) => q.run(py, v),
            None => Ok(None),
        }
    }
}
