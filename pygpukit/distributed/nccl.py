"""NcclCommunicator: NCCL loaded at run time with ctypes, one process per GPU.

libnccl comes from the nvidia-nccl-cu13 / -cu12 pip wheel first, then $CUDA_HOME, then
the system (as NVRTC and cuBLASLt are found). Collectives are enqueued on the step's
stream, so inside @gpk.compile they are recorded into the CUDA graph (NCCL supports
stream capture). NCCL_NVLS_ENABLE=0 is set before the library initialises.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from pygpukit.backends import devices
from pygpukit.errors import DistributedError

from .comm import Communicator, nccl_environment

_WHEEL_LIBS = ["cu13/lib/libnccl.so.2", "nccl/lib/libnccl.so.2"]
_SONAMES = ["libnccl.so.2", "libnccl.so"]
UNIQUE_ID_BYTES = 128

# ncclDataType_t and ncclRedOp_t (nccl.h).
NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7,
               "float64": 8, "bfloat16": 9}  # fmt: skip
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


class UniqueId(ctypes.Structure):
    # Bytes, not c_char: a c_char array reads back as a string cut at its first NUL.
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


_lib: list[Any] = []  # [CDLL] once loaded


def nccl_candidates() -> list[str]:
    """Paths and sonames to try, in order: pip wheel, $CUDA_HOME, system."""
    from pygpukit.backends.cuda import toolchain

    found = [str(d / s) for s in _WHEEL_LIBS for d in toolchain.nvidia_wheel_dirs()
             if (d / s).exists()]  # fmt: skip
    home = toolchain.cuda_home()
    if home is not None:
        for libdir in (home / "lib64", home / "lib"):
            found += sorted((str(p) for p in libdir.glob("libnccl.so*")), reverse=True)
    system = ctypes.util.find_library("nccl")
    return list(dict.fromkeys(found + ([system] if system else []) + _SONAMES))


def load_nccl() -> Any:
    """The NCCL library (loaded once); DistributedError listing every candidate tried."""
    if _lib:
        return _lib[0]
    nccl_environment()
    tried = []
    for cand in nccl_candidates():
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append(f"{cand} ({e})")
            continue
        _declare(lib)
        _lib.append(lib)
        return lib
    raise DistributedError(
        "NCCL not found (pip install nvidia-nccl-cu13, or nvidia-nccl-cu12 for a CUDA 12 "
        "driver); tried: " + "; ".join(tried)
    )


def nccl_version() -> int:
    """ncclGetVersion, e.g. 22703 for 2.27.3."""
    v = ctypes.c_int()
    _check(load_nccl().ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return int(v.value)


def _declare(lib: Any) -> None:
    p, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetErrorString.argtypes = [i]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), i, UniqueId, i]
    lib.ncclCommDestroy.argtypes = [p]
    lib.ncclAllReduce.argtypes = [p, p, sz, i, i, p, p]
    lib.ncclAllGather.argtypes = [p, p, sz, i, p, p]
    lib.ncclReduceScatter.argtypes = [p, p, sz, i, i, p, p]
    lib.ncclBroadcast.argtypes = [p, p, sz, i, i, p, p]
    returning_result = ("ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank",
                        "ncclCommDestroy", "ncclAllReduce", "ncclAllGather",
                        "ncclReduceScatter", "ncclBroadcast")  # fmt: skip
    for name in returning_result:
        getattr(lib, name).restype = i


def _check(code: int, what: str) -> None:
    if code != 0:
        msg = load_nccl().ncclGetErrorString(code) or b"?"
        raise DistributedError(f"{what} failed: NCCL error {code} ({msg.decode()})")


def new_unique_id() -> bytes:
    """ncclGetUniqueId: the 128 bytes rank 0 hands to every rank."""
    uid = UniqueId()
    _check(load_nccl().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return bytes(bytearray(uid.internal))


def _stream_handle(stream: Any) -> int:
    return 0 if stream is None else int(stream)


class NcclCommunicator(Communicator):
    """Rank `rank` of `world_size` processes, one GPU each: `device` (a gpk.Device or
    ordinal; default the current device), whose arrays its collectives take."""

    backend = "cuda"

    def __init__(self, rank: int, world_size: int, unique_id: bytes,
                 device: Any = None) -> None:  # fmt: skip
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise DistributedError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got "
                                   f"{len(unique_id)}")  # fmt: skip
        lib = load_nccl()
        from pygpukit.backends import get_backend
        from pygpukit.device import device_of, resolve

        ordinal = devices.current_ordinal() if device is None else resolve(device, "nccl")
        uid = UniqueId()
        uid.internal[:] = list(unique_id)
        comm = ctypes.c_void_p()
        # NCCL binds the communicator to the CUDA context current when it is made.
        with devices.using(ordinal):
            get_backend()
            _check(lib.ncclCommInitRank(ctypes.byref(comm), world_size, uid, rank),
                   f"ncclCommInitRank (rank {rank} of {world_size})")  # fmt: skip
        self._lib, self._comm = lib, comm
        self.rank, self.world_size = rank, world_size
        self.ordinal = ordinal
        self.device = device_of(ordinal)

    @property
    def handle(self) -> int:
        return int(self._comm.value or 0)

    def launch(self, op: str, attrs: dict[str, Any], send: int, recv: int, count: int,
               dtype: str, stream: Any) -> None:  # fmt: skip
        """Enqueue collective `op` (an IR collective with its attrs) on `stream`: `count`
        elements of `dtype` sent from `send` (per rank), results written to `recv`."""
        if self._comm.value is None:
            raise DistributedError(f"{op} on rank {self.rank}: the communicator was closed")
        if devices.ACTIVE[0] and devices.current_ordinal() != self.ordinal:
            from pygpukit.device import device_of

            raise DistributedError(f"{op} on rank {self.rank}: the arrays are on "
                                   f"{device_of(devices.current_ordinal())}, the communicator "
                                   f"on {self.device}")  # fmt: skip
        kind = NCCL_DTYPES.get(dtype)
        nbytes_per = 1
        if kind is None:  # bool/int16: moved as bytes (the IR refuses to reduce them)
            from pygpukit.ir.dtypes import as_dtype

            kind, nbytes_per = NCCL_DTYPES["uint8"], as_dtype(dtype).itemsize
        n = count * nbytes_per
        lib, comm, s = self._lib, self._comm, _stream_handle(stream)
        if op == "all_reduce":
            code = lib.ncclAllReduce(send, recv, n, kind, NCCL_OPS[attrs["op"]], comm, s)
        elif op == "all_gather":
            code = lib.ncclAllGather(send, recv, n, kind, comm, s)
        elif op == "reduce_scatter":
            code = lib.ncclReduceScatter(send, recv, n // self.world_size, kind,
                                         NCCL_OPS[attrs["op"]], comm, s)  # fmt: skip
        elif op == "broadcast":
            code = lib.ncclBroadcast(send, recv, n, kind, attrs["root"], comm, s)
        else:
            raise DistributedError(f"NCCL has no collective {op!r}")
        _check(code, f"{op} on rank {self.rank}")

    def close(self) -> None:
        """ncclCommDestroy (once)."""
        if self._comm.value is not None:
            comm, self._comm = self._comm, ctypes.c_void_p()
            _check(self._lib.ncclCommDestroy(comm), "ncclCommDestroy")
