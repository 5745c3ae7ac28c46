#!/usr/bin/env bash
# On the GPU machine, in one call: build the native extension, run the GPU tests of the
# decode path, then the LLM decode benchmark against torch.compile and the per-kernel
# profile of the captured decode step. Logs and JSON under $OUT.
#   PGK_LLM_BATCHES (1,4,16)  PGK_LLM_IMPLS (pygpukit,torch_compile)  PGK_LLM_MODEL (tinyllama)
#   PGK_LLM_TESTS (the test files; "none" skips them)  PGK_PROFILE_BATCHES (1; "none" skips)
#   PGK_TESTS_SECS (240)  PGK_BENCH_SECS (300)  PGK_PROFILE_SECS (200): time limits
# Bench JSON records the commit: call with PGK_GIT_COMMIT=<hash of the tree sent> (the
# machine's copy of .git can be a stale snapshot).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/pygpukit-device-out}"
mkdir -p "$OUT"
cp .carry/_rust.abi3.so pygpukit/_rust.abi3.so || exit 1
export PYTHONUNBUFFERED=1
tests="${PGK_LLM_TESTS:-tests/gpu/test_linear_fold_gpu.py tests/gpu/test_host_transfer.py tests/gpu/test_llm_gpu.py}"
bash scripts/device_build_native.sh bash -c "
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
  if [ '$tests' != none ]; then
    timeout ${PGK_TESTS_SECS:-240} python3 -m pytest -q -x -p no:cacheprovider --tb=short -n 4 $tests > $OUT/tests.log 2>&1
    echo \"== tests: exit \$? -- \$(tail -1 $OUT/tests.log)\"; grep -E '^(FAILED|ERROR)' $OUT/tests.log | head -20
  fi
  timeout ${PGK_BENCH_SECS:-300} python3 -m pygpukit.bench.llm --model ${PGK_LLM_MODEL:-tinyllama} \
    --batches ${PGK_LLM_BATCHES:-1,4,16} --impl ${PGK_LLM_IMPLS:-pygpukit,torch_compile} \
    --jsonl $OUT/llm.jsonl 2>&1 | tail -12
  if [ '${PGK_PROFILE_BATCHES:-1}' != none ]; then
    timeout ${PGK_PROFILE_SECS:-200} python3 scripts/graph_profile.py --batches ${PGK_PROFILE_BATCHES:-1} \
      --trace $OUT/trace.json --json $OUT/profile.json 2>&1 | tail -20
  fi
"
