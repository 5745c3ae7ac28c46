"""Memory planning: reuse shrinks the arena, live buffers never overlap, views get no bytes,
stores whose old contents are dead happen in place; the NumPy backend runs the plan."""

from __future__ import annotations

import numpy as np
from passes_util import arr, close, f64, record

import pygpukit as gpk
from pygpukit.backends import get_backend
from pygpukit.executor import PlannedProgram
from pygpukit.passes import lower
from pygpukit.passes.memory_plan import plan_memory


def _lifetimes(schedule, plan):
    """[start, end] step range of each buffer, including its views and in-place users."""
    end = len(schedule.steps)
    life = {s: [-1 if s in schedule.input_slots else None, -1] for s in plan.offsets}
    for k, st in enumerate(schedule.steps):
        r = plan.root(st.out)
        if r in life and life[r][0] is None:
            life[r][0] = k
        for i in st.ins:
            r = plan.root(i)
            if r in life:
                life[r][1] = max(life[r][1], k)
    for s in schedule.output_slots:
        r = plan.root(s)
        if r in life:
            life[r][1] = end
    out = {}
    for s, (a, b) in life.items():
        a = 0 if a is None else a
        out[s] = (a, max(a, b))
    return out


def assert_no_overlap(schedule, plan):
    life = _lifetimes(schedule, plan)
    slots = sorted(plan.offsets)
    for i, a in enumerate(slots):
        for b in slots[i + 1 :]:
            la, lb = life[a], life[b]
            if la[1] < lb[0] or lb[1] < la[0]:
                continue  # never live together
            oa, ob = plan.offsets[a], plan.offsets[b]
            assert oa + plan.nbytes[a] <= ob or ob + plan.nbytes[b] <= oa, (a, b, la, lb)


def _value(a):
    return gpk.from_numpy(a).realize().node.realized


def test_chain_reuses_memory():
    rng = np.random.default_rng(3)
    x = arr(rng, 64, 64)

    def chain(x):
        for _ in range(8):
            x = gpk.tanh(x) * 1.5 + 0.25
        return x.sum(-1)

    g, _ = record(chain, x)
    schedule = lower(g)  # unfused: every op gets a buffer
    plan = plan_memory(schedule)
    assert plan.arena_bytes < plan.naive_bytes / 4, (plan.arena_bytes, plan.naive_bytes)
    assert_no_overlap(schedule, plan)
    prog = PlannedProgram(schedule, get_backend())
    (out,) = prog([_value(x)], [])
    ref = f64(x)
    for _ in range(8):
        ref = np.tanh(ref) * 1.5 + 0.25
    close(get_backend().to_numpy(out), ref.sum(-1), factor=4)


def test_views_get_no_slots_and_copies_do():
    rng = np.random.default_rng(4)
    x = arr(rng, 4, 6)

    def f(x):
        a = x.reshape(6, 4).transpose()  # views of the input
        b = gpk.broadcast_to(x[1:3, None, :], (2, 5, 6))  # static index + expand: views
        c = (a * 2.0).transpose().reshape(24)  # reshape of a permuted value: a copy
        return a + 1.0, b * 1.0, c

    g, _ = record(f, x)
    schedule = lower(g)
    plan = plan_memory(schedule)
    for st in schedule.steps:
        if st.op in ("permute", "expand", "index"):
            assert st.out in plan.alias and st.out not in plan.offsets
    reshapes = [st for st in schedule.steps if st.op == "reshape"]
    assert any(st.out in plan.offsets for st in reshapes)  # the non-contiguous one
    assert any(st.out in plan.alias for st in reshapes)
    assert_no_overlap(schedule, plan)
    prog = PlannedProgram(schedule, get_backend())
    outs = prog([_value(x)], [])
    x64 = f64(x)
    a = x64.reshape(6, 4).T
    be = get_backend()
    close(be.to_numpy(outs[0]), a + 1)
    close(be.to_numpy(outs[1]), np.broadcast_to(x64[1:3, None, :], (2, 5, 6)))
    close(be.to_numpy(outs[2]), (a * 2).T.reshape(24))


def test_reshape_of_a_strided_slice_is_a_view():
    """The fused-QKV split: qkv[..., a:b].reshape(B, T, H, D) needs no copy (NumPy's rule
    over the slice's strides), and neither does the swap back of a one-token attention
    output; a reshape that merges across the gap of a strided view still copies."""
    rng = np.random.default_rng(6)
    x = arr(rng, 2, 1, 48)

    def f(x):
        q = x[:, :, :32].reshape(2, 1, 4, 8).swapaxes(1, 2)  # [2, 4, 1, 8] view
        v = x[:, :, 32:].reshape(2, 1, 2, 8)
        y = (q * 2.0).swapaxes(1, 2).reshape(2, 1, 32)  # t == 1: a view of q * 2
        merged = x[:, :, 8:40].reshape(64)  # crosses rows of a strided slice: a copy
        return q + 1.0, v * 3.0, y + 0.5, merged

    g, _ = record(f, x)
    schedule = lower(g)
    plan = plan_memory(schedule)
    reshapes = [st for st in schedule.steps if st.op == "reshape"]
    copied = [st for st in reshapes if st.out in plan.offsets]
    assert [st.shape for st in copied] == [(64,)], [st.shape for st in copied]
    assert_no_overlap(schedule, plan)
    outs = PlannedProgram(schedule, get_backend())([_value(x)], [])
    x64 = f64(x)
    q = x64[:, :, :32].reshape(2, 1, 4, 8).swapaxes(1, 2)
    be = get_backend()
    close(be.to_numpy(outs[0]), q + 1)
    close(be.to_numpy(outs[1]), x64[:, :, 32:].reshape(2, 1, 2, 8) * 3)
    close(be.to_numpy(outs[2]), (q * 2).swapaxes(1, 2).reshape(2, 1, 32) + 0.5)
    close(be.to_numpy(outs[3]), x64[:, :, 8:40].reshape(64))


def test_dead_store_base_is_written_in_place():
    rng = np.random.default_rng(5)
    x, v = arr(rng, 8, 8), arr(rng, 8)

    def f(x, v):
        y = x * 2.0
        y[3] = v  # y's old value is not read afterwards: in place
        return y + 1.0

    g, _ = record(f, x, v)
    schedule = lower(g)
    plan = plan_memory(schedule)
    assert len(plan.inplace) == 1
    prog = PlannedProgram(schedule, get_backend())
    (out,) = prog([_value(x), _value(v)], [])
    ref = f64(x) * 2
    ref[3] = f64(v)
    close(get_backend().to_numpy(out), ref + 1)


def test_compiled_graph_reports_plan_before_running():
    rng = np.random.default_rng(6)

    @gpk.compile
    def f(x):
        h = x
        for _ in range(4):
            h = h @ h.T * 0.1  # matmuls are not fused: buffers to plan
        return h

    f(gpk.from_numpy(arr(rng, 16, 16)))
    (entry,) = f.stats()["entries"]
    assert entry["arena_bytes"] < entry["naive_bytes"]
    info = f._cache[next(iter(f._cache))].program.schedule.info
    assert info["arena_bytes"] == entry["arena_bytes"]
