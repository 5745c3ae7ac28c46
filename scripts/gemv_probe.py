"""GEMV geometry where the decode step uses it: the four folded projections of a TinyLlama
layer (RMSNorm prologue on qkv and gate_up, residual on o and down), alone and as the
22-layer chain of one decode step (distinct weights, each GEMV reading the one before).

    python scripts/gemv_probe.py [--json FILE]

Alone: median us per call of 20 calls in one CUDA graph, weights rotated past L2 (as
`python -m pygpukit.bench`). Chain: us per replay of the 88-GEMV graph, so programmatic
dependent launch and the L2 prefetch before each wait act as in the decode step. Each
chain row changes one projection's geometry (or prefetch depth) from the default.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pygpukit.backends.cuda.kernels import gemv
from pygpukit.bench.kernels import _sets_for, _stream, time_graph

HIDDEN, INTER, QKV, LAYERS = 2048, 5632, 2560, 22
# (name, k, n, folded): qkv and gate_up take the RMSNorm prologue, o and down the residual.
PROJ = [("qkv", HIDDEN, QKV, "pro"), ("o", HIDDEN, HIDDEN, "res"),
        ("gate_up", HIDDEN, 2 * INTER, "pro"), ("down", INTER, HIDDEN, "res")]  # fmt: skip
CONFIGS = [(4, 1, 8, 2), (8, 1, 8, 2), (8, 1, 4, 3), (8, 2, 4, 2), (4, 2, 8, 2), (8, 1, 4, 2),
           (4, 1, 4, 3), (8, 4, 2, 2), (16, 1, 4, 2)]  # fmt: skip
PREFETCH = [0, 1, 4, 8]
# The gate/up projection with its SwiGLU epilogue (even tile counts).
GLU_CONFIGS = [(8, 2, 4, 2), (4, 2, 8, 2), (4, 2, 4, 3), (4, 2, 4, 2), (8, 2, 2, 3),
               (4, 2, 2, 4), (8, 4, 2, 2), (16, 2, 2, 2), (8, 2, 4, 1), (4, 4, 4, 2)]  # fmt: skip


# (blocks per SM of the persistent grid, W loaded before the predecessor ends): the weights
# here are never written, so early loads are right.
MODES = [(0, False), (0, True), (1, False), (1, True), (2, True)]
# Geometries small enough in shared memory for two kernels' blocks to share an SM.
PERSIST_CONFIGS = [(8, 1, 4, 3), (8, 1, 8, 2), (8, 1, 4, 2), (4, 1, 8, 3), (8, 2, 4, 2),
                   (8, 1, 2, 4), (4, 2, 4, 3), (8, 1, 8, 3)]  # fmt: skip
PERSIST_GLU_CONFIGS = [(8, 2, 4, 3), (8, 2, 4, 2), (8, 1, 4, 3), (8, 1, 8, 2), (4, 2, 8, 2),
                       (8, 2, 2, 4), (4, 2, 4, 3), (8, 1, 4, 2)]  # fmt: skip


def _launch(torch: Any, x: Any, w: Any, y: Any, folded: str, aux: Any, cfg: Any, pf: Any,
            glu: bool = False, mode: tuple[int, bool] | None = None) -> None:  # fmt: skip
    n, k = w.shape
    kw: dict[str, Any] = {"config": cfg, "prefetch": pf, "stream": _stream(), "glu": glu}
    if mode is not None:
        kw.update(blocks_per_sm=mode[0], w_early=mode[1])
    if folded == "pro":
        kw.update(prologue="rms_norm", pro=aux.data_ptr(), eps=1e-5)
    else:
        kw.update(residual=aux.data_ptr())
    gemv.gemv(x.data_ptr(), w.data_ptr(), y.data_ptr(), n, k, "bfloat16", **kw)


def _check(torch: Any, x: Any, w: Any, y: Any, folded: str, aux: Any, glu: bool = False) -> None:
    xf = x.double()
    if folded == "pro":
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * aux.double()
    ref = xf @ w.double().T
    if glu:
        g, u = ref.chunk(2, dim=-1)
        ref = torch.nn.functional.silu(g) * u
        y = y[:, : ref.shape[1]]
    if folded == "res":
        ref = ref + aux.double()
    err = float((y.double() - ref).norm() / ref.norm())
    if err > 2e-2:
        raise AssertionError(f"gemv probe: relative error {err:.3g}")


def alone(torch: Any, rows: list[dict[str, Any]], only: list[str] | None = None) -> None:
    for name, k, n, folded in PROJ + [("lm_head", HIDDEN, 32000, "pro")]:
        if only and name not in only:
            continue
        _alone_shape(torch, rows, name, k, n, folded)


def _alone_shape(torch: Any, rows: list[dict[str, Any]], name: str, k: int, n: int,
                 folded: str) -> None:  # fmt: skip
    sets = _sets_for(n * k * 2)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    aux = torch.randn(1, k if folded == "pro" else n, device="cuda", dtype=torch.bfloat16)
    cases = [(cfg, "none", False, md) for md in MODES for cfg in [None, *PERSIST_CONFIGS]]
    cases += [(cfg, folded, False, md) for md in MODES for cfg in [None, *PERSIST_CONFIGS]]
    if name == "gate_up":
        cases += [(cfg, folded, True, md) for md in MODES for cfg in [None, *PERSIST_GLU_CONFIGS]]
    for cfg, fold, glu, md in cases:

        def call(i: int, cfg: Any = cfg, fold: str = fold, glu: bool = glu,
                 md: Any = md) -> None:  # fmt: skip
            if fold == "none":
                gemv.gemv(xs[i].data_ptr(), ws[i].data_ptr(), ys[i].data_ptr(), n, k,
                          "bfloat16", config=cfg, stream=_stream(), blocks_per_sm=md[0],
                          w_early=md[1])  # fmt: skip
            else:
                _launch(torch, xs[i], ws[i], ys[i], fold, aux, cfg, None, glu, md)

        try:
            call(0)
            torch.cuda.synchronize()
            if fold != "none":
                _check(torch, xs[0], ws[0], ys[0], fold, aux, glu)
            us = time_graph(call, sets)
        except Exception as e:  # a geometry the shape cannot take
            print(f"  {name} {cfg}: {type(e).__name__}: {e}")
            continue
        row = {"probe": "alone", "proj": name, "k": k, "n": n, "fold": fold + "+glu" * glu,
               "config": cfg, "mode": md, "us": round(us, 2),
               "GB/s": round(n * k * 2 / us / 1e3, 1)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)


def once(torch: Any, only: list[str]) -> None:
    """One plain launch per projection and folding, nothing else, for a profiler."""
    for name, k, n, folded in PROJ + [("lm_head", HIDDEN, 32000, "pro")]:
        if name not in only:
            continue
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        aux = torch.randn(1, k if folded == "pro" else n, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):  # the first compiles and loads
            gemv.gemv(x.data_ptr(), w.data_ptr(), y.data_ptr(), n, k, "bfloat16",
                      stream=_stream())  # fmt: skip
            torch.cuda.synchronize()
            _launch(torch, x, w, y, folded, aux, None, None)
            torch.cuda.synchronize()


def chain(torch: Any, rows: list[dict[str, Any]], combos: dict[str, Any] | None = None) -> None:
    bf = torch.bfloat16
    layers = []
    for _ in range(LAYERS):
        layers.append({name: torch.randn(n, k, device="cuda", dtype=bf) * k**-0.5
                       for name, k, n, _f in PROJ})  # fmt: skip
    gain = torch.rand(HIDDEN, device="cuda", dtype=bf) + 0.5
    h = torch.randn(1, HIDDEN, device="cuda", dtype=bf)
    qkv = torch.empty(1, QKV, device="cuda", dtype=bf)
    h2 = torch.empty(1, HIDDEN, device="cuda", dtype=bf)
    gu = torch.empty(1, INTER, device="cuda", dtype=bf)  # silu(gate) * up
    out = torch.empty(1, HIDDEN, device="cuda", dtype=bf)

    def step(cfgs: dict[str, Any], pfs: dict[str, Any], md: Any) -> None:
        mds = md if isinstance(md, dict) else {nm: md for nm, *_ in PROJ}
        x = h
        for w in layers:
            # qkv[:, :2048] stands in for the attention output.
            _launch(torch, x, w["qkv"], qkv, "pro", gain, cfgs.get("qkv"), pfs.get("qkv"),
                    mode=mds["qkv"])  # fmt: skip
            _launch(torch, qkv[:, :HIDDEN], w["o"], h2, "res", x, cfgs.get("o"), pfs.get("o"),
                    mode=mds["o"])  # fmt: skip
            _launch(torch, h2, w["gate_up"], gu, "pro", gain, cfgs.get("gate_up"),
                    pfs.get("gate_up"), glu=True, mode=mds["gate_up"])  # fmt: skip
            _launch(torch, gu, w["down"], out, "res", h2, cfgs.get("down"), pfs.get("down"),
                    mode=mds["down"])  # fmt: skip
            x = out

    def timed(label: str, cfgs: dict[str, Any], pfs: dict[str, Any], md: Any = None) -> None:
        label = f"{label} mode={md}" if md is not None else label
        try:
            us = time_graph(lambda _i: step(cfgs, pfs, md), 1, calls=1, reps=40)
        except Exception as e:
            print(f"  chain {label}: {type(e).__name__}: {e}")
            return
        gb = sum(n * k * 2 for _nm, k, n, _f in PROJ) * LAYERS / 1e9
        row = {"probe": "chain", "label": label, "us": round(us, 1),
               "GB/s": round(gb / us * 1e6, 1)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)

    timed("default", {}, {})
    if combos:
        for label, spec in combos.items():  # spec: proj -> [config, mode, prefetch]
            cfgs = {nm: tuple(v[0]) if v[0] else None for nm, v in spec.items()}
            mds = {nm: tuple(spec.get(nm, [None, (0, False)])[1]) for nm, *_ in PROJ}
            pfs = {nm: v[2] for nm, v in spec.items() if len(v) > 2}
            timed(label, cfgs, pfs, mds)
        return
    for md in MODES:
        timed("defaults", {}, {}, md)
    for md in MODES[1:]:
        for name, _k, _n, _f in PROJ:
            for cfg in PERSIST_GLU_CONFIGS if name == "gate_up" else PERSIST_CONFIGS:
                timed(f"{name} config={cfg}", {name: cfg}, {}, md)
        for pf in PREFETCH:
            timed(f"all prefetch={pf}", {}, {nm: pf for nm, *_ in PROJ}, md)
    timed("default again", {}, {})


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--skip-alone", action="store_true")
    ap.add_argument("--skip-chain", action="store_true")
    ap.add_argument("--proj", help="alone: only these projections (comma-separated)")
    ap.add_argument("--combos", help="chain: only these settings (JSON: label -> proj -> "
                    "[config, [blocks_per_sm, w_early], prefetch])")  # fmt: skip
    ap.add_argument(
        "--once",
        action="store_true",
        help="launch each --proj once without and with its folding (for ncu)",
    )
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    if a.once:
        once(torch, a.proj.split(",") if a.proj else ["gate_up"])
        return
    if not a.skip_chain:
        chain(torch, rows, json.loads(a.combos) if a.combos else None)
    if not a.skip_alone:
        alone(torch, rows, a.proj.split(",") if a.proj else None)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
