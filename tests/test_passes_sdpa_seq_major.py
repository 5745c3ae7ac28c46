"""sdpa_seq_major: attention read only with its heads and sequence axes swapped writes
that layout itself (one sdpa node, no transposing permute); checked against float64 NumPy
and the unfused program on fresh random inputs, and left alone where the output is also
read as it is, or for a single query row (decode)."""

from __future__ import annotations

import numpy as np
import pytest
from attention_ref import sdpa_ref
from passes_util import arr, close, fused, ops, record, report, run_lazy, run_unfused

import pygpukit as gpk
from pygpukit.ir import ops as irops
from pygpukit.ir.dtypes import as_dtype
from pygpukit.ir.shapes import ShapeRuleError
from pygpukit.passes.sdpa_seq_major import sdpa_seq_major

B, H, KV, T, S, D = 2, 4, 2, 5, 7, 8


def _merged(q, k, v, kv_len, kv_start):
    o = gpk.nn.scaled_dot_product_attention(q, k, v, is_causal=True, kv_len=kv_len,
                                            kv_start=kv_start)  # fmt: skip
    return o.swapaxes(1, 2).reshape(q.shape[0], q.shape[2], -1) * 2.0


def _inputs(rng, t, dtype="float32"):
    q = arr(rng, B, H, t, D, dtype=dtype)
    k, v = arr(rng, B, KV, S, D, dtype=dtype), arr(rng, B, KV, S, D, dtype=dtype)
    kv_len = np.array(S - 1, dtype=np.int64)
    kv_start = rng.integers(0, 2, B).astype(np.int64)
    return q, k, v, kv_len, kv_start


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merged_heads_read_the_seq_major_output(dtype):
    rng = np.random.default_rng()
    ins = _inputs(rng, T, dtype)
    g = fused(_merged, *ins)
    sd = [n for n in g.nodes if n.op == "sdpa"]
    assert len(sd) == 1 and sd[0].attrs.get("seq_major"), ops(g)
    assert sd[0].shape == (B, T, H, D)
    assert "permute" not in ops(g), ops(g)
    assert len(report(g, "sdpa_seq_major", "matched")) == 1
    q, k, v, kv_len, kv_start = ins
    ref = sdpa_ref(q, k, v, causal=True, kv_len=kv_len, kv_start=kv_start)
    ref = ref.swapaxes(1, 2).reshape(B, T, H * D) * 2.0
    (out,) = run_lazy(_merged, *ins)
    assert out.shape == (B, T, H * D)
    close(out, ref, dtype)
    (unfused,) = run_unfused(_merged, *ins)
    close(out, unfused, dtype)


def test_compiled_step_keeps_the_layout():
    """A compiled function (the prefill's path) gives the same values on each call."""
    rng = np.random.default_rng()
    f = gpk.compile(_merged)
    for _ in range(2):
        ins = _inputs(rng, T)
        q, k, v, kv_len, kv_start = ins
        out = f(*[gpk.from_numpy(a) for a in ins]).to_numpy()
        ref = sdpa_ref(q, k, v, causal=True, kv_len=kv_len, kv_start=kv_start)
        close(out, ref.swapaxes(1, 2).reshape(B, T, H * D) * 2.0)


def test_output_read_as_it_is_or_one_row_stays():
    rng = np.random.default_rng()

    def both(q, k, v, kv_len, kv_start):
        o = gpk.nn.scaled_dot_product_attention(q, k, v, is_causal=True, kv_len=kv_len,
                                                kv_start=kv_start)  # fmt: skip
        return o.swapaxes(1, 2) + 1.0, o * 3.0

    ins = _inputs(rng, T)
    g = fused(both, *ins)
    assert not any(n.attrs.get("seq_major") for n in g.nodes if n.op == "sdpa")
    (miss,) = report(g, "sdpa_seq_major", "missed")
    assert "own layout" in miss["reason"]
    q, k, v, kv_len, kv_start = ins
    ref = sdpa_ref(q, k, v, causal=True, kv_len=kv_len, kv_start=kv_start)
    a, b = run_lazy(both, *ins)
    close(a, ref.swapaxes(1, 2) + 1.0)
    close(b, ref * 3.0)

    one = _inputs(rng, 1)
    g = fused(_merged, *one)
    assert not any(n.attrs.get("seq_major") for n in g.nodes if n.op == "sdpa")
    q, k, v, kv_len, kv_start = one
    ref = sdpa_ref(q, k, v, causal=True, kv_len=kv_len, kv_start=kv_start)
    (out,) = run_lazy(_merged, *one)
    close(out, ref.swapaxes(1, 2).reshape(B, 1, H * D) * 2.0)


def test_op_rule_swaps_heads_and_seq():
    f32 = as_dtype("float32")
    specs = [((B, H, T, D), f32), ((B, KV, S, D), f32), ((B, KV, S, D), f32)]
    assert irops.infer("sdpa", specs, {"seq_major": True})[0] == (B, T, H, D)
    assert irops.infer("sdpa", specs, {})[0] == (B, H, T, D)
    with pytest.raises(ShapeRuleError):
        irops.infer("sdpa", [((B, H, T, D), f32), ((B, 3, S, D), f32), ((B, 3, S, D), f32)],
                    {"seq_major": True})  # fmt: skip


def test_other_permutes_pass_through():
    """Transposes of fewer than three axes (and other perms) are no heads swap."""
    rng = np.random.default_rng()
    a = arr(rng, 3, 4)
    b = arr(rng, 2, 3, 4)
    c = arr(rng, 5)

    def f(a, b, c):
        return a.T * 2.0, b.transpose(2, 0, 1) + 1.0, c.transpose(0) - 1.0

    raw, _ = record(f, a, b, c)  # the recorded permutes, before simplification drops any
    assert sdpa_seq_major(raw).report == raw.report
    g = fused(f, a, b, c)
    assert not report(g, "sdpa_seq_major", "matched")
    x, y, z = run_lazy(f, a, b, c)
    close(x, a.T.astype(np.float64) * 2.0)
    close(y, b.transpose(2, 0, 1).astype(np.float64) + 1.0)
    close(z, c.astype(np.float64) - 1.0)
