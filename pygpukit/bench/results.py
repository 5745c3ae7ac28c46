"""Where a benchmark run's JSON goes: bench/results/<device>-<group>.json, one file per
device and result group, which the next run of that group overwrites (git keeps the
history). bench/results/README.md lists the files and the command behind each.
"""

from __future__ import annotations

import re
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"

# Result group -> the harness groups (`--only` names) a run of it selects, less `copy`
# (the copy ceiling, which any run may add). Groups share no harness group, so each
# workload's latest result lives in one file.
RESULT_GROUPS: dict[str, frozenset[str]] = {
    "kernels": frozenset({"gemm", "rms_norm", "rope", "softmax", "gemv", "decode"}),
    "compiled": frozenset({"chain64", "linear_gelu"}),
    "dispatch": frozenset({"dispatch", "compile_time"}),
    "read-floor": frozenset({"read_floor"}),
    "sdpa": frozenset({"sdpa"}),
    "llm": frozenset({"llm"}),
    "llm-prefill": frozenset({"llm_prefill"}),
    "llm-long": frozenset({"llm_long"}),
    "llm-load": frozenset({"llm_load"}),
    "quant": frozenset({"quant", "quant_llm"}),
    "transfer": frozenset({"transfer"}),
}
# --llm-model -> the result group of its LLM rows.
LLM_GROUPS = {"tinyllama": "llm", "llama2-7b": "llm-7b"}
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro"}


def device_tag(name: str) -> str:
    """A short file-name tag for a device name: 'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB
    HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100', 'NVIDIA GeForce RTX 4090' ->
    'rtx4090' (the words up to the first with a digit, vendor words dropped)."""
    words = [w.split("-")[0] for w in name.split() if w.lower() not in _VENDOR_WORDS]
    kept: list[str] = []
    for w in words:
        kept.append(w)
        if any(c.isdigit() for c in w):
            break
    return re.sub(r"[^a-z0-9]", "", "".join(kept).lower()) or "gpu"


def result_group(groups: set[str], llm_model: str = "tinyllama") -> str:
    """The result group a run of these harness groups records; ValueError when they are
    not exactly one group's (with or without `copy`)."""
    wanted = frozenset(groups - {"copy"})
    if wanted == RESULT_GROUPS["llm"]:
        if llm_model not in LLM_GROUPS:
            raise ValueError(f"no result file for --llm-model {llm_model!r}")
        return LLM_GROUPS[llm_model]
    for name, members in RESULT_GROUPS.items():
        if wanted == members:
            return name
    known = "; ".join(f"{n}: {','.join(sorted(m))}" for n, m in RESULT_GROUPS.items())
    raise ValueError(f"--only {','.join(sorted(groups))} is no result group ({known}); "
                     "name the JSON file")  # fmt: skip


def result_path(device_name: str, group: str, root: Path = RESULTS_DIR) -> Path:
    """bench/results/<device>-<group>.json (the folder must exist: a source checkout)."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist (not a source checkout): name the file")
    return root / f"{device_tag(device_name)}-{group}.json"
