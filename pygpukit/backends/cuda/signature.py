"""Parameter lists of `extern "C"` CUDA kernels, parsed from their source.

One parser for gpk.jit (user kernels) and the kernel templates' launchers: each parameter
gets the launch format character pygpukit._native's Function.launch packs it with
(P pointer, i int, I unsigned, q 64-bit integer, f float, d double, T a tensor map: the
128-byte `pgk_tmap` a template takes as a __grid_constant__ parameter), so a launch's
argument format is read from the kernel's own signature, never typed by hand.
"""

from __future__ import annotations

import re

from pygpukit.errors import CompileError, DTypeError

_SCALARS = {
    "int": "i", "int32_t": "i", "signed": "i", "signed int": "i", "short": "i", "char": "i",
    "bool": "i", "unsigned": "I", "unsigned int": "I", "uint32_t": "I",
    "long long": "q", "long long int": "q", "int64_t": "q", "long": "q", "size_t": "q",
    "ptrdiff_t": "q", "uint64_t": "q", "unsigned long long": "q", "unsigned long": "q",
    "float": "f", "double": "d",
}  # fmt: skip
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__"}
_BY_VALUE = {"pgk_tmap": "T"}  # opaque structs passed by value (a CUtensorMap's 128 bytes)
# Attributes a kernel head may carry: __launch_bounds__, __cluster_dims__ and the macros
# (PGK_...) that expand to one of them for some defines.
_LAUNCH_BOUNDS = r"(?:(?:__launch_bounds__\([^)]*\)|__cluster_dims__\([^)]*\)|PGK_[A-Z0-9_]+)\s*)*"

Param = tuple[str, str, str]  # (C type, parameter name, launch format character)


def _declaration(source: str, name: str) -> tuple[str, str] | None:
    """(text that declares kernel `name`, its parameter list), or None. A kernel stamped
    out by a function-like macro (`#define M(NAME, ...) ... void NAME(...)` used as
    `M(name, ...)`) is found through the macro's body."""
    head = r"__global__\s+" + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS
    m = re.search(head + re.escape(name) + r"\s*\(([^)]*)\)", source)
    if m is not None:
        return source, m.group(1)
    for d in re.finditer(r"#define\s+(\w+)\(\s*(\w+)\s*[,)]((?:[^\n]*\\\n)*[^\n]*)", source):
        macro, arg, body = d.group(1), d.group(2), d.group(3).replace("\\\n", " ")
        if not re.search(r"(?<!#define )\b" + macro + r"\(\s*" + re.escape(name) + r"\s*[,)]",
                         source):  # fmt: skip
            continue
        bm = re.search(head + arg + r"\s*\(([^)]*)\)", body)
        if bm is not None:
            return body.replace(arg, name), bm.group(1)
    return None


def parse_params(source: str, name: str, who: str = "jit") -> list[Param]:
    """[(C type, parameter name, launch format character)] of kernel `name` in `source`.
    `who` prefixes the errors (the jit, or the template family)."""
    found = _declaration(source, name)
    if found is None:
        raise CompileError(f"{who}: no __global__ void {name}(...) in the source")
    text, body = found
    if not re.search(r'extern\s+"C"[^;{]*?\b' + re.escape(name) + r"\s*\(", text):
        raise CompileError(f'{who}: kernel {name} must be declared extern "C"')
    out: list[Param] = []
    body = body.strip()
    if not body or body == "void":
        return out
    for k, raw in enumerate(body.split(",")):
        decl = " ".join(raw.split())
        pm = re.match(r"(.*?)([A-Za-z_]\w*)\s*(\[\s*\])?$", decl)
        if pm is None:
            raise DTypeError(f"{who}: kernel {name}: cannot parse parameter {k} {decl!r}")
        ctype, pname = pm.group(1).strip(), pm.group(2)
        if "*" in ctype or pm.group(3):
            out.append((ctype, pname, "P"))
            continue
        base = " ".join(w for w in ctype.split() if w not in _QUALIFIERS)
        if base in _BY_VALUE:
            out.append((ctype, pname, _BY_VALUE[base]))
            continue
        if base not in _SCALARS:
            raise DTypeError(f"{who}: kernel {name}: parameter {pname!r} has unsupported type "
                             f"{ctype!r} (pointers, ints and floats are supported)")  # fmt: skip
        out.append((ctype, pname, _SCALARS[base]))
    return out


def launch_format(source: str, name: str, who: str = "jit") -> str:
    """The argument format Function.launch takes for kernel `name`, e.g. "PPiqq"."""
    return "".join(p[2] for p in parse_params(source, name, who))


def kernel_names(source: str) -> list[str]:
    """Every `extern "C"` __global__ kernel `source` declares, macro-stamped ones included."""
    head = r'extern\s+"C"\s+__global__\s+' + _LAUNCH_BOUNDS + r"void\s+" + _LAUNCH_BOUNDS
    macros = {d.group(2): d.group(1)
              for d in re.finditer(r"#define\s+(\w+)\(\s*(\w+)\s*[,)]", source)}  # fmt: skip
    out: list[str] = []
    for n in re.findall(head + r"(\w+)\s*\(", source):
        if n in macros:  # a macro's parameter: the kernels are the macro's uses
            out += re.findall(r"^\s*" + macros[n] + r"\(\s*(\w+)\s*[,)]", source, re.M)
        else:
            out.append(n)
    return list(dict.fromkeys(out))


__all__ = ["Param", "kernel_names", "launch_format", "parse_params"]
