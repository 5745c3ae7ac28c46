"""The NVRTC kernel families: each is its template (<family>.cuh), its launcher
(<family>.py: device pointers and shapes in, variant and geometry chosen, launched with
the argument format the template's `extern "C"` signature declares) and, for the fused IR
ops, its planner (<family>_plan.py: a schedule step onto the launcher, with a PLANNERS
table of the ops it plans, which cuda/plan.py collects).

    activation   gelu, silu, swiglu          activation_plan: swiglu
    argmax_topk  argmax, top-k               (planned by ops_reduce)
    attention    prefill and decode SDPA     attention_plan: sdpa, sdpa_append
    embedding    row gather
    gemm_mma     tensor-core GEMM            linear_plan: matmul, linear (GEMV, mma GEMM,
    gemv         GEMV with folded prologue     matmul_simple or cuBLASLt)
    matmul_simple  every dtype
    layer_norm, rms_norm, rope, softmax      <family>_plan

loader.py finds, compiles and caches the templates (common.cuh is inlined into each);
variants.py lists every variant a launcher can ask for, for ahead-of-time compile checks.
Submodules are imported by name (nothing here imports them: the plan modules import the
backend's helpers, which import the loader).
"""
