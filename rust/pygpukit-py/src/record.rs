//! `pygpukit._rust.LazyScalars`: the lazy record of an array and a Python scalar (`x + 0.5`,
//! `2 * x`) in one native call from the array operator's method (pygpukit/array.py's
//! `_operator`): what that method's Python fast path does once the first record of the op,
//! the array's dtype, the scalar and its side taught it the nodes (`register`): the scalar's
//! 0-d `full` node and the op's node as `Node.known_scalar_op` makes them, the op node's
//! summary as pending.py defines it (`Node.sub`), and the GPUArray.
//!
//! It serves that case and nothing else: any other call (an unknown spec, an int beyond 64
//! bits, a realised operand without its leaf kid yet, a summary part not interned yet)
//! answers None having changed nothing, and the method takes its Python path, which decides
//! as before and learns what was missing. The table's lock is only tried, never waited for
//! (a finaliser recording on the same thread in the middle of a record takes the Python
//! path).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple, PyType};
use pyo3::{ffi, intern};
use pyo3::{PyTraverseError, PyVisit};

use crate::frames::{locate, Here, Sites};
use crate::fx::FxBuild;
use crate::slots::{first_item, ArraySlots, KnownNode, NodeSlots};

/// A spec's key: the op (an interned str) and the array's dtype by identity, the scalar's
/// kind (float, int, bool) and value bits (a float's bits: 0.0 and -0.0 differ), the side.
type Key = (usize, usize, u8, u64, bool);

/// What the first record of a key made (array._SCALAR_OPS's entry).
struct Spec {
    /// The key's op and dtype, held so that their addresses stay theirs.
    op: Py<PyAny>,
    dtype: Py<PyAny>,
    /// The `full` node's attrs, canonical attrs and dtype.
    fattrs: Py<PyAny>,
    fitems: Py<PyAny>,
    fdtype: Py<PyAny>,
    /// The op node's op, canonical attrs and dtype.
    nop: Py<PyAny>,
    nitems: Py<PyAny>,
    ndtype: Py<PyAny>,
    /// The op node's kid by its array operand's (pending.py), shared with the Python path,
    /// which fills it.
    kids: Py<PyDict>,
}

impl Spec {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for o in [
            &self.op,
            &self.dtype,
            &self.fattrs,
            &self.fitems,
            &self.fdtype,
            &self.nop,
            &self.nitems,
            &self.ndtype,
        ] {
            visit.call(o)?;
        }
        visit.call(&self.kids)
    }
}

/// The array operand's part of a summary: its key among the spec's kids, its leaves, its
/// trail (a pending operand's summary, a leaf's `(where,)`), the op node's tree size.
type Part<'a, 'py> = (Held<'a, 'py>, Held<'a, 'py>, Held<'a, 'py>, i64);

/// A reference the record reads: made by it, or borrowed from an operand that holds it.
enum Held<'a, 'py> {
    Own(Bound<'py, PyAny>),
    Lent(Borrowed<'a, 'py, PyAny>),
}

impl<'a, 'py> From<Bound<'py, PyAny>> for Held<'a, 'py> {
    fn from(b: Bound<'py, PyAny>) -> Self {
        Held::Own(b)
    }
}

impl<'a, 'py> From<Borrowed<'a, 'py, PyAny>> for Held<'a, 'py> {
    fn from(b: Borrowed<'a, 'py, PyAny>) -> Self {
        Held::Lent(b)
    }
}

impl<'py> std::ops::Deref for Held<'_, 'py> {
    type Target = Bound<'py, PyAny>;

    fn deref(&self) -> &Bound<'py, PyAny> {
        match self {
            Held::Own(b) => b,
            Held::Lent(b) => b,
        }
    }
}

type Specs = HashMap<Key, Arc<Spec>, FxBuild>;

/// What the table learns: the specs, and the user's call sites (frames.rs).
#[derive(Default)]
struct State {
    specs: Specs,
    sites: Sites,
}

struct Table {
    node_type: Py<PyType>,
    array_type: Py<PyType>,
    ids: Py<PyAny>,
    node: NodeSlots,
    array: ArraySlots,
    /// pending.EPOCH.
    epoch: Py<PyList>,
    /// ir.node's attrs of nodes made without any (one dict, never changed in place).
    no_attrs: Py<PyAny>,
    library: Py<PyDict>,
    /// ir.source.LIBRARY_GENERATION.
    library_generation: Py<PyList>,
    user_frame: Py<PyAny>,
    float_type: Py<PyType>,
    int_type: Py<PyType>,
    bool_type: Py<PyType>,
    state: Mutex<State>,
}

/// The key's scalar part of value: (kind, bits), or None for a value no key holds.
fn scalar_part(t: &Table, value: &Bound<'_, PyAny>) -> PyResult<Option<(u8, u64)>> {
    let ty = type_of(value);
    if ty == t.float_type.as_ptr() {
        // SAFETY: an exact float: PyFloat_AsDouble cannot fail on it.
        return Ok(Some((
            0,
            unsafe { ffi::PyFloat_AsDouble(value.as_ptr()) }.to_bits(),
        )));
    }
    if ty == t.int_type.as_ptr() {
        return Ok(value.extract::<i64>().ok().map(|v| (1, v as u64)));
    }
    if ty == t.bool_type.as_ptr() {
        return Ok(Some((2, u64::from(value.is_truthy()?))));
    }
    Ok(None)
}

/// The object's type, for an identity test (no reference taken).
fn type_of(o: &Bound<'_, PyAny>) -> *mut ffi::PyObject {
    // SAFETY: a live object's ob_type (PyObject's layout is in the limited API).
    unsafe { ffi::Py_TYPE(o.as_ptr()).cast() }
}

impl Table {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for t in [
            &self.node_type,
            &self.array_type,
            &self.float_type,
            &self.int_type,
            &self.bool_type,
        ] {
            visit.call(t)?;
        }
        for o in [&self.ids, &self.no_attrs, &self.user_frame] {
            visit.call(o)?;
        }
        visit.call(&self.epoch)?;
        visit.call(&self.library_generation)?;
        visit.call(&self.library)?;
        self.node.traverse(visit)?;
        self.array.traverse(visit)?;
        // Held by a record on this thread (a collection inside it): its references go
        // unreported this time, which keeps them alive, never frees them early.
        if let Ok(s) = self.state.try_lock() {
            for spec in s.specs.values() {
                spec.traverse(visit)?;
            }
            s.sites.traverse(visit)?;
        }
        Ok(())
    }

    /// The key's spec, and the site `here`'s `where` and `(where,)` if cached; None where
    /// the key has none (or the lock is held: a record on this thread).
    #[allow(clippy::type_complexity)]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        key: &Key,
        here: Option<&Here<'py>>,
    ) -> Option<(Arc<Spec>, Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>)> {
        let state = self.state.try_lock().ok()?;
        let spec = state.specs.get(key)?.clone();
        let now = first_item(py, &self.library_generation).ok()?;
        let site = here.and_then(|h| state.sites.get(py, h, now));
        Some((spec, site))
    }

    /// The user's location for `here` found anew (frames::locate) and `(where,)`; the
    /// site kept when it is the user's.
    fn locate<'py>(
        &self,
        py: Python<'py>,
        here: Option<&Here<'py>>,
        skip: u8,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (where_, users) = locate(py, &self.library, &self.user_frame, here, skip)?;
        let own = tuple(py, &[&where_])?;
        if let (Some(h), true) = (here, users) {
            let now = first_item(py, &self.library_generation)?;
            let old = match self.state.try_lock() {
                Ok(mut state) => state.sites.put(h, now, &where_, &own),
                Err(_) => None,
            };
            drop(old); // after the lock: its references may free code objects
        }
        Ok((where_, own))
    }

    /// A pending node as Node.known makes it, its summary and leaves `summary`.
    #[allow(clippy::too_many_arguments)]
    fn node<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        inputs: &Bound<'py, PyAny>,
        attrs: &Bound<'py, PyAny>,
        canon: &Bound<'py, PyAny>,
        shape: &Bound<'py, PyAny>,
        dtype: &Bound<'py, PyAny>,
        where_: &Bound<'py, PyAny>,
        summary: (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = KnownNode {
            op,
            inputs,
            attrs,
            canon,
            shape,
            dtype,
            where_,
        };
        let none = py.None().into_bound(py);
        self.node
            .known(py, &self.node_type, &self.ids, n, &none, summary)
    }

    fn record<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        x: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
        first: bool,
        skip: u8,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if type_of(x) != self.array_type.as_ptr() {
            return Ok(None);
        }
        let Some((kind, bits)) = scalar_part(self, value)? else {
            return Ok(None);
        };
        let node = self.array.node(x)?;
        if type_of(&node) != self.node_type.as_ptr() {
            return Ok(None);
        }
        let slots = &self.node;
        let dtype = slots.dtype.peek(&node)?;
        let key = (
            op.as_ptr() as usize,
            dtype.as_ptr() as usize,
            kind,
            bits,
            first,
        );
        let here = Here::of(py, skip)?;
        let Some((spec, site)) = self.lookup(py, &key, here.as_ref()) else {
            return Ok(None);
        };
        // The array operand's part of the summary (pending.py): a realised node is a leaf
        // (its kid negated), a pending one brings its summary if it is current.
        // SAFETY: pending.EPOCH, a list of one int never emptied: a borrowed reference, made
        // a new one (Python code that a collection runs may bump EPOCH before it is stored).
        let epoch = unsafe {
            Bound::from_borrowed_ptr_or_err(py, ffi::PyList_GetItem(self.epoch.as_ptr(), 0))?
        };
        // Held, not borrowed: while the summary (a tuple) is held its items, borrowed, stay
        // alive through the allocations below (whose collections may run Python code).
        let sub = slots.sub.peek(&node)?.to_owned();
        let mut part: Option<Part<'_, 'py>> = None;
        let mut used = false;
        if !slots.realized.peek(&node)?.is_none() {
            if !sub.is_exact_instance_of::<PyInt>() {
                return Ok(None); // no leaf kid yet: pending.leaf_kid makes it
            }
            let xkey = sub.neg()?;
            let leaves = tuple(py, &[&node])?;
            let trail = tuple(py, &[&*slots.where_.peek(&node)?])?;
            part = Some((xkey.into(), leaves.into(), trail.into(), 3));
        } else if let Some(s) = Summary::current(sub.as_borrowed(), &epoch)? {
            let size = s.item(2).extract::<i64>()?;
            // A summarised node's leaves: a tuple beside its summary (pending.py); held, as
            // the summary is, for what a collection may run before they are stored.
            let leaves = slots.leaves.peek(&node)?.to_owned();
            part = Some((s.item(0).into(), leaves.into(), s.0.into(), size + 2));
            used = true;
        }
        let (where_, own) = match site {
            Some(site) => site,
            None => self.locate(py, here.as_ref(), skip)?,
        };
        // The op node's summary (kid, epoch, size, where, input trails) and its leaves.
        let (summary, leaves) = match part {
            Some((xkey, leaves, trail, size)) => {
                // SAFETY: a borrowed reference, or null: absent (no exception set) or an
                // error (an int key's hash and comparison cannot fail).
                let kid =
                    unsafe { ffi::PyDict_GetItemWithError(spec.kids.as_ptr(), xkey.as_ptr()) };
                if kid.is_null() {
                    return Ok(None); // a part not interned yet: the Python path
                }
                // SAFETY: a borrowed reference, made a new one.
                let kid = unsafe { Bound::from_borrowed_ptr(py, kid) };
                if used {
                    slots.used.replace(&node, &PyBool::new(py, true))?;
                }
                let size = size.into_pyobject(py)?.into_any();
                let (a, b) = if first {
                    (&own, &*trail)
                } else {
                    (&*trail, &own)
                };
                let summary = Summary::make(py, [&kid, &epoch, &size, &where_, a, b])?;
                (summary, leaves.to_owned())
            }
            None => (py.None().into_bound(py), py.None().into_bound(py)),
        };
        let none = py.None().into_bound(py);
        let empty = PyTuple::empty(py).into_any();
        let const_ = self.node(
            py,
            intern!(py, "full").as_any(),
            &empty,
            spec.fattrs.bind(py),
            spec.fitems.bind(py),
            &empty,
            spec.fdtype.bind(py),
            &where_,
            (&none, &none),
        )?;
        let inputs = if first {
            tuple(py, &[&const_, &node])?
        } else {
            tuple(py, &[&node, &const_])?
        };
        let n = self.node(
            py,
            spec.nop.bind(py),
            &inputs,
            self.no_attrs.bind(py),
            spec.nitems.bind(py),
            &*slots.shape.peek(&node)?,
            spec.ndtype.bind(py),
            &where_,
            (&summary, &leaves),
        )?;
        self.array.wrap(py, &self.array_type, &n).map(Some)
    }
}

/// A new tuple of `items` (PyTuple_Pack: no iterator, no per-item call).
fn tuple<'py>(py: Python<'py>, items: &[&Bound<'py, PyAny>]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyTuple_Pack takes borrowed references (it increfs them) and returns a new
    // reference or null with an exception set.
    unsafe {
        let t = match items {
            [a] => ffi::PyTuple_Pack(1, a.as_ptr()),
            [a, b] => ffi::PyTuple_Pack(2, a.as_ptr(), b.as_ptr()),
            [a, b, c] => ffi::PyTuple_Pack(3, a.as_ptr(), b.as_ptr(), c.as_ptr()),
            _ => return Ok(PyTuple::new(py, items)?.into_any()),
        };
        Bound::from_owned_ptr_or_err(py, t)
    }
}

/// A pending node's summary as pending.py makes it: the tuple (kid, epoch, size, where,
/// input trails...), which is its node's trail too; read through borrowed items.
#[derive(Clone, Copy)]
struct Summary<'a, 'py>(Borrowed<'a, 'py, PyAny>);

impl<'a, 'py> Summary<'a, 'py> {
    /// `sub` as a summary if it is one made at `epoch` (pending.EPOCH's value now).
    fn current(sub: Borrowed<'a, 'py, PyAny>, epoch: &Bound<'py, PyAny>) -> PyResult<Option<Self>> {
        // SAFETY: sub is a live object; PyTuple_Size on an exact tuple cannot fail.
        if !sub.is_exact_instance_of::<PyTuple>() || unsafe { ffi::PyTuple_Size(sub.as_ptr()) } < 4
        {
            return Ok(None);
        }
        let s = Self(sub);
        let made = s.item(1);
        // The epoch object itself, usually: EPOCH[0] was stored in it.
        if made.is(epoch) || made.eq(epoch)? {
            return Ok(Some(s));
        }
        Ok(None)
    }

    /// Item `i` (< 4) of the summary, borrowed from it.
    fn item(&self, i: isize) -> Borrowed<'a, 'py, PyAny> {
        // SAFETY: an exact tuple of at least 4 items (checked in `current`): a borrowed
        // reference, alive while the tuple is.
        unsafe { Borrowed::from_ptr(self.0.py(), ffi::PyTuple_GetItem(self.0.as_ptr(), i)) }
    }

    /// A new summary (kid, epoch, size, where, a, b): a and b, its node's input trails in
    /// input order.
    fn make(py: Python<'py>, items: [&Bound<'py, PyAny>; 6]) -> PyResult<Bound<'py, PyAny>> {
        let [kid, epoch, size, where_, a, b] = items.map(|i| i.as_ptr());
        // SAFETY: PyTuple_Pack takes borrowed references (it increfs them) and returns a
        // new reference or null with an exception set.
        unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyTuple_Pack(6, kid, epoch, size, where_, a, b))
        }
    }
}

/// The process's table of lazy array-scalar records (one, made by pygpukit.array).
#[pyclass(name = "LazyScalars", module = "pygpukit._rust")]
pub struct LazyScalars {
    t: Option<Table>,
}

impl LazyScalars {
    /// `record` for a caller `skip` frames below the user's (operator.rs: 0).
    pub(crate) fn record_at<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        x: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
        first: bool,
        skip: u8,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.t {
            Some(t) => t.record(py, op, x, value, first, skip),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl LazyScalars {
    /// types: (Node, GPUArray); ids: ir.node's id counter; epoch: pending.EPOCH; no_attrs:
    /// ir.node's shared empty attrs; library: (ir.source.LIBRARY_FILES,
    /// ir.source.LIBRARY_GENERATION); user_frame: ir.source.user_frame.
    #[new]
    fn new(
        py: Python<'_>,
        types: (Py<PyType>, Py<PyType>),
        ids: Py<PyAny>,
        epoch: Py<PyList>,
        no_attrs: Py<PyAny>,
        library: (Py<PyDict>, Py<PyList>),
        user_frame: Py<PyAny>,
    ) -> PyResult<Self> {
        let (library, library_generation) = library;
        let (node_type, array_type) = types;
        let node = NodeSlots::of(node_type.bind(py))?;
        if !node.located() {
            return Ok(Self { t: None }); // no offsets to read at: the Python path serves all
        }
        let t = Table {
            node,
            array: ArraySlots::of(array_type.bind(py))?,
            node_type,
            array_type,
            ids,
            epoch,
            no_attrs,
            library,
            library_generation,
            user_frame,
            float_type: py.get_type::<PyFloat>().unbind(),
            int_type: py.get_type::<PyInt>().unbind(),
            bool_type: py.get_type::<PyBool>().unbind(),
            state: Mutex::new(State::default()),
        };
        Ok(Self { t: Some(t) })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.t {
            Some(t) => t.traverse(&visit),
            None => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        self.t = None;
    }

    /// The array of `x op value` (`value op x` when `first`) recorded lazily, or None: take
    /// the Python path. op: the operator's interned name; x: a GPUArray; value: anything.
    fn record<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        x: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
        first: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.t {
            Some(t) => t.record(py, op, x, value, first, 1),
            None => Ok(None),
        }
    }

    /// Serve op's key from now on: dtype, the array operand's; value, the scalar; spec,
    /// array._SCALAR_OPS's entry (fattrs, fitems, fdtype, fkid, nop, nitems, ndtype, kids).
    /// False where no key holds the value (an int beyond 64 bits).
    fn register(
        &self,
        op: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        first: bool,
        spec: &Bound<'_, PyTuple>,
    ) -> PyResult<bool> {
        let Some(t) = &self.t else {
            return Ok(false);
        };
        let Some((kind, bits)) = scalar_part(t, value)? else {
            return Ok(false);
        };
        let s = Spec {
            op: op.clone().unbind(),
            dtype: dtype.clone().unbind(),
            fattrs: spec.get_item(0)?.unbind(),
            fitems: spec.get_item(1)?.unbind(),
            fdtype: spec.get_item(2)?.unbind(),
            nop: spec.get_item(4)?.unbind(),
            nitems: spec.get_item(5)?.unbind(),
            ndtype: spec.get_item(6)?.unbind(),
            kids: spec.get_item(7)?.cast_into::<PyDict>()?.unbind(),
        };
        let key = (
            op.as_ptr() as usize,
            dtype.as_ptr() as usize,
            kind,
            bits,
            first,
        );
        let Ok(mut all) = t.state.try_lock() else {
            return Ok(false);
        };
        all.specs.insert(key, Arc::new(s));
        Ok(true)
    }

    /// Drops every spec (array._SCALAR_OPS was cleared).
    fn clear(&self) {
        if let Some(t) = &self.t {
            if let Ok(mut all) = t.state.try_lock() {
                all.specs.clear();
            }
        }
    }

    /// The specs kept.
    fn __len__(&self) -> usize {
        match &self.t {
            Some(t) => t.state.try_lock().map(|s| s.specs.len()).unwrap_or(0),
            None => 0,
        }
    }
}
