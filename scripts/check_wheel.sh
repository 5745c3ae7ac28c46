#!/usr/bin/env bash
# Build the wheel the way users get it and check it: tagged for one CPython version (the C++
# module is a pybind11 extension of that version), accepted by auditwheel for a manylinux
# tag, refused by another Python minor version, and working there when built for it
# (`pygpukit info` and the demo, from outside the checkout so the wheel is what imports).
#
#   scripts/check_wheel.sh [OTHER_PYTHON]     (default: pyenv's newest 3.12, else 3.13, 3.10)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
host_tag="$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
other="${1:-}"
if [ -z "$other" ]; then
  for v in 3.12 3.13 3.10; do
    cand="$(ls -d "$HOME"/.pyenv/versions/"$v".*/bin/python 2>/dev/null | sort -V | tail -1 || true)"
    if [ -n "$cand" ] && [ "$("$cand" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')" != "$host_tag" ]; then
      other="$cand"
      break
    fi
  done
fi
[ -n "$other" ] || { echo "check_wheel: no second Python minor version found" >&2; exit 1; }
other_tag="$("$other" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m pip install -q auditwheel
check() {  # wheel, its CPython tag
  local whl="$1" tag="$2"
  case "$(basename "$whl")" in
    *-"$tag"-"$tag"-linux_x86_64.whl) ;;
    *) echo "check_wheel: $whl is not tagged $tag-$tag" >&2; exit 1 ;;
  esac
  # (the listing is read whole first: grep -q closing the pipe early would fail pipefail)
  python3 -m zipfile -l "$whl" > "$work/files.txt"
  grep -q "pygpukit/_native.cpython-${tag#cp}-" "$work/files.txt" \
    || { echo "check_wheel: $whl lacks the $tag _native module" >&2; exit 1; }
  python3 -m auditwheel show "$whl" | tee "$work/show.txt"
  # auditwheel wraps its lines; the tag it finds the wheel consistent with must be manylinux.
  tr '\n' ' ' < "$work/show.txt" > "$work/show1.txt"
  grep -Eq 'consistent with the +following platform tag: +"manylinux_' "$work/show1.txt" \
    || { echo "check_wheel: auditwheel gives $whl no manylinux tag" >&2; exit 1; }
}

python3 -m pip wheel -q --no-deps -w "$work/host" "$repo"
check "$work"/host/*.whl "$host_tag"

"$other" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
if "$work/venv/bin/python" -m pip install -q --no-deps "$work"/host/*.whl 2>/dev/null; then
  echo "check_wheel: the $host_tag wheel installed on $other_tag" >&2
  exit 1
fi
"$work/venv/bin/python" -m pip wheel -q --no-deps -w "$work/other" "$repo"
check "$work"/other/*.whl "$other_tag"
"$work/venv/bin/python" -m pip install -q "$work"/other/*.whl
cd "$work"
"$work/venv/bin/pygpukit" info
"$work/venv/bin/pygpukit" demo
echo "check_wheel: $host_tag and $other_tag wheels OK"
