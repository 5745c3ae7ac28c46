"""scripts/graph_profile.py's prefill breakdown on synthetic profiler events: own times
under overlapping (programmatic dependent) launches, the layer window, each kernel's role
and bytes, and the GEMM / non-GEMM split (the device run feeds it CUPTI's events)."""

import importlib.util
from pathlib import Path

import pytest

from pygpukit.bench.llm import tinyllama_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gp():
    spec = importlib.util.spec_from_file_location(
        "graph_profile", ROOT / "scripts" / "graph_profile.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# One layer as the chunked prefill launches it on main before the fusions, then the fused one.
SPLIT = ["pgk_rms_norm", "nvjet_a", "pgk_rope", "pgk_ew_k", "pgk_ew_v", "pgk_attention_flash",
         "pgk_ew_t", "nvjet_b", "pgk_rms_norm", "Memset (Unknown)", "nvjet_c", "pgk_swiglu",
         "nvjet_d"]  # fmt: skip
FUSED = ["pgk_rms_norm", "nvjet_a", "pgk_rope_store", "pgk_attention_flash", "nvjet_b",
         "pgk_rms_norm", "nvjet_c", "pgk_swiglu", "nvjet_d"]  # fmt: skip


def test_own_times_count_overlap_once(gp):
    ev = [{"ts": 0.0, "dur": 10.0}, {"ts": 4.0, "dur": 8.0}, {"ts": 20.0, "dur": 2.0},
          {"ts": 20.5, "dur": 0.5}]  # fmt: skip
    assert gp._own_times(ev) == [10.0, 2.0, 2.0, 0.0]


def test_layer_roles_and_bytes(gp):
    cfg = tinyllama_config()
    b, t = 4, 512
    m, qd, kd, hid = b * t, 32 * 64, 4 * 64, 2048
    roles = gp.layer_roles(SPLIT, cfg, b, t, t)
    got = [r["role"] for r in roles]
    assert got == ["rms_norm", "qkv", "rope", "k_store", "v_store", "attention",
                   "attn_out_copy", "attn_out", "rms_norm", "memset", "gate_up", "swiglu",
                   "down"]  # fmt: skip
    by = {r["role"]: r for r in roles}
    assert by["qkv"]["mnk"] == (m, qd + 2 * kd, hid)
    assert by["down"]["mnk"] == (m, hid, 5632)
    # a residual GEMM reads C as well as writing D
    assert by["down"]["bytes"] == 2 * (m * 5632 + hid * 5632 + 2 * m * hid)
    assert by["rope"]["bytes"] == 2 * 2 * m * (qd + kd)
    assert by["k_store"]["bytes"] == 2 * 2 * m * kd
    assert by["attn_out_copy"]["bytes"] == 2 * 2 * m * qd
    fused = {r["role"]: r for r in gp.layer_roles(FUSED, cfg, b, t, t)}
    assert fused["rope+kv_store"]["bytes"] == 2 * 2 * m * (qd + 2 * kd)
    assert "attn_out_copy" not in fused


def test_summary_layer_and_annotation(gp):
    cfg = tinyllama_config()
    ev, ts = [], 100.0
    for _ in range(4):  # four layers, each kernel 3 us after the last one ends
        for name in SPLIT:
            dur = 50.0 if name.startswith("nvjet") else 5.0
            ev.append({"name": name, "ts": ts, "dur": dur, "args": {"grid": [1, 1, 1]}})
            ts += dur + 3.0
    mark = {"ts": 90.0, "dur": ts - 80.0}
    s = gp._summarise(ev, mark, 4)
    assert [r["name"] for r in s["one_layer"]] == SPLIT
    assert s["own_us"] == pytest.approx(4 * (4 * 50.0 + 9 * 5.0))
    assert s["gaps_us"] == pytest.approx(4 * 13 * 3.0 - 3.0)
    ref = [{"m": 2048, "n": n, "k": k, "linear_us": 40.0, "linear_add_us": 25.0}
           for n, k in ((2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632))]  # fmt: skip
    gp.annotate_layer(s, cfg, 4, 512, 512, 4000.0, ref)
    assert s["layer_gemm_own_us"] == pytest.approx(200.0)
    assert s["layer_rest_own_us"] == pytest.approx(45.0)
    by = {r["role"]: r for r in s["one_layer"]}
    assert by["qkv"]["vs_ref"] == pytest.approx(50.0 / 40.0)
    assert by["attn_out"]["vs_ref"] == pytest.approx(50.0 / 25.0)  # the addmm reference
    assert by["swiglu"]["gb_s"] == pytest.approx(2 * 3 * 2048 * 5632 / 5.0 / 1e3)
    assert by["swiglu"]["of_copy"] == pytest.approx(by["swiglu"]["gb_s"] / 4000.0)
