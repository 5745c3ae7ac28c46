"""Writable-weight (no early loads) GEMV time against the L2 prefetch depth, for the
shapes the decode step's wide projections have: median us of 20 calls in a CUDA graph.

    python scripts/gemv_pf_probe.py
"""

from __future__ import annotations

import json

import torch

from pygpukit.backends.cuda.kernels import gemv
from pygpukit.bench.kernels import _sets_for, _stream, time_graph


def probe(k: int, n: int) -> None:
    sets = _sets_for(n * k * 2)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    for early in (False, True):
        for pf in (0, 1, 2, 4):

            def call(i: int, pf: int = pf, early: bool = early) -> None:
                gemv.gemv(xs[i].data_ptr(), ws[i].data_ptr(), ys[i].data_ptr(), n, k,
                          "bfloat16", prefetch=pf, w_early=early, stream=_stream())  # fmt: skip

            us = time_graph(call, sets)
            row = {"k": k, "n": n, "w_early": early, "prefetch": pf, "us": round(us, 2)}
            print(json.dumps(row), flush=True)


for shape in ((2048, 11264), (2048, 32000), (4096, 4096), (2048, 5632)):
    probe(*shape)
