//! `pygpukit._rust.EagerHits`: an eager elementwise op's usual hit (array op array, array
//! op scalar, realised operands, the controller's plan recorded for their layouts) in one
//! native call from the array operator (pygpukit/array.py): the key's check, the plan's
//! run through the dispatch controller (`Dispatcher::run_allocating`: the inputs touched,
//! the output block from the pool, the launch), and the result's Storage, DeviceValue,
//! Node and GPUArray. It serves what `eager_ops.hit` with a `dispatch.EagerReplay` serves
//! and nothing else: any other call, or a check that fails, answers None having changed
//! nothing, and the caller takes the Python path (`array.binary`), which decides again.
//!
//! Entries are added by eager_ops (`register`) when a key of the eager cache gets its
//! replay, and leave with it: `forget` when the key leaves the cache, `clear` with the
//! cache, all of them when a setting changes (settings.CHANGES: the key holds the skipped
//! passes, and a hit is not taken while debug() is on), and one whose replay declines
//! (its EagerOp's replay is then None, as the Python hit leaves it).
//!
//! The table's lock is only tried, never waited for: a finaliser run by the collector in
//! the middle of a hit may make an eager op on the same thread, which then takes the
//! Python path (and files nothing) instead of waiting for itself.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};

use crate::dispatch::{Block, PyDispatcher};
use crate::frames::user_location;
use crate::pool::PyPool;
use crate::quick::StreamCache;
use crate::slots::{ArraySlots, NodeSlots, RealisedNode, Slot, StorageSlots, ValueSlots};

/// Entries kept under one digest (a guard: an entry leaves with its key, so the table is
/// no larger than the eager cache).
const PER_DIGEST: usize = 8;

/// One operand of a key: a realised array of this layout, or a Python scalar.
enum Operand {
    Array {
        shape: Py<PyAny>,
        dtype: Py<PyAny>,
        strides: Py<PyAny>,
        align: u64,
        itemsize: u64,
    },
    /// type(value) and value; a float by its bits (0.0 and -0.0 differ, as in the key).
    Scalar {
        ty: Py<PyType>,
        value: Py<PyAny>,
        bits: Option<u64>,
    },
}

/// Where a schedule input comes from: operand k's value, or a kept constant's block.
enum Source {
    Operand(usize),
    Const { storage: Py<PyAny>, offset: u64 },
}

struct Entry {
    /// The op's name as the key holds it (compared by identity: interned).
    name: Py<PyAny>,
    operands: [Operand; 2],
    same: bool,
    backend: Py<PyAny>,
    /// The eager cache's EagerOp and the replay it held when this was registered.
    eager_op: Py<PyAny>,
    replay: Py<PyAny>,
    native: Py<PyAny>,
    native_stats: Py<PyDict>,
    ctrl: Py<PyDispatcher>,
    key: u64,
    out_bytes: u64,
    out_shape: Py<PyAny>,
    out_strides: Py<PyAny>,
    out_offset: i64,
    out_dtype: Py<PyAny>,
    sources: Vec<Source>,
    op: Py<PyAny>,
    attrs: Py<PyAny>,
    items: Py<PyAny>,
    shape: Py<PyAny>,
    dtype: Py<PyAny>,
    built: Py<PyAny>,
    lines: Vec<i64>,
}

impl Entry {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for o in &self.operands {
            match o {
                Operand::Array {
                    shape,
                    dtype,
                    strides,
                    ..
                } => {
                    visit.call(shape)?;
                    visit.call(dtype)?;
                    visit.call(strides)?;
                }
                Operand::Scalar { ty, value, .. } => {
                    visit.call(ty)?;
                    visit.call(value)?;
                }
            }
        }
        for s in &self.sources {
            if let Source::Const { storage, .. } = s {
                visit.call(storage)?;
            }
        }
        for o in [
            &self.name,
            &self.backend,
            &self.eager_op,
            &self.replay,
            &self.native,
            &self.out_shape,
            &self.out_strides,
            &self.out_dtype,
            &self.op,
            &self.attrs,
            &self.items,
            &self.shape,
            &self.dtype,
            &self.built,
        ] {
            visit.call(o)?;
        }
        visit.call(&self.native_stats)?;
        visit.call(&self.ctrl)
    }
}

/// One operand of a call, as far as the checks have read it.
enum Arg<'py> {
    Array {
        node: Bound<'py, PyAny>,
        value: Bound<'py, PyAny>,
    },
    Scalar(Bound<'py, PyAny>),
}

/// The digests are mixed already: a map keyed by them needs no second hash.
#[derive(Default)]
struct Mixed(u64);

impl Hasher for Mixed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[derive(Default)]
struct Entries {
    /// settings.CHANGES[0] when the entries were made.
    changes: i64,
    /// By digest (`digest`: the op, the operands' shapes, the scalars).
    by_digest: HashMap<u64, Vec<Arc<Entry>>, BuildHasherDefault<Mixed>>,
}

struct Table {
    node_type: Py<PyType>,
    array_type: Py<PyType>,
    storage_type: Py<PyType>,
    value_type: Py<PyType>,
    ids: Py<PyAny>,
    node: NodeSlots,
    array: ArraySlots,
    st: StorageSlots,
    dv: ValueSlots,
    /// EagerOp.replay.
    replay: Slot,
    /// pygpukit.backends' globals (`_backend`: get_backend()'s answer while one device).
    backends: Py<PyDict>,
    changes: Py<PyList>,
    releases: Py<PyList>,
    stats: Py<PyDict>,
    last_run: Py<PyList>,
    library: Py<PyDict>,
    user_frame: Py<PyAny>,
    cuda_error: Py<PyAny>,
    float_type: Py<PyType>,
    int_type: Py<PyType>,
    bool_type: Py<PyType>,
    stream: StreamCache,
    entries: Mutex<Entries>,
}

/// What a key's digest is made of, per operand.
enum Part<'a> {
    Shape(Bound<'a, PyAny>),
    Float(u64),
    Other(Bound<'a, PyAny>),
}

impl Operand {
    fn part<'py>(&self, py: Python<'py>) -> Part<'py> {
        match self {
            Operand::Array { shape, .. } => Part::Shape(shape.bind(py).clone()),
            Operand::Scalar { bits: Some(b), .. } => Part::Float(*b),
            Operand::Scalar { value, .. } => Part::Other(value.bind(py).clone()),
        }
    }
}

fn mix(op: &Bound<'_, PyAny>, parts: &[Part<'_>]) -> PyResult<u64> {
    let mut h = (op.as_ptr() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for p in parts {
        let v = match p {
            Part::Shape(s) | Part::Other(s) => s.hash()? as u64,
            Part::Float(b) => *b,
        };
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    }
    Ok(h)
}

fn same_object(a: &Bound<'_, PyAny>, b: &Py<PyAny>) -> PyResult<bool> {
    Ok(a.is(b) || a.eq(b)?)
}

fn add_one(d: &Bound<'_, PyDict>, key: &Bound<'_, PyString>) -> PyResult<()> {
    let n = match d.get_item(key)? {
        Some(v) => v.add(1)?,
        None => 1i64.into_pyobject(d.py())?.into_any(),
    };
    d.set_item(key, n)
}

impl Table {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for t in [
            &self.node_type,
            &self.array_type,
            &self.storage_type,
            &self.value_type,
            &self.float_type,
            &self.int_type,
            &self.bool_type,
        ] {
            visit.call(t)?;
        }
        for o in [&self.ids, &self.user_frame, &self.cuda_error] {
            visit.call(o)?;
        }
        for d in [&self.backends, &self.stats, &self.library] {
            visit.call(d)?;
        }
        for l in [&self.changes, &self.releases, &self.last_run] {
            visit.call(l)?;
        }
        self.node.traverse(visit)?;
        self.array.traverse(visit)?;
        self.st.traverse(visit)?;
        self.dv.traverse(visit)?;
        self.replay.traverse(visit)?;
        self.stream.traverse(visit)?;
        // Held by a hit on this thread (a collection inside it): its references go
        // unreported this time, which keeps them alive, never frees them early.
        if let Ok(e) = self.entries.try_lock() {
            for list in e.by_digest.values() {
                for x in list {
                    x.traverse(visit)?;
                }
            }
        }
        Ok(())
    }

    /// An operand as the key sees it: a realised array's node and DeviceValue, a Python
    /// scalar; None for anything else (a pending array, another backend's value, ...).
    fn arg<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Option<Arg<'py>>> {
        let ty = x.get_type();
        if ty.is(&self.array_type) {
            let node = self.array.node(x)?;
            if !node.get_type().is(&self.node_type) {
                return Ok(None);
            }
            let value = self.node.realized.get(&node)?;
            if !value.get_type().is(&self.value_type) {
                return Ok(None); // not realised (None), or not a DeviceValue
            }
            return Ok(Some(Arg::Array { node, value }));
        }
        if ty.is(&self.float_type) || ty.is(&self.int_type) || ty.is(&self.bool_type) {
            return Ok(Some(Arg::Scalar(x.clone())));
        }
        Ok(None)
    }

    fn matches(&self, o: &Operand, a: &Arg<'_>) -> PyResult<bool> {
        match (o, a) {
            (
                Operand::Array {
                    shape,
                    dtype,
                    strides,
                    align,
                    itemsize,
                },
                Arg::Array { node, value },
            ) => {
                if !self.node.dtype.get(node)?.is(dtype)
                    || !same_object(&self.node.shape.get(node)?, shape)?
                    || !same_object(&self.dv.strides.get(value)?, strides)?
                {
                    return Ok(false);
                }
                // dispatch.align: the address mod 16 without touching the block.
                let st = self.dv.storage.get(value)?;
                let addr: u64 = self.st.addr.get(&st)?.extract()?;
                let offset: u64 = self.dv.offset.get(value)?.extract()?;
                Ok((addr.wrapping_add(offset.wrapping_mul(*itemsize))) & 15 == *align)
            }
            (Operand::Scalar { ty, value, bits }, Arg::Scalar(x)) => {
                if !x.get_type().is(ty) {
                    return Ok(false);
                }
                match bits {
                    Some(b) => Ok(x.extract::<f64>()?.to_bits() == *b),
                    None => x.eq(value),
                }
            }
            _ => Ok(false),
        }
    }

    /// The digest of op(args): what `register` filed the entry under.
    fn digest(&self, op: &Bound<'_, PyAny>, args: &[Arg<'_>; 2]) -> PyResult<u64> {
        let mut parts = Vec::with_capacity(2);
        for a in args {
            parts.push(match a {
                Arg::Array { node, .. } => Part::Shape(self.node.shape.get(node)?),
                Arg::Scalar(x) if x.get_type().is(&self.float_type) => {
                    Part::Float(x.extract::<f64>()?.to_bits())
                }
                Arg::Scalar(x) => Part::Other(x.clone()),
            });
        }
        mix(op, &parts)
    }

    /// The entry of op(a, b), if one is kept for these operands.
    fn find(
        &self,
        py: Python<'_>,
        op: &Bound<'_, PyAny>,
        args: &[Arg<'_>; 2],
    ) -> PyResult<Option<Arc<Entry>>> {
        let Ok(mut e) = self.entries.try_lock() else {
            return Ok(None); // another thread is in the table: the Python path
        };
        let changes: i64 = self.changes.bind(py).get_item(0)?.extract()?;
        if changes != e.changes {
            e.by_digest.clear();
            e.changes = changes;
            return Ok(None);
        }
        let Some(list) = e.by_digest.get(&self.digest(op, args)?) else {
            return Ok(None);
        };
        let same = match args {
            [Arg::Array { node: a, .. }, Arg::Array { node: b, .. }] => a.is(b),
            _ => false,
        };
        let backend = self.backends.bind(py).get_item(intern!(py, "_backend"))?;
        for x in list.iter() {
            if x.same == same
                && op.is(&x.name)
                && self.matches(&x.operands[0], &args[0])?
                && self.matches(&x.operands[1], &args[1])?
                && backend.as_ref().is_some_and(|b| b.is(&x.backend))
            {
                return Ok(Some(x.clone()));
            }
        }
        Ok(None)
    }

    fn remove(&self, gone: &Entry) {
        if let Ok(mut e) = self.entries.try_lock() {
            for list in e.by_digest.values_mut() {
                list.retain(|x| !x.eager_op.is(&gone.eager_op));
            }
        }
    }

    /// The replay declined or cannot run now: the Python hit's `entry.replay = None`.
    fn decline(&self, py: Python<'_>, x: &Entry) -> PyResult<()> {
        self.replay
            .set(x.eager_op.bind(py), &py.None().into_bound(py))?;
        self.remove(x);
        Ok(())
    }

    /// The user's frame as recording keeps it (frames.rs).
    fn location<'py>(&self, py: Python<'py>, skip: u8) -> PyResult<Bound<'py, PyAny>> {
        user_location(py, &self.library, &self.user_frame, skip)
    }

    fn hit<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
        skip: u8,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let (Some(x), Some(y)) = (self.arg(a)?, self.arg(b)?) else {
            return Ok(None);
        };
        if matches!((&x, &y), (Arg::Scalar(_), Arg::Scalar(_))) {
            return Ok(None);
        }
        let args = [x, y];
        let Some(e) = self.find(py, op, &args)? else {
            return Ok(None);
        };
        if !self.replay.get(e.eager_op.bind(py))?.is(&e.replay) {
            self.remove(&e); // the Python hit replaced or dropped it meanwhile
            return Ok(None);
        }
        let backend = e.backend.bind(py);
        if !backend.getattr(intern!(py, "native"))?.is(&e.native)
            || backend.getattr(intern!(py, "poison"))?.is_truthy()?
        {
            self.decline(py, &e)?;
            return Ok(None);
        }
        // The schedule's inputs as Dispatcher.run_alloc takes them (dispatch.operand).
        let check_freed = self.releases.bind(py).get_item(0)?.is_truthy()?;
        let mut blocks: Vec<Block> = Vec::with_capacity(e.sources.len());
        for s in &e.sources {
            let (storage, off) = match s {
                Source::Operand(k) => {
                    let (Arg::Array { value, .. }, Operand::Array { itemsize, .. }) =
                        (&args[*k], &e.operands[*k])
                    else {
                        return Ok(None);
                    };
                    let offset: u64 = self.dv.offset.get(value)?.extract()?;
                    (self.dv.storage.get(value)?, offset * itemsize)
                }
                Source::Const { storage, offset } => (storage.bind(py).clone(), *offset),
            };
            if !storage.is_instance(self.storage_type.bind(py))? {
                return Ok(None);
            }
            if check_freed && self.st.freed.get(&storage)?.is_truthy()? {
                return Ok(None); // the Python hit drops the key and raises FreedArrayError
            }
            let h = self.st.h.get(&storage)?;
            blocks.push(if h.is_none() {
                (self.st.addr.get(&storage)?.extract::<u64>()? + off, None)
            } else {
                (off, Some(h.extract()?))
            });
        }
        let pool = backend.getattr(intern!(py, "pool"))?;
        let Ok(pool_ref) = pool.cast::<PyPool>() else {
            return Ok(None);
        };
        let stream = self.stream.handle(backend)?;
        let got =
            e.ctrl
                .get()
                .run_allocating(py, e.key, &blocks, &[e.out_bytes], stream, pool_ref.get());
        let got = match got {
            Ok(Some(g)) => g,
            Ok(None) => {
                // An eviction meanwhile, a temporary that did not fit, the plan dropped.
                add_one(e.native_stats.bind(py), intern!(py, "fallbacks"))?;
                self.decline(py, &e)?;
                return Ok(None);
            }
            Err(err) if err.is_instance_of::<PyRuntimeError>(py) => {
                let msg = err.value(py).str()?;
                return Err(PyErr::from_value(self.cuda_error.bind(py).call1((msg,))?));
            }
            Err(err) => return Err(err),
        };
        add_one(e.native_stats.bind(py), intern!(py, "native_runs"))?;
        let stats = self.stats.bind(py);
        add_one(stats, intern!(py, "realize_calls"))?;
        add_one(stats, intern!(py, "schedule_hits"))?;
        let where_ = self.location(py, skip)?;
        // errors.note_run(entry.built, [where or operand k's line, per built location]).
        let mut now = Vec::with_capacity(e.lines.len());
        for &k in &e.lines {
            now.push(match usize::try_from(k).ok().and_then(|k| args.get(k)) {
                Some(Arg::Array { node, .. }) => self.node.where_.get(node)?,
                _ => where_.clone(),
            });
        }
        let run = PyTuple::new(
            py,
            [e.built.bind(py).clone(), PyList::new(py, now)?.into_any()],
        )?;
        self.last_run.bind(py).set_item(0, run)?;
        let (addr, h) = got[0];
        let storage = self
            .st
            .adopt(py, &self.storage_type, &pool, e.out_bytes, addr, h)?;
        let value = self.dv.make(
            py,
            &self.value_type,
            &storage,
            e.out_shape.bind(py),
            e.out_strides.bind(py),
            e.out_offset,
            e.out_dtype.bind(py),
        )?;
        let node = self.node.realised(
            py,
            &self.node_type,
            &self.ids,
            RealisedNode {
                op: e.op.bind(py),
                attrs: e.attrs.bind(py),
                canon: e.items.bind(py),
                shape: e.shape.bind(py),
                dtype: e.dtype.bind(py),
                where_: &where_,
                value: &value,
            },
        )?;
        self.array.wrap(py, &self.array_type, &node).map(Some)
    }

    fn operand(&self, spec: &Bound<'_, PyAny>) -> PyResult<Operand> {
        let py = spec.py();
        let t = spec.cast::<PyTuple>()?;
        if t.len() == 4 {
            let dtype = t.get_item(1)?;
            let itemsize: u64 = dtype.getattr(intern!(py, "itemsize"))?.extract()?;
            return Ok(Operand::Array {
                shape: t.get_item(0)?.unbind(),
                dtype: dtype.unbind(),
                strides: t.get_item(2)?.unbind(),
                align: t.get_item(3)?.extract()?,
                itemsize,
            });
        }
        let value = t.get_item(1)?;
        let ty = value.get_type();
        let bits = if ty.is(&self.float_type) {
            Some(value.extract::<f64>()?.to_bits())
        } else {
            None
        };
        Ok(Operand::Scalar {
            ty: ty.unbind(),
            value: value.unbind(),
            bits,
        })
    }
}

/// (Node, GPUArray, Storage, DeviceValue, EagerOp).
type Types = (Py<PyType>, Py<PyType>, Py<PyType>, Py<PyType>, Py<PyType>);

/// The process's table of native eager hits (one, made by pygpukit.eager_ops).
#[pyclass(name = "EagerHits", module = "pygpukit._rust")]
pub struct EagerHits {
    t: Option<Table>,
}

impl EagerHits {
    /// `binary` for a caller `skip` frames below the user's (operator.rs: 0).
    pub(crate) fn hit_at<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
        skip: u8,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.t {
            Some(t) => t.hit(py, op, a, b, skip),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl EagerHits {
    /// types: (Node, GPUArray, Storage, DeviceValue, EagerOp); ids: ir.node's id counter;
    /// backends: pygpukit.backends' globals; changes, releases: settings.CHANGES and
    /// memory.RELEASES; stats: runtime.stats; last_run: errors._LAST_RUN; library:
    /// ir.source.LIBRARY_FILES; user_frame: ir.source.user_frame; cuda_error: CUDAError.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        types: Types,
        ids: Py<PyAny>,
        backends: Py<PyDict>,
        changes: Py<PyList>,
        releases: Py<PyList>,
        stats: Py<PyDict>,
        last_run: Py<PyList>,
        library: Py<PyDict>,
        user_frame: Py<PyAny>,
        cuda_error: Py<PyAny>,
    ) -> PyResult<Self> {
        let (node_type, array_type, storage_type, value_type, op_type) = types;
        let t = Table {
            node: NodeSlots::of(node_type.bind(py))?,
            array: ArraySlots::of(array_type.bind(py))?,
            st: StorageSlots::of(storage_type.bind(py))?,
            dv: ValueSlots::of(value_type.bind(py))?,
            replay: Slot::of(op_type.bind(py), "replay")?,
            node_type,
            array_type,
            storage_type,
            value_type,
            ids,
            backends,
            changes,
            releases,
            stats,
            last_run,
            library,
            user_frame,
            cuda_error,
            float_type: py.get_type::<PyFloat>().unbind(),
            int_type: py.get_type::<PyInt>().unbind(),
            bool_type: py.get_type::<PyBool>().unbind(),
            stream: StreamCache::default(),
            entries: Mutex::new(Entries::default()),
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

    /// The result array of op(a, b) (op: the operator's interned name), or None: take the
    /// Python path.
    fn binary<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.t {
            Some(t) => t.hit(py, op, a, b, 1),
            None => Ok(None),
        }
    }

    /// Serve op's key from now on: entry, the EagerOp whose replay is `replay` (a
    /// dispatch.EagerReplay); operands: per operand (shape, dtype, strides, align) of an
    /// array or (type, value) of a scalar; same: both operands one array; backend: the
    /// key's; sources: per schedule input an operand index or a constant's DeviceValue.
    /// False where the replay is not one this table can run (its output views an input,
    /// a stand-in controller).
    #[allow(clippy::too_many_arguments)]
    fn register(
        &self,
        py: Python<'_>,
        op: Bound<'_, PyString>,
        entry: Bound<'_, PyAny>,
        replay: Bound<'_, PyAny>,
        operands: (Bound<'_, PyAny>, Bound<'_, PyAny>),
        same: bool,
        backend: Bound<'_, PyAny>,
        sources: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let Some(t) = &self.t else {
            return Ok(false);
        };
        // Another backend's replay (a callable without a plan): not served here.
        let Ok(native) = replay.getattr("native") else {
            return Ok(false);
        };
        let Ok(ctrl) = native.getattr("ctrl")?.cast_into::<PyDispatcher>() else {
            return Ok(false);
        };
        let buf_bytes: Vec<u64> = replay.getattr("buf_bytes")?.extract()?;
        let out = replay.getattr("out")?;
        let out = out.cast::<PyTuple>()?;
        let j: i64 = out.get_item(0)?.extract()?;
        if j != 0 || buf_bytes.len() != 1 {
            return Ok(false); // a view of an input: the Python replay makes it
        }
        let operands = [t.operand(&operands.0)?, t.operand(&operands.1)?];
        let mut srcs = Vec::with_capacity(sources.len());
        for s in sources {
            if let Ok(k) = s.extract::<usize>() {
                if k > 1 || !matches!(operands[k], Operand::Array { .. }) {
                    return Ok(false);
                }
                srcs.push(Source::Operand(k));
            } else if s.get_type().is(&t.value_type) {
                let itemsize: u64 = t.dv.dtype.get(&s)?.getattr("itemsize")?.extract()?;
                let offset: u64 = t.dv.offset.get(&s)?.extract()?;
                srcs.push(Source::Const {
                    storage: t.dv.storage.get(&s)?.unbind(),
                    offset: offset * itemsize,
                });
            } else {
                return Ok(false);
            }
        }
        let lines: Vec<i64> = entry.getattr("lines")?.extract()?;
        let d = {
            let parts: Vec<Part<'_>> = operands.iter().map(|o| o.part(py)).collect();
            mix(op.as_any(), &parts)?
        };
        let e = Entry {
            name: op.clone().into_any().unbind(),
            operands,
            same,
            backend: backend.unbind(),
            native_stats: native.getattr("stats")?.cast_into::<PyDict>()?.unbind(),
            native: native.unbind(),
            ctrl: ctrl.unbind(),
            key: replay.getattr("key")?.extract()?,
            out_bytes: buf_bytes[0],
            out_shape: out.get_item(1)?.unbind(),
            out_strides: out.get_item(2)?.unbind(),
            out_offset: out.get_item(3)?.extract()?,
            out_dtype: out.get_item(4)?.unbind(),
            sources: srcs,
            op: entry.getattr("op")?.unbind(),
            attrs: entry.getattr("attrs")?.unbind(),
            items: entry.getattr("items")?.unbind(),
            shape: entry.getattr("shape")?.unbind(),
            dtype: entry.getattr("dtype")?.unbind(),
            built: entry.getattr("built")?.unbind(),
            lines,
            eager_op: entry.unbind(),
            replay: replay.unbind(),
        };
        let changes: i64 = t.changes.bind(py).get_item(0)?.extract()?;
        let Ok(mut all) = t.entries.try_lock() else {
            return Ok(false);
        };
        if all.changes != changes {
            all.by_digest.clear();
            all.changes = changes;
        }
        let list = all.by_digest.entry(d).or_default();
        list.retain(|x| !x.eager_op.is(&e.eager_op));
        if list.len() >= PER_DIGEST {
            list.remove(0);
        }
        list.push(Arc::new(e));
        Ok(true)
    }

    /// Drops what serves `entry` (an EagerOp that left the eager cache).
    fn forget(&self, entry: &Bound<'_, PyAny>) {
        if let Some(t) = &self.t {
            if let Ok(mut all) = t.entries.try_lock() {
                for list in all.by_digest.values_mut() {
                    list.retain(|x| !x.eager_op.is(entry));
                }
            }
        }
    }

    /// Drops every entry (the eager cache was cleared).
    fn clear(&self) {
        if let Some(t) = &self.t {
            if let Ok(mut all) = t.entries.try_lock() {
                all.by_digest.clear();
            }
        }
    }

    /// The entries kept.
    fn __len__(&self) -> usize {
        match &self.t {
            Some(t) => t
                .entries
                .try_lock()
                .map(|e| e.by_digest.values().map(|l| l.len()).sum())
                .unwrap_or(0),
            None => 0,
        }
    }
}
