//! Reading and writing the `__slots__` of pygpukit's Python classes through their member
//! descriptors, found once: what `obj.name` does after the type lookup, which is most of
//! its cost on the native hits' objects (Storage, DeviceValue, Node, GPUArray); and the
//! one way those hits (hit.rs, quick.rs, eager.rs) make these objects.

use std::sync::OnceLock;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyTuple, PyType};
use pyo3::{ffi, intern};
use pyo3::{PyTraverseError, PyVisit};

/// One slot of one class: its member descriptor, and for the classes `located` (those
/// without a finaliser, whose instances may be made bare to look), the slot's byte offset
/// in an instance.
pub(crate) struct Slot(Py<PyAny>, Option<isize>);

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
        Ok(Self(d.unbind(), None))
    }

    /// The slot `name` of `ty` with its offset, found by setting it on a bare instance and
    /// finding the value among the instance's words (no layout of CPython's read: what the
    /// descriptor wrote is where it lives). `ty` must have no finaliser: the instance is
    /// made without `__init__` and dropped.
    pub(crate) fn located(ty: &Bound<'_, PyType>, name: &str) -> PyResult<Self> {
        let py = ty.py();
        let mut slot = Self::of(ty, name)?;
        let size: usize = ty.getattr(intern!(py, "__basicsize__"))?.extract()?;
        let probe = bare(py, &ty.clone().unbind())?;
        let mark = PyTuple::new(py, [py.None()])?; // an object no other slot holds
        slot.set(&probe, &mark)?;
        let words = size / std::mem::size_of::<usize>();
        let base = probe.as_ptr().cast::<*mut ffi::PyObject>();
        // SAFETY: an instance of ty is __basicsize__ bytes from its address; each word read
        // is inside it.
        let found: Vec<usize> = (0..words)
            .filter(|&k| unsafe { *base.add(k) } == mark.as_ptr())
            .collect();
        if let [k] = found[..] {
            slot.1 = Some((k * std::mem::size_of::<usize>()) as isize);
        }
        Ok(slot)
    }

    /// The address of obj's word for this slot where `located` found its offset (obj an
    /// instance of the slot's class or a subclass: the callers check its type). Reading or
    /// writing it is the callers' unsafe part.
    #[inline]
    fn word(&self, obj: &Bound<'_, PyAny>) -> Option<*mut *mut ffi::PyObject> {
        self.1.map(|at| {
            obj.as_ptr()
                .cast::<u8>()
                .wrapping_offset(at)
                .cast::<*mut ffi::PyObject>()
        })
    }

    /// obj.name = value on an instance made by `bare` whose slot is unset (a fresh object:
    /// written in place where the offset is known, nothing to release).
    #[inline]
    pub(crate) fn init<T>(&self, obj: &Bound<'_, PyAny>, value: &Bound<'_, T>) -> PyResult<()> {
        self.init_owned(obj, value.clone().into_any())
    }

    /// obj.name read in place where the offset is known; obj must be an instance of the
    /// slot's class or a subclass (the caller checked its type).
    #[inline]
    pub(crate) fn read<'py>(&self, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(p) = self.word(obj) {
            // SAFETY: the word is the slot's value (a borrowed reference) or null.
            if let Some(v) = unsafe { Bound::from_borrowed_ptr_or_opt(obj.py(), *p) } {
                return Ok(v);
            }
        }
        self.get(obj) // unset: the descriptor raises AttributeError
    }

    /// obj.name as a borrowed reference (alive while obj holds it), for a slot whose offset
    /// is known (`located` found it: see `found`); an unset slot raises AttributeError.
    #[inline]
    pub(crate) fn peek<'a, 'py>(
        &self,
        obj: &'a Bound<'py, PyAny>,
    ) -> PyResult<Borrowed<'a, 'py, PyAny>> {
        // SAFETY: as in `read`.
        let got = self.word(obj).and_then(|p| unsafe {
            let v = *p;
            (!v.is_null()).then(|| Borrowed::from_ptr(obj.py(), v))
        });
        match got {
            Some(v) => Ok(v),
            None => Err(self
                .get(obj)
                .err()
                .unwrap_or_else(|| PyTypeError::new_err("slot read without its offset"))),
        }
    }

    /// obj.name = value where obj's slot is set (the old value released), in place where
    /// the offset is known.
    #[inline]
    pub(crate) fn replace<T>(&self, obj: &Bound<'_, PyAny>, value: &Bound<'_, T>) -> PyResult<()> {
        match self.word(obj) {
            // SAFETY: the word takes a new reference to value, then the old one (if any) is
            // released, last, as CPython's member setter does.
            Some(p) => unsafe {
                let old = *p;
                *p = value.clone().into_any().into_ptr();
                ffi::Py_XDECREF(old);
                Ok(())
            },
            None => self.set(obj, value),
        }
    }

    /// Whether `located` found the slot's offset.
    pub(crate) fn found(&self) -> bool {
        self.1.is_some()
    }

    /// obj.name = value on a fresh instance (as `init`), taking the reference given.
    #[inline]
    pub(crate) fn init_owned(
        &self,
        obj: &Bound<'_, PyAny>,
        value: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        match self.word(obj) {
            // SAFETY: obj is a fresh instance of the slot's class (bare made it), its word
            // null (unset): the word takes value's reference.
            Some(p) => unsafe {
                debug_assert!((*p).is_null());
                *p = value.into_ptr();
                Ok(())
            },
            None => self.set(obj, &value),
        }
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

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.0)
    }
}

/// list[0] of a list that is never emptied (the operator switches', LIBRARY_GENERATION),
/// borrowed from it: no reference count traffic on the hot path.
pub(crate) fn first_item<'a, 'py>(
    py: Python<'py>,
    list: &'a Py<PyList>,
) -> PyResult<Borrowed<'a, 'py, PyAny>> {
    // SAFETY: a borrowed reference, or null with an exception set (an empty list).
    unsafe {
        let got = ffi::PyList_GetItem(list.as_ptr(), 0);
        if got.is_null() {
            return Err(PyErr::fetch(py));
        }
        Ok(Borrowed::from_ptr(py, got))
    }
}

/// `tp_alloc` of a slotted Python class: every slot unset until the caller sets it (the
/// way `object.__new__` makes one, without the class's own `__new__`/`__init__` frames).
pub(crate) fn bare<'py>(py: Python<'py>, ty: &Py<PyType>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyType_GenericAlloc is the stable ABI's allocator for any type; it returns a
    // new reference or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_GenericAlloc(ty.as_ptr().cast(), 0)) }
}

/// ir.Node's slots (all of them: the native hits make their result's node).
pub(crate) struct NodeSlots {
    pub(crate) shape: Slot,
    pub(crate) dtype: Slot,
    pub(crate) where_: Slot,
    pub(crate) realized: Slot,
    pub(crate) sub: Slot,
    pub(crate) leaves: Slot,
    pub(crate) used: Slot,
    id: Slot,
    op: Slot,
    inputs: Slot,
    attrs: Slot,
    origin: Slot,
    canon: Slot,
}

/// The fields of a realised node without inputs (what `Node.known` sets, then `realized`).
pub(crate) struct RealisedNode<'a, 'py> {
    pub(crate) op: &'a Bound<'py, PyAny>,
    pub(crate) attrs: &'a Bound<'py, PyAny>,
    pub(crate) canon: &'a Bound<'py, PyAny>,
    pub(crate) shape: &'a Bound<'py, PyAny>,
    pub(crate) dtype: &'a Bound<'py, PyAny>,
    pub(crate) where_: &'a Bound<'py, PyAny>,
    pub(crate) value: &'a Bound<'py, PyAny>,
}

impl NodeSlots {
    pub(crate) fn of(ty: &Bound<'_, PyType>) -> PyResult<Self> {
        Ok(Self {
            id: Slot::located(ty, "id")?,
            op: Slot::located(ty, "op")?,
            inputs: Slot::located(ty, "inputs")?,
            attrs: Slot::located(ty, "attrs")?,
            shape: Slot::located(ty, "shape")?,
            dtype: Slot::located(ty, "dtype")?,
            where_: Slot::located(ty, "where")?,
            origin: Slot::located(ty, "origin")?,
            realized: Slot::located(ty, "realized")?,
            canon: Slot::located(ty, "_canon")?,
            sub: Slot::located(ty, "sub")?,
            leaves: Slot::located(ty, "leaves")?,
            used: Slot::located(ty, "used")?,
        })
    }

    /// Whether every slot that `peek` reads has its offset.
    pub(crate) fn located(&self) -> bool {
        [
            &self.shape,
            &self.dtype,
            &self.where_,
            &self.realized,
            &self.sub,
            &self.leaves,
            &self.used,
        ]
        .iter()
        .all(|s| s.found())
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for s in [
            &self.id,
            &self.op,
            &self.inputs,
            &self.attrs,
            &self.shape,
            &self.dtype,
            &self.where_,
            &self.origin,
            &self.realized,
            &self.canon,
            &self.sub,
            &self.leaves,
            &self.used,
        ] {
            s.traverse(visit)?;
        }
        Ok(())
    }

    /// A new node of type `ty` (ir.Node), its id the next of `ids` (ir.node's counter), its
    /// slots set as Node.known sets them, realised as `n.value`.
    pub(crate) fn realised<'py>(
        &self,
        py: Python<'py>,
        ty: &Py<PyType>,
        ids: &Py<PyAny>,
        n: RealisedNode<'_, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let known = KnownNode {
            op: n.op,
            inputs: &PyTuple::empty(py),
            attrs: n.attrs,
            canon: n.canon,
            shape: n.shape,
            dtype: n.dtype,
            where_: n.where_,
        };
        let none = py.None().into_bound(py);
        self.known(py, ty, ids, known, n.value, (&none, &none))
    }

    /// A new node of type `ty` (ir.Node), its id the next of `ids`, its slots set as
    /// Node.known sets them, `realized` set to `value` (None: pending), `sub` and `leaves`
    /// to `summary`'s and `used` False.
    pub(crate) fn known<'py>(
        &self,
        py: Python<'py>,
        ty: &Py<PyType>,
        ids: &Py<PyAny>,
        n: KnownNode<'_, 'py>,
        value: &Bound<'py, PyAny>,
        summary: (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
    ) -> PyResult<Bound<'py, PyAny>> {
        let (sub, leaves) = summary;
        let node = bare(py, ty)?;
        // SAFETY: PyIter_Next returns a new reference, or null (an exception set or not).
        let id = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyIter_Next(ids.as_ptr()))? };
        self.id.init_owned(&node, id)?;
        self.op.init(&node, n.op)?;
        self.inputs.init(&node, n.inputs)?;
        self.attrs.init(&node, n.attrs)?;
        self.shape.init(&node, n.shape)?;
        self.dtype.init(&node, n.dtype)?;
        self.where_.init(&node, n.where_)?;
        self.origin.init(&node, intern!(py, ""))?;
        self.realized.init(&node, value)?;
        self.canon.init(&node, n.canon)?;
        self.sub.init(&node, sub)?;
        self.leaves.init(&node, leaves)?;
        self.used.init(&node, &PyBool::new(py, false))?;
        Ok(node)
    }
}

/// The fields of a node as `Node.known` takes them.
pub(crate) struct KnownNode<'a, 'py> {
    pub(crate) op: &'a Bound<'py, PyAny>,
    pub(crate) inputs: &'a Bound<'py, PyAny>,
    pub(crate) attrs: &'a Bound<'py, PyAny>,
    pub(crate) canon: &'a Bound<'py, PyAny>,
    pub(crate) shape: &'a Bound<'py, PyAny>,
    pub(crate) dtype: &'a Bound<'py, PyAny>,
    pub(crate) where_: &'a Bound<'py, PyAny>,
}

/// GPUArray's slots.
pub(crate) struct ArraySlots {
    pub(crate) raw: Slot,
    pub(crate) link: Slot,
    readonly: Slot,
}

impl ArraySlots {
    pub(crate) fn of(ty: &Bound<'_, PyType>) -> PyResult<Self> {
        Ok(Self {
            raw: Slot::located(ty, "_raw")?,
            readonly: Slot::located(ty, "_readonly")?,
            link: Slot::located(ty, "_link")?,
        })
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for s in [&self.raw, &self.readonly, &self.link] {
            s.traverse(visit)?;
        }
        Ok(())
    }

    /// `GPUArray(node)` of type `ty`: its slots set as GPUArray.__init__ sets them.
    pub(crate) fn wrap<'py>(
        &self,
        py: Python<'py>,
        ty: &Py<PyType>,
        node: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = bare(py, ty)?;
        self.raw.init(&a, node)?;
        self.readonly.init(&a, &PyBool::new(py, false))?;
        self.link.init(&a, &py.None().into_bound(py))?;
        Ok(a)
    }

    /// The array's node: its `_raw`, or for a view the `_node` it re-derives.
    pub(crate) fn node<'py>(&self, a: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if self.link.read(a)?.is_none() {
            self.raw.read(a)
        } else {
            a.getattr(intern!(a.py(), "_node"))
        }
    }
}

/// memory.Storage's slots.
pub(crate) struct StorageSlots {
    pub(crate) freed: Slot,
    pub(crate) addr: Slot,
    pub(crate) h: Slot,
    pool: Slot,
    nbytes: Slot,
    pins: Slot,
    gen: Slot,
    readonly: Slot,
}

impl StorageSlots {
    pub(crate) fn of(ty: &Bound<'_, PyType>) -> PyResult<Self> {
        Ok(Self {
            pool: Slot::of(ty, "pool")?,
            nbytes: Slot::of(ty, "nbytes")?,
            freed: Slot::of(ty, "freed")?,
            addr: Slot::of(ty, "_addr")?,
            h: Slot::of(ty, "_h")?,
            pins: Slot::of(ty, "_pins")?,
            gen: Slot::of(ty, "gen")?,
            readonly: Slot::of(ty, "readonly")?,
        })
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for s in [
            &self.pool,
            &self.nbytes,
            &self.freed,
            &self.addr,
            &self.h,
            &self.pins,
            &self.gen,
            &self.readonly,
        ] {
            s.traverse(visit)?;
        }
        Ok(())
    }

    /// The Storage (type `ty`) of a block `alloc_storage` returned, as memory.adopt makes it.
    pub(crate) fn adopt<'py>(
        &self,
        py: Python<'py>,
        ty: &Py<PyType>,
        pool: &Bound<'py, PyAny>,
        nbytes: u64,
        addr: u64,
        h: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = bare(py, ty)?;
        let (no, zero) = (PyBool::new(py, false), 0i64.into_pyobject(py)?);
        self.pool.set(&s, pool)?;
        self.nbytes.set(&s, &nbytes.into_pyobject(py)?)?;
        self.freed.set(&s, &no)?;
        self.addr.set(&s, &addr.into_pyobject(py)?)?;
        self.h.set(&s, &h.into_pyobject(py)?)?;
        self.pins.set(&s, &zero)?;
        self.gen.set(&s, &zero)?;
        self.readonly.set(&s, &no)?;
        Ok(s)
    }
}

/// The CUDA backend's DeviceValue slots.
pub(crate) struct ValueSlots {
    pub(crate) storage: Slot,
    pub(crate) shape: Slot,
    pub(crate) strides: Slot,
    pub(crate) offset: Slot,
    pub(crate) dtype: Slot,
}

impl ValueSlots {
    pub(crate) fn of(ty: &Bound<'_, PyType>) -> PyResult<Self> {
        Ok(Self {
            storage: Slot::of(ty, "storage")?,
            shape: Slot::of(ty, "shape")?,
            strides: Slot::of(ty, "strides")?,
            offset: Slot::of(ty, "offset")?,
            dtype: Slot::of(ty, "dtype")?,
        })
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for s in [
            &self.storage,
            &self.shape,
            &self.strides,
            &self.offset,
            &self.dtype,
        ] {
            s.traverse(visit)?;
        }
        Ok(())
    }

    /// `DeviceValue(storage, shape, strides, offset, dtype)` of type `ty`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make<'py>(
        &self,
        py: Python<'py>,
        ty: &Py<PyType>,
        storage: &Bound<'py, PyAny>,
        shape: &Bound<'py, PyAny>,
        strides: &Bound<'py, PyAny>,
        offset: i64,
        dtype: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let v = bare(py, ty)?;
        self.storage.set(&v, storage)?;
        self.shape.set(&v, shape)?;
        self.strides.set(&v, strides)?;
        self.offset.set(&v, &offset.into_pyobject(py)?)?;
        self.dtype.set(&v, dtype)?;
        Ok(v)
    }
}
