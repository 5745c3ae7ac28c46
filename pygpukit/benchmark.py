"""The original project's benchmark command: times a few public-API workloads on the
running backend (CUDA, or NumPy without a GPU), with no peer libraries needed.

    python -m pygpukit.benchmark [--quick] [--save FILE] [--compare FILE
                                 [--fail-on-regression] [--threshold 0.2]] [--markdown]

--save writes the results as JSON; --compare prints each workload's ratio to a saved run
and, with --fail-on-regression, exits 1 when one is slower by more than --threshold
(default 20%). The peer comparison (torch, CuPy) is `python -m pygpukit.bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

FORMAT = "pygpukit.benchmark/1"


def _workloads(quick: bool) -> dict[str, Callable[[], Callable[[], Any]]]:
    """name -> a setup returning one timed call (which realizes its result)."""
    import pygpukit as gpk

    n = 256 if quick else 1024
    rows = 64 if quick else 512

    def matmul() -> Callable[[], Any]:
        a, b = gpk.random.normal((n, n), seed=1), gpk.random.normal((n, n), seed=2)
        return lambda: (a @ b).realize()

    def elementwise() -> Callable[[], Any]:
        x = gpk.random.normal((rows, n), seed=3)
        return lambda: (gpk.exp(x * 0.5) + gpk.tanh(x) * x).realize()

    def reduction() -> Callable[[], Any]:
        x = gpk.random.normal((rows, n), seed=4)
        return lambda: x.sum(axis=-1).realize()

    def compiled_block() -> Callable[[], Any]:
        x, w = gpk.random.normal((rows, n), seed=5), gpk.random.normal((n, n), seed=6)

        @gpk.compile
        def block(x: Any, w: Any) -> Any:
            h = gpk.nn.gelu(x @ w.T)
            return h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6)

        return lambda: block(x, w).realize()

    return {"matmul": matmul, "elementwise": elementwise, "reduction": reduction,
            "compiled_block": compiled_block}  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    """Median milliseconds per call of each workload, with the backend and sizes."""
    import pygpukit as gpk

    reps, warmup = (5, 2) if quick else (20, 3)
    results: dict[str, float] = {}
    for name, setup in _workloads(quick).items():
        call = setup()
        for _ in range(warmup):  # traces, compiles and plans outside the timing
            call()
        gpk.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            gpk.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        results[name] = statistics.median(times)
    return {"format": FORMAT, "backend": gpk.backend_name(), "quick": quick,
            "version": gpk.__version__, "median_ms": results}  # fmt: skip


def compare(now: dict[str, Any], before: dict[str, Any], threshold: float) -> list[dict[str, Any]]:
    """Per workload in both runs: times and ratio now/before, regressed when the ratio is
    above 1 + threshold. Runs of another backend or size are refused."""
    for key in ("format", "backend", "quick"):
        if before.get(key) != now[key]:
            raise SystemExit(f"--compare: the saved run has {key}={before.get(key)!r}, this one "
                             f"{now[key]!r}; compare runs of the same kind")  # fmt: skip
    rows = []
    for name, ms in now["median_ms"].items():
        old = before["median_ms"].get(name)
        if old is None:
            continue
        ratio = ms / old if old > 0 else float("inf")
        rows.append({"workload": name, "before_ms": old, "now_ms": ms, "ratio": ratio,
                     "regressed": ratio > 1.0 + threshold})  # fmt: skip
    return rows


def _table(result: dict[str, Any], rows: list[dict[str, Any]] | None, markdown: bool) -> str:
    head = ["workload", "ms"] + (["before ms", "ratio", ""] if rows is not None else [])
    by_name = {r["workload"]: r for r in rows or []}
    body = []
    for name, ms in result["median_ms"].items():
        line = [name, f"{ms:.3f}"]
        if rows is not None:
            r = by_name.get(name)
            line += (["-", "-", "new"] if r is None else
                     [f"{r['before_ms']:.3f}", f"{r['ratio']:.2f}x",
                      "REGRESSED" if r["regressed"] else ""])  # fmt: skip
        body.append(line)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(b) + " |" for b in body])
    return "\n".join(" ".join(f"{c:<16}" for c in b).rstrip() for b in [head, *body])


def main(argv: list[str] | None = None) -> int:
    """The command; 0, or 1 when --fail-on-regression finds a regression."""
    p = argparse.ArgumentParser(prog="python -m pygpukit.benchmark",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    p.add_argument("--save", metavar="FILE", help="write the results as JSON")
    p.add_argument("--compare", metavar="FILE", help="compare with a run saved by --save")
    p.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a workload is slower than --compare's by > threshold",
    )
    p.add_argument("--threshold", type=float, default=0.2, help="allowed slowdown (0.2: 20%%)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = p.parse_args(argv)
    if args.fail_on_regression and not args.compare:
        p.error("--fail-on-regression needs --compare FILE")
    if not np.isfinite(args.threshold) or args.threshold < 0:
        p.error(f"--threshold must be >= 0, got {args.threshold}")
    before = None
    if args.compare:
        try:
            with open(args.compare) as fh:
                before = json.load(fh)
        except (OSError, ValueError) as e:
            p.error(f"--compare: cannot read {args.compare}: {e}")
        if not isinstance(before, dict) or not isinstance(before.get("median_ms"), dict):
            p.error(f"--compare: {args.compare} is not a file written by --save")
    result = run(args.quick)
    rows = None if before is None else compare(result, before, args.threshold)
    print(f"pygpukit {result['version']} on the {result['backend']} backend"
          + (" (quick)" if args.quick else ""))  # fmt: skip
    print(_table(result, rows, args.markdown))
    if args.save:
        with open(args.save, "w") as fh:
            json.dump(result, fh, indent=1)
    if rows is not None and args.fail_on_regression:
        bad = [r["workload"] for r in rows if r["regressed"]]
        if bad:
            print(f"regression (> {args.threshold:.0%} slower): {', '.join(bad)}",
                  file=sys.stderr)  # fmt: skip
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
