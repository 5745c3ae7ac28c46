"""Decode attention time against the split count, the merge (separate kernel or the last
split block) and early cache loads (kv_early): median us of 20 calls in a CUDA graph, each
checked against torch's attention first.

    python scripts/decode_probe.py [--batches 1,8] [--ctx 8192]
"""

from __future__ import annotations

import argparse
import json

import torch

from pygpukit.backends.cuda.kernels import attention
from pygpukit.bench.kernels import _sets_for, _stream, time_graph

H, KVH, D = 32, 4, 128


def _inputs(batch: int, ctx: int) -> tuple[int, list, list, list, list, torch.Tensor]:
    """(sets, q, K, V, o per set, the length): random sets spanning ~3x L2."""
    sets = _sets_for(2 * batch * KVH * ctx * D * 2)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    qs = [mk(batch, H, D) for _ in range(sets)]
    ks = [mk(batch, KVH, ctx, D) for _ in range(sets)]
    vs = [mk(batch, KVH, ctx, D) for _ in range(sets)]
    os_ = [torch.empty(batch, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    return sets, qs, ks, vs, os_, torch.tensor([ctx], dtype=torch.int32, device="cuda")


def probe(batch: int, ctx: int) -> None:
    sets, qs, ks, vs, os_, length = _inputs(batch, ctx)
    ws = torch.empty(attention.decode_workspace_bytes(batch, H, 256, D), dtype=torch.uint8,
                     device="cuda")  # fmt: skip
    ctr = torch.zeros(attention.decode_counters(batch, H, KVH), dtype=torch.int32, device="cuda")
    ref = torch.nn.functional.scaled_dot_product_attention(
        qs[0][:, :, None].float(), ks[0].float(), vs[0].float(), enable_gqa=True
    )[:, :, 0]
    base = attention.decode_splits(batch, H, KVH, ctx)
    for splits in sorted({max(1, base // 2), base, 2 * base, 4 * base} - {0}):
        if splits > attention.MAX_SPLITS:
            continue
        for merge in ("kernel", "last_block"):
            for stages in (1, 2):
                for early in (False, True):

                    def call(i: int, sp: int = splits, m: str = merge, st: int = stages,
                             e: bool = early) -> None:  # fmt: skip
                        attention.decode(
                            qs[i].data_ptr(), ks[i].data_ptr(), vs[i].data_ptr(),
                            length.data_ptr(), os_[i].data_ptr(), ws.data_ptr(), batch, H, KVH,
                            ctx, D, "bfloat16", splits=sp,
                            counters=ctr.data_ptr() if m == "last_block" and sp > 1 else 0,
                            stages=st, kv_early=e, stream=_stream(),
                        )  # fmt: skip

                    os_[0].fill_(float("nan"))
                    call(0)
                    torch.cuda.synchronize()
                    err = (os_[0].float() - ref).abs().max().item()
                    assert err < 3e-2, (splits, merge, stages, early, err)
                    us = time_graph(call, sets)
                    row = {"batch": batch, "ctx": ctx, "splits": splits, "merge": merge,
                           "stages": stages, "kv_early": early, "us": round(us, 2),
                           "max_err": round(err, 4)}  # fmt: skip
                    print(json.dumps(row), flush=True)


def parts(batch: int, ctx: int, splits: int, stages: int) -> None:
    """The split kernel alone (its merge launch dropped) and the merge kernel alone, each as
    20 dependent launches: where a call's time goes."""
    from pygpukit.backends.cuda.kernels import loader

    sets, qs, ks, vs, os_, length = _inputs(batch, ctx)
    ws = torch.randn(attention.decode_workspace_bytes(batch, H, splits, D) // 4, device="cuda")
    real = loader.get_function

    class _Drop:  # a kernel whose launches (and settings) do nothing
        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: None

    for what in ("both", "split", "merge"):
        for early in (False, True):

            def get(fam: str, name: str, defines: dict, what: str = what) -> object:
                drop = {"split": "pgk_attn_decode_reduce", "merge": "pgk_attn_decode_mma"}
                return _Drop() if drop.get(what) == name else real(fam, name, defines)

            def call(i: int, e: bool = early) -> None:
                attention.decode(
                    qs[i].data_ptr(), ks[i].data_ptr(), vs[i].data_ptr(), length.data_ptr(),
                    os_[i].data_ptr(), ws.data_ptr(), batch, H, KVH, ctx, D, "bfloat16",
                    splits=splits, stages=stages, kv_early=e, stream=_stream(),
                )  # fmt: skip

            loader.get_function = get  # type: ignore[assignment]
            try:
                us = time_graph(call, sets)
            finally:
                loader.get_function = real  # type: ignore[assignment]
            row = {"batch": batch, "ctx": ctx, "splits": splits, "stages": stages,
                   "part": what, "kv_early": early, "us": round(us, 2)}  # fmt: skip
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--parts", default="", help="splits,stages: time the two kernels apart")
    a = ap.parse_args()
    for b in (int(x) for x in a.batches.split(",")):
        if a.parts:
            parts(b, a.ctx, *(int(x) for x in a.parts.split(",")))
        else:
            probe(b, a.ctx)
