#!/usr/bin/env bash
# Build only pygpukit._native in place (no CMake, no cargo), for machines without the Rust
# toolchain such as the GPU machine, then run the given command (default: the native tests)
# with the checkout on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
suffix="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
out="pygpukit/_native$suffix"
objdir="${PGK_OBJDIR:-/tmp/pygpukit-native-obj}"
mkdir -p "$objdir"
flags="-std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Inative/src $(python3 -m pybind11 --includes)"
pids=()
for src in native/src/*.cpp; do
  c++ $flags -c "$src" -o "$objdir/$(basename "$src" .cpp).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
c++ -shared -o "$out" "$objdir"/*.o -ldl
echo "built $out"

# The wheel maps ir/ and passes/ to pygpukit.ir and pygpukit.passes; without an install,
# symlinks give the same layout. Only links made here are removed afterwards.
made=()
for pkg in ir passes; do
  if [ ! -e "pygpukit/$pkg" ]; then
    ln -s "../$pkg" "pygpukit/$pkg"
    made+=("pygpukit/$pkg")
  fi
done
cleanup() { for l in "${made[@]}"; do rm -f "$l"; done; }
trap cleanup EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$#" -gt 0 ]; then
  "$@"
else
  python3 -m pytest tests/gpu/test_native_runtime.py -x -q
fi
