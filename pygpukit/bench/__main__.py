"""The benchmark harness: PyGPUkit against torch eager, torch.compile and CuPy (where
installed), on the same device buffers, in one run.

    python -m pygpukit.bench [--json [FILE]] [--llm] [--only NAMES] [--no-compile] [--no-cupy]

NAMES (comma-separated): gemm, copy, rms_norm, rope, softmax, gemv, decode, sdpa, read_floor,
quant, quant_llm, chain64, linear_gelu, compile_time, dispatch, transfer, llm, llm_prefill,
llm_long, llm_load; a GEMM workload alone as gemm:<dtype>:<size>, e.g. gemm:bf16:4096. Default:
everything but the llm groups and quant_llm (--llm adds llm; the others run when named).
Prints a table of times and ratios; --json writes every row plus the device, driver, torch
version and git commit. --json without FILE writes bench/results/<device>-<group>.json when
NAMES are one result group's (results.RESULT_GROUPS: kernels, compiled, dispatch,
read-floor, sdpa, transfer, llm, llm-7b), overwriting the last run of that group:

    python -m pygpukit.bench --only gemm,copy,rms_norm,rope,softmax,gemv,decode --json
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import compiled, gemm, kernels, quant, quant_llm, read_floor, results, transfer

KERNEL_GROUPS: dict[str, Callable[[list[dict[str, Any]], float, bool], None]] = {
    "rms_norm": kernels.bench_rms_norm,
    "rope": kernels.bench_rope,
    "softmax": kernels.bench_softmax,
    "gemv": kernels.bench_gemv,
    "decode": kernels.bench_decode,
    "sdpa": kernels.bench_sdpa,
    "read_floor": read_floor.bench_read_floor,
    "quant": quant.bench_quant,
    "quant_llm": quant_llm.bench_quant_llm,
}
COMPILED_GROUPS = ("chain64", "linear_gelu", "compile_time", "dispatch")
LLM_EXTRA_GROUPS = ("llm_prefill", "llm_long", "llm_load")  # run only when named
HEAVY_GROUPS = (*LLM_EXTRA_GROUPS, "quant_llm")  # not in a run without --only
GROUPS = ("gemm", "copy", *KERNEL_GROUPS, *COMPILED_GROUPS, "transfer", "llm", *LLM_EXTRA_GROUPS)


def _parse_only(only: str | None, llm: bool) -> tuple[set[str], list[tuple[int, str]]]:
    """(groups to run, explicit GEMM (size, dtype) workloads)."""
    groups: set[str] = set()
    if not only:
        groups = set(GROUPS) - set(HEAVY_GROUPS) - ({"llm"} if not llm else set())
        return groups, [(n, t) for n in gemm.SIZES for t in gemm.DTYPES]
    gemms: list[tuple[int, str]] = []
    for item in (s.strip() for s in only.split(",") if s.strip()):
        if item.startswith("gemm:"):
            _, tag, size = item.split(":")
            if tag not in gemm.DTYPES:
                raise SystemExit(f"--only: unknown GEMM dtype {tag!r} ({', '.join(gemm.DTYPES)})")
            gemms.append((int(size), tag))
            groups.add("gemm")
        elif item in GROUPS:
            groups.add(item)
            if item == "gemm":
                gemms += [(n, t) for n in gemm.SIZES for t in gemm.DTYPES]
        else:
            raise SystemExit(f"--only: unknown name {item!r}; known: {', '.join(GROUPS)}")
    if llm:
        groups.add("llm")
    return groups, list(dict.fromkeys(gemms))


_after_group: list[Callable[[], None]] = []
_RESULT_FILE = "\0result-group"  # --json given without FILE


def _guard(rows: list[dict[str, Any]], name: str, fn: Callable[[], None]) -> None:
    """Runs one group; a failure is a row with the error, and the others still run. The
    JSON is rewritten after each group, so a run cut short keeps what it measured."""
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:
        traceback.print_exc()
        rows.append({"bench": name, "error": f"{type(e).__name__}: {e}"[:500]})
    print(f"# {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    for cb in _after_group:
        cb()


def print_tables(rows: list[dict[str, Any]]) -> None:
    if any(r.get("bench") == "gemm" for r in rows):
        print("\n== GEMM: ours (gpk GPUArray @, cuBLASLt) vs peers; ratio = peer time / ours")
        print(gemm.format_rows(rows))
    krows = [r for r in rows if r.get("bench") == "kernels" and "speedup_vs_eager" in r]
    if krows or any(r.get("bench") == "kernels" for r in rows):
        print("\n== kernels: ours (launchers) vs torch; ratio = torch time / ours")
        print(f"{'workload':<44} {'ours us':>9} {'GB/s':>8} {'%copy':>6} {'eager us':>9} "
              f"{'comp us':>9} {'vs eager':>8} {'vs comp':>8}")  # fmt: skip
        for r in rows:
            if r.get("bench") != "kernels" or "workload" not in r:
                continue
            if "speedup_vs_eager" not in r:  # sweeps and the copy ceiling
                print(f"{r['workload']:<44} {r.get('us', '-'):>9} {r.get('GB/s', '-'):>8}")
                continue
            print(f"{r['workload']:<44} {r['us']:>9} {r['GB/s']:>8} {r['pct_copy_bw']!s:>6} "
                  f"{r['torch_eager_us']:>9} {r['torch_compile_us']!s:>9} "
                  f"{r['speedup_vs_eager']:>8} {r['speedup_vs_compile']!s:>8}")  # fmt: skip
    if any(r.get("bench") == "compiled" for r in rows):
        print("\n== @gpk.compile vs peers")
        print(compiled.format_rows(rows))
    if any(r.get("bench") == "transfer" for r in rows):
        print("\n== transfers of 256 MB: ours (transfer engine) vs torch; host clock")
        print(transfer.format_rows(rows))
    lrows = [r for r in rows if r.get("bench") == "llm_decode"]
    if lrows:
        from . import llm

        model = lrows[0].get("model", "tinyllama-1.1b-shape")
        print(f"\n== LLM decode ({model}, random bf16 weights)")
        print(llm.format_rows(lrows))
    for r in rows:
        if "error" in r and r.get("bench") in GROUPS:
            print(f"!! {r['bench']}: {r['error']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pygpukit.bench", description=__doc__.split("\n")[0])
    p.add_argument("--json", nargs="?", const=_RESULT_FILE,
                   help="write the rows and run metadata to this file (no FILE: the result "
                        "group's file in bench/results/)")  # fmt: skip
    p.add_argument("--llm", action="store_true", help="add the LLM decode rows")
    p.add_argument("--only", help="comma-separated names (see the module docstring)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="without torch: the small sizes of PyGPUkit's own workloads",
    )
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--no-cupy", action="store_true", help="skip CuPy")
    p.add_argument("--llm-batches", default="1,4,16")
    p.add_argument("--llm-steps", type=int, default=64)
    p.add_argument("--llm-impls", default="pygpukit,torch_compile,transformers")
    p.add_argument("--llm-model", default="tinyllama", help="tinyllama or llama2-7b (shapes)")
    args = p.parse_args(argv)
    groups, gemms = _parse_only(args.only, args.llm)
    group = None  # the result group whose file --json without FILE names
    if args.json == _RESULT_FILE:
        try:
            group = results.result_group(groups, args.llm_model)
        except ValueError as e:
            raise SystemExit(f"--json: {e}") from None

    try:
        import torch
    except ImportError:
        # Every group here times on torch's CUDA events and checks against torch; without
        # it, PyGPUkit's own workloads (pygpukit.benchmark) run alone: our rows, no peers.
        print('pygpukit.bench: torch is not installed, so no peers (torch eager, '
              'torch.compile, CuPy): pip install "pygpukit[bench]" for them. Running '
              "PyGPUkit's own workloads alone (python -m pygpukit.benchmark).",
              file=sys.stderr)  # fmt: skip
        from pygpukit import benchmark

        own = ["--quick"] if args.quick else []
        if args.json not in (None, _RESULT_FILE):
            own += ["--save", args.json]
        return benchmark.main(own)
    if not torch.cuda.is_available():
        print("pygpukit.bench needs a CUDA device (torch.cuda.is_available() is False)")
        return 2
    import pygpukit as gpk

    from .timing import metadata

    meta = metadata()
    now = datetime.datetime.now(datetime.timezone.utc)
    meta.update(started=now.isoformat(timespec="seconds"), backend=gpk.backend_name(),
                argv=sys.argv[1:] if argv is None else argv)  # fmt: skip
    print(json.dumps(meta), flush=True)
    if group is not None:
        try:
            args.json = str(results.result_path(meta.get("device", "gpu"), group))
        except FileNotFoundError as e:
            raise SystemExit(f"--json: {e}") from None
        print(f"# writing {args.json}", flush=True)
    rows: list[dict[str, Any]] = []

    def save() -> None:
        if args.json:
            meta["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            )
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "rows": rows}, fh, indent=1, default=str)

    _after_group.append(save)
    # `timeout` sends SIGTERM: exit through the finally below, which saves and prints.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    use_compile = not args.no_compile
    try:
        for n, tag in gemms if "gemm" in groups else []:

            def one(n: int = n, tag: str = tag) -> None:
                gemm.run(rows, (n,), (tag,), use_compile, not args.no_cupy)

            _guard(rows, "gemm", one)
        kgroups = [g for g in KERNEL_GROUPS if g in groups]
        if kgroups or "copy" in groups:
            copy_gbs = [0.0]

            def copy() -> None:
                copy_gbs[0] = kernels.bench_copy(rows)

            _guard(rows, "copy", copy)
            for g in kgroups:

                def kern(g: str = g) -> None:
                    KERNEL_GROUPS[g](rows, copy_gbs[0], use_compile)

                _guard(rows, g, kern)
                torch.cuda.empty_cache()
        if "chain64" in groups:
            _guard(rows, "chain64", lambda: compiled.bench_chain64(rows))
        if "linear_gelu" in groups:
            _guard(rows, "linear_gelu", lambda: compiled.bench_linear_gelu(rows, use_compile))
        if "compile_time" in groups:
            _guard(rows, "compile_time", lambda: compiled.bench_compile_time(rows))
        if "dispatch" in groups:
            _guard(rows, "dispatch", lambda: compiled.bench_dispatch(rows))
        if "transfer" in groups:
            _guard(rows, "transfer", lambda: transfer.bench_transfer(rows))
        if "llm" in groups:
            from . import llm

            def sink(r: dict[str, Any]) -> None:
                rows.append(r)
                print(json.dumps(r), flush=True)

            def run_llm() -> None:
                llm.run([int(b) for b in args.llm_batches.split(",")], args.llm_steps,
                        args.llm_impls.split(","), cfg=llm.MODELS[args.llm_model](),
                        sink=sink)  # fmt: skip

            _guard(rows, "llm", run_llm)
        for g in LLM_EXTRA_GROUPS:
            if g in groups:
                from . import llm

                def run_extra(g: str = g) -> None:
                    def sink(r: dict[str, Any]) -> None:
                        rows.append(r)
                        print(json.dumps(r), flush=True)

                    if g == "llm_prefill":
                        llm.run_prefill(sink=sink)
                    elif g == "llm_long":
                        llm.run_long(sink=sink)
                    else:
                        llm.run_load(sink=sink)

                _guard(rows, g, run_extra)
                torch.cuda.empty_cache()
    finally:
        save()
        _after_group.remove(save)
        print_tables(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
