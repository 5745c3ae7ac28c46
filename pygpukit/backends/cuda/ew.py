"""Builds elementwise launches: layouts -> spec -> compiled kernel + fixed arguments.

Everything that depends on shapes and strides is computed once here; the returned
launcher only takes this run's pointers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.ir import DType, dtypes
from pygpukit.ir.expr import Expr

from . import compiler
from .codegen.elementwise import EwSpec, generate
from .context import Context, cdiv, contiguous
from .kernels import loader
from .layout import broadcast_strides, collapse, is_contiguous
from .value import DeviceValue

Launcher = Callable[..., None]  # (out_ptr, in_ptrs, dyn_ptrs=())
BLOCK = 256


COPY = ("in", 0)
WORD = dtypes.int64  # the unit a widened copy moves


def make(ctx: Context, expr: Expr, ins: Sequence[DeviceValue], out_shape: tuple[int, ...],
         out_strides: tuple[int, ...], out_dtype: DType, out_ptr_hint: int,
         dyn: Sequence[tuple[int, DType, int, int]] = (), tag: int = 0) -> Launcher:  # fmt: skip
    """launch(out_ptr, in_ptrs, dyn_ptrs). dyn: (operand, index dtype, size, stride), with
    operand -1 for the output, k for input k. A strided copy whose rows are unit-stride
    (a transposing reshape, a KV-cache store) moves 8-byte words (widened_copy) while
    both pointers are 8-byte aligned: a thread per element, with the index arithmetic of
    the strided layout, ran such a copy at a third of the word copy's speed."""
    wide = widened_copy(expr, ins, out_shape, out_strides, out_dtype, dyn)
    if wide is None:
        return _make(ctx, expr, ins, out_shape, out_strides, out_dtype, out_ptr_hint, dyn, tag)
    shape, ost, view, wdyn = wide
    words = _make(ctx, COPY, [view], shape, ost, WORD, out_ptr_hint, wdyn, tag)
    narrow: list[Launcher] = []  # made on the first launch with a pointer off 8 bytes

    def launch(out_ptr: int, in_ptrs: Sequence[int], dyn_ptrs: Sequence[int] = ()) -> None:
        if not (out_ptr % 8 or in_ptrs[0] % 8):
            words(out_ptr, in_ptrs, dyn_ptrs)
            return
        if not narrow:
            narrow.append(_make(ctx, expr, ins, out_shape, out_strides, out_dtype,
                                out_ptr_hint, dyn, tag))  # fmt: skip
        narrow[0](out_ptr, in_ptrs, dyn_ptrs)

    return launch


def widened_copy(expr: Expr, ins: Sequence[DeviceValue], out_shape: tuple[int, ...],
                 out_strides: tuple[int, ...], out_dtype: DType,
                 dyn: Sequence[tuple[int, DType, int, int]]
                 ) -> tuple[tuple[int, ...], tuple[int, ...], DeviceValue,
                            list[tuple[int, DType, int, int]]] | None:  # fmt: skip
    """The same copy in 8-byte words: (shape, output strides, input view, dyn terms), or
    None. Only for a copy (same dtype, narrower than a word) that the element kernel would
    not vectorize (strided or dynamically indexed) whose innermost dim is unit-stride on
    both sides and a whole number of words, with every other stride, every dynamic
    index's stride and the input's offset whole words too."""
    if len(ins) != 1 or expr not in (COPY, ("cast", out_dtype.name, COPY)) or not out_shape:
        return None
    x = ins[0]
    isz = out_dtype.itemsize
    if x.dtype != out_dtype or WORD.itemsize % isz or isz == WORD.itemsize:
        return None
    r = WORD.itemsize // isz
    xst = broadcast_strides(x.shape, x.strides, out_shape)
    # Size-1 dims take any stride: as 0 they never decide.
    ost = [st if d > 1 else 0 for st, d in zip(out_strides, out_shape, strict=True)]
    ist = [st if d > 1 else 0 for st, d in zip(xst, out_shape, strict=True)]
    if not dyn and is_contiguous(out_shape, out_strides) and _same(xst, contiguous(out_shape),
                                                                  out_shape):  # fmt: skip
        return None  # a contiguous copy: already 16 bytes per thread
    if out_shape[-1] % r or out_strides[-1] != 1 or xst[-1] != 1 or (x.offset * isz) % 8:
        return None
    if any(st % r for st in ost[:-1] + ist[:-1]) or any(st % r for *_, st in dyn):
        return None
    shape = (*out_shape[:-1], out_shape[-1] // r)
    view = DeviceValue(x.storage, shape, (*(st // r for st in ist[:-1]), 1),
                       x.offset * isz // WORD.itemsize, WORD)  # fmt: skip
    return (shape, (*(st // r for st in ost[:-1]), 1), view,
            [(o, d, size, st // r) for o, d, size, st in dyn])  # fmt: skip


def _make(ctx: Context, expr: Expr, ins: Sequence[DeviceValue], out_shape: tuple[int, ...],
          out_strides: tuple[int, ...], out_dtype: DType, out_ptr_hint: int,
          dyn: Sequence[tuple[int, DType, int, int]] = (), tag: int = 0) -> Launcher:  # fmt: skip
    """make() without the widening: one kernel over the elements."""
    n = 1
    for d in out_shape:
        n *= d
    out_contig = is_contiguous(out_shape, out_strides)
    cst = contiguous(out_shape)
    bstrides = [broadcast_strides(v.shape, v.strides, out_shape) for v in ins]
    dyn_ops = {o for o, *_ in dyn}
    modes = []
    for k, st in enumerate(bstrides):
        if all(s == 0 for s in st) and k not in dyn_ops:
            modes.append("scalar")
        elif out_contig and _same(st, cst, out_shape) and -1 not in dyn_ops:
            modes.append("contig")
        else:
            modes.append("strided")
    out_mode = "contig" if out_contig else "strided"
    strided = ([list(out_strides)] if out_mode == "strided" else []) + [
        list(st) for st, m in zip(bstrides, modes, strict=True) if m == "strided"
    ]
    sizes, cstr = collapse(out_shape, *strided) if strided else ([], [])
    if strided and not sizes:  # every dim was 1
        sizes, cstr = [1], [[0] for _ in strided]
    vec = 1
    if not strided and not dyn and n:
        items = [out_dtype.itemsize] + [v.dtype.itemsize for v, m in zip(ins, modes, strict=True)
                                        if m == "contig"]  # fmt: skip
        vec = 16 // max(items)
    contig_k = [k for k, m in enumerate(modes) if m == "contig"]
    base = (expr, tuple(v.dtype for v in ins), out_dtype, tuple(modes), out_mode, len(sizes),
            tuple((o, d) for o, d, _, _ in dyn))  # fmt: skip
    mid: list[int] = [n]
    if strided:
        mid += sizes
        for cs in cstr:
            mid += cs
    err = ctx.err_addr
    dyn_static = [(size, stride) for _, _, size, stride in dyn]
    mid_t = tuple(mid)
    variants: dict[int, tuple[object, str, tuple[int]]] = {}

    def variant(v: int) -> tuple[object, str, tuple[int]]:
        # Compiled on first need: the 16-byte variant, and the scalar one for pointers that
        # are not 16-byte aligned (views at odd offsets), chosen per launch.
        got = variants.get(v)
        if got is None:
            src = generate(EwSpec(*base, v))  # type: ignore[arg-type]
            grid = (max(1, min(cdiv(cdiv(n, v), BLOCK), ctx.sm_count * 16)),)
            got = variants[v] = (compiler.function(src), src.fmt, grid)
        return got

    variant(vec if all(p % 16 == 0 for p in [out_ptr_hint] + [ins[k].ptr for k in contig_k])
            else 1)  # fmt: skip

    def launch(out_ptr: int, in_ptrs: Sequence[int], dyn_ptrs: Sequence[int] = ()) -> None:
        if n == 0:
            return
        v = vec
        if v > 1 and (out_ptr % 16 or any(in_ptrs[k] % 16 for k in contig_k)):
            v = 1
        fn, fmt, grid = variant(v)
        tail: list[int] = []
        for p, (size, stride) in zip(dyn_ptrs, dyn_static, strict=True):
            tail += (p, size, stride)
        args = (out_ptr, *in_ptrs, *mid_t, *tail, err, tag)
        fn.launch(grid, (BLOCK,), fmt, args, 0, ctx.stream, pdl=loader.pdl_enabled())  # type: ignore[attr-defined]

    return launch


def _same(a: Sequence[int], b: Sequence[int], shape: Sequence[int]) -> bool:
    """Equal strides wherever the dim has more than one element."""
    return all(x == y for x, y, d in zip(a, b, shape, strict=True) if d > 1)
