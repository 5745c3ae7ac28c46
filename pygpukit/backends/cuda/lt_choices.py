"""cuBLASLt algorithm choices kept on disk beside the kernel cache: a GEMM plan's tuning
(LtMatmul.tune: its candidates timed on the first run, waiting for the GPU; 49 to 96 ms a
prefill shape's first call on the H200) is made once per problem and device, not once per
process.

One JSON file in the kernel cache's directory maps "<device name>|<cuBLASLt version>|<plan
key>" to the chosen candidate's index and algorithm (LtMatmul.candidate_id). A choice is
taken (LtMatmul.choose) only where the heuristic offers that algorithm at that index again,
so another cuBLASLt or driver that orders its candidates otherwise tunes anew. The file is
rewritten whole (a temporary file, then a rename) after each new choice, merged with what
other processes wrote meanwhile; a file that does not parse counts as empty. A choice only
picks among the heuristic's own candidates, each valid for the problem: a stale or foreign
file can cost speed, never results. `pygpukit cache clear` removes it with the kernels.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from pygpukit import _native

from . import toolchain

FILE_NAME = "cublaslt-choices.json"
_lock = threading.Lock()
# The choices read from (and written to) the file at _loaded_from; None: not read yet.
_kept: dict[str, dict[str, Any]] | None = None
_loaded_from: str | None = None


def path() -> str | None:
    """The file of kept choices: in the kernel cache's directory (None without one)."""
    toolchain.configure_kernel_cache()
    d = _native.kernel_cache_dir()
    return os.path.join(d, FILE_NAME) if d else None


def _read(p: str) -> dict[str, dict[str, Any]]:
    try:
        with open(p, encoding="ascii") as f:
            got = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(got, dict):
        return {}
    return {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, dict)}


def _choices(p: str | None) -> dict[str, dict[str, Any]]:
    """The kept choices (read once per file; the caller holds _lock)."""
    global _kept, _loaded_from
    if _kept is None or _loaded_from != p:
        _kept, _loaded_from = (_read(p) if p else {}), p
    return _kept


def _key(plan: Any) -> str:
    try:
        version = str(_native.cublaslt_version())
    except Exception:  # noqa: BLE001 - not loaded: no version to key on
        version = "?"
    name = toolchain.device_info().get("name", "?")
    return f"{name}|{version}|{plan.key}"


def take(plan: Any) -> bool:
    """Whether a kept choice for the plan's problem was taken (LtMatmul.choose): the plan
    then needs no tuning."""
    p = path()
    key = _key(plan)
    with _lock:
        got = _choices(p).get(key)
    if got is None:
        return False
    index = got.get("index")
    if not isinstance(index, int) or plan.candidate_id(index) != got.get("id"):
        return False
    return bool(plan.choose(index))


def keep(plan: Any, index: int) -> None:
    """Keeps the plan's tuned choice (candidate `index`) for later processes; an
    unwritable directory keeps it for this process only."""
    entry = {"index": index, "id": plan.candidate_id(index)}
    p = path()
    key = _key(plan)
    with _lock:
        kept = _choices(p)
        kept[key] = entry
        if p is None:
            return
        kept.update({k: v for k, v in _read(p).items() if k != key})
        # The kernel cache's temp-file prefix: `pygpukit cache clear` removes a dead
        # writer's leftover.
        tmp = os.path.join(os.path.dirname(p), f".tmp-lt-{os.getpid()}-{threading.get_ident()}")
        try:
            with open(tmp, "w", encoding="ascii") as f:
                json.dump(kept, f, indent=0, sort_keys=True)
            os.replace(tmp, p)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def forget() -> bool:
    """Removes the file of kept choices (and this process's copy); whether there was one."""
    global _kept
    p = path()
    with _lock:
        _kept = None
        if p is None:
            return False
        try:
            os.unlink(p)
        except FileNotFoundError:
            return False
    return True


__all__ = ["FILE_NAME", "forget", "keep", "path", "take"]
