"""`pygpukit graph`: dump, diff and profile the graph of a function.

    pygpukit graph dump model.py:block --arg "bf16[1,2048]" --arg "bf16[2048]"
    pygpukit graph dump model.py:block --arg "f32[4,64]" --format json > a.json
    pygpukit graph dump model.py:block --arg "f32[4,64]" --format html > block.html
    pygpukit graph dump model.py:block --arg "f32[4,64]" --skip fuse_linear
    pygpukit graph diff a.json b.json          (exit 0: same, 1: different, 2: trouble)
    pygpukit graph profile model.py:block --arg "bf16[1,2048]"     (needs the CUDA backend)
    pygpukit graph profile model.py:block --arg "bf16[1,2048]" --format json

`dump` traces without running anything on a GPU: it prints the graph after each pass
(or only after --after PASS; --skip PASS leaves a pass out), per-pass provenance, the
fusion report, the memory plan and the kernel list (`--format html`: a page drawing the
graph). `profile` times each kernel of the plan one by one (time, bytes moved, GB/s, % of
the measured copy bandwidth), then compiles the function with gpk.compile and times its
captured CUDA Graph's replays: the median per-call replay time is printed next to the
per-kernel sum.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import json
import linecache
import math
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from pygpukit import settings

from . import graph_diff
from .console import UsageError
from .graph_html import graph_page

_SPEC = re.compile(r"^\s*([a-z0-9_]+)\s*\[([0-9,\s]*)\]\s*$")


def parse_arg(text: str) -> Any:
    """`bf16[1,2048]` -> an array spec; anything else is a Python literal (a static arg)."""
    from pygpukit.ir.dtypes import UnsupportedDType, as_dtype

    m = _SPEC.match(text)
    if m:
        try:
            dtype = as_dtype(m.group(1))
        except UnsupportedDType as e:
            raise UsageError(f"--arg {text!r}: {e}") from None
        shape = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
        return SimpleNamespace(shape=shape, dtype=dtype)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"--arg {text!r} is neither dtype[shape] (f32[4,8]) nor a Python literal"
        ) from None


def load_function(target: str) -> Any:
    """FILE.py:FUNC (FUNC may be dotted: model.forward) -> the plain Python function."""
    path, sep, name = target.rpartition(":")
    if not sep or not path:
        raise UsageError(f"expected FILE.py:FUNC, got {target!r}")
    if not os.path.exists(path):
        raise UsageError(f"no such file {path!r}")
    mod_name = "_pygpukit_graph_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None or os.path.isdir(path):
        raise UsageError(f"{path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{path} has no {name!r}")
        obj = getattr(obj, part)
    fn = getattr(obj, "__wrapped_fn__", obj)
    if not callable(fn):
        raise UsageError(f"{path}:{name} is a {type(fn).__name__}, not a function")
    return fn


def check_call(fn: Any, args: tuple[Any, ...]) -> None:
    """One --arg per parameter of `fn`, before tracing calls it with the wrong count."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: tracing will tell
        return
    try:
        sig.bind(*args)
    except TypeError as e:
        name = getattr(fn, "__name__", "the function")
        raise UsageError(
            f"{name}{sig} takes one --arg per parameter; got {len(args)}: {e}"
        ) from None


def trace_target(target: str, arg_texts: list[str]) -> Any:
    return trace_function(load_function(target), tuple(parse_arg(a) for a in arg_texts))


def trace_function(fn: Any, args: tuple[Any, ...]) -> Any:
    """Trace `fn` on parse_arg's values (array specs and static literals)."""
    check_call(fn, args)
    from pygpukit import runtime
    from pygpukit.compile.captures import scan
    from pygpukit.compile.pytree import flatten
    from pygpukit.compile.trace import trace

    specs = [a for a in args if isinstance(a, SimpleNamespace)]
    unused: list[tuple[str, Any]] = []
    leaves = tuple(("*",) if isinstance(a, SimpleNamespace) else flatten(a, "", unused, unused)
                   for a in args)  # fmt: skip
    tree = ("tuple", ("tuple",) + leaves, ("dict", ()))
    captured = scan(fn, [])
    pending = [a._node for _, a in captured if a._node.realized is None]
    if pending:
        runtime.realize(pending)
    return trace(fn, args, {}, specs, tree, captured, getattr(fn, "__name__", "graph"))


# -- output -----------------------------------------------------------------------------


def graph_json(g: Any) -> dict[str, Any]:
    names: dict[int, str] = {n.id: f"in{k}" for k, n in enumerate(g.inputs)}
    t = 0
    for n in g.nodes:
        if n.id not in names:
            names[n.id], t = f"t{t}", t + 1
    from pygpukit.ir.expr import to_source

    nodes = []
    for n in g.nodes:
        attrs = {k: repr(v) for k, v in sorted(n.attrs.items())}
        if "expr" in n.attrs:
            attrs["expr"] = to_source(n.attrs["expr"], [names[i.id] for i in n.inputs])
        nodes.append({"name": names[n.id], "op": n.op, "dtype": n.dtype.name,
                      "shape": list(n.shape), "inputs": [names[i.id] for i in n.inputs],
                      "attrs": attrs, "loc": str(n.loc) if n.loc else "",
                      "origin": n.origin})  # fmt: skip
    return {"name": g.name, "inputs": [names[n.id] for n in g.inputs],
            "outputs": [names[o.id] for o in g.outputs], "nodes": nodes}  # fmt: skip


def graph_dot(g: Any) -> str:
    js = graph_json(g)
    lines = [f'digraph "{js["name"]}" {{', "  node [shape=box, fontname=monospace];"]
    for n in js["nodes"]:
        shape = ",".join(str(d) for d in n["shape"])
        label = f"{n['name']} = {n['op']}\\n{n['dtype']}[{shape}]"
        if n["loc"]:
            label += f"\\n{n['loc']}"
        if n["origin"]:
            label += f"\\n{n['origin']}"
        style = ', style=filled, fillcolor="#dde8ff"' if n["origin"] else ""
        lines.append(f'  "{n["name"]}" [label="{label}"{style}];')
        for i in n["inputs"]:
            lines.append(f'  "{i}" -> "{n["name"]}";')
    lines.append("}")
    return "\n".join(lines)


def check_pass_name(name: str, flag: str) -> None:
    """UsageError unless `name` is a pass of the pipeline."""
    from pygpukit.passes.pipeline import pass_named

    try:
        pass_named(name)
    except KeyError as e:
        raise UsageError(f"{flag} {name}: {e.args[0]}") from None


@contextmanager
def skipping(names: list[str]) -> Iterator[None]:
    """`dump --skip`: leave these passes out for this command, added to what the skip-passes
    setting (gpk.set_skip_passes / PYGPUKIT_SKIP_PASSES) already names."""
    for name in names:
        check_pass_name(name, "--skip")
    with settings.also_skipping(names):
        yield


def graph_html_doc(g: Any) -> dict[str, Any]:
    """graph_json's dict with each node's code line (`source`) for the page's hover."""
    doc = graph_json(g)
    for n, row in zip(g.nodes, doc["nodes"], strict=True):
        row["source"] = linecache.getline(n.loc.file, n.loc.line).strip() if n.loc else ""
    return doc


def compile_target(traced: Any, after: str | None, on_pass: Any) -> tuple[Any, Any, Any]:
    from pygpukit.passes import lower
    from pygpukit.passes.memory_plan import plan_memory
    from pygpukit.passes.pipeline import default_passes, run_pipeline

    try:
        passes = default_passes()  # PIPELINE less PYGPUKIT_SKIP_PASSES (dump's --skip)
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    if after is not None:
        check_pass_name(after, "--after")
        if after not in {p.__name__ for p in passes}:
            raise UsageError(f"--after {after}: that pass is skipped")
    final = run_pipeline(traced.graph, passes, on_pass=on_pass)
    schedule = lower(final)
    n_args = len(traced.graph.inputs) - len(traced.persistent) - len(traced.constants)
    external = set(schedule.input_slots[n_args:]) - {-1}
    outs = schedule.output_slots
    wb = [(outs[traced.n_outputs + j], schedule.input_slots[n_args + p])
          for j, p in enumerate(traced.writeback_persistent)]  # fmt: skip
    plan = plan_memory(schedule, external, wb)
    schedule.info["memory_plan"] = plan
    return final, schedule, plan


def kernel_list(schedule: Any, plan: Any) -> list[dict[str, Any]]:
    rows = []
    for k, st in enumerate(schedule.steps):
        if st.out in plan.alias and k not in plan.inplace:
            continue
        rows.append({"step": k, "op": st.op, "type": f"{st.dtype.short}{list(st.shape)}",
                     "loc": str(st.loc or ""), "origin": st.origin,
                     "inplace": k in plan.inplace})  # fmt: skip
    return rows


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / 2**20:.2f} MiB"


def dump(args: argparse.Namespace) -> int:
    """Trace the target and print its graph through the passes (text, json, dot or html)."""
    settings.prefer_backend("cpu")  # tracing needs no GPU
    with skipping(args.skip or []):
        return _dump(args)


def _dump(args: argparse.Namespace) -> int:
    from pygpukit.ir import format_graph
    from pygpukit.passes.patterns import format_report

    traced = trace_target(args.target, args.arg or [])
    snapshots: list[tuple[str, Any]] = [("traced", traced.graph)]
    final, schedule, plan = compile_target(
        traced, args.after, lambda name, g: snapshots.append((name, g))
    )
    all_snapshots = list(snapshots)
    if args.after is not None:
        snapshots = [s for s in snapshots if s[0] == args.after][-1:]
    shown = snapshots[-1][1] if snapshots else final
    kernels = kernel_list(schedule, plan)
    if args.format == "json":
        doc = {
            "name": final.name,
            "graphs": [{"after": name, "graph": graph_json(g)} for name, g in snapshots],
            "provenance": final.provenance,
            "report": final.report,
            "memory_plan": {
                "arena_bytes": plan.arena_bytes,
                "naive_bytes": plan.naive_bytes,
                "offsets": {str(k): v for k, v in plan.offsets.items()},
                "inplace_steps": sorted(plan.inplace),
            },  # fmt: skip
            "kernels": kernels,
        }
        print(json.dumps(doc, indent=1))
        return 0
    if args.format == "dot":
        print(graph_dot(shown))
        return 0
    if args.format == "html":
        title = f"{final.name} after {args.after or 'all passes'}"
        sys.stdout.write(graph_page(graph_html_doc(shown), title))
        return 0
    prov = {id(g): p for (_, g), p in zip(all_snapshots[1:], final.provenance, strict=False)}
    for name, g in snapshots:
        p = prov.get(id(g))
        head = f"# after {name}"
        if p is not None:
            head += f" ({p['ms']:.2f} ms, {p['nodes_before']} -> {p['nodes_after']} nodes)"
        print(head)
        print(format_graph(g))
        print()
    print("# provenance")
    for p in final.provenance:
        print(f"  {p['pass']:<36} {p['ms']:>8.3f} ms  {p['nodes_before']:>4} -> "
              f"{p['nodes_after']:<4} nodes")  # fmt: skip
    print("# fusion report")
    for line in format_report(final.report) or ["(no patterns seen)"]:
        print("  " + line)
    saved = 100 * (1 - plan.arena_bytes / plan.naive_bytes) if plan.naive_bytes else 0.0
    print(f"# memory plan: arena {_kib(plan.arena_bytes)}, naive {_kib(plan.naive_bytes)} "
          f"({saved:.0f}% saved by reuse)")  # fmt: skip
    nodes = schedule.graph.nodes
    for s, off in sorted(plan.offsets.items(), key=lambda x: x[1]):
        print(f"  slot {s:<4} @ {off:>10}  {plan.nbytes[s]:>10} B  "
              f"{nodes[s].dtype.short}{list(nodes[s].shape)}")  # fmt: skip
    print(f"# kernels ({len(kernels)})")
    for r in kernels:
        extra = " in place" if r["inplace"] else ""
        note = "; ".join(x for x in (r["loc"], r["origin"]) if x)
        print(f"  {r['step']:>3} {r['op']:<18} {r['type']:<20}{extra}  # {note}")
    return 0


def profile(args: argparse.Namespace) -> int:
    from pygpukit.backends import get_backend

    backend = get_backend()
    if backend.name != "cuda":
        raise UsageError("graph profile needs the CUDA backend, but this process runs on the "
                         f"{backend.name} (NumPy) backend; kernel times on the CPU say nothing "
                         "about the GPU. Use `pygpukit graph dump` for the plan, or run where "
                         "`pygpukit info` shows an SM80+ device.")  # fmt: skip
    import pygpukit as gpk
    from pygpukit.passes import lower, run_pipeline
    from pygpukit.profiling import copy_bandwidth_gbs, replay_profile
    from pygpukit.profiling import profile as run_profile

    fn = load_function(args.target)
    parsed = tuple(parse_arg(a) for a in args.arg or [])
    traced = trace_function(fn, parsed)
    schedule = lower(run_pipeline(traced.graph))
    host = random_inputs(traced)
    inputs = [backend.from_numpy(a) for a in host]
    inputs += [p._node.realized for p in traced.persistent] + list(traced.constants)
    rows = run_profile(schedule, inputs, repeats=args.repeat, backend=backend)
    # The whole function: compiled, captured, and its graph replayed back to back. Static
    # outputs: a call allocates nothing, so only the replay (and its host dispatch) is timed.
    compiled = gpk.compile(fn, static_outputs=True)
    replay = replay_profile(compiled, call_args(parsed, host), calls=args.replays,
                            backend=backend)  # fmt: skip
    print_profile(args.format, traced.graph.name, rows, copy_bandwidth_gbs(backend), replay)
    return 0


def random_inputs(traced: Any) -> list[Any]:
    """Host arrays for the traced graph's argument inputs (seeded; small ints for ints)."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_args = len(traced.graph.inputs) - len(traced.persistent) - len(traced.constants)
    out = []
    for n in traced.graph.inputs[:n_args]:
        a = rng.standard_normal(n.shape) if n.dtype.is_float else rng.integers(0, 4, n.shape)
        out.append(np.asarray(a).astype(n.dtype.np))
    return out


def call_args(parsed: tuple[Any, ...], host: list[Any]) -> tuple[Any, ...]:
    """parse_arg's values with each array spec replaced by its host array, uploaded."""
    import pygpukit as gpk

    arrays = iter(host)
    return tuple(gpk.from_numpy(next(arrays)) if isinstance(a, SimpleNamespace) else a
                 for a in parsed)  # fmt: skip


def profile_json(name: str, rows: list[dict[str, Any]], copy_gbs: float,
                 replay: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from pygpukit.profiling import kernel_sum_ms

    return {"name": name, "copy_gbs": copy_gbs if math.isfinite(copy_gbs) else None,
            "kernels": rows, "kernel_sum_ms": kernel_sum_ms(rows), "replay": replay}  # fmt: skip


def print_profile(fmt: str, name: str, rows: list[dict[str, Any]], copy_gbs: float,
                  replay: dict[str, Any]) -> None:  # fmt: skip
    from pygpukit.profiling import format_profile, format_replay, kernel_sum_ms

    if fmt == "json":
        print(json.dumps(profile_json(name, rows, copy_gbs, replay), indent=1))
        return
    print(format_profile(rows, copy_gbs))
    print(format_replay(replay, kernel_sum_ms(rows)))


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("graph", help="dump, diff or profile a function's graph")
    sub = p.add_subparsers(dest="graph_command", required=True)
    d = sub.add_parser("dump", help="trace FILE.py:FUNC and print the graph through the passes")
    d.add_argument("target", help="FILE.py:FUNC")
    d.add_argument("--arg", action="append", help='an argument: "bf16[1,2048]" or a literal')
    d.add_argument("--format", choices=("text", "json", "dot", "html"), default="text",
                   help="html: one self-contained page drawing the graph")  # fmt: skip
    d.add_argument("--after", metavar="PASS", help="show only the graph after this pass")
    d.add_argument("--skip", metavar="PASS", action="append",
                   help="run without this pass (repeatable; as PYGPUKIT_SKIP_PASSES)")  # fmt: skip
    d.set_defaults(func=dump)
    graph_diff.add_parser(sub)
    r = sub.add_parser("profile", help="run FILE.py:FUNC on the GPU: each kernel's time and "
                       "the whole graph's replay time")  # fmt: skip
    r.add_argument("target", help="FILE.py:FUNC")
    r.add_argument("--arg", action="append", help='an argument: "bf16[1,2048]" or a literal')
    r.add_argument("--repeat", type=int, default=5, help="timings per kernel (best is kept)")
    r.add_argument(
        "--replays",
        type=int,
        default=20,
        help="graph replays per timing of the whole function (median of 15)",
    )
    r.add_argument("--format", choices=("text", "json"), default="text")
    r.set_defaults(func=profile)
