//! `pygpukit._rust.CompiledHit`: a compiled function's usual hit (one array argument with
//! the guarded shape and dtype, one fresh array result) in one native call from
//! `CompiledFunction.__call__`: the checks of `_Guard.hit` (pygpukit/compile/function.py),
//! the program's quick call (a `QuickCall` is run without a Python crossing) and the
//! result's node and array, built here. Anything else is the `miss` object, having changed
//! nothing: the caller then takes the full path, which decides everything again.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};
use pyo3::{PyTraverseError, PyVisit};

use crate::quick::QuickCall;
use crate::slots::{ArraySlots, NodeSlots, RealisedNode};

/// What `gc.get_referents(*containers)` would list, compared item by item with `held`.
struct Referents<'a> {
    held: &'a [Py<PyAny>],
    next: usize,
    same: bool,
}

extern "C" fn compare_referent(obj: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    // SAFETY: arg is the &mut Referents that `now_is_held` passed to tp_traverse.
    let r = unsafe { &mut *(arg as *mut Referents<'_>) };
    match r.held.get(r.next) {
        Some(h) if h.as_ptr() == obj => r.next += 1,
        _ => {
            r.same = false;
            return 1; // stops the traversal
        }
    }
    0
}

/// Cleared by the garbage collector (`__clear__`): what it compares may hold the compiled
/// function that holds it (a method's instance __dict__, a module's globals).
#[pyclass(name = "CompiledHit", module = "pygpukit._rust")]
pub struct CompiledHit {
    h: Option<Hit>,
    hits: AtomicU64,
}

struct Hit {
    guard: Py<PyAny>,
    prog: Py<PyAny>,
    miss: Py<PyAny>,
    tracing: Py<PyList>,
    active: Py<PyList>,
    releases: Py<PyList>,
    array_type: Py<PyType>,
    node_type: Py<PyType>,
    ids: Py<PyAny>,
    shape: Py<PyAny>,
    dtype: Py<PyAny>,
    containers: Vec<Py<PyAny>>,
    globals: Vec<(Py<PyDict>, Vec<Py<PyString>>)>,
    held: Vec<Py<PyAny>>,
    attrs: Py<PyAny>,
    out_shape: Py<PyAny>,
    out_dtype: Py<PyAny>,
    out_where: Py<PyAny>,
    node: NodeSlots,
    array: ArraySlots,
}

impl Hit {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for o in [
            &self.guard,
            &self.prog,
            &self.miss,
            &self.ids,
            &self.shape,
            &self.dtype,
            &self.attrs,
            &self.out_shape,
            &self.out_dtype,
            &self.out_where,
        ] {
            visit.call(o)?;
        }
        for t in [&self.array_type, &self.node_type] {
            visit.call(t)?;
        }
        self.node.traverse(visit)?;
        self.array.traverse(visit)?;
        for l in [&self.tracing, &self.active, &self.releases] {
            visit.call(l)?;
        }
        for o in self.containers.iter().chain(self.held.iter()) {
            visit.call(o)?;
        }
        for (d, names) in &self.globals {
            visit.call(d)?;
            for n in names {
                visit.call(n)?;
            }
        }
        Ok(())
    }

    /// Whether the containers still hold, and the globals still name, the objects `held`
    /// holds (`_Guard.hit`'s comparison of `_now()` with `held`, without the list).
    fn now_is_held(&self, py: Python<'_>) -> PyResult<bool> {
        let mut r = Referents {
            held: &self.held,
            next: 0,
            same: true,
        };
        for c in &self.containers {
            let ty = c.bind(py).get_type();
            // SAFETY: PyType_GetSlot works on static types from 3.10 (the abi3 floor) and
            // returns the type's tp_traverse or null; gc.get_referents calls the same one,
            // on GC objects only.
            unsafe {
                if ffi::PyType_GetFlags(ty.as_type_ptr()) & ffi::Py_TPFLAGS_HAVE_GC == 0 {
                    continue;
                }
                let slot = ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_traverse);
                if slot.is_null() {
                    continue;
                }
                let traverse: ffi::traverseproc = std::mem::transmute(slot);
                traverse(
                    c.as_ptr(),
                    compare_referent,
                    &mut r as *mut Referents<'_> as *mut c_void,
                );
            }
            if !r.same {
                return Ok(false);
            }
        }
        for (dict, names) in &self.globals {
            let dict = dict.bind(py);
            for name in names {
                let now = dict.get_item(name)?; // dict.get: None when missing
                let Some(h) = self.held.get(r.next) else {
                    return Ok(false);
                };
                let same = match now {
                    Some(v) => v.is(h),
                    None => h.is_none(py),
                };
                if !same {
                    return Ok(false);
                }
                r.next += 1;
            }
        }
        Ok(r.next == self.held.len())
    }

    /// The result array: `_Outputs.build` of one array (Node("input", ...) realised as
    /// `value`, in a GPUArray), its slots set as Node.__init__ and GPUArray.__init__ set them.
    fn result<'py>(
        &self,
        py: Python<'py>,
        value: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let none = py.None().into_bound(py);
        let node = self.node.realised(
            py,
            &self.node_type,
            &self.ids,
            RealisedNode {
                op: intern!(py, "input").as_any(),
                attrs: self.attrs.bind(py),
                canon: &none,
                shape: self.out_shape.bind(py),
                dtype: self.out_dtype.bind(py),
                where_: self.out_where.bind(py),
                value: &value,
            },
        )?;
        self.array.wrap(py, &self.array_type, &node)
    }

    /// The argument's realised value when the call hits the guard, checked as `hit` checks
    /// it (before its freed-array check), else None.
    fn matched<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if !self.tracing.bind(py).is_empty()
            || self.active.bind(py).get_item(0)?.is_truthy()?
            || args.len() != 1
        {
            return Ok(None);
        }
        let v = args.get_item(0)?;
        if !v.get_type().is(&self.array_type) {
            return Ok(None);
        }
        let node = self.array.node(&v)?;
        if !node.get_type().is(&self.node_type) {
            return Ok(None);
        }
        let n = &self.node;
        let shape = n.shape.get(&node)?;
        if !(shape.is(&self.shape) || shape.eq(&self.shape)?)
            || !n.dtype.get(&node)?.is(&self.dtype)
        {
            return Ok(None);
        }
        let r = n.realized.get(&node)?;
        if r.is_none() || !self.now_is_held(py)? {
            return Ok(None);
        }
        Ok(Some(r))
    }

    fn hit<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        hits: &AtomicU64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(r) = self.matched(py, args)? else {
            return Ok(None);
        };
        let guard = self.guard.bind(py);
        let releases = self.releases.bind(py).get_item(0)?;
        if !releases.eq(guard.getattr(intern!(py, "releases"))?)? {
            // Something was freed since the last check: FreedArrayError if it was ours.
            guard.call_method1(intern!(py, "check_freed"), (PyList::new(py, [&r])?,))?;
        }
        hits.fetch_add(1, Ordering::Relaxed);
        let prog = self.prog.bind(py);
        let quick = prog.getattr(intern!(py, "quick"))?;
        let mut out = None;
        if let Ok(q) = quick.cast::<QuickCall>() {
            out = q.borrow().run(py, &r)?;
        } else if !quick.is_none() {
            let got = quick.call1((PyList::new(py, [&r])?,))?;
            if !got.is_none() {
                out = Some(got.get_item(0)?);
            }
        }
        let value = match out {
            Some(v) => v,
            None => {
                let externals = guard.getattr(intern!(py, "externals"))?;
                let values = PyList::new(py, [&r])?;
                prog.call_method1(intern!(py, "call"), (values, externals, true, true))?
                    .get_item(0)?
            }
        };
        self.result(py, value).map(Some)
    }
}

impl CompiledHit {
    /// `matches`, for the scheduler's native step (pygpukit-py/src/scheduler/step.rs).
    pub(crate) fn matches_args(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        match &self.h {
            Some(h) => Ok(h.matched(py, args)?.is_some()),
            None => Ok(false),
        }
    }

    /// `__call__` for the scheduler's native step: the result array, or None on a miss.
    pub(crate) fn run_args<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.h {
            Some(h) => h.hit(py, args, &self.hits),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl CompiledHit {
    /// guard: the Python _Guard (its `releases`, `check_freed`, `externals`); prog: its
    /// PlannedProgram (`quick`, `call`); miss: returned for a call not served here;
    /// tracing, active, releases: trace.TRACING, devices.ACTIVE, memory.RELEASES;
    /// array_type, node_type, ids: GPUArray, Node and the node id counter; arg: the
    /// guarded (shape, dtype); containers, globals ([(dict, names)]) and held: what
    /// _Guard.hit compares; out: (attrs, shape, dtype, where) of the result's node.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        guard: Py<PyAny>,
        prog: Py<PyAny>,
        miss: Py<PyAny>,
        tracing: Py<PyList>,
        active: Py<PyList>,
        releases: Py<PyList>,
        array_type: Py<PyType>,
        node_type: Py<PyType>,
        ids: Py<PyAny>,
        arg: (Py<PyAny>, Py<PyAny>),
        containers: Vec<Py<PyAny>>,
        globals: Vec<(Py<PyDict>, Vec<Py<PyString>>)>,
        held: Vec<Py<PyAny>>,
        out: (Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>),
    ) -> PyResult<Self> {
        let (node, array) = Python::attach(|py| {
            PyResult::Ok((
                NodeSlots::of(node_type.bind(py))?,
                ArraySlots::of(array_type.bind(py))?,
            ))
        })?;
        let h = Hit {
            guard,
            prog,
            miss,
            tracing,
            active,
            releases,
            array_type,
            node_type,
            ids,
            shape: arg.0,
            dtype: arg.1,
            containers,
            globals,
            held,
            attrs: out.0,
            out_shape: out.1,
            out_dtype: out.2,
            out_where: out.3,
            node,
            array,
        };
        Ok(Self {
            h: Some(h),
            hits: AtomicU64::new(0),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.h {
            Some(h) => h.traverse(&visit),
            None => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        self.h = None;
    }

    /// The call's result array, or `miss` (take the full path).
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(h) = &self.h else {
            return Ok(py.None().into_bound(py)); // cleared: unreachable, never called again
        };
        Ok(match h.hit(py, args, &self.hits)? {
            Some(a) => a,
            None => h.miss.bind(py).clone(),
        })
    }

    /// Whether a call with these positional arguments hits the guard (`__call__` would
    /// run it): a scheduler reserves the guarded entry's memory on this before it runs
    /// the call through `__call__`, which checks again. Runs and counts nothing.
    fn matches(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        match &self.h {
            Some(h) => Ok(h.matched(py, args)?.is_some()),
            None => Ok(false),
        }
    }

    /// The hits served so far, then zero (CompiledFunction folds them into its counts).
    fn take_hits(&self) -> u64 {
        self.hits.swap(0, Ordering::Relaxed)
    }

    /// The hits served since the last take_hits().
    #[getter]
    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}
