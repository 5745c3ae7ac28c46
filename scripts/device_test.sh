#!/usr/bin/env bash
# On the GPU machine (no cargo, no network): build both extensions in place, then run the
# CUDA backend's tests, the other GPU tests and the CPU suite (on the CUDA backend), with
# logs under $OUT. The Rust library is built beforehand where cargo exists
# (cd rust && cargo build --release -p pygpukit-py) and carried as .carry/_rust.abi3.so.
# Bench JSON records the commit: call with PGK_GIT_COMMIT=<hash of the tree sent> (the
# machine's copy of .git can be a stale snapshot).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/pygpukit-device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -V; } \
  | tee "$OUT/device.txt"
cp .carry/_rust.abi3.so pygpukit/_rust.abi3.so || exit 1
# The wheel maps ir/ and passes/ to pygpukit.ir and pygpukit.passes; in place, links do.
ln -sfn ../ir pygpukit/ir
ln -sfn ../passes pygpukit/passes
bash scripts/device_build_native.sh true > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -c "import pygpukit as g; print('backend:', g.backend_name())" || exit 1
run() {  # name, seconds, pytest args...
  local name=$1 secs=$2
  shift 2
  timeout "$secs" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE "$@" \
    > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? -- $(tail -1 "$OUT/$name.log")"
}
python3 scripts/cuda_overhead.py 2>&1 | tee "$OUT/overhead.txt"
run cuda_ops "${PGK_CUDA_OPS_SECS:-150}" -n 8 tests/gpu/test_cuda_ops.py ${PGK_K:+-k "$PGK_K"}
grep -E "^(FAILED|ERROR)" "$OUT/cuda_ops.log" | head -60
if [ -z "${PGK_ONLY_CUDA_OPS:-}" ]; then
  run gpu_other "${PGK_GPU_OTHER_SECS:-100}" -n 4 -m gpu tests --deselect tests/gpu/test_cuda_ops.py \
    --ignore=tests/gpu/test_cuda_ops.py
  [ -n "${PGK_SKIP_CPU_SUITE:-}" ] || run cpu_suite 170 -n 8 -m "not gpu" tests
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_other.log" "$OUT/cpu_suite.log" | head -40
fi
