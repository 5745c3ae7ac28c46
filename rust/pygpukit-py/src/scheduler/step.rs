//! `GuaranteedStep`: the scheduler's on-caller step of an already-checked compiled call in
//! native calls. `submit` admits and starts the task in the core (`submit_start_now`), runs
//! the compiled function's native hit (the direct call's `CompiledHit`) between the task's
//! events on its stream, and leaves a native `StepWait` as the task's `_wait_gpu`: the
//! thread in `Task.result()` waits on the end event without the GIL and ends the task
//! here. It is pygpukit/scheduler/scheduler.py's `submit`, `CudaDevice.launch`, the
//! device's wait closure, `_on_done_waiter` and `_book_locked` for that one case, on the
//! same Python state under the same locks; anything else (a condition that does not hold
//! before the core commits, an end that frees work) is handed to those Python methods.
//!
//! The scheduler's and the device's containers that are never rebound (`_tasks`,
//! `_ended`, the lanes, ...) and the locks' bound acquire/release are looked up once, at
//! the step's making or the device's first step: an attribute lookup by name costs a few
//! hundred instructions, and a step made some sixty of them.

use pyo3::exceptions::PyException;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList, PyTuple};
use pyo3::BoundObject;
use pyo3::{PyTraverseError, PyVisit};
use std::sync::Mutex;

use pygpukit_core::scheduler::{Qos, TaskSpec};

use super::{to_py, PySchedulerCore};
use crate::hit::CompiledHit;

/// What `Scheduler._check_submit` fixed for one set of submit options, and the Python
/// objects the step works on.
#[pyclass(frozen, name = "GuaranteedStep", module = "pygpukit._rust")]
pub struct GuaranteedStep {
    sched: Py<PyAny>,
    func: Py<PyAny>,
    core: Py<PySchedulerCore>,
    mu: Lock,
    exec_lock: Py<PyAny>,
    exec: Lock,
    task_type: Py<PyAny>,
    fields: TaskFields,
    cuda_device: Py<PyAny>,
    done_type: Py<PyAny>,
    poll: Py<PyAny>,
    perf_counter: Py<PyAny>,
    native_clock: bool, // perf_counter is time.perf_counter (see perf_counter_s)
    future_lock: Lock,
    // The scheduler's containers (never rebound: Scheduler.__init__ makes them).
    tasks: Py<PyDict>,
    ended: Py<PyAny>,
    waiting: Py<PyDict>,
    counts: Py<PyDict>,
    steps: Py<PyDict>,
    pending: Py<PyAny>,
    unbooked: Py<PyList>,
    // The scheduler's instance dict, where its attributes are (None: its class has one of
    // the names the step reads as a class attribute or property; see Sched).
    sched_dict: Option<Py<PyDict>>,
    // The device the last step ran on, as the steps use it (Scheduler._device may be
    // replaced: it is checked against this on every submit).
    dev: Mutex<Option<DevCache>>,
    // The function's last _Guard and its fields (see guard_of).
    #[allow(clippy::type_complexity)]
    guard: Mutex<Option<(Py<PyAny>, bool, Py<PyAny>, Py<PyAny>)>>,
    t0: f64,
    tenant: String,
    tenant_py: Py<PyAny>,
    partition: String,
    partition_py: Py<PyAny>,
    qos_py: Py<PyAny>,
    bandwidth: f64,
    priority: i32,
    prio_high: Py<PyAny>,
    sim_bytes_per_ms: f64,
    spare_max: u64,
    ended_kept: usize,
}

/// A Guaranteed on-caller task's wait (the device's `wait` closure): set as the task's
/// `_wait_gpu`; `Task.result()` calls it with no timeout.
#[pyclass(frozen, name = "StepWait", module = "pygpukit._rust")]
pub struct StepWait {
    step: Py<GuaranteedStep>,
    device: Py<PyAny>,
    dev_dict: Py<PyDict>,
    spare_events: Py<PyList>,
    dev_lock: Lock,
    task: Py<PyAny>,
    start: Py<PyAny>,
    end: Py<PyAny>,
    result: Py<PyAny>,
    // What the task's ended record holds that the step set at submission.
    id: u64,
    id_py: Py<PyAny>,
    held: u64,
    arena_bytes: Py<PyAny>,
    submitted_ms: f64,
}

/// A lock's bound `acquire` and `release` (and, of a plain `_thread.lock`, `locked`).
struct Lock {
    acquire: Py<PyAny>,
    release: Py<PyAny>,
    locked: Option<Py<PyAny>>,
}

impl Lock {
    fn of(l: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = l.py();
        let ty = l.get_type();
        let plain = ty.name()?.to_str()? == "lock" && ty.module()?.to_str()? == "_thread";
        Ok(Lock {
            acquire: attr(l, intern!(py, "acquire"))?.unbind(),
            release: attr(l, intern!(py, "release"))?.unbind(),
            locked: if plain {
                Some(attr(l, intern!(py, "locked"))?.unbind())
            } else {
                None
            },
        })
    }

    fn clone_ref(&self, py: Python<'_>) -> Self {
        Lock {
            acquire: self.acquire.clone_ref(py),
            release: self.release.clone_ref(py),
            locked: self.locked.as_ref().map(|l| l.clone_ref(py)),
        }
    }

    /// `held` for a section that runs no Python code (C-level slot, list, deque and
    /// dict operations whose replaced values are None or bools: no finalizer runs), so
    /// this thread keeps the GIL throughout it (abi3 modules load only on builds with
    /// a GIL). With the lock free then, no other thread is inside a section it guards,
    /// and none gets into one before this one ends: one `locked()` call stands for
    /// `acquire` and `release`, whose argument parsing is most of a lock's cost. A held
    /// lock (or an RLock, which has no `locked`) is taken as usual.
    fn held_briefly<R>(&self, py: Python<'_>, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        if let Some(l) = &self.locked {
            if !l.bind(py).call0()?.is_truthy()? {
                return f();
            }
        }
        self.held(py, f)
    }

    fn acquire(&self, py: Python<'_>) -> PyResult<()> {
        self.acquire.bind(py).call0().map(|_| ())
    }

    fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.release.bind(py).call0().map(|_| ())
    }

    /// `f()` with the lock held (released on every way out).
    fn held<R>(&self, py: Python<'_>, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        self.acquire(py)?;
        let out = f();
        let rel = self.release(py);
        let out = out?;
        rel?;
        Ok(out)
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.acquire)?;
        visit.call(&self.release)?;
        if let Some(l) = &self.locked {
            visit.call(l)?;
        }
        Ok(())
    }
}

/// A `CudaDevice` whose steps this step runs, and its parts a step uses that the device
/// never rebinds.
struct DevCache {
    device: Py<PyAny>,
    // Its instance dict, where `_unwatched` (rebound by collect and flush) is read.
    dict: Py<PyDict>,
    lanes: Py<PyDict>,
    spare_events: Py<PyList>,
    lock: Lock,
    backend: Py<PyAny>,
}

impl DevCache {
    fn clone_ref(&self, py: Python<'_>) -> Self {
        DevCache {
            device: self.device.clone_ref(py),
            dict: self.dict.clone_ref(py),
            lanes: self.lanes.clone_ref(py),
            spare_events: self.spare_events.clone_ref(py),
            lock: self.lock.clone_ref(py),
            backend: self.backend.clone_ref(py),
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.device)?;
        visit.call(&self.dict)?;
        visit.call(&self.lanes)?;
        visit.call(&self.spare_events)?;
        self.lock.visit(visit)?;
        visit.call(&self.backend)
    }
}

/// The scheduler as the step reads and writes it: its plain attributes (flags, counters,
/// the spare) in its instance dict, a dict lookup instead of the generic attribute
/// protocol (the type's MRO walked first, a few hundred instructions); the same values,
/// as new_step checked that its class defines none of those names.
struct Sched<'py> {
    obj: Bound<'py, PyAny>,
    dict: Option<Bound<'py, PyDict>>,
}

impl<'py> std::ops::Deref for Sched<'py> {
    type Target = Bound<'py, PyAny>;

    fn deref(&self) -> &Self::Target {
        &self.obj
    }
}

impl<'py> Sched<'py> {
    fn get(&self, name: &Bound<'py, pyo3::types::PyString>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(d) = &self.dict {
            if let Some(v) = d.get_item(name)? {
                return Ok(v);
            }
        }
        self.obj.getattr(name)
    }

    fn set<V: IntoPyObject<'py>>(
        &self,
        name: &Bound<'py, pyo3::types::PyString>,
        value: V,
    ) -> PyResult<()> {
        match &self.dict {
            Some(d) => d.set_item(name, value),
            None => self.obj.setattr(name, value),
        }
    }
}

/// The scheduler attributes a step reads or writes through `Sched`.
const SCHED_FIELDS: [&str; 8] = [
    "_device",
    "_spare",
    "_spare_bytes",
    "_closed",
    "_stopped",
    "_paused",
    "_waiting_not_be",
    "_untold",
];

/// The Task fields a step writes or reads on every step.
#[derive(Clone, Copy)]
enum F {
    WaitGpu,
    Waited,
    EndClaimed,
    GpuMs,
    FinishedMs,
    Arena,
    State,
    Outcome,
    Fut,
    Final,
    Fn,
    Args,
    Kwargs,
}

const F_NAMES: [&str; 13] = [
    "_wait_gpu",
    "_waited",
    "_end_claimed",
    "gpu_ms",
    "finished_ms",
    "arena",
    "_state",
    "_outcome",
    "_fut",
    "_final",
    "fn",
    "args",
    "kwargs",
];

type DescrGet = unsafe extern "C" fn(
    *mut pyo3::ffi::PyObject,
    *mut pyo3::ffi::PyObject,
    *mut pyo3::ffi::PyObject,
) -> *mut pyo3::ffi::PyObject;
type DescrSet = unsafe extern "C" fn(
    *mut pyo3::ffi::PyObject,
    *mut pyo3::ffi::PyObject,
    *mut pyo3::ffi::PyObject,
) -> std::os::raw::c_int;

/// Task's fields by their slot descriptors (Task has __slots__): what `setattr` and
/// `getattr` on a Task end in, called directly (the name's lookup in the type and the
/// generic attribute protocol before it are most of the cost). Only for an object whose
/// type is Task itself; anything else takes getattr and setattr.
struct TaskFields {
    task_type: Py<PyAny>,
    names: Vec<Py<pyo3::types::PyString>>,
    slots: Option<Vec<(Py<PyAny>, DescrGet, DescrSet)>>,
}

impl TaskFields {
    fn new(task_type: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = task_type.py();
        let names = F_NAMES
            .iter()
            .map(|n| pyo3::types::PyString::intern(py, n).unbind())
            .collect::<Vec<_>>();
        let own = attr(task_type, intern!(py, "__dict__"))?;
        let mut slots = Some(Vec::with_capacity(F_NAMES.len()));
        for name in &names {
            let desc = match own.get_item(name) {
                Ok(d) => d,
                Err(_) => {
                    slots = None;
                    break;
                }
            };
            // The descriptor's own get and set (a slot's member descriptor; a type
            // without both is not what this was written for).
            let ty = desc.get_type();
            // SAFETY: PyType_GetSlot reads a slot of a live type object (any type from
            // Python 3.10 on); the pointers it returns are the type's own functions, of
            // the descrgetfunc and descrsetfunc signatures.
            let (g, st) = unsafe {
                let tp = ty.as_ptr() as *mut pyo3::ffi::PyTypeObject;
                (
                    pyo3::ffi::PyType_GetSlot(tp, pyo3::ffi::Py_tp_descr_get),
                    pyo3::ffi::PyType_GetSlot(tp, pyo3::ffi::Py_tp_descr_set),
                )
            };
            if g.is_null() || st.is_null() || !ty.name()?.to_str()?.eq("member_descriptor") {
                slots = None;
                break;
            }
            if let Some(v) = slots.as_mut() {
                // SAFETY: see above: the slots' declared types.
                v.push(unsafe {
                    (
                        desc.unbind(),
                        std::mem::transmute::<*mut std::ffi::c_void, DescrGet>(g),
                        std::mem::transmute::<*mut std::ffi::c_void, DescrSet>(st),
                    )
                });
            }
        }
        Ok(TaskFields {
            task_type: task_type.clone().unbind(),
            names,
            slots,
        })
    }

    fn slot(&self, task: &Bound<'_, PyAny>, f: F) -> Option<&(Py<PyAny>, DescrGet, DescrSet)> {
        let own = task.get_type_ptr() as *mut pyo3::ffi::PyObject == self.task_type.as_ptr();
        self.slots.as_ref().filter(|_| own).map(|v| &v[f as usize])
    }

    fn get<'py>(&self, task: &Bound<'py, PyAny>, f: F) -> PyResult<Bound<'py, PyAny>> {
        let py = task.py();
        match self.slot(task, f) {
            // SAFETY: the descriptor's get on an instance of its type, the GIL held; it
            // returns a new reference or NULL with an exception set.
            Some((d, get, _)) => unsafe {
                Bound::from_owned_ptr_or_err(
                    py,
                    get(d.as_ptr(), task.as_ptr(), self.task_type.as_ptr()),
                )
            },
            None => task.getattr(self.names[f as usize].bind(py)),
        }
    }

    fn set<'py>(&self, task: &Bound<'py, PyAny>, f: F, v: impl IntoPyObject<'py>) -> PyResult<()> {
        let py = task.py();
        let v = v
            .into_pyobject(py)
            .map_err(Into::into)?
            .into_any()
            .into_bound();
        match self.slot(task, f) {
            Some((d, _, set)) => {
                // SAFETY: the descriptor's set on an instance of its type, the GIL held;
                // it takes its own reference to the value and returns -1 with an
                // exception set on failure.
                if unsafe { set(d.as_ptr(), task.as_ptr(), v.as_ptr()) } < 0 {
                    return Err(PyErr::fetch(py));
                }
                Ok(())
            }
            None => task.setattr(self.names[f as usize].bind(py), v),
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.task_type)?;
        for n in &self.names {
            visit.call(n)?;
        }
        if let Some(v) = &self.slots {
            for (d, _, _) in v {
                visit.call(d)?;
            }
        }
        Ok(())
    }
}

/// Puts `v` in the cache `m`; the value it replaces is dropped after the mutex is let go
/// (a drop may run Python code).
fn replace_cached<T>(m: &Mutex<Option<T>>, v: T) {
    let old = m.lock().unwrap_or_else(|e| e.into_inner()).replace(v);
    drop(old);
}

fn attr<'py>(
    o: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    o.getattr(name)
}

/// `d[key] += n` for the scheduler's counters.
fn bump(d: &Bound<'_, PyDict>, key: &Bound<'_, pyo3::types::PyString>, n: i64) -> PyResult<()> {
    let v: i64 = match d.get_item(key)? {
        Some(v) => v.extract()?,
        None => return Err(pyo3::exceptions::PyKeyError::new_err(key.clone().unbind())),
    };
    d.set_item(key, v + n)
}

/// The device's `_unwatched` deque, from its instance dict.
fn unwatched<'py>(dict: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
    dict.get_item(intern!(dict.py(), "_unwatched"))?
        .ok_or_else(|| pyo3::exceptions::PyAttributeError::new_err("_unwatched"))
}

fn none_or<'py>(o: Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    if o.is_none() {
        None
    } else {
        Some(o)
    }
}

/// `time.perf_counter()` as CPython reads it on Linux (clock_gettime(CLOCK_MONOTONIC),
/// nanoseconds to seconds as _PyTime_AsSecondsDouble does), without a Python call.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn perf_counter_s() -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given, laid out as the C timespec
    // (64-bit Linux: two 64-bit fields).
    if unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) } != 0 {
        return None;
    }
    let ns = ts
        .tv_sec
        .checked_mul(1_000_000_000)?
        .checked_add(ts.tv_nsec)?;
    Some(if ns % 1_000_000_000 == 0 {
        (ns / 1_000_000_000) as f64
    } else {
        ns as f64 / 1e9
    })
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn perf_counter_s() -> Option<f64> {
    None
}

impl GuaranteedStep {
    /// `perf_counter()`: natively where it is time.perf_counter and the platform's clock
    /// is read as CPython reads it (a Python call, some 400 instructions, four per step).
    fn perf_counter(&self, py: Python<'_>) -> PyResult<f64> {
        if self.native_clock {
            if let Some(t) = perf_counter_s() {
                return Ok(t);
            }
        }
        self.perf_counter.bind(py).call0()?.extract()
    }

    fn sched_of<'py>(&self, py: Python<'py>) -> Sched<'py> {
        Sched {
            obj: self.sched.bind(py).clone(),
            dict: self.sched_dict.as_ref().map(|d| d.bind(py).clone()),
        }
    }

    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        Ok((self.perf_counter(py)? - self.t0) * 1e3)
    }

    /// The device's parts the steps use, if it is the CUDA device of the scheduler's
    /// exec lock (else the step is not this one's case).
    fn dev_of(&self, device: &Bound<'_, PyAny>) -> PyResult<Option<DevCache>> {
        let py = device.py();
        {
            let kept = self.dev.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = kept.as_ref() {
                if c.device.bind(py).is(device) {
                    return Ok(Some(c.clone_ref(py)));
                }
            }
        }
        if !device.get_type().is(self.cuda_device.bind(py))
            || !attr(device, intern!(py, "exec_lock"))?.is(self.exec_lock.bind(py))
        {
            return Ok(None);
        }
        let cls = device.get_type();
        if cls.hasattr(intern!(py, "_unwatched"))? || cls.hasattr(intern!(py, "__getattr__"))? {
            return Ok(None); // not the CudaDevice step.rs was written against
        }
        let c = DevCache {
            device: device.clone().unbind(),
            dict: attr(device, intern!(py, "__dict__"))?
                .cast_into::<PyDict>()?
                .unbind(),
            lanes: attr(device, intern!(py, "_lanes"))?
                .cast_into::<PyDict>()?
                .unbind(),
            spare_events: attr(device, intern!(py, "_spare_events"))?
                .cast_into::<PyList>()?
                .unbind(),
            lock: Lock::of(&attr(device, intern!(py, "_lock"))?)?,
            backend: attr(device, intern!(py, "backend"))?.unbind(),
        };
        let out = c.clone_ref(py);
        replace_cached(&self.dev, c);
        Ok(Some(out))
    }

    /// `Scheduler._keep_arena`; open: the caller found the scheduler open (not closed,
    /// not stopped) in the hold of its lock this runs in.
    fn keep_arena(
        &self,
        sched: &Sched<'_>,
        arena: &Bound<'_, PyAny>,
        nbytes: u64,
        open: bool,
    ) -> PyResult<()> {
        let py = sched.py();
        if nbytes > self.spare_max
            || !open && sched.get(intern!(py, "_closed"))?.is_truthy()?
            || !open && !sched.get(intern!(py, "_stopped"))?.is_none()
        {
            arena.call_method0(intern!(py, "release"))?;
            return Ok(());
        }
        let old = sched.get(intern!(py, "_spare"))?;
        sched.set(intern!(py, "_spare"), arena)?;
        sched.set(intern!(py, "_spare_bytes"), nbytes)?;
        if !old.is_none() {
            old.call_method0(intern!(py, "release"))?;
        }
        Ok(())
    }

    /// `Scheduler._end_locked(task, "done", deliver=False, record=record)`: a booked end,
    /// its result delivered already. A record is that of a task `StepWait::ended` ended
    /// (state, end time, `_wait_gpu` and arena done there; `_ticket` never set).
    fn end_done(
        &self,
        sched: &Sched<'_>,
        task: &Bound<'_, PyAny>,
        record: Option<&Bound<'_, PyTuple>>,
    ) -> PyResult<()> {
        let py = sched.py();
        let mut arena_bytes = None;
        let id = match record {
            Some(r) => r.get_item(0)?,
            None => {
                let nbytes = attr(task, intern!(py, "reservation"))?.get_item(0)?;
                let arena = attr(task, intern!(py, "arena"))?;
                if !arena.is_none() {
                    task.setattr(intern!(py, "arena"), py.None())?;
                    self.keep_arena(sched, &arena, nbytes.extract()?, false)?;
                }
                arena_bytes = Some(nbytes);
                attr(task, intern!(py, "id"))?
            }
        };
        let tasks = self.tasks.bind(py);
        tasks.del_item(&id)?;
        let waiting = self.waiting.bind(py);
        if waiting.contains(&id)? {
            waiting.del_item(&id)?;
            let qos = attr(task, intern!(py, "qos"))?;
            let not_be = !qos.eq(intern!(py, "best_effort"))?;
            let n: i64 = sched.get(intern!(py, "_waiting_not_be"))?.extract()?;
            sched.set(intern!(py, "_waiting_not_be"), n - i64::from(not_be))?;
        }
        let done = intern!(py, "done");
        if record.is_none() {
            task.setattr(intern!(py, "_state"), done)?;
            if attr(task, intern!(py, "finished_ms"))?.is_none() {
                task.setattr(intern!(py, "finished_ms"), self.now(py)?)?;
            }
        }
        let fields = &self.fields;
        fields.set(task, F::Fn, py.None())?;
        fields.set(task, F::Args, PyTuple::empty(py))?;
        fields.set(task, F::Kwargs, PyDict::new(py))?;
        let record = match (record, arena_bytes) {
            (Some(r), _) => r.clone().into_any(),
            (None, nbytes) => {
                task.setattr(intern!(py, "_wait_gpu"), py.None())?;
                task.setattr(intern!(py, "_ticket"), py.None())?;
                // Task._record().
                let holds = !attr(task, intern!(py, "arena"))?.is_none();
                PyTuple::new(
                    py,
                    [
                        id.clone(),
                        attr(task, intern!(py, "tenant"))?,
                        attr(task, intern!(py, "qos"))?,
                        attr(task, intern!(py, "partition"))?,
                        done.clone().into_any(),
                        attr(task, intern!(py, "reserved_bytes"))?,
                        nbytes.unwrap_or_else(|| py.None().into_bound(py)),
                        PyBool::new(py, holds).to_owned().into_any(),
                        attr(task, intern!(py, "stream_priority"))?,
                        attr(task, intern!(py, "submitted_ms"))?,
                        attr(task, intern!(py, "started_ms"))?,
                        attr(task, intern!(py, "finished_ms"))?,
                        attr(task, intern!(py, "gpu_ms"))?,
                    ],
                )?
                .into_any()
            }
        };
        let ended = self.ended.bind(py);
        ended.set_item(&id, record)?;
        if ended.len()? > self.ended_kept {
            let kw = PyDict::new(py);
            kw.set_item(intern!(py, "last"), false)?;
            ended.call_method(intern!(py, "popitem"), (), Some(&kw))?;
        }
        if tasks.is_empty() && sched.get(intern!(py, "_closed"))?.is_truthy()? {
            sched.call_method0(intern!(py, "_notify_locked"))?;
        }
        Ok(())
    }

    /// `Scheduler._book_locked(kick=False)`: books the ends waiters left.
    fn book(&self, sched: &Sched<'_>) -> PyResult<()> {
        let py = sched.py();
        let unbooked = self.unbooked.bind(py);
        let n = unbooked.len();
        let booked: Vec<Bound<'_, PyAny>> = unbooked.iter().collect();
        unbooked.del_slice(0, n)?;
        sched.set(intern!(py, "_untold"), 0)?;
        let now = self.now(py)?;
        let counts = self.counts.bind(py);
        let completed = intern!(py, "completed");
        for entry in booked {
            // Tuples (indexed directly: a tuple's index by a Python int costs more).
            let entry = entry.cast_into::<PyTuple>()?;
            let task = entry.get_item(0)?;
            let told = entry.get_item(1)?.is_truthy()?;
            let record = none_or(entry.get_item(2)?)
                .map(|r| r.cast_into::<PyTuple>())
                .transpose()?;
            bump(counts, completed, 1)?;
            if told {
                self.end_done(sched, &task, record.as_ref())?;
                continue;
            }
            let (id, gpu) = match &record {
                Some(r) => (r.get_item(0)?, r.get_item(12)?),
                None => (
                    attr(&task, intern!(py, "id"))?,
                    attr(&task, intern!(py, "gpu_ms"))?,
                ),
            };
            let id: u64 = id.extract()?;
            let gpu_ms: f64 = if gpu.is_none() { 0.0 } else { gpu.extract()? };
            let core = self.core.get();
            let others = core
                .with(py, |s| s.complete(id, gpu_ms, now))?
                .map_err(|e| to_py(py, e))?;
            self.end_done(sched, &task, record.as_ref())?;
            if !others.is_empty() {
                sched.call_method1(intern!(py, "_admit_locked"), (others, now))?;
            }
        }
        Ok(())
    }

    /// The `_Guard`'s `plain`, `native` and `entry` (set once, in its __init__), kept for
    /// the last guard seen (held here: its identity stays its own).
    #[allow(clippy::type_complexity)]
    fn guard_of<'py>(
        &self,
        fast: &Bound<'py, PyAny>,
    ) -> PyResult<(bool, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let py = fast.py();
        {
            let kept = self.guard.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((g, plain, native, entry)) = kept.as_ref() {
                if g.bind(py).is(fast) {
                    return Ok((*plain, native.bind(py).clone(), entry.bind(py).clone()));
                }
            }
        }
        let plain = attr(fast, intern!(py, "plain"))?.is_truthy()?;
        let native = attr(fast, intern!(py, "native"))?;
        let entry = attr(fast, intern!(py, "entry"))?;
        let new = (
            fast.clone().unbind(),
            plain,
            native.clone().unbind(),
            entry.clone().unbind(),
        );
        replace_cached(&self.guard, new);
        Ok((plain, native, entry))
    }

    /// Whether the step is the direct call's native hit in the spare arena, checked as
    /// `CompiledFunction.reserve_matched` and `call_in_matched` check it: (hit, the
    /// reservation, the program's arena), or None.
    #[allow(clippy::type_complexity)]
    fn matched<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<
        Option<(
            Bound<'py, CompiledHit>,
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
        )>,
    > {
        let func = self.func.bind(py);
        let fast = attr(func, intern!(py, "_fast"))?;
        if fast.is_none() {
            return Ok(None);
        }
        let (plain, native, entry) = self.guard_of(&fast)?;
        if !plain {
            return Ok(None);
        }
        let hit = attr(func, intern!(py, "_hit"))?;
        if !native.is(&hit) {
            return Ok(None);
        }
        let Ok(hit) = hit.cast_into::<CompiledHit>() else {
            return Ok(None);
        };
        let res = attr(&entry, intern!(py, "reservation"))?;
        if res.is_none() || !hit.borrow().matches_args(py, args)? {
            return Ok(None);
        }
        let arena = attr(&attr(&entry, intern!(py, "program"))?, intern!(py, "arena"))?;
        Ok(Some((hit, res, arena)))
    }

    /// `CudaDevice.launch(task, prio, True, run, now, on_caller=True)` with the run being
    /// the native hit (or, had the hit missed, the compiled function's usual call).
    #[allow(clippy::too_many_arguments)]
    fn launch<'py>(
        slf: &Bound<'py, GuaranteedStep>,
        dev: &DevCache,
        task: &Bound<'py, PyAny>,
        hit: &Bound<'py, CompiledHit>,
        args: &Bound<'py, PyTuple>,
        arena: &Bound<'py, PyAny>,
        (id, id_py, held, arena_bytes, now): (u64, Bound<'py, PyAny>, u64, Bound<'py, PyAny>, f64),
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let device = dev.device.bind(py);
        let prio = this.prio_high.bind(py);
        let lane = match dev.lanes.bind(py).get_item(prio)? {
            Some(l) => l,
            None => device.call_method1(intern!(py, "_stream"), (prio,))?,
        };
        let lane = lane.cast_into::<PyTuple>()?;
        let stream = lane.get_item(0)?;
        let q = lane.get_item(1)?;
        let spare = dev.spare_events.bind(py);
        let (start, end) = if spare.is_empty() {
            let ev = attr(&attr(device, intern!(py, "_native"))?, intern!(py, "Event"))?;
            (ev.call1((true,))?, ev.call1((true,))?)
        } else {
            // list.pop(), in two list calls (no Python code runs between them).
            let last = spare.len() - 1;
            let pair = spare.get_item(last)?.cast_into::<PyTuple>()?;
            spare.del_item(last)?;
            (pair.get_item(0)?, pair.get_item(1)?)
        };
        let b = dev.backend.bind(py);
        let old = attr(b, intern!(py, "stream"))?;
        b.setattr(intern!(py, "stream"), &stream)?;
        let ran = (|| -> PyResult<(Bound<'py, PyAny>, Option<PyErr>)> {
            start.call_method1(intern!(py, "record"), (&stream,))?;
            let out = match hit.borrow().run_args(py, args) {
                Ok(Some(v)) => Ok(v),
                // The hit missed (changed nothing): the usual call in the task's arena.
                Ok(None) => {
                    let func = this.func.bind(py);
                    let mut all = vec![arena.clone()];
                    all.extend(args.iter());
                    func.call_method1(intern!(py, "call_in"), PyTuple::new(py, all)?)
                }
                Err(e) => Err(e),
            };
            let (result, error) = match out {
                Ok(v) => (v, None),
                Err(e) if e.is_instance_of::<PyException>(py) => {
                    (py.None().into_bound(py), Some(e))
                }
                Err(e) => return Err(e),
            };
            end.call_method1(intern!(py, "record"), (&stream,))?;
            Ok((result, error))
        })();
        b.setattr(intern!(py, "stream"), old)?;
        let (result, error) = ran?;
        let err_obj = match &error {
            Some(e) => e.value(py).clone().into_any(),
            None => py.None().into_bound(py),
        };
        let item = PyTuple::new(
            py,
            [
                task.clone(),
                start.clone(),
                end.clone(),
                result.clone(),
                err_obj,
            ],
        )?;
        if error.is_some() {
            q.call_method1(intern!(py, "put"), (item,))?; // its completer fails it
            return Ok(());
        }
        let wait = StepWait {
            step: slf.clone().unbind(),
            device: dev.device.clone_ref(py),
            dev_dict: dev.dict.clone_ref(py),
            spare_events: dev.spare_events.clone_ref(py),
            dev_lock: dev.lock.clone_ref(py),
            task: task.clone().unbind(),
            start: start.unbind(),
            end: end.unbind(),
            result: result.unbind(),
            id,
            id_py: id_py.unbind(),
            held,
            arena_bytes: arena_bytes.unbind(),
            submitted_ms: now,
        };
        this.fields.set(task, F::WaitGpu, Py::new(py, wait)?)?;
        let t = PyFloat::new(py, this.perf_counter(py)?).into_any();
        let entry = PyTuple::new(py, [t, q, item.into_any()])?;
        // Read in the lock's section, as CudaDevice.launch does: collect() and flush()
        // rebind it in theirs.
        dev.lock.held_briefly(py, || {
            unwatched(dev.dict.bind(py))?
                .call_method1(intern!(py, "append"), (entry,))
                .map(|_| ())
        })
    }

    /// `Task._deliver()` for a task nobody made a Future of (else the method itself).
    fn deliver(&self, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = task.py();
        let plain = self.future_lock.held_briefly(py, || {
            if self.fields.get(task, F::Fut)?.is_none() {
                self.fields.set(task, F::Final, true)?;
                return Ok(true);
            }
            Ok(false)
        })?;
        if !plain {
            task.call_method0(intern!(py, "_deliver"))?;
        }
        Ok(())
    }

    /// `Scheduler._deliver()` if a future is pending.
    fn deliver_pending(&self, sched: &Sched<'_>) -> PyResult<()> {
        let py = sched.py();
        if self.pending.bind(py).len()? > 0 {
            sched.call_method0(intern!(py, "_deliver"))?;
        }
        Ok(())
    }
}

#[pymethods]
impl GuaranteedStep {
    /// Submits `func(*args)` as a Guaranteed task started and launched now, or returns
    /// None having changed nothing (the caller then submits as usual).
    fn submit<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        let this = slf.get();
        let sched = &this.sched_of(py);
        let Some(dev) = this.dev_of(&sched.get(intern!(py, "_device"))?)? else {
            return Ok(None);
        };
        this.exec.acquire(py)?;
        let out = Self::submit_locked(slf, sched, &dev, args);
        let rel = this.exec.release(py);
        let Some((task, now)) = out? else {
            rel?;
            return Ok(None);
        };
        rel?;
        this.deliver_pending(sched)?;
        // The booking after the launch (Scheduler._book_after_launch), native in its usual
        // cases: nothing the ends free may start, or the core was told of them already.
        if !this.unbooked.bind(py).is_empty() {
            let native = this.mu.held(py, || {
                let untold = sched.get(intern!(py, "_untold"))?.is_truthy()?;
                if untold
                    && (!this.waiting.bind(py).is_empty()
                        || sched.get(intern!(py, "_closed"))?.is_truthy()?)
                {
                    return Ok(false);
                }
                this.book(sched)?;
                Ok(true)
            })?;
            if native {
                this.deliver_pending(sched)?;
            } else {
                sched.call_method1(intern!(py, "_book_after_launch"), (now,))?;
            }
        }
        Ok(Some(task))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for o in [
            &self.sched,
            &self.func,
            &self.exec_lock,
            &self.task_type,
            &self.cuda_device,
            &self.done_type,
            &self.poll,
            &self.perf_counter,
            &self.ended,
            &self.pending,
            &self.tenant_py,
            &self.partition_py,
            &self.qos_py,
            &self.prio_high,
        ] {
            visit.call(o)?;
        }
        for o in [&self.tasks, &self.waiting, &self.counts, &self.steps] {
            visit.call(o)?;
        }
        visit.call(&self.unbooked)?;
        if let Some(d) = &self.sched_dict {
            visit.call(d)?;
        }
        self.mu.visit(&visit)?;
        self.exec.visit(&visit)?;
        self.future_lock.visit(&visit)?;
        self.fields.visit(&visit)?;
        // Held only for a reference count's change (no Python runs then): a collection
        // cannot start inside; try_lock is for safety, as skipping a visit is.
        if let Ok(kept) = self.dev.try_lock() {
            if let Some(c) = kept.as_ref() {
                c.visit(&visit)?;
            }
        }
        if let Ok(kept) = self.guard.try_lock() {
            if let Some((g, _, native, entry)) = kept.as_ref() {
                visit.call(g)?;
                visit.call(native)?;
                visit.call(entry)?;
            }
        }
        visit.call(&self.core)
    }
}

/// A task the core started at submission: the task, its id (and as a Python int), when.
type Committed<'py> = (Bound<'py, PyAny>, (u64, Bound<'py, PyAny>), f64);

impl GuaranteedStep {
    /// submit() under the exec lock: the checks, the core's commit and the launch.
    fn submit_locked<'py>(
        slf: &Bound<'py, Self>,
        sched: &Sched<'py>,
        dev: &DevCache,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, f64)>> {
        let py = slf.py();
        let this = slf.get();
        let Some((hit, res, arena)) = this.matched(py, args)? else {
            return Ok(None);
        };
        let (a, i, o, traffic): (u64, u64, u64, f64) = res.extract()?;
        let held = a + i + o;
        let cost = traffic / this.sim_bytes_per_ms;
        if !cost.is_finite() {
            return Ok(None); // submit() says why
        }
        let committed = this.mu.held(py, || -> PyResult<Option<Committed<'py>>> {
            let spare = sched.get(intern!(py, "_spare"))?;
            if !sched.get(intern!(py, "_stopped"))?.is_none()
                || sched.get(intern!(py, "_closed"))?.is_truthy()?
                || sched.get(intern!(py, "_paused"))?.is_truthy()?
                || sched.get(intern!(py, "_waiting_not_be"))?.is_truthy()?
                || sched.get(intern!(py, "_spare_bytes"))?.extract::<i64>()? != a as i64
                || !spare.is(&arena)
                || unwatched(dev.dict.bind(py))?.is_truthy()?
            {
                return Ok(None);
            }
            let core = this.core.get();
            let now = this.now(py)?;
            if sched.get(intern!(py, "_untold"))?.is_truthy()? {
                // Ends the core has not heard of could stand in this reservation's way:
                // submit() books them first.
                let room = core.with(py, |s| s.headroom(&this.partition))?;
                if room.is_none_or(|r| r < held) {
                    return Ok(None);
                }
            }
            let spec = TaskSpec {
                tenant: this.tenant.clone(),
                reservation_bytes: held,
                qos: Qos::Guaranteed,
                priority: this.priority,
                partition: this.partition.clone(),
                bandwidth_share: this.bandwidth,
                deadline_ms: None,
            };
            let Some((tid, _prio)) = core
                .with(py, |s| s.submit_start_now(spec, now))?
                .map_err(|e| to_py(py, e))?
            else {
                return Ok(None);
            };
            let tid_py = tid.into_pyobject(py)?.into_any();
            let call_args = PyTuple::new(
                py,
                [
                    sched.obj.clone(),
                    tid_py.clone(),
                    this.func.bind(py).clone(),
                    args.clone().into_any(),
                    PyDict::new(py).into_any(),
                    this.tenant_py.bind(py).clone(),
                    this.qos_py.bind(py).clone(),
                    this.partition_py.bind(py).clone(),
                    res.clone(),
                    cost.into_pyobject(py)?.into_any(),
                    now.into_pyobject(py)?.into_any(),
                    held.into_pyobject(py)?.into_any(),
                    PyBool::new(py, true).to_owned().into_any(),
                    // Scheduler.submit's start in the spare, as it sets the fields.
                    spare.clone(),
                    this.prio_high.bind(py).clone(),
                    PyFloat::new(py, now).into_any(),
                ],
            )?;
            let task = this.task_type.bind(py).call1(call_args)?;
            this.tasks.bind(py).set_item(&tid_py, &task)?;
            sched.set(intern!(py, "_spare"), py.None())?;
            sched.set(intern!(py, "_spare_bytes"), -1)?;
            bump(this.counts.bind(py), intern!(py, "launched"), 1)?;
            bump(this.steps.bind(py), intern!(py, "native"), 1)?;
            Ok(Some((task, (tid, tid_py), now)))
        })?;
        let Some((task, (tid, tid_py), now)) = committed else {
            return Ok(None);
        };
        let arena_bytes = res.cast::<PyTuple>()?.get_item(0)?;
        Self::launch(
            slf,
            dev,
            &task,
            &hit,
            args,
            &arena,
            (tid, tid_py, held, arena_bytes, now),
        )?;
        Ok(Some((task, now)))
    }
}

impl StepWait {
    /// `CudaDevice._claim_unwatched`.
    fn claim(&self, py: Python<'_>) -> PyResult<bool> {
        let task = self.task.bind(py);
        let fields = &self.step.get().fields;
        self.dev_lock.held_briefly(py, || {
            if fields.get(task, F::EndClaimed)?.is_truthy()? {
                return Ok(false);
            }
            fields.set(task, F::EndClaimed, true)?;
            let w = unwatched(self.dev_dict.bind(py))?;
            let n = w.len()?;
            if n > 0 && w.get_item(n - 1)?.get_item(2)?.get_item(0)?.is(task) {
                w.call_method0(intern!(py, "pop"))?;
            }
            Ok(true)
        })
    }

    /// `Task._record()` of the task once `ended` has ended it (finished now, `ms` of GPU
    /// time), from what the step set at submission: the booking's record.
    fn record<'py>(&self, py: Python<'py>, ms: f64, now: f64) -> PyResult<Bound<'py, PyTuple>> {
        let step = self.step.get();
        PyTuple::new(
            py,
            [
                self.id_py.bind(py).clone(),
                step.tenant_py.bind(py).clone(),
                step.qos_py.bind(py).clone(),
                step.partition_py.bind(py).clone(),
                intern!(py, "done").clone().into_any(),
                self.held.into_pyobject(py)?.into_any(),
                self.arena_bytes.bind(py).clone(),
                PyBool::new(py, false).to_owned().into_any(), // its arena is the spare now
                step.prio_high.bind(py).clone(),
                PyFloat::new(py, self.submitted_ms).into_any(),
                PyFloat::new(py, self.submitted_ms).into_any(), // started as submitted
                PyFloat::new(py, now).into_any(),
                PyFloat::new(py, ms).into_any(),
            ],
        )
    }

    /// `Scheduler._on_done_waiter` for a Guaranteed on-caller task's end.
    fn ended(&self, py: Python<'_>, ms: f64) -> PyResult<()> {
        let step = self.step.get();
        let sched = &step.sched_of(py);
        let task = self.task.bind(py);
        let result = self.result.bind(py);
        // None: not the usual case (closed, stopped): the Python method decides it all.
        let deferred = step.mu.held(py, || -> PyResult<Option<bool>> {
            if sched.get(intern!(py, "_closed"))?.is_truthy()?
                || !sched.get(intern!(py, "_stopped"))?.is_none()
            {
                return Ok(None);
            }
            let now = step.now(py)?;
            let told = if !step.waiting.bind(py).is_empty() {
                if sched.get(intern!(py, "_untold"))?.is_truthy()? {
                    step.book(sched)?; // the core hears of ends in order
                }
                let (others, ready) = step.core.get().complete_waited(py, self.id, ms, now)?;
                if !others.is_empty() || ready {
                    task.setattr(intern!(py, "gpu_ms"), ms)?;
                    task.setattr(intern!(py, "finished_ms"), now)?;
                    sched.call_method1(
                        intern!(py, "_ended_locked"),
                        (task, true, result, py.None(), others, now),
                    )?;
                    return Ok(Some(false));
                }
                true
            } else {
                false
            };
            let fields = &step.fields;
            fields.set(task, F::GpuMs, ms)?;
            fields.set(task, F::FinishedMs, now)?;
            let arena = fields.get(task, F::Arena)?;
            if !arena.is_none() {
                fields.set(task, F::Arena, py.None())?;
                step.keep_arena(sched, &arena, self.arena_bytes.extract(py)?, true)?;
            }
            fields.set(task, F::State, intern!(py, "done"))?;
            fields.set(task, F::Outcome, result)?;
            fields.set(task, F::WaitGpu, py.None())?;
            let entry = PyTuple::new(
                py,
                [
                    task.clone().into_any(),
                    PyBool::new(py, told).to_owned().into_any(),
                    self.record(py, ms, now)?.into_any(),
                ],
            )?;
            step.unbooked.bind(py).append(entry)?;
            if !told {
                let n: i64 = sched.get(intern!(py, "_untold"))?.extract()?;
                sched.set(intern!(py, "_untold"), n + 1)?;
            }
            Ok(Some(true))
        })?;
        match deferred {
            Some(true) => step.deliver(task),
            Some(false) => step.deliver_pending(sched),
            None => {
                let done =
                    step.done_type
                        .bind(py)
                        .call1((task, ms, result, py.None(), py.None()))?;
                sched.call_method1(intern!(py, "_on_done_waiter"), (done,))?;
                Ok(())
            }
        }
    }
}

#[pymethods]
impl StepWait {
    /// Waits for the launch's end (timeout None: without the GIL, for as long as it
    /// takes; else polled for at most `timeout` seconds) and ends the task if this caller
    /// is the first to see it end.
    #[pyo3(signature = (timeout = None))]
    fn __call__(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let task = self.task.bind(py);
        let end = self.end.bind(py);
        match timeout {
            None => {
                // This thread ends the task once the event fires: no sweep for it.
                let fields = &self.step.get().fields;
                fields.set(task, F::Waited, true)?;
                if let Err(e) = end.call_method0(intern!(py, "synchronize")) {
                    fields.set(task, F::Waited, false)?; // a fault: collect() reports it
                    return Err(e);
                }
            }
            Some(t) => {
                let step = self.step.get();
                if !step.poll.bind(py).call1((end, t))?.is_truthy()? {
                    return Ok(());
                }
            }
        }
        if !self.claim(py)? {
            return Ok(());
        }
        let start = self.start.bind(py);
        let ms: f64 = start
            .call_method1(intern!(py, "elapsed_time"), (end,))?
            .extract()?;
        let pair = PyTuple::new(py, [start.clone(), end.clone()])?;
        self.spare_events.bind(py).append(pair)?;
        self.ended(py, ms)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.step)?;
        for o in [
            &self.device,
            &self.task,
            &self.start,
            &self.end,
            &self.result,
            &self.arena_bytes,
            &self.id_py,
        ] {
            visit.call(o)?;
        }
        visit.call(&self.spare_events)?;
        visit.call(&self.dev_dict)?;
        self.dev_lock.visit(&visit)
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn new_step(
    py: Python<'_>,
    core: Py<PySchedulerCore>,
    sched: Py<PyAny>,
    func: Py<PyAny>,
    tenant: String,
    partition: String,
    bandwidth: f64,
    priority: i32,
    objects: &Bound<'_, PyDict>,
) -> PyResult<Py<GuaranteedStep>> {
    let get = |k: &str| -> PyResult<Py<PyAny>> {
        objects
            .get_item(k)?
            .map(Bound::unbind)
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(k.to_string()))
    };
    let s = sched.bind(py);
    let dict = |name: &Bound<'_, pyo3::types::PyString>| -> PyResult<Py<PyDict>> {
        Ok(attr(s, name)?.cast_into::<PyDict>()?.unbind())
    };
    let exec_lock = get("exec_lock")?;
    // Attributes only in the instance dict (no class attribute, property or
    // __getattr__/__setattr__ of those names) are read and written there.
    let cls = s.get_type();
    let mut plain = !cls.hasattr(intern!(py, "__getattr__"))?
        && cls.getattr(intern!(py, "__setattr__"))?.is(py
            .get_type::<pyo3::types::PyAny>()
            .getattr(intern!(py, "__setattr__"))?);
    for name in SCHED_FIELDS {
        plain = plain && !cls.hasattr(name)?;
    }
    let sched_dict = if plain {
        Some(
            attr(s, intern!(py, "__dict__"))?
                .cast_into::<PyDict>()?
                .unbind(),
        )
    } else {
        None
    };
    let step = GuaranteedStep {
        sched_dict,
        mu: Lock::of(get("mu")?.bind(py))?,
        exec: Lock::of(exec_lock.bind(py))?,
        exec_lock,
        fields: TaskFields::new(get("task")?.bind(py))?,
        task_type: get("task")?,
        cuda_device: get("cuda_device")?,
        done_type: get("done")?,
        poll: get("poll")?,
        native_clock: get("perf_counter")?.bind(py).is(py
            .import(intern!(py, "time"))?
            .getattr(intern!(py, "perf_counter"))?),
        perf_counter: get("perf_counter")?,
        future_lock: Lock::of(get("future_lock")?.bind(py))?,
        tasks: dict(intern!(py, "_tasks"))?,
        ended: attr(s, intern!(py, "_ended"))?.unbind(),
        waiting: dict(intern!(py, "_waiting"))?,
        counts: dict(intern!(py, "_counts"))?,
        steps: dict(intern!(py, "_steps"))?,
        pending: attr(s, intern!(py, "_pending"))?.unbind(),
        unbooked: attr(s, intern!(py, "_unbooked"))?
            .cast_into::<PyList>()?
            .unbind(),
        dev: Mutex::new(None),
        guard: Mutex::new(None),
        t0: get("t0")?.extract(py)?,
        tenant_py: tenant.clone().into_pyobject(py)?.into_any().unbind(),
        tenant,
        partition_py: partition.clone().into_pyobject(py)?.into_any().unbind(),
        partition,
        qos_py: intern!(py, "guaranteed").clone().into_any().unbind(),
        bandwidth,
        priority,
        prio_high: get("prio_high")?,
        sim_bytes_per_ms: get("sim_bytes_per_ms")?.extract(py)?,
        spare_max: get("spare_max")?.extract(py)?,
        ended_kept: get("ended_kept")?.extract(py)?,
        sched,
        func,
        core,
    };
    Py::new(py, step)
}
