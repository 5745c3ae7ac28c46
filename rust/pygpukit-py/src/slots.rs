//! Reading and writing the `__slots__` of pygpukit's Python classes through their member
//! descriptors, found once: what `obj.name` does after the type lookup, which is most of
//! its cost on the compiled hit's objects (Storage, DeviceValue, Node, GPUArray).

use std::sync::OnceLock;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// One slot of one class: its member descriptor.
pub(crate) struct Slot(Py<PyAny>);

type Accessors = (ffi::descrgetfunc, ffi::descrsetfunc);

static ACCESSORS: OnceLock<(usize, usize)> = OnceLock::new();

fn accessors(descr: &Bound<'_, PyAny>) -> Accessors {
    let (get, set) = *ACCESSORS.get_or_init(|| {
        let ty = descr.get_type();
        // SAFETY: PyType_GetSlot works on static types from 3.10 (the abi3 floor);
        // member_descriptor has both.
        unsafe {
            (
                ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_descr_get) as usize,
                ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_descr_set) as usize,
            )
        }
    });
    // SAFETY: both are the non-null slots of member_descriptor (checked in Slot::of).
    unsafe {
        (
            std::mem::transmute::<usize, ffi::descrgetfunc>(get),
            std::mem::transmute::<usize, ffi::descrsetfunc>(set),
        )
    }
}

impl Slot {
    /// The slot `name` that `ty` itself declares (a member descriptor in its __dict__).
    pub(crate) fn of(ty: &Bound<'_, PyType>, name: &str) -> PyResult<Self> {
        let d = ty.getattr("__dict__")?.get_item(name)?;
        if d.get_type().name()?.to_str()? != "member_descriptor" {
            return Err(PyTypeError::new_err(format!(
                "{}.{name} is not a __slots__ member",
                ty.name()?
            )));
        }
        accessors(&d);
        Ok(Self(d.unbind()))
    }

    /// obj.name; obj must be an instance of the slot's class.
    pub(crate) fn get<'py>(&self, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = obj.py();
        let d = self.0.bind(py);
        let (get, _) = accessors(d);
        // SAFETY: member_descriptor's tp_descr_get returns a new reference or null with an
        // exception set (a type it does not belong to, an unset slot).
        unsafe {
            Bound::from_owned_ptr_or_err(py, get(d.as_ptr(), obj.as_ptr(), obj.get_type().as_ptr()))
        }
    }

    /// obj.name = value.
    pub(crate) fn set<T>(&self, obj: &Bound<'_, PyAny>, value: &Bound<'_, T>) -> PyResult<()> {
        let py = obj.py();
        let d = self.0.bind(py);
        let (_, set) = accessors(d);
        // SAFETY: member_descriptor's tp_descr_set returns 0 or -1 with an exception set.
        if unsafe { set(d.as_ptr(), obj.as_ptr(), value.as_ptr()) } == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(py))
        }
    }

    pub(crate) fn traverse(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.0)
    }
}
