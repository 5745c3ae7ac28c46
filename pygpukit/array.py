"""GPUArray: a NumPy-like array whose operations are recorded into the IR."""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pygpukit import _rust, errors
from pygpukit.ir import Node, dtypes, indexing, shapes, user_location
from pygpukit.ir import node as node_mod
from pygpukit.ir import strides as strides_mod
from pygpukit.ir.dtypes import DType
from pygpukit.ir.elementwise import canonical
from pygpukit.ir.node import canonical_items, freeze
from pygpukit.ir.ops import weak_scalar_dtype
from pygpukit.ir.source import LIBRARY_FILES as _LIBRARY_FILES
from pygpukit.ir.source import LIBRARY_GENERATION as _LIBRARY_GENERATION
from pygpukit.ir.source import user_frame

from . import eager_ops, pending, runtime, settings
from .backends import devices, get_backend
from .mode import _eager as _eager_mode
from .mode import is_eager
from .pending import EPOCH

# Bound once: the recording fast paths (an op of two arrays; of an array and a Python
# scalar, two nodes an op).
_known = Node.known
_known_scalar_op = Node.known_scalar_op
# The attrs of the op nodes _two_arrays makes (none): one dict, as node attrs are never
# changed in place.
_NO_ATTRS: dict[str, Any] = {}
_eager_now = _eager_mode.get
_new = object.__new__  # the recording fast paths make their GPUArray without a type call
_devices_active = devices.ACTIVE  # one list, changed in place only
_eager_default = settings.EAGER_NOW  # likewise
_getframe = sys._getframe

Scalar = int | float | bool
ArrayLike = Any


def _scalar_node(value: Scalar, like: DType, op: str = "") -> Node:
    d = weak_scalar_dtype(value, like, exact=op in _COMPARISONS)
    return runtime.record("full", (), {"shape": (), "dtype": d.name,
                                       "value": scalar_value(value, d)})  # fmt: skip


def scalar_value(value: Scalar, d: DType) -> Scalar:
    """A Python scalar as a value of dtype d, with NumPy 2's checks: an int out of d's range
    raises OverflowError, a float NaN into an integer dtype ValueError, inf OverflowError.
    Raises the builtins; callers wrap them with the op and the user's line."""
    kind = type(value).__name__
    # -0.0 == 0.0 hashes alike: the sign is part of the key, or one would stand for the other.
    sign = math.copysign(1.0, value) if kind == "float" else 1.0
    return _scalar_value(kind, value, d.name, sign)


@functools.lru_cache(maxsize=4096)  # every op with a Python scalar asks: a hot path
def _scalar_value(kind: str, value: Scalar, dtype: str, sign: float) -> Scalar:
    d = dtypes.as_dtype(dtype)
    if d.kind in "iu" and kind != "bool":
        if kind == "float":
            if math.isnan(value):
                raise ValueError("cannot convert float NaN to integer")
            if math.isinf(value):
                raise OverflowError("cannot convert float infinity to integer")
            value = int(value)
        info = np.iinfo(d.np)
        if not info.min <= value <= info.max:
            raise OverflowError(f"Python integer {value} out of bounds for {d.name}")
    with np.errstate(all="ignore"):  # a float too large for f16 becomes inf, as in NumPy
        out: Scalar = d.np.type(value).item()
    return out


def _scalar_error(op: str, e: Exception, a: Any, b: Any) -> Exception:
    """A scalar that does not fit the other operand's dtype, named with op and line."""
    ins: list[tuple[tuple[int, ...], object]] = [
        (x.shape, x.dtype) if isinstance(x, GPUArray) else ((), type(x).__name__) for x in (a, b)
    ]
    return errors.op_error(op, e, ins, user_location())


def _node_of(x: ArrayLike, like: DType | None = None, op: str = "asarray") -> Node:
    if isinstance(x, GPUArray):
        return x._node
    if isinstance(x, bool | int | float) and like is not None:
        return _scalar_node(x, like, op)
    if isinstance(x, np.generic):
        x = np.asarray(x)
    from .creation import to_array

    return to_array(x, None, op)._node


def _pair(a: ArrayLike, b: ArrayLike, op: str = "asarray") -> tuple[Node, Node]:
    """Nodes of two operands; a Python scalar takes the other side's dtype (NEP 50)."""
    if isinstance(a, GPUArray):
        return a._node, _node_of(b, a.dtype, op)
    if isinstance(b, GPUArray):
        return _node_of(a, b.dtype, op), b._node
    return _node_of(a, None, op), _node_of(b, None, op)


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


def _wide_scalar(value: Any, x: Any) -> Any:
    """NumPy 2 compares an integer array with an out-of-range Python int exactly (int8 < 300
    is True): the scalar joins as int64, or float64 past int64's range."""
    if isinstance(value, int) and not isinstance(value, bool) and isinstance(x, GPUArray):
        if -(2**63) <= value < 2**63:
            return from_node(_typed_scalar(value, dtypes.int64))
        return from_node(_typed_scalar(float(value), dtypes.float64))
    return value


def _typed_scalar(value: Scalar, d: DType) -> Node:
    return runtime.record("full", (), {"shape": (), "dtype": d.name, "value": value})


def from_node(node: Node) -> GPUArray:
    """A GPUArray over a recorded node."""
    return GPUArray(node)


def binary(op: str, a: ArrayLike, b: ArrayLike) -> GPUArray:
    """Record elementwise op(a, b); Python scalars are weak (NEP 50). Eager: a call whose
    key was seen runs its cached schedule (eager_ops.py). Called only from the library's
    one-frame wrappers (GPUArray's operators, ops.py): the lazy fast paths take the frame
    above that wrapper's as the first that may be the user's."""
    if not _devices_active[0]:
        eager = _eager_now()  # is_eager(), inline: this runs for every operator
        if eager is None:
            eager = _eager_default[0]
            if eager is None:
                eager = settings.eager()
        if not eager:
            if type(a) is GPUArray and type(b) in _SCALAR_TYPES:
                return _scalar_operator(op, False)(a, b)
            if type(b) is GPUArray and type(a) in _SCALAR_TYPES:
                return _scalar_operator(op, True)(b, a)
            if type(a) is GPUArray and type(b) is GPUArray:
                return _two_arrays(op, a, b)
        elif not settings.debug():
            out = _eager_hit(op, a, b)  # eager_ops.NATIVE: a hit in one native call
            if out is not None:
                return out
            node = _eager_binary(op, a, b)
            if node is not None:
                return GPUArray(node)
    return _binary(op, a, b)


def _operator(op: str, reflected: bool) -> Callable[[GPUArray, Any], GPUArray]:
    """GPUArray's method for the binary operator of op: self op o, or o op self when
    `reflected` (__radd__ and the like); anything but the case below goes to binary().

    A lazy op of an array and a Python scalar (`x + 0.5`, `2 * x`), the commonest recorded
    op, is made in the method with no further Python call (one frame between the user's
    line and the nodes): the `full` node of the scalar and the op's node made from what the
    first such record found (Node.known_scalar_op: no dtype rules, no attr freezing), with
    the summary pending.summarise would give. A first record takes _binary, which raises
    what it raises."""
    first = reflected
    op = sys.intern(op)  # the native table keys its specs by the name's identity

    def method(self: GPUArray, value: Any) -> GPUArray:
        if _devices_active[0]:
            return binary(op, value, self) if first else binary(op, self, value)
        eager = _eager_now()  # is_eager(), inline
        if eager is None:
            eager = _eager_default[0]
            if eager is None:
                eager = settings.eager()
        if eager:
            # A hit the native table serves (eager_ops.NATIVE), else binary(), which asks
            # it again (a miss costs twice; the Python hit is the slow path anyway).
            out = _eager_hit(op, value, self) if first else _eager_hit(op, self, value)
            if out is not None:
                return out
            return binary(op, value, self) if first else binary(op, self, value)
        if type(value) not in _SCALAR_TYPES:
            return binary(op, value, self) if first else binary(op, self, value)
        # The usual record, natively (what the rest of this method does); None: a first
        # record of this key or of this operand's summary part, which the rest learns.
        out = _lazy_scalar(op, self, value, first)
        if out is not None:
            return out
        node = self._raw if self._link is None else self._node
        t = type(value)
        spec = _SCALAR_OPS.get((op, node.dtype.name, t, value if t is not float or (value and
                                value == value) else repr(value), first))  # fmt: skip
        if spec is None:
            return _learn_scalar_op(op, self, value, first, node)
        fattrs, fitems, fdtype, fkid, nop, nitems, ndtype, kids = spec
        # The user's line is the caller's, or the walk from the caller finds it (the
        # operator was used by library code, or binary() called this for ops.py).
        f = _getframe(1)
        code = f.f_code
        where = (
            (code, f.f_lasti) if _LIBRARY_FILES.get(code.co_filename) is False else user_frame(1)
        )
        n = _known_scalar_op(nop, node, first, nitems, ndtype, fattrs, fitems, fdtype, where)
        out = _new(GPUArray)  # GPUArray(n), without the type call
        out._raw = n
        out._readonly = False
        out._link = None
        epoch = EPOCH[0]
        if node.realized is not None:
            xkey = -pending.leaf_kid(node)  # kids are positive: a leaf's key is its kid negated
            leaves: tuple[Node, ...] = (node,)
            trail = (node.where,)
            size = 3
        else:
            sub = node.sub
            if sub is None:
                return out
            xkey, made, size = sub[:3]
            if made != epoch:
                return out
            node.used = True
            leaves = node.leaves or ()
            trail = sub  # a summary is its node's trail (pending.py)
            size += 2
        kid = kids.get(xkey)
        if kid is None:
            if len(kids) > _SCALAR_OPS_LIMIT:
                kids.clear()
            xpart = (-xkey, 0) if xkey < 0 else (xkey, None)
            parts = (fkid, None), xpart
            kid = kids[xkey] = pending.kid_of((nop, nitems, *(parts if first else parts[::-1])))
        n.sub = ((kid, epoch, size, where, (where,), trail) if first
                 else (kid, epoch, size, where, trail, (where,)))  # fmt: skip
        n.leaves = leaves
        return out

    method.__name__ = method.__qualname__ = f"__{'r' if reflected else ''}{op}__"
    _OPERATOR_OF[method] = (op, reflected)
    return method


# _operator's methods -> (op, reflected), for _native_operators.
_OPERATOR_OF: dict[Callable[..., Any], tuple[str, bool]] = {}


def _native_operators(cls: type) -> None:
    """Make cls's binary operators native (rust/pygpukit-py/src/operator.rs): method
    descriptors that serve the eager and lazy hits the native tables hold with no Python
    frame, and call _operator's method for everything else."""
    _rust.operators_setup(_LAZY_SCALARS, eager_ops.NATIVE, _eager_mode, _eager_default,
                          _devices_active)  # fmt: skip
    for name, method in list(vars(cls).items()):
        spec = _OPERATOR_OF.get(method) if callable(method) else None
        if spec is not None:
            setattr(cls, name, _rust.operator_method(cls, name, spec[0], spec[1], method))


# (op, reflected) -> _operator's method, for binary()'s callers other than the operators
# (gpk.add(x, 0.5), gpk.maximum(x, 0.0)).
_OPERATORS: dict[tuple[str, bool], Callable[[GPUArray, Any], GPUArray]] = {}


def _scalar_operator(op: str, reflected: bool) -> Callable[[GPUArray, Any], GPUArray]:
    method = _OPERATORS.get((op, reflected))
    if method is None:
        method = _OPERATORS[(op, reflected)] = _operator(op, reflected)
    return method


_SCALAR_TYPES = frozenset({int, float, bool})
# (op, array dtype, scalar key, scalar first) -> what recording that op made the first
# time: the `full` node's attrs and dtype, the op node's, and the kids of both (pending.py).
_SCALAR_OPS: dict[Any, Any] = {}
_SCALAR_OPS_LIMIT = 4096


# (op, dtypes, shapes) -> the op node's op, canonical attrs, shape and dtype, from the first
# record of two arrays of these.
_PAIR_OPS: dict[Any, tuple[str, tuple[Any, ...], tuple[int, ...], DType]] = {}


def _two_arrays(op: str, a: GPUArray, b: GPUArray) -> GPUArray:
    """Lazy op(a, b) of two arrays: the node from what the first record of these dtypes and
    shapes found (Node.known), else _binary, which raises what it raises."""
    na = a._raw if a._link is None else a._node
    nb = b._raw if b._link is None else b._node
    key = (op, na.dtype.name, nb.dtype.name, na.shape, nb.shape)
    spec = _PAIR_OPS.get(key)
    if spec is None:
        out = _binary(op, a, b)
        n = out._raw
        if len(n.inputs) == 2 and n.inputs[0] is na and n.inputs[1] is nb and not n.attrs:
            if len(_PAIR_OPS) >= _SCALAR_OPS_LIMIT:
                _PAIR_OPS.clear()
            _PAIR_OPS[key] = (n.op, n.canonical_attrs(), n.shape, n.dtype)
        return out
    nop, items, shape, dtype = spec
    # Frames above the walk's start: this one, binary() and binary()'s one-frame wrapper.
    n = _known(nop, (na, nb), _NO_ATTRS, items, shape, dtype, user_frame(3))
    pending.summarise(n)
    return GPUArray(n)


def _learn_scalar_op(op: str, x: GPUArray, value: Scalar, first: bool, node: Node) -> GPUArray:
    out = _binary(op, value, x) if first else _binary(op, x, value)
    n = out._raw
    if n.op == "full" or len(n.inputs) != 2 or n.attrs or n.shape != node.shape:
        return out
    const, other = n.inputs if first else n.inputs[::-1]
    if other is not node or const.op != "full" or const.inputs or const.shape:
        return out
    if len(_SCALAR_OPS) >= _SCALAR_OPS_LIMIT:
        forget_scalar_ops()
    t = type(value)
    fkid = pending.kid_of(("full", const.canonical_attrs()))
    spec: tuple[Any, ...] = (
        const.attrs, const.canonical_attrs(), const.dtype, fkid, n.op, n.canonical_attrs(),
        n.dtype, {})  # fmt: skip
    _SCALAR_OPS[(op, node.dtype.name, t, eager_ops.scalar_key(value)[1], first)] = spec
    _LAZY_SCALARS.register(op, node.dtype, value, first, spec)
    return out


def forget_scalar_ops() -> None:
    """Drop what the lazy array-scalar records learnt (_SCALAR_OPS and its native table):
    the next record of each key takes the rule path again."""
    _SCALAR_OPS.clear()
    _LAZY_SCALARS.clear()


def _eager_binary(op: str, a: ArrayLike, b: ArrayLike) -> Node | None:
    """The eager fast path (eager_ops.py) for op(a, b); None where no key applies (an
    operand neither a realised array nor a Python scalar)."""
    backend = get_backend()
    na = nb = None
    if isinstance(a, GPUArray):
        na = a._raw if a._link is None else a._node
        va = na.realized
        if va is None:
            return None
        ka = (na.shape, na.dtype.name, backend.layout_key(va))
    else:
        ka = eager_ops.scalar_key(a)
    if isinstance(b, GPUArray):
        nb = b._raw if b._link is None else b._node
        vb = nb.realized
        if vb is None:
            return None
        kb = (nb.shape, nb.dtype.name, backend.layout_key(vb))
    else:
        kb = eager_ops.scalar_key(b)
    if ka is None or kb is None or (na is None and nb is None):
        return None
    key = (op, ka, kb, na is nb, backend, settings.skip_passes())
    entry = runtime.EAGER_CACHE.get(key)
    if entry is not None:  # a hit makes no closure for today's path
        node = eager_ops.hit(entry, key, (na, nb), backend)
        if node is not None:
            return node
    return eager_ops.learn(key, (na, nb), lambda: _binary(op, a, b), backend)


def _binary(op: str, a: ArrayLike, b: ArrayLike) -> GPUArray:
    try:
        na, nb = _pair(a, b, op)
    except (OverflowError, ValueError) as e:
        if isinstance(e, errors.GPUKitError):
            raise
        if op not in _COMPARISONS or not isinstance(e, OverflowError):
            raise _scalar_error(op, e, a, b) from None
        na, nb = _pair(_wide_scalar(a, b), _wide_scalar(b, a), op)
    return GPUArray(runtime.record(canonical(op, [na.dtype, nb.dtype]), (na, nb)))


def unary(op: str, x: ArrayLike, **attrs: Any) -> GPUArray:
    """Record elementwise op(x; attrs). Eager: a call whose key was seen runs its cached
    schedule (eager_ops.py)."""
    if (not devices.ACTIVE[0] and isinstance(x, GPUArray) and is_eager()
            and not settings.debug()):  # fmt: skip
        n = x._raw if x._link is None else x._node
        value = n.realized
        if value is not None:
            backend = get_backend()
            items = canonical_items({k: freeze(v) for k, v in attrs.items()}) if attrs else ()
            key = (op, items, n.shape, n.dtype.name, backend.layout_key(value), backend,
                   settings.skip_passes())  # fmt: skip
            entry = runtime.EAGER_CACHE.get(key)
            if entry is not None:  # a hit makes no closure for today's path
                node = eager_ops.hit(entry, key, (n,), backend)
                if node is not None:
                    return GPUArray(node)
            return GPUArray(eager_ops.learn(key, (n,), lambda: _unary(op, x, attrs), backend))
    return _unary(op, x, attrs)


def _unary(op: str, x: ArrayLike, attrs: dict[str, Any]) -> GPUArray:
    n = _node_of(x, None, op)
    return GPUArray(runtime.record(canonical(op, [n.dtype]), (n,), attrs))


class GPUArray:
    """An n-dimensional array on the current backend, computed lazily.

    Operations record nodes; nothing runs until the value is needed (to_numpy, print,
    `.realize()`, `gpk.realize(*xs)`), or at once inside `gpk.eager()`.
    """

    __slots__ = ("_raw", "_readonly", "_link", "__weakref__")
    __array_priority__ = 100  # NumPy defers `ndarray + GPUArray` to us

    def __init__(self, node: Node) -> None:
        self._raw = node
        self._readonly = False
        self._link: _ViewLink | None = None

    @property
    def _node(self) -> Node:
        """The node of this array's current value. A view re-derives it from its base's
        current value when the base was written since (NumPy aliasing: writes to the base
        show through its views)."""
        link = self._link
        if link is None:
            return self._raw
        base_node = link.base._node
        if base_node is not link.seen or (not link.aliased and base_node.realized is not None):
            self._raw = runtime.record(link.op, (base_node,), link.attrs)
            link.seen, link.aliased = base_node, base_node.realized is not None
        return self._raw

    @_node.setter
    def _node(self, node: Node) -> None:
        self._raw = node
        link = self._link
        if link is not None:
            link.seen = link.base._node
            link.aliased = link.seen.realized is not None

    @property
    def base(self) -> GPUArray | None:
        """The array this one is a view of (None for an array that owns its value), as in
        NumPy: writes through a view reach its base and the base's other views."""
        return None if self._link is None else self._link.base

    @property
    def readonly(self) -> bool:
        """True for arrays that must not be written in place (loaded model weights)."""
        return self._readonly

    @readonly.setter
    def readonly(self, value: bool) -> None:
        self._readonly = bool(value)
        if self._readonly and self._node.realized is None:
            self.realize()  # the value is final: its memory is what views share
        storage = getattr(self._node.realized, "storage", None)
        if storage is not None:
            storage.readonly = self._readonly  # views sharing the memory are read-only too

    # -- properties ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each dimension, as a tuple of ints (known without running anything)."""
        return self._node.shape

    @property
    def dtype(self) -> DType:
        """The element type, a `gpk.DType` (`gpk.float32`, `gpk.bfloat16`, ...)."""
        return self._node.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._node.shape)

    @property
    def size(self) -> int:
        """The number of elements (the product of the shape; 1 for a 0-d array)."""
        return math.prod(self._node.shape)

    @property
    def nbytes(self) -> int:
        """The bytes the elements take: `size * itemsize`."""
        return self.size * self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        """The bytes one element takes."""
        return self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides: the view's own once realised, C-contiguous before."""
        if self._node.realized is not None:
            return get_backend().strides(self._node.realized)
        return tuple(s * self.dtype.itemsize for s in shapes.contiguous_strides(self.shape))

    @property
    def T(self) -> GPUArray:
        """The array with its axes reversed (`transpose()`): a view."""
        return self.transpose()

    @property
    def device(self) -> Any:
        """The gpk.Device the array's memory is on (`<Device cuda:0>`, `<Device cpu>`);
        a pending array's is where it will be computed."""
        from .device import device_of

        return device_of(devices.ordinal_of(self._node))

    def to(self, device: Any) -> GPUArray:
        """A copy of the array on `device` (an int, 'cuda:1', a gpk.Device); the array
        itself when it is there already. Between GPUs that can reach each other the copy
        goes peer to peer, else through host memory; a pending array runs first.

        Raises:
            ValueError: No such device.
            FreedArrayError: The array was freed.
        """
        from .device import resolve
        from .device_copy import copy_between

        target = resolve(device, "to")
        source = devices.ordinal_of(self._node)
        if target == source:
            return self
        return copy_between(self, source, target)

    def _own_device(self) -> Any:
        """A block in which the array's device is current (its backend's copies and
        waits then run in the right context)."""
        if not devices.ACTIVE[0]:
            return contextlib.nullcontext()
        return devices.using(devices.ordinal_of(self._node))

    @property
    def node(self) -> Node:
        """The IR node of the array's current value (`pygpukit.ir.Node`).

        A write (`x[i] = v`) records a new node and moves the array to it, so a node's value never
        changes under a reader. For graph tools and tests; user code rarely needs it.
        """
        return self._node

    @property
    def is_realized(self) -> bool:
        """Whether the current value has been computed (a lazy array becomes realized when run)."""
        return self._node.realized is not None

    def __len__(self) -> int:
        if not self.shape:
            raise errors.user_error(errors.DTypeError, "len", "len() of unsized object (a 0-d "
                                    "array)")  # fmt: skip
        return self.shape[0]

    # -- running ---------------------------------------------------------------------------
    def realize(self) -> GPUArray:
        """Run the pending work under this array now (lazy mode), through the passes.

        Returns:
            The array itself, realized.
        """
        runtime.realize([self._node])
        return self

    def _live_value(self, op: str) -> Any:
        """The realised backend value, for reading back; a freed array raises."""
        self.realize()
        value = self._node.realized
        if get_backend().storage(value).freed:
            raise errors.FreedArrayError(
                f"{op}: the array {self.dtype.short}{list(self.shape)} was freed"
            )
        return value

    def to_numpy(self) -> np.ndarray:
        """Copy the array to the host as a NumPy array (`get` is the same, CuPy's name).

        Runs the pending work under the array first. bfloat16 comes back as `ml_dtypes.bfloat16`.

        Returns:
            A new NumPy array of the same shape and dtype.

        Raises:
            FreedArrayError: The array was freed (`free()`).
        """
        value = self._live_value("to_numpy")
        with self._own_device():
            return get_backend().to_numpy(value)

    get = to_numpy  # CuPy's name

    def to_numpy_async(self) -> Any:
        """Start copying to host memory and return at once; `.result()` waits for this copy
        alone (work queued afterwards keeps running) and gives the NumPy array, `.done()`
        polls. Like torch's `.to("cpu", non_blocking=True)` followed by an event wait."""
        value = self._live_value("to_numpy_async")
        with self._own_device():
            return get_backend().to_numpy_async(value)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def item(self) -> Any:
        """The one element as a Python scalar."""
        return self._scalar("item", errors.ShapeError)

    def _scalar(self, op: str, cls: type[errors.GPUKitError]) -> Any:
        if self.size != 1:
            raise errors.user_error(cls, op, f"only arrays of size 1 convert to a Python "
                                    f"scalar, got shape {self.shape}")  # fmt: skip
        return self.to_numpy().reshape(()).item()

    def tolist(self) -> Any:
        """The elements as nested Python lists (a Python scalar for a 0-d array).

        Returns:
            `self.to_numpy().tolist()`.
        """
        return self.to_numpy().tolist()

    def __bool__(self) -> bool:
        return bool(self._scalar("bool", errors.GPUKitValueError))  # NumPy: ambiguous

    def __float__(self) -> float:
        return float(self._scalar("float", errors.DTypeError))

    def __int__(self) -> int:
        return int(self._scalar("int", errors.DTypeError))

    def __index__(self) -> int:
        if not self.dtype.is_int or self.ndim:
            raise errors.user_error(errors.DTypeError, "index", "only 0-d integer arrays can "
                                    f"be used as an index, got {self.dtype.short}"
                                    f"{list(self.shape)}")  # fmt: skip
        return int(self.item())

    def free(self) -> None:
        """Return the memory to the pool now; later use of the array raises FreedArrayError.
        A pending array is never computed: anything recorded from it raises when realised."""
        node = self._node
        if node.realized is None:
            with self._own_device():
                backend = get_backend()
                node.realized = backend.empty((0,), self.dtype)  # type: ignore[attr-defined]
            node.inputs = ()  # its pending graph is dropped, not run
            pending.drop(node)
        get_backend().storage(node.realized).release()

    def __repr__(self) -> str:
        body = np.array2string(self.to_numpy(), separator=", ", prefix="GPUArray(")
        return f"GPUArray({body}, dtype={self.dtype.name})"

    def __str__(self) -> str:
        return str(self.to_numpy())

    def __iter__(self) -> Any:
        if not self.shape:
            raise errors.user_error(errors.DTypeError, "iter", "iteration over a 0-d array")
        for i in range(len(self)):
            yield self[i]

    # -- arithmetic ------------------------------------------------------------------------
    __add__ = _operator("add", False)
    __radd__ = _operator("add", True)
    __sub__ = _operator("sub", False)
    __rsub__ = _operator("sub", True)
    __mul__ = _operator("mul", False)
    __rmul__ = _operator("mul", True)
    __truediv__ = _operator("div", False)
    __rtruediv__ = _operator("div", True)
    __pow__ = _operator("pow", False)
    __rpow__ = _operator("pow", True)

    def __matmul__(self, o: ArrayLike) -> GPUArray:
        return matmul(self, o)

    def __rmatmul__(self, o: ArrayLike) -> GPUArray:
        return matmul(o, self)

    def __neg__(self) -> GPUArray:
        return unary("neg", self)

    def __pos__(self) -> GPUArray:
        return GPUArray(self._node)  # a new array, as NumPy's +a

    def __abs__(self) -> GPUArray:
        return unary("abs", self)

    def __invert__(self) -> GPUArray:
        return unary("invert", self)

    __and__ = _operator("bitwise_and", False)
    __rand__ = _operator("bitwise_and", True)
    __or__ = _operator("bitwise_or", False)
    __ror__ = _operator("bitwise_or", True)
    __xor__ = _operator("bitwise_xor", False)
    __rxor__ = _operator("bitwise_xor", True)
    __eq__ = _operator("eq", False)  # type: ignore[assignment]
    __ne__ = _operator("ne", False)  # type: ignore[assignment]
    __lt__ = _operator("lt", False)
    __le__ = _operator("le", False)
    __gt__ = _operator("gt", False)
    __ge__ = _operator("ge", False)

    __hash__ = object.__hash__  # identity, as torch.Tensor; == is elementwise

    # -- methods -------------------------------------------------------------------------
    def astype(self, dtype: Any) -> GPUArray:
        """The array converted to `dtype` (see `gpk.astype`).

        Args:
            dtype: A dtype: `gpk.float16`, a name ("bf16"), a NumPy dtype or a Python type.

        Returns:
            A new array, never a view (as NumPy's `astype`), even for the same dtype.

        Raises:
            DTypeError: The dtype is not supported.
        """
        d = _dtype_arg("astype", dtype)
        if d == self.dtype:
            return GPUArray(self._node)  # a new array (NumPy copies): writes stay its own
        return GPUArray(runtime.record("cast", (self._node,), {"dtype": d.name}))

    def reshape(self, *shape: Any) -> GPUArray:
        """A view when NumPy's would be one (the memory allows it), else a new array."""
        new = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        return _view_of(self, "reshape", {"shape": _ints("reshape", new)})

    def flatten(self) -> GPUArray:
        """A 1-D copy (NumPy's flatten never returns a view)."""
        return GPUArray(self.reshape(-1)._node)

    def transpose(self, *axes: Any) -> GPUArray:
        """The array with its axes permuted (`permute` is the same).

        Args:
            *axes: A permutation of the axes, as separate ints or one sequence; none reverses
                them.

        Returns:
            A view: writes through it change this array.

        Raises:
            ShapeError: The axes are not a permutation of this array's axes.
        """
        if len(axes) == 1 and isinstance(axes[0], Sequence):
            axes = tuple(axes[0])
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        perm = _axes("transpose", axes, self)
        if sorted(perm) != list(range(self.ndim)):
            raise errors.user_error(errors.ShapeError, "transpose", f"axes {tuple(axes)} do not "
                                    f"match an array of shape {self.shape}")  # fmt: skip
        return _view_of(self, "permute", {"perm": perm})

    permute = transpose

    def swapaxes(self, a: int, b: int) -> GPUArray:
        """The array with axes `a` and `b` exchanged.

        Args:
            a: One axis (negative counts from the end).
            b: The other axis.

        Returns:
            A view.

        Raises:
            AxisError: An axis out of range.
        """
        perm = list(range(self.ndim))
        i, j = _axes("swapaxes", (a, b), self)
        perm[i], perm[j] = perm[j], perm[i]
        return self.transpose(perm)

    def expand(self, *shape: Any) -> GPUArray:
        """The array broadcast to `shape` (torch's `expand`; see `gpk.broadcast_to`).

        Args:
            *shape: The new shape, as separate ints or one sequence; -1 keeps that dimension.

        Returns:
            A read-only view: writing into it raises a ValueError, as NumPy's.

        Raises:
            ShapeError: The array does not broadcast to `shape`.
        """
        new = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        pad = len(new) - self.ndim
        full = tuple(self.shape[i - pad] if d == -1 and i >= pad else d for i, d in enumerate(new))
        return broadcast_to(self, full)

    def squeeze(self, axis: int | Sequence[int] | None = None) -> GPUArray:
        """The array without axes of size 1.

        Args:
            axis: The axis or axes to remove, or None for every axis of size 1.

        Returns:
            A view.

        Raises:
            ShapeError: A named axis does not have size 1.
        """
        if axis is None:
            drop = tuple(i for i, d in enumerate(self.shape) if d == 1)
        else:
            drop = _axes("squeeze", (axis,) if isinstance(axis, int) else tuple(axis), self)
            for a in drop:
                if self.shape[a] != 1:
                    raise errors.user_error(errors.ShapeError, "squeeze", f"cannot select an "
                                            f"axis to squeeze out which has size not equal to "
                                            f"one: axis {a} of shape {self.shape}")  # fmt: skip
        return self.reshape(tuple(d for i, d in enumerate(self.shape) if i not in drop))

    def unsqueeze(self, axis: int) -> GPUArray:
        """The array with a new axis of size 1 at `axis` (torch's name; `gpk.expand_dims`).

        Args:
            axis: Where the new axis goes in the result (negative counts from the end).

        Returns:
            A view with one more dimension.

        Raises:
            AxisError: The axis is out of range.
        """
        return expand_dims(self, axis)

    def sum(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """Sum over `axis` (see `gpk.sum`).

        Args:
            axis: None (every element), an axis, or a tuple of axes; negative axes count from
                the end.
            keepdims: Keep the reduced axes with size 1.

        Returns:
            A new array (integers and bools sum in int64).

        Raises:
            AxisError: An axis out of range or repeated.
        """
        return reduce("sum", self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """Arithmetic mean over `axis` (see `gpk.mean`).

        Args:
            axis: None (every element), an axis, or a tuple of axes; negative axes count from
                the end.
            keepdims: Keep the reduced axes with size 1.

        Returns:
            A new array (float64 for integer inputs).

        Raises:
            AxisError: An axis out of range or repeated.
        """
        return reduce("mean", self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """Maximum over `axis` (see `gpk.max`).

        Args:
            axis: None (every element), an axis, or a tuple of axes; negative axes count from
                the end.
            keepdims: Keep the reduced axes with size 1.

        Returns:
            A new array.

        Raises:
            AxisError: An axis out of range or repeated.
        """
        return reduce("max", self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """Minimum over `axis` (see `gpk.min`).

        Args:
            axis: None (every element), an axis, or a tuple of axes; negative axes count from
                the end.
            keepdims: Keep the reduced axes with size 1.

        Returns:
            A new array.

        Raises:
            AxisError: An axis out of range or repeated.
        """
        return reduce("min", self, axis, keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> GPUArray:
        """Index of the maximum along `axis` (see `gpk.argmax`).

        Args:
            axis: An axis, or None for the index into the flattened array.
            keepdims: Keep the reduced axis with size 1.

        Returns:
            A new int64 array.

        Raises:
            AxisError: The axis is out of range.
        """
        return reduce("argmax", self, axis, keepdims)

    def copy(self) -> GPUArray:
        """A new array with the same contents and its own memory (never a view).

        Recorded lazily like any op: realize it (`y.copy().realize()`) before the memory it
        copies changes, e.g. a static output of a compiled function before the next call.

        Returns:
            The copy.
        """
        return _copy(self)

    # -- NumPy breadth: // and %, more reductions, scans, sorts, dot (the functions live in
    # pygpukit/ops.py, reductions.py, scans.py, sorting.py and einsum.py) ------------------
    __floordiv__ = _operator("floor_divide", False)
    __rfloordiv__ = _operator("floor_divide", True)
    __mod__ = _operator("remainder", False)
    __rmod__ = _operator("remainder", True)

    def prod(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """See gpk.prod."""
        return reduce("prod", self, axis, keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """See gpk.any."""
        return reduce("any", self, axis, keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> GPUArray:
        """See gpk.all."""
        return reduce("all", self, axis, keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> GPUArray:
        """See gpk.argmin."""
        return reduce("argmin", self, axis, keepdims)

    def var(self, axis: Any = None, *, ddof: int | float = 0, keepdims: bool = False) -> GPUArray:
        """See gpk.var."""
        from .reductions import var

        return var(self, axis, ddof=ddof, keepdims=keepdims)

    def std(self, axis: Any = None, *, ddof: int | float = 0, keepdims: bool = False) -> GPUArray:
        """See gpk.std."""
        from .reductions import std

        return std(self, axis, ddof=ddof, keepdims=keepdims)

    def cumsum(self, axis: int | None = None, dtype: Any = None) -> GPUArray:
        """See gpk.cumsum."""
        from .scans import cumsum

        return cumsum(self, axis, dtype)

    def cumprod(self, axis: int | None = None, dtype: Any = None) -> GPUArray:
        """See gpk.cumprod."""
        from .scans import cumprod

        return cumprod(self, axis, dtype)

    def sort(self, axis: int = -1, kind: str | None = None, order: Any = None, *,
             stable: bool | None = None) -> None:  # fmt: skip
        """Sort in place along axis, as ndarray.sort: a write of gpk.sort(self, ...) into
        this array (so a view's base sees it, and a read-only array refuses it)."""
        from .sorting import sort

        if axis is None:
            raise errors.user_error(errors.DTypeError, "sort", "an in-place sort needs an "
                                    "int axis (axis=None flattens: use gpk.sort)")  # fmt: skip
        self[...] = sort(self, axis, kind, order, stable=stable)

    def argsort(self, axis: int | None = -1, kind: str | None = None, order: Any = None, *,
                stable: bool | None = None) -> GPUArray:  # fmt: skip
        """See gpk.argsort."""
        from .sorting import argsort

        return argsort(self, axis, kind, order, stable=stable)

    def dot(self, b: ArrayLike) -> GPUArray:
        """See gpk.dot."""
        from .einsum import dot

        return dot(self, b)

    # -- indexing ------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> GPUArray:
        from .masking import mask_of, select

        mask = mask_of(index)
        if mask is not None:
            return select(self, mask)
        take_axis, take_index = _array_index(index, self)
        if take_index is not None:
            return take(self, take_index, axis=take_axis)
        spec_index, dyn = _dynamic(index)
        try:
            spec, _ = indexing.normalize_index(self.shape, spec_index)
        except (indexing.IndexRuleError, shapes.ShapeRuleError) as e:
            raise errors.op_error("index", e, [(self.shape, self.dtype)], user_location()) from None
        if dyn:  # NumPy copies for an array index, even a 0-d one: not a view
            return GPUArray(runtime.record("index", (self._node, *dyn), {"spec": spec}))
        return _view_of(self, "index", {"spec": spec})

    # -- interop (zero-copy; see pygpukit/interop.py) --------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        from .interop import cuda_array_interface

        return cuda_array_interface(self)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        from .interop import to_dlpack

        return to_dlpack(self, stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        from .interop import dlpack_device

        return dlpack_device(self)

    # -- NumPy protocols: functions stay on the device (pygpukit/numpy_dispatch.py) ---------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        from .numpy_dispatch import array_ufunc

        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        from .numpy_dispatch import array_function

        return array_function(func, types, args, kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickling copies the value to the host (a pending array runs first; a freed one
        raises FreedArrayError) and back to the device on loading; dtype and shape kept."""
        value = self._live_value("pickle")
        with self._own_device():
            return (_unpickle, (get_backend().to_numpy(value),))

    def __setitem__(self, index: Any, value: ArrayLike) -> None:
        from .masking import assign, mask_of

        mask = mask_of(index)
        if mask is not None:
            return assign(self, mask, value)
        _check_writable(self)
        spec_index, dyn = _dynamic(index)
        try:
            spec, _ = indexing.normalize_index(self.shape, spec_index)
        except (indexing.IndexRuleError, shapes.ShapeRuleError) as e:
            raise errors.op_error(
                "setitem", e, [(self.shape, self.dtype)], user_location()
            ) from None
        if any(e[0] == "new" for e in spec):
            spec = tuple(e for e in spec if e[0] != "new")
        v = _store_value(value, self)
        if v.dtype != self.dtype:
            v = runtime.record("cast", (v,), {"dtype": self.dtype.name})
        _assign(self, runtime.record("setitem", (self._node, v, *dyn), {"spec": spec}))


# The array operators' (and binary()'s) native eager hit: op(a, b) or None (eager_ops.py).
_eager_hit = eager_ops.start_native(GPUArray)
# The lazy array-scalar records' native table (rust/pygpukit-py/src/record.rs), filled by
# _learn_scalar_op with what _SCALAR_OPS holds.
_LAZY_SCALARS = _rust.LazyScalars((Node, GPUArray), node_mod._ids, EPOCH, node_mod._NO_ATTRS,
                                  (_LIBRARY_FILES, _LIBRARY_GENERATION), user_frame)  # fmt: skip
_lazy_scalar = _LAZY_SCALARS.record
_native_operators(GPUArray)


def _store_value(value: ArrayLike, x: GPUArray) -> Node:
    """The node of a value stored into x; a scalar is checked against x's dtype (NumPy 2:
    `int8_array[0] = 300` and `int_array[0] = nan` raise)."""
    if isinstance(value, np.generic):
        value = value.item()  # NumPy scalars follow the Python scalar rules here
    if isinstance(value, str):
        raise errors.user_error(errors.GPUKitValueError, "setitem", f"could not convert string "
                                f"{value!r:.40} to {x.dtype.name}")  # fmt: skip
    if value is None:  # NumPy stores None as NaN into floats
        if not x.dtype.is_float:
            raise errors.user_error(errors.DTypeError, "setitem", f"cannot store None into a "
                                    f"{x.dtype.name} array")  # fmt: skip
        value = math.nan
    if isinstance(value, bool | int | float) and not isinstance(value, GPUArray):
        try:
            v = scalar_value(value, x.dtype)
        except (OverflowError, ValueError) as e:
            raise _scalar_error("setitem", e, x, value) from None
        return runtime.record("full", (), {"shape": (), "dtype": x.dtype.name, "value": v})
    return _node_of(value, x.dtype, "setitem")


def _unpickle(host: np.ndarray) -> GPUArray:
    from .creation import from_numpy

    return from_numpy(host)


def _copy(x: GPUArray) -> GPUArray:
    # An explicit materialised copy: cast to the same dtype is the identity kernel.
    return GPUArray(runtime.record("cast", (x._node,), {"dtype": x.dtype.name}))


def _ints(op: str, values: Any) -> tuple[int, ...]:
    """Integer arguments (a shape): anything else raises TypeError naming op."""
    try:
        if isinstance(values, str) or not isinstance(values, Sequence):
            return (operator.index(values),)  # type: ignore[arg-type]  # a str raises
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise errors.user_error(errors.DTypeError, op, f"expected integers, got "
                                f"{values!r}") from None  # fmt: skip


def _axes(op: str, axes: Sequence[Any], x: GPUArray) -> tuple[int, ...]:
    ints = _ints(op, axes)
    try:
        return tuple(shapes.normalize_axis(a, x.ndim) for a in ints)
    except shapes.AxisRuleError as e:
        raise errors.op_error(op, e, [(x.shape, x.dtype)], user_location()) from None


def _dtype_arg(op: str, dtype: Any) -> DType:
    from .creation import _dtype

    return _dtype(dtype, dtypes.float32, op)


class DynamicSlice:
    """An index entry: `length` elements starting at `start`, a 0-d integer GPUArray read
    on the device (made by dynamic_slice)."""

    __slots__ = ("start", "length")

    def __init__(self, start: GPUArray, length: int) -> None:
        self.start, self.length = start, length


def dynamic_slice(start: ArrayLike, length: int) -> DynamicSlice | slice:
    """x[..., dynamic_slice(start, length)]: `length` elements from `start`, where start is
    a 0-d integer GPUArray read on the device, so one compiled graph serves every start (a
    chunk written into a static cache at a device position). Reads copy, stores write in
    place. start must lie in [0, size - length] (checked where it is read; a negative start
    counts the possible starts from the end, as a dynamic index). A Python int start gives
    the plain slice(start, start + length)."""
    if not isinstance(length, int | np.integer) or isinstance(length, bool) or length < 0:
        raise errors.user_error(errors.GPUKitValueError, "dynamic_slice", "length must be an "
                                f"integer >= 0, got {length!r}")  # fmt: skip
    if isinstance(start, int | np.integer) and not isinstance(start, bool):
        return slice(int(start), int(start) + int(length))
    if not isinstance(start, GPUArray) or start.ndim != 0 or not start.dtype.is_int:
        what = f"{start.dtype.short}{list(start.shape)}" if isinstance(start, GPUArray) else \
            type(start).__name__  # fmt: skip
        raise errors.user_error(errors.IndexError_, "dynamic_slice", "start must be a 0-d "
                                f"integer GPUArray or an int, got {what}")  # fmt: skip
    return DynamicSlice(start, int(length))


def _dynamic(index: Any) -> tuple[Any, list[Node]]:
    """Replace 0-d integer arrays and dynamic slices in an index by placeholders; return
    their nodes (the dynamic inputs, in order)."""
    items = index if isinstance(index, tuple) else (index,)
    out: list[Any] = []
    dyn: list[Node] = []
    for i in items:
        if isinstance(i, DynamicSlice):
            out.append(indexing.DynamicSlice(len(dyn), i.length))
            dyn.append(i.start._node)
        elif isinstance(i, GPUArray):
            if i.ndim != 0 or not i.dtype.is_int:
                raise errors.user_error(errors.IndexError_, "index", "a GPUArray index must be "
                                        f"a 0-d integer array here, got {i.dtype.short}"
                                        f"{list(i.shape)}")  # fmt: skip
            out.append(indexing.DynamicIndex(len(dyn)))
            dyn.append(i._node)
        elif isinstance(i, np.integer):
            out.append(int(i))
        elif isinstance(i, np.ndarray) and i.ndim == 0 and i.dtype.kind in "iu":
            out.append(int(i))
        else:
            out.append(i)
    return tuple(out) if isinstance(index, tuple) else out[0], dyn


def _array_index(index: Any, x: GPUArray) -> tuple[int, Any]:
    """`x[..., ids, ...]` with one integer array (ndim >= 1) and full slices: a take."""
    items = index if isinstance(index, tuple) else (index,)
    arrays = [
        k
        for k, i in enumerate(items)
        if (isinstance(i, GPUArray) and i.ndim > 0)
        or (isinstance(i, np.ndarray | list) and np.asarray(i).ndim > 0)
    ]
    if not arrays:
        return 0, None
    k = arrays[0]
    rest = [i for j, i in enumerate(items) if j != k]
    if len(arrays) > 1 or any(not (isinstance(i, slice) and i == slice(None)) for i in rest):
        raise errors.user_error(errors.IndexError_, "index", "only one integer array index, "
                                "with full slices around it, is supported")  # fmt: skip
    idx = items[k]
    if not isinstance(idx, GPUArray):
        arr = np.asarray(idx)
        if arr.dtype == np.bool_:
            raise errors.user_error(errors.IndexError_, "index", "boolean masks are not "
                                    "supported (dynamic shape)")  # fmt: skip
        if arr.dtype.kind not in "iu":
            raise errors.user_error(errors.IndexError_, "index", "arrays used as indices must "
                                    f"be of integer type, got {arr.dtype}")  # fmt: skip
        idx = asarray(arr)
    return k, idx


# -- functions used by methods (the public op API re-exports them) ---------------------------


def reduce(op: str, x: ArrayLike, axis: Any, keepdims: bool, name: str | None = None) -> GPUArray:
    """Record reduction op of x over axis; errors name `name` (the user's function, as var
    for its mean) or op."""
    label = name or op
    x = x if isinstance(x, GPUArray) else _operand(x, label)
    if axis is not None:
        if op in ("argmax", "argmin") and not isinstance(axis, int | np.integer):
            raise errors.user_error(errors.DTypeError, label, f"axis must be an int or None, got "
                                    f"{axis!r}")  # fmt: skip
        ints = _ints(label, axis)
        if len(set(ints)) != len(ints):
            raise errors.user_error(errors.ShapeError, label, f"duplicate value in 'axis' {ints}")
        if x.ndim == 0 and isinstance(axis, int | np.integer) and ints[0] in (0, -1) \
                and op != "mean":  # fmt: skip
            ints = ()  # NumPy takes an int axis 0 (or -1) of a 0-d array as no axis
        if x.ndim == 0 and ints:
            raise errors.user_error(errors.AxisError, label, f"axis {ints[0]} is out of bounds "
                                    "for an array of dimension 0")  # fmt: skip
        axis = ints[0] if isinstance(axis, int | np.integer) and ints else ints
    try:
        axes = shapes.normalize_axes(axis, x.ndim)
    except shapes.AxisRuleError as e:
        raise errors.op_error(label, e, [(x.shape, x.dtype)], user_location()) from None
    return GPUArray(runtime.record(op, (x._node,), {"axes": axes, "keepdims": bool(keepdims)},
                                   label))  # fmt: skip


def matmul(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """a @ b with NumPy's batching and 1-D rules."""
    na, nb = _node_of(a, None, "matmul"), _node_of(b, None, "matmul")
    return GPUArray(runtime.record("matmul", (na, nb)))


def broadcast_to(x: ArrayLike, shape: Sequence[int]) -> GPUArray:
    """A read-only view of x broadcast to shape (NumPy's: writing it raises)."""
    xa = x if isinstance(x, GPUArray) else _operand(x, "broadcast_to")
    new = _ints("broadcast_to", shape)
    if any(d < 0 for d in new):
        raise errors.user_error(errors.ShapeError, "broadcast_to", f"all elements of broadcast "
                                f"shape must be non-negative, got {new}")  # fmt: skip
    if new == xa.shape:
        out = GPUArray(xa._node)
        out._link = _ViewLink(xa, "expand", {"shape": new}, xa._node, _layout(xa))
        return out
    return _view_of(xa, "expand", {"shape": new}, "broadcast_to")


def expand_dims(x: GPUArray, axis: int) -> GPUArray:
    """x with a new axis of size 1 at axis (a view)."""
    (ax,) = _ints("expand_dims", (axis,))
    try:
        a = shapes.normalize_axis(ax, x.ndim + 1)
    except shapes.AxisRuleError as e:
        raise errors.op_error("expand_dims", e, [(x.shape, x.dtype)], user_location()) from None
    return x.reshape(x.shape[:a] + (1,) + x.shape[a:])


def take(x: ArrayLike, indices: ArrayLike, axis: int | None = None) -> GPUArray:
    """Elements of `x` at integer `indices` along `axis`, as NumPy's `take` (a gather).

    Args:
        x: The array.
        indices: An integer array (or list) of positions; negative ones count from the end.
            Its shape replaces the `axis` dimension in the result.
        axis: The axis to index, or None to index the flattened array.

    Returns:
        A new array (a copy, as NumPy's).

    Raises:
        DTypeError: `indices` is not an integer array.
        AxisError: The axis is out of range.
        IndexError: An index out of range (`gpk.IndexError`; found when run).
    """
    xa = x if isinstance(x, GPUArray) else _operand(x, "take")
    if axis is None:
        xa, axis = xa.reshape(-1), 0
    ax = _axes("take", (axis,), xa)[0]
    ni = _node_of(indices, None, "take")
    if not ni.dtype.is_int:
        raise errors.user_error(errors.DTypeError, "take", f"indices must be integers, got "
                                f"{ni.dtype}")  # fmt: skip
    return GPUArray(runtime.record("take", (xa._node, ni), {"axis": ax}))


def _operand(x: ArrayLike, op: str) -> GPUArray:
    from .creation import to_array

    return to_array(x, None, op)


def asarray(x: ArrayLike, dtype: Any = None) -> GPUArray:
    from .creation import asarray as _asarray

    return _asarray(x, dtype)


# -- views: NumPy aliasing -------------------------------------------------------------------


class _ViewLink:
    """How a view derives from its base: the op and attrs that made it, the base node it was
    last derived from, and its element strides in the root array's memory (which decide
    whether a later reshape of it is a view, NumPy's rule)."""

    __slots__ = ("base", "op", "attrs", "seen", "aliased", "strides")

    def __init__(self, base: GPUArray, op: str, attrs: dict[str, Any], seen: Node,
                 strides: tuple[int, ...]) -> None:  # fmt: skip
        self.base, self.op, self.attrs, self.seen = base, op, attrs, seen
        self.aliased = seen.realized is not None  # derived from realised memory: shares it
        self.strides = strides


def _layout(x: GPUArray) -> tuple[int, ...]:
    """x's element strides in its root's memory (a root is C-contiguous)."""
    return x._link.strides if x._link is not None else shapes.contiguous_strides(x.shape)


def _view_of(x: GPUArray, op: str, attrs: dict[str, Any], name: str | None = None) -> GPUArray:
    """op(x) as a view of x where NumPy's would be one, else as a new array; errors name
    `name`, the user's function."""
    base_node = x._node
    node = runtime.record(op, (base_node,), attrs, name)
    out = GPUArray(node)
    src = _layout(x)
    if op == "index":
        strides: tuple[int, ...] | None = strides_mod.index_view(
            x.shape, src, node.attrs["spec"])[1]  # fmt: skip
    elif op == "permute":
        strides = tuple(src[p] for p in node.attrs["perm"])
    elif op == "expand":
        strides = strides_mod.broadcast_strides(x.shape, src, node.shape)
    else:
        strides = strides_mod.reshape_strides(x.shape, src, node.shape)
    if strides is not None:
        out._link = _ViewLink(x, op, node.attrs, base_node, strides)
    return out


def _read_only_reason(x: GPUArray) -> str | None:
    """Why x must not be written, or None: read-only memory (loaded weights) or a
    broadcast view anywhere up its chain of bases."""
    a: GPUArray | None = x
    while a is not None:
        if a._readonly or _over_readonly(a._raw):
            return "is read-only (loaded weights are; write into a .copy())"
        link = a._link
        if link is not None and link.op == "expand":
            return ("is a broadcast view (broadcast_to/expand), read-only as in NumPy; "
                    "write into a .copy()")  # fmt: skip
        a = None if link is None else link.base
    return None


def _check_writable(x: GPUArray) -> None:
    reason = _read_only_reason(x)
    if reason is not None:
        loc = user_location()
        where = f"\n  at {loc.full}" if loc else ""
        raise errors.GPUKitValueError(
            f"setitem: the array {x.dtype.short}{list(x.shape)} {reason}{where}"
        )


def _assign(x: GPUArray, node: Node) -> None:
    """x's whole value becomes node; for a view, by writing its base (NumPy aliasing)."""
    link = x._link
    if link is None:
        x._raw = node
        return
    base = link.base
    if link.op == "index":
        spec = link.attrs["spec"]
        region = indexing.region_shape(base.shape, spec)
        if node.shape != region:  # drop the dims None inserted
            node = runtime.record("reshape", (node,), {"shape": region})
        stored = tuple(e for e in spec if e[0] != "new")
        new = runtime.record("setitem", (base._node, node), {"spec": stored})
    elif link.op == "permute":
        perm = link.attrs["perm"]
        new = runtime.record("permute", (node,), {"perm": tuple(perm.index(i) for i in
                                                                range(len(perm)))})  # fmt: skip
    else:  # reshape
        new = runtime.record("reshape", (node,), {"shape": base.shape})
    _assign(base, new)  # x re-derives from the written base when next read


def realize_arrays(arrays: Sequence[GPUArray]) -> None:
    """Realise arrays in one graph, the bases of views first, so a view's memory is its
    base's (an in-place write into it, as a compiled function's writeback, reaches the base)."""
    roots: list[GPUArray] = []
    for a in arrays:
        if a._link is not None:
            while a._link is not None:
                a = a._link.base
            roots.append(a)
    if roots:
        runtime.realize([r._node for r in roots])
    runtime.realize([a._node for a in arrays])


_VIEW_OPS = ("reshape", "permute", "expand", "index")


def _over_readonly(node: Node) -> bool:
    """Whether node is (a view of) memory marked read-only through another array."""
    while node.realized is None and node.op in _VIEW_OPS and node.inputs:
        node = node.inputs[0]
    return bool(getattr(getattr(node.realized, "storage", None), "readonly", False))
