"""Per-call host cost of a compiled LLM decode step (produced decode_host in
bench/results/h200-2026-11-22-graphs-profile.json).

    python scripts/compiled_host_cost.py OUT.json

For the tiny model's config (pygpukit/llm/tiny.py, 2 layers, float32) and the
TinyLlama-shape one (22 layers, bf16, random weights): ms per step of a 32-token
generation, the wall time of one call with its read-back, and the host side alone (the
captured replay swapped for a no-op, so guard, argument binding and result arrays are
what is timed). Runs on any backend.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from pygpukit.bench.llm import random_model, tinyllama_config
from pygpukit.compile import CompiledFunction
from pygpukit.llm.sampling import SamplingParams
from pygpukit.llm.tiny import tiny_config


class _NoReplay:
    reads_values = False  # like a CUDA graph: the values list is not set for it

    def replay(self) -> None:
        pass


def _generator(model: Any) -> Any:
    for v in vars(model).values():
        if hasattr(v, "_decode"):
            return v
        if isinstance(v, dict):
            for g in v.values():
                if hasattr(g, "_decode"):
                    return g
    raise RuntimeError("no compiled generator found")


def _best_us(f: Callable[[], Any], n: int, reps: int = 7) -> float:
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def measure(cfg: Any, dtype: str) -> dict[str, Any]:
    model = random_model(cfg, dtype)
    prompt = [list(range(3, 19))]
    sp = SamplingParams()
    model.generate_ids(prompt, 4, sp, max_seq_len=64, stop_at_eos=False)
    res = model.generate_ids(prompt, 33, sp, max_seq_len=64, stop_at_eos=False)
    dec = _generator(model)._decode
    seen: dict[str, Any] = {}
    real = CompiledFunction.__call__

    # On the class: the compiled step scans the generator's attributes for arrays, and a
    # spy there (holding the arguments) would be part of its cache key.
    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is dec:
            seen["call"] = (args, kwargs)
        return real(self, *args, **kwargs)

    CompiledFunction.__call__ = spy  # type: ignore[method-assign]
    try:
        model.generate_ids(prompt, 3, sp, max_seq_len=64, stop_at_eos=False)
    finally:
        CompiledFunction.__call__ = real  # type: ignore[method-assign]
    args, kwargs = seen["call"]
    wall = _best_us(lambda: dec(*args, **kwargs).to_numpy(), 20, 3)
    entry = list(dec._cache.values())[-1]
    prog = entry.program
    info = prog.replay_info()
    for key in prog._captures:
        prog._captures[key] = _NoReplay()
    prog._replay = _NoReplay()
    for which in ("_hot", "_cold"):  # the last two graphs, replayed without a lookup
        hot_key, replay = getattr(prog, which, (None, None))
        if replay is not None:
            setattr(prog, which, (hot_key, _NoReplay()))
    host = _best_us(lambda: dec(*args, **kwargs), 500)
    st = dec.stats()
    counts = {k: st[k] for k in ("hits", "misses", "fast_hits")}
    return {"ms_per_step_generate": 1e3 * res.decode_s / res.decode_steps,
            "host_us_per_call": round(host, 1), "wall_us_per_call_with_sync": round(wall, 1),
            "persistent": len(entry.traced.persistent), "kernels": len(prog.kernels),
            "replay": info, "stats": counts}  # fmt: skip


def main() -> None:
    warnings.simplefilter("ignore")
    out = {}
    for name, cfg, dtype in (("tiny", tiny_config(384), "float32"),
                             ("tinyllama22", tinyllama_config(), "bfloat16")):  # fmt: skip
        out[name] = measure(cfg, dtype)
        print(name, json.dumps(out[name]), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
