#!/usr/bin/env bash
# Build only pygpukit._native in place (no CMake, no cargo), for machines without the Rust
# toolchain such as the GPU machine, then run the given command (default: the native tests).
set -euo pipefail
cd "$(dirname "$0")/.."
out="pygpukit/_native$(python3-config --extension-suffix)"
objdir="${PGK_OBJDIR:-/tmp/pygpukit-native-obj}"
mkdir -p "$objdir"
flags="-std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Inative/src $(python3 -m pybind11 --includes)"
pids=()
for src in native/src/*.cpp; do
  c++ $flags -c "$src" -o "$objdir/$(basename "$src" .cpp).o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
c++ -shared -o "$out" "$objdir"/*.o -ldl
echo "built $out"
if [ "$#" -gt 0 ]; then
  exec "$@"
fi
PYTHONPATH=. exec python3 -m pytest tests/gpu/test_native_runtime.py -x -q
