"""The NVRTC kernel families, each in one place:

    <family>.cuh       the template (common.cuh is inlined into each)
    <family>.py        its launcher: device pointers and shapes in; it picks the variant
                       (#defines) and geometry and launches with the argument format the
                       template's extern "C" signature declares (loader.get_kernel)
    <op>_plan.py       the planner of the IR ops the family computes: a schedule step onto
                       the launchers, with a PLANNERS table that cuda/plan.py collects

    softmax_plan     softmax, log_softmax    softmax
    rms_norm_plan    rms_norm                rms_norm
    layer_norm_plan  layer_norm              layer_norm
    activation_plan  swiglu                  activation (also gelu, silu)
    rope_plan        rope                    rope
    attention_plan   sdpa, sdpa_append       attention (attention_prefill, attention_decode),
                                             matmul_simple and softmax for the composed path
    linear_plan      matmul, linear          gemv, gemm_mma, matmul_simple, cuBLASLt
    scan_plan        scan                    scan (cumsum, cumprod)
    sort_plan        sort                    sort (sort, argsort, topk)

argmax_topk and embedding have launchers only (ops_reduce plans argmax). loader.py finds,
compiles and caches the templates; variants.py lists every variant a launcher can ask
for, for ahead-of-time compile checks. Nothing here imports the submodules: the planners
import the backend's helpers, which import the loader.
"""
