//! The `gpk.eager()` block's entry and exit (pygpukit/mode.py subclasses `EagerBlock`).
//!
//! An eager op's `with gpk.eager():` is on its hot path: as a Python class the block cost
//! three Python frames (construction, `__enter__`, `__exit__`) and a token list, about as
//! much as the native hit itself. Here construction, entry and exit are native calls that
//! set and reset the contextvar the array operators read (`EAGER_MODE`, made once at module
//! init and bound as `pygpukit.mode._eager`), so blocks keep the contextvar's semantics:
//! they nest (the innermost wins), are per thread and per asyncio task, and one object
//! entered again inside itself restores each level on the way out.

use std::os::raw::c_int;

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict};

use crate::errors;

// CPython's context variable calls (public C API since 3.7, same signatures since). They are
// not in the limited API, so pyo3-ffi leaves them out of an abi3 build; the interpreter
// exports them on every version this module loads in (Linux: symbols resolve at load).
extern "C" {
    fn PyContextVar_Set(var: *mut ffi::PyObject, value: *mut ffi::PyObject) -> *mut ffi::PyObject;
    fn PyContextVar_Reset(var: *mut ffi::PyObject, token: *mut ffi::PyObject) -> c_int;
}

/// The contextvar `pygpukit_eager` (default None: no block, the process setting decides).
static EAGER_MODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn eager_mode(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    EAGER_MODE.get_or_try_init(py, || {
        let kwargs = PyDict::new(py);
        kwargs.set_item("default", py.None())?;
        let var = py
            .import("contextvars")?
            .getattr("ContextVar")?
            .call(("pygpukit_eager",), Some(&kwargs))?;
        Ok(var.unbind())
    })
}

/// Adds `EagerBlock` and the contextvar `EAGER_MODE` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("EAGER_MODE", eager_mode(m.py())?.clone_ref(m.py()))?;
    m.add_class::<EagerBlock>()
}

/// One `gpk.eager(enabled)` block: `__enter__` sets `EAGER_MODE` to `enabled`, `__exit__`
/// resets it to what it was.
#[pyclass(module = "pygpukit._rust", subclass)]
pub struct EagerBlock {
    /// Py_True, Py_False or Py_None (the process setting decides inside the block).
    enabled: Py<PyAny>,
    /// The innermost entry's token (None outside the block); the same object may be entered
    /// again inside, and `outer` keeps the tokens of the entries not yet exited around it
    /// (inline first: a block entered once allocates nothing more).
    token: Option<Py<PyAny>>,
    outer: Vec<Py<PyAny>>,
}

#[pymethods]
impl EagerBlock {
    #[new]
    #[pyo3(signature = (enabled = Choice(Some(true))))]
    fn new(py: Python<'_>, enabled: Choice) -> Self {
        let enabled = match enabled.0 {
            Some(b) => PyBool::new(py, b).to_owned().into_any().unbind(),
            None => py.None(),
        };
        EagerBlock {
            enabled,
            token: None,
            outer: Vec::new(),
        }
    }

    /// True for eager, False for lazy inside the block, None for the process setting.
    #[getter]
    fn enabled(&self, py: Python<'_>) -> Py<PyAny> {
        self.enabled.clone_ref(py)
    }

    fn __enter__(&mut self, py: Python<'_>) -> PyResult<()> {
        let var = eager_mode(py)?;
        // SAFETY: var is a ContextVar and enabled a live object; Set returns a new
        // reference (the token) or NULL with an exception set.
        let token = unsafe {
            Bound::from_owned_ptr_or_err(py, PyContextVar_Set(var.as_ptr(), self.enabled.as_ptr()))?
        };
        if let Some(held) = self.token.replace(token.unbind()) {
            self.outer.push(held);
        }
        Ok(())
    }

    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let Some(token) = self.token.take() else {
            return Err(PyRuntimeError::new_err(
                "gpk.eager(): __exit__ without a matching __enter__",
            ));
        };
        self.token = self.outer.pop();
        let var = eager_mode(py)?;
        // SAFETY: both are live objects; Reset returns -1 with an exception set (a token of
        // another context, or one already used).
        if unsafe { PyContextVar_Reset(var.as_ptr(), token.as_ptr()) } < 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(())
    }
}

/// `gpk.eager`'s argument: True, False or None, else SettingError naming what was passed.
struct Choice(Option<bool>);

impl<'a, 'py> FromPyObject<'a, 'py> for Choice {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_none() {
            return Ok(Choice(None));
        }
        match obj.cast::<PyBool>() {
            Ok(b) => Ok(Choice(Some(b.is_true()))),
            Err(_) => Err(errors::setting_error(
                obj.py(),
                format!(
                    "gpk.eager: expected True, False or None, got {}",
                    obj.repr()?
                ),
            )),
        }
    }
}
