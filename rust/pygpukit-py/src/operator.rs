//! GPUArray's binary operators (`__add__`, `__rmul__`, ...) as method descriptors over
//! native functions: `x + 0.5` enters native code from the interpreter's operator slot, with
//! no Python frame between the user's line and the record. Each serves the two usual cases
//! itself: an eager op that the native eager table serves (eager.rs) and a lazy array-scalar
//! record that the lazy table serves (record.rs); everything else, and a case either table
//! declines, calls the operator's Python method (array._operator's), which decides as
//! before. The user's location is then the current frame (the one running the operator),
//! where the Python method's native calls look one frame further back.
//!
//! A method descriptor (`PyDescr_NewMethod`) over a `METH_O` function is what CPython's
//! operator slots call unbound, as `f(self, other)`: the same call a Python function gets.
//! The C function has no closure, so each operator is one of `SLOTS` monomorphised entry
//! points, its index naming its entry in `OPERATORS`.

use std::ffi::{c_int, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString, PyType};

use crate::eager::EagerHits;
use crate::record::LazyScalars;
use crate::slots::first_item;

extern "C" {
    // CPython's context variable read (public C API since 3.7; left out of pyo3-ffi's abi3
    // declarations, as block.rs's Set and Reset are). 0 and a new reference or null (unset
    // without a default), or -1 with an exception set.
    fn PyContextVar_Get(
        var: *mut ffi::PyObject,
        default_value: *mut ffi::PyObject,
        value: *mut *mut ffi::PyObject,
    ) -> c_int;
}

/// The operators' shared state: both tables and the switches the Python method reads.
struct Shared {
    lazy: Py<LazyScalars>,
    eager: Py<EagerHits>,
    /// mode._eager (the `gpk.eager()` block's contextvar).
    eager_mode: Py<PyAny>,
    /// settings.EAGER_NOW, devices.ACTIVE (lists changed in place only).
    eager_now: Py<PyList>,
    devices: Py<PyList>,
}

/// One operator: its op's interned name, whether it is reflected (`value op self`), and the
/// Python method every other case goes to.
struct Operator {
    op: Py<PyString>,
    first: bool,
    python: Py<PyAny>,
}

const SLOTS: usize = 48;

static SHARED: PyOnceLock<Shared> = PyOnceLock::new();
static OPERATORS: [PyOnceLock<Operator>; SLOTS] = [const { PyOnceLock::new() }; SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The result of one operator call: the native answer, or the Python method's.
fn call<'py>(
    py: Python<'py>,
    e: &Operator,
    x: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(s) = SHARED.get(py) {
        if let Some(out) = serve(py, s, e, x, value)? {
            return Ok(out);
        }
    }
    e.python.bind(py).call1((x, value))
}

/// What the Python method's first lines decide, then the table that serves the case.
fn serve<'py>(
    py: Python<'py>,
    s: &Shared,
    e: &Operator,
    x: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if truthy(first_item(py, &s.devices)?)? {
        return Ok(None);
    }
    let mut mode: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: eager_mode is a ContextVar; on 0, mode is a new reference (its default is
    // None, so never null).
    if unsafe { PyContextVar_Get(s.eager_mode.as_ptr(), std::ptr::null_mut(), &mut mode) } != 0 {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference (checked non-null).
    let Some(mut eager) = (unsafe { Bound::from_owned_ptr_or_opt(py, mode) }) else {
        return Ok(None);
    };
    if eager.is_none() {
        eager = first_item(py, &s.eager_now)?.to_owned();
        if eager.is_none() {
            return Ok(None); // settings.eager() decides: the Python method reads it
        }
    }
    let op = e.op.bind(py).as_any();
    if truthy(eager.as_borrowed())? {
        let (a, b) = if e.first { (value, x) } else { (x, value) };
        return s.eager.bind(py).borrow().hit_at(py, op, a, b, 0);
    }
    s.lazy
        .bind(py)
        .borrow()
        .record_at(py, op, x, value, e.first, 0)
}

/// bool(o), for the switches' usual True, False and None without a call.
fn truthy(o: Borrowed<'_, '_, PyAny>) -> PyResult<bool> {
    let p = o.as_ptr();
    // SAFETY: the interpreter's True, False and None singletons, never null.
    unsafe {
        if p == ffi::Py_True() {
            return Ok(true);
        }
        if p == ffi::Py_False() || p == ffi::Py_None() {
            return Ok(false);
        }
    }
    o.is_truthy()
}

/// The METH_O function of operator K: `self op value` (reflected: `value op self`).
unsafe extern "C" fn entry<const K: usize>(
    slf: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: called by the interpreter with the GIL held (a method descriptor's call).
    let py = unsafe { Python::assume_attached() };
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let Some(e) = OPERATORS[K].get(py) else {
            return Err(PyRuntimeError::new_err("GPUArray operator not set up"));
        };
        // SAFETY: both are borrowed references the call holds for its duration.
        let (x, v) = unsafe {
            (
                Bound::from_borrowed_ptr(py, slf),
                Bound::from_borrowed_ptr(py, value),
            )
        };
        call(py, e, &x, &v)
    }));
    match got {
        Ok(Ok(out)) => out.into_ptr(),
        Ok(Err(err)) => {
            err.restore(py);
            std::ptr::null_mut()
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|m| m.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic in a GPUArray operator".to_string());
            pyo3::panic::PanicException::new_err(msg).restore(py);
            std::ptr::null_mut()
        }
    }
}

macro_rules! entries {
    ($($k:literal)*) => {
        [$(entry::<$k> as ffi::PyCFunction),*]
    };
}

static ENTRIES: [ffi::PyCFunction; SLOTS] = entries!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23
    24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47
);

/// Set up what every operator shares (once per process, by pygpukit.array): the lazy and
/// eager tables, mode._eager, settings.EAGER_NOW and devices.ACTIVE.
#[pyfunction]
pub fn operators_setup(
    py: Python<'_>,
    lazy: Py<LazyScalars>,
    eager: Py<EagerHits>,
    eager_mode: Py<PyAny>,
    eager_now: Py<PyList>,
    devices: Py<PyList>,
) -> PyResult<()> {
    let shared = Shared {
        lazy,
        eager,
        eager_mode,
        eager_now,
        devices,
    };
    SHARED
        .set(py, shared)
        .map_err(|_| PyRuntimeError::new_err("GPUArray operators are set up already"))
}

/// A method descriptor of `cls` named `name` for the binary operator of `op` (interned),
/// reflected when `first`, whose other calls go to `python` (array._operator's method).
#[pyfunction]
pub fn operator_method<'py>(
    py: Python<'py>,
    cls: &Bound<'py, PyType>,
    name: &str,
    op: Bound<'py, PyString>,
    first: bool,
    python: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    if k >= SLOTS {
        return Err(PyTypeError::new_err("no native operator slot left"));
    }
    let e = Operator {
        op: op.unbind(),
        first,
        python,
    };
    if OPERATORS[k].set(py, e).is_err() {
        return Err(PyRuntimeError::new_err("native operator slot taken"));
    }
    // The definition lives as long as the process: a method descriptor points at it.
    let def = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: CString::new(name)?.into_raw(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunction: ENTRIES[k],
        },
        ml_flags: ffi::METH_O,
        ml_doc: std::ptr::null(),
    }));
    // SAFETY: cls is a type object and def a valid definition that outlives the
    // descriptor; a new reference or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(cls.as_type_ptr(), def)) }
}
