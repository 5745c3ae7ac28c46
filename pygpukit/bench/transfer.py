"""Host/device copies of 256 MB through the transfer engine against torch in the same run:
host to device and device to host, from pageable NumPy memory and from pinned memory,
each timed on the host clock from the call to the data having landed (median of REPS).

Torch's rows: a pinned tensor (`torch.empty(..., pin_memory=True)`) copied with
`.copy_(..., non_blocking=True)` and with `.cuda(non_blocking=True)` / `.cpu()`-style
copies, and a pageable tensor over the same NumPy memory. `vs_torch_pinned` is our
bandwidth over torch's pinned `.copy_` in the same direction (the issue's target: >= 0.9);
`vs_torch_same` compares with torch from the same kind of host memory. A sweep of staging
chunk sizes and copy threads (separate engines) shows what the defaults were chosen from.
One of the `python -m pygpukit.bench` groups; this writes bench/results/<device>-transfer.json:

    python -m pygpukit.bench --only transfer --json
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZE = 256 << 20
REPS = 9
SWEEP = ((8 << 20, 1), (8 << 20, 2), (8 << 20, 4), (8 << 20, 8), (2 << 20, 4), (4 << 20, 4),
         (16 << 20, 4), (32 << 20, 4))  # fmt: skip


def _median_s(fn: Callable[[], Any], sync: Callable[[], None], reps: int = REPS) -> float:
    fn()
    fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gbs(seconds: float) -> float:
    return round(SIZE / seconds / 1e9, 2)


def bench_transfer(rows: list[dict[str, Any]]) -> None:
    """Appends one row per (direction, host memory, implementation) and the sweep rows."""
    import torch

    import pygpukit as gpk
    from pygpukit import _native, _rust
    from pygpukit.backends.cuda import transfers

    rng = np.random.default_rng(0)
    pageable = rng.integers(0, 256, SIZE, dtype=np.uint8)
    out_pageable = np.empty_like(pageable)
    out_pageable[:] = 1  # touched, so no run pays the first-touch page faults
    pin_in_buf: Any = _native.HostBuffer(SIZE)
    pin_out_buf: Any = _native.HostBuffer(SIZE)
    pinned = np.frombuffer(pin_in_buf, np.uint8)
    pinned_out = np.frombuffer(pin_out_buf, np.uint8)
    pinned[:] = pageable
    pinned_out[:] = 1
    dev = gpk.empty((SIZE,), "uint8")
    dev.realize()
    ptr = int(dev.__cuda_array_interface__["data"][0])

    t_dev = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
    t_pinned = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
    t_pinned.copy_(torch.from_numpy(pageable))
    t_pinned_out = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
    t_pageable = torch.from_numpy(pageable)
    t_pageable_out = torch.from_numpy(out_pageable)

    def gsync() -> None:
        _native.synchronize()
        torch.cuda.synchronize()

    def tsync(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
            torch.cuda.synchronize()

        return run

    engine = transfers.engine()
    ours: dict[tuple[str, str], Callable[[], Any]] = {
        ("h2d", "pageable"): lambda: transfers.upload(ptr, pageable, None).wait(),
        ("h2d", "pinned"): lambda: transfers.upload(ptr, pinned, None).wait(),
        ("d2h", "pageable"): lambda: transfers.download(out_pageable, ptr, None).wait(),
        ("d2h", "pinned"): lambda: transfers.download(pinned_out, ptr, None).wait(),
    }

    def from_numpy() -> None:
        gpk.from_numpy(pageable)
        _native.synchronize()

    api: dict[tuple[str, str], Callable[[], Any]] = {
        ("h2d", "pageable"): from_numpy,
        ("d2h", "pageable"): lambda: dev.to_numpy(),
    }
    torch_impls: dict[tuple[str, str, str], Callable[[], None]] = {
        ("h2d", "pinned", "copy_"): tsync(lambda: t_dev.copy_(t_pinned, non_blocking=True)),
        ("h2d", "pinned", "cuda"): tsync(lambda: t_pinned.cuda(non_blocking=True)),
        ("h2d", "pageable", "copy_"): tsync(lambda: t_dev.copy_(t_pageable)),
        ("d2h", "pinned", "copy_"): tsync(lambda: t_pinned_out.copy_(t_dev, non_blocking=True)),
        ("d2h", "pageable", "copy_"): tsync(lambda: t_pageable_out.copy_(t_dev)),
        ("d2h", "pageable", "cpu"): tsync(lambda: t_dev.cpu()),
    }
    torch_gbs: dict[tuple[str, str, str], float] = {}
    for key, fn in torch_impls.items():
        torch_gbs[key] = _gbs(_median_s(fn, gsync))
        rows.append({"bench": "transfer", "direction": key[0], "host": key[1],
                     "impl": f"torch .{key[2]}", "MB": SIZE >> 20,
                     "GB/s": torch_gbs[key]})  # fmt: skip
    for (direction, host), fn in ours.items():
        gbs = _gbs(_median_s(fn, gsync))
        ok = True
        if direction == "h2d":
            ok = bool(np.array_equal(dev.to_numpy(), pageable))
        else:
            ok = bool(np.array_equal(out_pageable if host == "pageable" else pinned_out, pageable))
        pinned_ref = torch_gbs[(direction, "pinned", "copy_")]
        same_ref = torch_gbs[(direction, host, "copy_")]
        rows.append({"bench": "transfer", "direction": direction, "host": host,
                     "impl": "pygpukit engine", "MB": SIZE >> 20, "GB/s": gbs,
                     "vs_torch_pinned": round(gbs / pinned_ref, 3),
                     "vs_torch_same": round(gbs / same_ref, 3), "correct": ok})  # fmt: skip
    for (direction, host), fn in api.items():
        gbs = _gbs(_median_s(fn, gsync))
        rows.append({"bench": "transfer", "direction": direction, "host": host,
                     "impl": "gpk.from_numpy" if direction == "h2d" else "GPUArray.to_numpy",
                     "MB": SIZE >> 20, "GB/s": gbs,
                     "vs_torch_pinned": round(gbs / torch_gbs[(direction, "pinned", "copy_")], 3),
                     })  # fmt: skip
    for chunk, threads in SWEEP:
        eng = _rust.TransferEngine(chunk_bytes=chunk, copy_threads=threads)
        addr_in = int(pageable.__array_interface__["data"][0])
        addr_out = int(out_pageable.__array_interface__["data"][0])

        def up(eng: Any = eng, a: int = addr_in) -> None:
            eng.htod(ptr, a, SIZE, pageable).wait()

        def down(eng: Any = eng, a: int = addr_out) -> None:
            eng.dtoh(a, ptr, SIZE, out_pageable).wait()

        for direction, fn in (("h2d", up), ("d2h", down)):
            gbs = _gbs(_median_s(fn, gsync, reps=5))
            rows.append({"bench": "transfer_sweep", "direction": direction, "host": "pageable",
                         "chunk_MB": chunk >> 20, "copy_threads": threads, "GB/s": gbs,
                         "vs_torch_pinned": round(gbs / torch_gbs[(direction, "pinned",
                                                                    "copy_")], 3)})  # fmt: skip
        del eng
    rows.append({"bench": "transfer_engine", **engine.stats()})


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The transfer rows as a table."""
    lines = [f"{'direction':<6} {'host':<9} {'impl':<22} {'GB/s':>8} {'vs torch pinned':>16}"]
    for r in rows:
        if r.get("bench") == "transfer":
            lines.append(f"{r['direction']:<6} {r['host']:<9} {r['impl']:<22} {r['GB/s']:>8} "
                         f"{r.get('vs_torch_pinned', '-')!s:>16}")  # fmt: skip
        elif r.get("bench") == "transfer_sweep":
            impl = f"chunk {r['chunk_MB']} MB x{r['copy_threads']}"
            lines.append(f"{r['direction']:<6} {r['host']:<9} {impl:<22} {r['GB/s']:>8} "
                         f"{r['vs_torch_pinned']!s:>16}")  # fmt: skip
    return "\n".join(lines)
