#!/usr/bin/env bash
# Rebuild the editable install (both extensions). Serialised with a lock so that
# several shells working in one checkout never run CMake in the same build dir at once.
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/pygpukit-build.lock python3 -m pip install -q --no-build-isolation --no-deps -e . "$@"
