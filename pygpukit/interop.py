"""Zero-copy interop: DLPack both ways and __cuda_array_interface__ (torch, CuPy, JAX).

Exported capsules keep the array's storage alive until the consumer calls the deleter;
imported memory wraps as an ExternalStorage that the pool never frees and that keeps the
producer's managed tensor alive until the last view of it dies. Capsules are built with
ctypes: no C++ is needed for DLPack.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

from pygpukit.errors import DTypeError
from pygpukit.ir import DType, dtypes

KDL_CPU, KDL_CUDA = 1, 2
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBool
KDL_BFLOAT = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Exports alive until their deleter runs: address of the DLManagedTensor -> what it holds.
_exports: dict[int, tuple[Any, ...]] = {}
_cai_pinned: weakref.WeakSet[Any] = weakref.WeakSet()


def _delete_export(managed: Any) -> None:
    held = _exports.pop(ctypes.addressof(managed.contents), None)
    if held is not None:
        held[-1].unpin()  # the consumer is done with the address: evictable again


_DELETER = _Deleter(_delete_export)


def _capsule_destructor() -> int:
    """The C destructor of our capsules (native/src/dlpack.cpp): it calls the deleter of an
    unconsumed one. Not a ctypes callback: a consumer may drop the capsule while raising
    (NumPy has no DLPack code for bfloat16), and Python code run then would lose that
    exception (NumPy then raised SystemError)."""
    from pygpukit import _native

    return int(_native.dlpack_capsule_destructor())


def _dl_dtype(d: DType) -> DLDataType:
    if d == dtypes.bfloat16:
        return DLDataType(KDL_BFLOAT, 16, 1)
    return DLDataType(_CODES[d.kind], d.itemsize * 8, 1)


def _backend_value(arr: Any) -> tuple[Any, Any]:
    from pygpukit.backends import devices

    arr.realize()
    return devices.backend_of(arr.node), arr.node.realized


def _synchronized(arr: Any, backend: Any) -> None:
    """The array's device has finished its queued work (waited on in its own context)."""
    with arr._own_device():
        backend.synchronize()


def dlpack_device(arr: Any) -> tuple[int, int]:
    from pygpukit.backends import get_backend

    if get_backend().name == "cuda":
        return KDL_CUDA, int(arr.device.id)
    return KDL_CPU, 0


def to_dlpack(arr: Any, stream: Any = None) -> Any:
    """A 'dltensor' capsule over the array's memory (no copy)."""
    backend, value = _backend_value(arr)
    # Consumers may read on any stream: our queued work must have finished.
    _synchronized(arr, backend)
    storage = backend.storage(value)
    storage.pin()  # the consumer holds the address until its deleter runs: never evicted
    shape = tuple(arr.shape)
    if backend.name == "cuda":
        data, strides = value.ptr, tuple(value.strides)
    else:
        data = value.array.ctypes.data
        strides = tuple(s // arr.itemsize for s in value.array.strides)
    nd = len(shape)
    shape_c = (ctypes.c_int64 * max(nd, 1))(*shape)
    strides_c = (ctypes.c_int64 * max(nd, 1))(*strides)
    managed = DLManagedTensor()
    dev_type, dev_id = dlpack_device(arr)
    managed.dl_tensor = DLTensor(data, DLDevice(dev_type, dev_id), nd, _dl_dtype(arr.dtype),
                                 shape_c, strides_c, 0)  # fmt: skip
    managed.manager_ctx = None
    managed.deleter = _DELETER
    addr = ctypes.addressof(managed)
    _exports[addr] = (managed, shape_c, strides_c, value, storage)
    return _api.PyCapsule_New(addr, b"dltensor", _capsule_destructor())


class _Imported:
    """Owns a consumed DLManagedTensor; calls its deleter when the last view dies."""

    def __init__(self, ptr: int, producer: Any) -> None:
        self.ptr = ptr
        self.producer = producer

    def __del__(self) -> None:
        m = ctypes.cast(self.ptr, ctypes.POINTER(DLManagedTensor))
        if m.contents.deleter:
            m.contents.deleter(m)


def _dtype_of(t: DLDataType) -> DType:
    if t.lanes != 1:
        raise DTypeError(f"from_dlpack: vector dtypes (lanes={t.lanes}) are not supported")
    if t.code == KDL_BFLOAT and t.bits == 16:
        return dtypes.bfloat16
    kinds = {0: "int", 1: "uint", 2: "float", 6: "bool"}
    if t.code not in kinds:
        raise DTypeError(f"from_dlpack: DLPack type code {t.code} is not supported")
    name = "bool" if t.code == 6 else f"{kinds[t.code]}{t.bits}"
    try:
        return dtypes.as_dtype(name)
    except dtypes.UnsupportedDType as e:
        raise DTypeError(f"from_dlpack: {e}") from None


def _wrap_device(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], d: DType,
                 owner: Any) -> Any:  # fmt: skip
    from pygpukit import runtime
    from pygpukit.array import GPUArray
    from pygpukit.backends.cuda.value import DeviceValue, ExternalStorage

    span = (
        1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) if all(shape) else 0
    )
    storage = ExternalStorage(ptr, span * d.itemsize, owner)
    value = DeviceValue(storage, shape, strides, 0, d)
    return GPUArray(runtime.leaf(value, shape, d))


def from_dlpack(obj: Any) -> Any:
    """A GPUArray over `obj`'s memory: zero-copy for CUDA tensors on the CUDA backend, a
    copy for host tensors."""
    from pygpukit.backends import get_backend
    from pygpukit.creation import from_numpy

    backend = get_backend()
    if not hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__cuda_array_interface__") and backend.name == "cuda":
            return from_cuda_array_interface(obj)
        raise DTypeError(f"from_dlpack: {type(obj).__name__} has no __dlpack__")
    dev_type, dev_id = obj.__dlpack_device__()
    if dev_type != KDL_CUDA or backend.name != "cuda":
        host = obj.cpu() if dev_type == KDL_CUDA and hasattr(obj, "cpu") else obj
        if dev_type == KDL_CUDA and hasattr(obj, "get"):
            host = obj.get()
        return from_numpy(np.from_dlpack(host))
    capsule = obj.__dlpack__(stream=1)  # 1: the legacy default stream, the one we use
    ptr = _api.PyCapsule_GetPointer(ctypes.c_void_p(id(capsule)), b"dltensor")
    _api.PyCapsule_SetName(capsule, b"used_dltensor")
    m = ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)).contents
    t = m.dl_tensor
    d = _dtype_of(t.dtype)
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(t.ndim))
    else:
        strides = tuple(int(s) for s in _contig(shape))
    owner = _Imported(ptr, obj)
    from pygpukit.backends import devices

    with devices.using(int(dev_id)):  # the array lives on the producer's GPU
        return _wrap_device(int(t.data or 0) + int(t.byte_offset), shape, strides, d, owner)


def _contig(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


_TYPESTR = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int8": "|i1", "uint8": "|u1",
            "int16": "<i2", "int32": "<i4", "int64": "<i8", "bool": "|b1"}  # fmt: skip


def cuda_array_interface(arr: Any) -> dict[str, Any]:
    """Version 3 of Numba's __cuda_array_interface__ (AttributeError off the GPU)."""
    from pygpukit.backends import get_backend

    if get_backend().name != "cuda":
        raise AttributeError("__cuda_array_interface__ exists only on the CUDA backend")
    if arr.dtype.name not in _TYPESTR:
        raise AttributeError(f"__cuda_array_interface__ has no typestr for {arr.dtype}")
    backend, value = _backend_value(arr)
    _synchronized(arr, backend)
    storage = backend.storage(value)
    if storage not in _cai_pinned:  # the address escapes with no end of use: never evicted
        storage.pin()
        _cai_pinned.add(storage)
    isz = arr.itemsize
    from pygpukit.backends.cuda.layout import is_contiguous

    contiguous = is_contiguous(value.shape, value.strides)
    return {
        "shape": tuple(arr.shape),
        "typestr": _TYPESTR[arr.dtype.name],
        "data": (int(value.ptr), False),
        "strides": None if contiguous else tuple(s * isz for s in value.strides),
        "version": 3,
        "stream": None,
    }


def from_cuda_array_interface(obj: Any) -> Any:
    cai = obj.__cuda_array_interface__
    np_dt = np.dtype(cai["typestr"])
    d = dtypes.as_dtype(np_dt)
    shape = tuple(int(s) for s in cai["shape"])
    if cai.get("strides") is None:
        strides = tuple(_contig(shape))
    else:
        strides = tuple(int(s) // np_dt.itemsize for s in cai["strides"])
    return _wrap_device(int(cai["data"][0]), shape, strides, d, obj)


__all__ = ["cuda_array_interface", "dlpack_device", "from_dlpack", "to_dlpack"]
