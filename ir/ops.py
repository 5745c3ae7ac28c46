"""The op set: every op's name, kind and shape/dtype rule, in one table.

Front end, pass validation and backends all ask this table; nothing else
re-derives a shape or a dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import dtypes as dt
from . import elementwise, indexing, shapes
from .dtypes import DType, DTypeRuleError
from .linear import LinearSpec
from .shapes import Shape, ShapeRuleError

Spec = tuple[Shape, DType]
Infer = Callable[[list[Spec], dict[str, Any]], Spec]


@dataclass(frozen=True)
class OpDef:
    name: str
    # leaf unary binary ternary cast reduce scan sort movement matmul gather scatter fused
    # collective
    kind: str
    infer: Infer
    n_inputs: int | None  # None: variadic
    ufunc: Any = None  # the NumPy ufunc whose type resolution the op follows


OPS: dict[str, OpDef] = {}


def _register(name: str, kind: str, infer: Infer, n: int | None, ufunc: Any = None) -> None:
    OPS[name] = OpDef(name, kind, infer, n, ufunc)


# ---- elementwise ops: declared in ir/elementwise.py ---------------------------------------


def weak_scalar_dtype(value: Any, other: DType, exact: bool = False) -> DType:
    """NEP 50: a Python scalar takes the array's dtype unless it needs a wider kind; a float
    with an integer array is the default float (ir/dtypes.py), or float64 when `exact` (a
    comparison, whose bool result shows no dtype, compares the value as NumPy does)."""
    if isinstance(value, bool):
        return other
    if isinstance(value, int):
        return other if other.kind != "b" else dt.int64
    if isinstance(value, float):
        return other if other.is_float else (dt.float64 if exact else dt.DEFAULT_FLOAT)
    raise DTypeRuleError(f"unsupported scalar {value!r}")


for _decl in elementwise.OPS.values():
    _register(_decl.name, _decl.kind, _decl.infer, _decl.arity, _decl.ufunc)

# ---- leaves ---------------------------------------------------------------------------


def _leaf(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    return tuple(attrs["shape"]), dt.as_dtype(attrs["dtype"])


_register("input", "leaf", _leaf, 0)  # a realised buffer or a traced argument
_register("full", "leaf", _leaf, 0)  # attrs: value
_register("arange", "leaf", _leaf, 0)  # attrs: start, step

# ---- reductions -----------------------------------------------------------------------


def _reduce(kind: str) -> Infer:
    def infer(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
        ((shape, d),) = ins
        axes = attrs["axes"]
        for a in axes:
            if shape[a] == 0 and kind in ("max", "min", "argmax", "argmin"):
                raise ShapeRuleError(f"{kind} of an empty axis {a} of shape {shape}")
        out = shapes.reduce_shape(shape, axes, attrs["keepdims"])
        if kind in ("sum", "prod"):
            # NumPy sums small ints in the platform int; we have no uint64, so int64 for all.
            rd = dt.int64 if d.kind in "biu" else d
        elif kind == "mean":
            rd = d if d.is_float else dt.DEFAULT_FLOAT  # ir/dtypes.py: no float64 from ints
        elif kind in ("argmax", "argmin"):
            rd = dt.int64
        elif kind in ("any", "all"):
            rd = dt.bool_
        else:
            rd = d
        return out, rd

    return infer


REDUCTIONS = ("sum", "mean", "max", "min", "argmax", "prod", "any", "all", "argmin")
for _n in REDUCTIONS:
    _register(_n, "reduce", _reduce(_n), 1)

# ---- scans and sorts along one axis ------------------------------------------------------


def _scan(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # cumsum (kind "add") / cumprod ("mul") along attrs["axis"]; NumPy's dtypes: integers
    # and bools accumulate in the platform int (int64 here), floats in their own dtype.
    ((shape, d),) = ins
    if attrs["kind"] not in ("add", "mul"):
        raise ShapeRuleError(f"scan: kind must be 'add' or 'mul', got {attrs['kind']!r}")
    shapes.normalize_axis(attrs["axis"], len(shape))
    return shape, dt.int64 if d.kind in "biu" else d


def _sort(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # Sorted values (or, with indices=True, the int64 positions they came from) along
    # attrs["axis"], ascending with NaN last or descending with NaN first, ties in index
    # order (stable); attrs["k"] keeps the first k (top-k), None all of them.
    ((shape, d),) = ins
    if not shape:
        raise ShapeRuleError("sort needs an array of at least one dimension")
    ax = shapes.normalize_axis(attrs["axis"], len(shape))
    k = attrs.get("k")
    n = shape[ax]
    if k is not None and not 0 <= k <= n:
        raise ShapeRuleError(f"k={k} is out of range for axis {ax} of size {n} (shape {shape})")
    out = shape if k is None else shape[:ax] + (k,) + shape[ax + 1 :]
    return out, dt.int64 if attrs.get("indices") else d


_register("scan", "scan", _scan, 1)
_register("sort", "sort", _sort, 1)

# ---- movement -------------------------------------------------------------------------


def _reshape(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    return shapes.reshape_shape(ins[0][0], attrs["shape"]), ins[0][1]


def _permute(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    return shapes.permute_shape(ins[0][0], attrs["perm"]), ins[0][1]


def _expand(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    return shapes.expand_shape(ins[0][0], tuple(attrs["shape"])), ins[0][1]


def _index(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    (shape, d), *dyn = ins
    for s, di in dyn:
        if s != () or not di.is_int:
            raise DTypeRuleError(f"a dynamic index must be a 0-d integer array, got {di}{list(s)}")
    return indexing.check_spec(shape, attrs["spec"]), d


def _setitem(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    (shape, d), (vs, vd), *dyn = ins
    indexing.check_spec(shape, attrs["spec"])
    region = indexing.region_shape(shape, attrs["spec"])
    try:
        shapes.expand_shape(vs, region)
    except ShapeRuleError as e:
        raise ShapeRuleError(
            f"could not broadcast input array from shape {vs} into shape {region}"
        ) from e
    for s, di in dyn:
        if s != () or not di.is_int:
            raise DTypeRuleError(f"a dynamic index must be a 0-d integer array, got {di}{list(s)}")
    return shape, d


def _concat(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    return (
        shapes.concat_shape([s for s, _ in ins], attrs["axis"]),
        dt.result_type(*[d for _, d in ins]),
    )


def _take(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    (shape, d), (ishape, idt) = ins
    if not idt.is_int:
        raise DTypeRuleError(f"take: indices must be integers, got {idt}")
    ax = attrs["axis"]
    return shape[:ax] + ishape + shape[ax + 1 :], d


def _flat_mask(name: str, ins: list[Spec]) -> Shape:
    ((shape, d),) = ins
    if d != dt.bool_ or len(shape) != 1:
        raise DTypeRuleError(f"{name} takes a 1-D bool mask, got {d}{list(shape)}")
    return shape


def _flatnonzero(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # The positions of a 1-D mask's True elements, in order; attrs["count"] is how many
    # there are (read from the device first: the output's shape depends on the data).
    n = _flat_mask("flatnonzero", ins)[0]
    count = attrs["count"]
    if not 0 <= count <= n:
        raise ShapeRuleError(f"flatnonzero: count {count} is not within [0, {n}]")
    return (count,), dt.int64


def _mask_rank(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # For each element of a 1-D mask, how many True elements come before it (an exclusive
    # prefix count): where a True element's value sits among the selected ones.
    return _flat_mask("mask_rank", ins), dt.int64


_register("reshape", "movement", _reshape, 1)
_register("permute", "movement", _permute, 1)
_register("expand", "movement", _expand, 1)
_register("index", "movement", _index, None)
_register("setitem", "scatter", _setitem, None)
_register("concat", "movement", _concat, None)
_register("take", "gather", _take, 2)
_register("flatnonzero", "gather", _flatnonzero, 1)
_register("mask_rank", "gather", _mask_rank, 1)

# ---- matmul ---------------------------------------------------------------------------


def _matmul(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    (sa, da), (sb, db) = ins
    if da == dt.bool_ or db == dt.bool_:
        raise DTypeRuleError("matmul of bool arrays is not supported")
    return shapes.matmul_shape(sa, sb), dt.result_type(da, db)


_register("matmul", "matmul", _matmul, 2)

# ---- collectives (across the ranks of a communicator) -----------------------------------
# attrs["world_size"] is recorded with the node (a shape rule needs it); the communicator
# itself is found at run time. A collective is a node of its own: no pass fuses into or
# across it, and its result is a normal value for memory planning.

REDUCE_OPS = ("sum", "prod", "max", "min", "avg")
# What NCCL reduces: bool and int16 have no NCCL type (they may be gathered or broadcast).
_REDUCIBLE = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def _world(name: str, attrs: dict[str, Any]) -> int:
    n = attrs.get("world_size")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ShapeRuleError(f"{name}: world_size must be an integer >= 1, got {n!r}")
    return n


def _reducible(name: str, op: Any, d: DType) -> None:
    if op not in REDUCE_OPS:
        raise ShapeRuleError(f"{name}: op must be one of {REDUCE_OPS}, got {op!r}")
    if d.name not in _REDUCIBLE or (op == "avg" and not d.is_float):
        raise DTypeRuleError(f"{name}: cannot reduce {d} with op {op!r} (NCCL reduces "
                             f"{', '.join(_REDUCIBLE)}; avg floats only)")  # fmt: skip


def _collective_axis(name: str, shape: Shape, attrs: dict[str, Any]) -> int:
    ax = attrs.get("axis")
    if isinstance(ax, bool) or not isinstance(ax, int) or not 0 <= ax < len(shape):
        raise ShapeRuleError(f"{name}: axis {ax!r} out of range for shape {shape}")
    return ax


def _all_reduce(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    ((shape, d),) = ins
    _world("all_reduce", attrs)
    _reducible("all_reduce", attrs.get("op"), d)
    return shape, d


def _all_gather(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # Every rank's x concatenated along axis, in rank order.
    ((shape, d),) = ins
    n = _world("all_gather", attrs)
    ax = _collective_axis("all_gather", shape, attrs)
    return shape[:ax] + (shape[ax] * n,) + shape[ax + 1 :], d


def _reduce_scatter(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # The reduction over ranks of x, split along axis into world_size parts: rank r's part r.
    ((shape, d),) = ins
    n = _world("reduce_scatter", attrs)
    _reducible("reduce_scatter", attrs.get("op"), d)
    ax = _collective_axis("reduce_scatter", shape, attrs)
    if shape[ax] % n:
        raise ShapeRuleError(f"reduce_scatter: axis {ax} of shape {shape} does not split into "
                             f"{n} equal parts")  # fmt: skip
    return shape[:ax] + (shape[ax] // n,) + shape[ax + 1 :], d


def _broadcast(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # Rank root's x on every rank.
    ((shape, d),) = ins
    n = _world("broadcast", attrs)
    root = attrs.get("root")
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n:
        raise ShapeRuleError(f"broadcast: root {root!r} is not a rank of a world of {n}")
    return shape, d


_register("all_reduce", "collective", _all_reduce, 1)
_register("all_gather", "collective", _all_gather, 1)
_register("reduce_scatter", "collective", _reduce_scatter, 1)
_register("broadcast", "collective", _broadcast, 1)

# ---- fused ops (map to tuned kernels) -------------------------------------------------


def _float_only(name: str, d: DType) -> None:
    if not d.is_float:
        raise DTypeRuleError(f"{name} needs a floating-point input, got {d}")


def _softmax(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    ((shape, d),) = ins
    _float_only("softmax", d)
    return shape, d


def _norm(name: str, residual: bool = False) -> Infer:
    """With residual: rms_norm(x, gain[, r]); attrs["has_residual"] adds r (x's exact shape
    and dtype) and normalises x + r rounded to x's dtype, one kernel for both."""

    def infer(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
        (shape, d), *params = ins
        _float_only(name, d)
        if not shape:
            raise ShapeRuleError(f"{name}: input must have at least one dim")
        if residual:
            has_res = bool(attrs.get("has_residual", False))
            if len(ins) != 2 + has_res:
                raise ShapeRuleError(f"{name} takes {2 + has_res} inputs with "
                                     f"has_residual={has_res}, got {len(ins)}")  # fmt: skip
            if has_res:
                rs, rd = params.pop()
                if (rs, rd) != (shape, d):
                    raise ShapeRuleError(f"{name}: residual {rd.short}{list(rs)} must have x's "
                                         f"shape and dtype {d.short}{list(shape)}")  # fmt: skip
        for ps, _ in params[: attrs.get("n_params", len(params))]:
            if ps not in ((shape[-1],), ()):
                raise ShapeRuleError(
                    f"{name}: parameter of shape {ps} does not match the last dim {shape[-1]}"
                )
        return shape, d

    return infer


def _rope(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    (shape, d), (cs, _), (ss, _) = ins
    _float_only("rope", d)
    if len(shape) < 2 or shape[-1] % 2:
        raise ShapeRuleError(f"rope: input {shape} needs [..., seq, even head_dim]")
    want = (shape[-2], shape[-1] // 2)
    if cs[-2:] != want or ss[-2:] != want:
        raise ShapeRuleError(f"rope: cos/sin shapes {cs}, {ss} must end in {want} for x {shape}")
    return shape, d


def _sdpa(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # Optional inputs after q, k, v (flagged in attrs so the arity is explicit):
    #   kv_len   0-d int: keys at or past it are masked (a static cache filled up to kv_len)
    #   kv_start [batch] int: keys before it are masked (left padding of batched prompts)
    # attrs["window"] (optional int >= 1, a sliding window): query i sees only keys
    # j > i + kv_len - seq_q - window (Mistral's rule at the causal alignment).
    # attrs["seq_major"] (optional bool): the output is [..., seq, heads, dim], the layout
    # the heads are merged in afterwards (passes/sdpa_seq_major.py).
    (sq, dq), (sk, _), (sv, _), *extra = ins
    _float_only("scaled_dot_product_attention", dq)
    window = attrs.get("window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):  # fmt: skip
        raise ShapeRuleError(f"sdpa: window must be a positive int or None, got {window!r}")
    want = int(bool(attrs.get("kv_len"))) + int(bool(attrs.get("kv_start")))
    if len(extra) != want:
        raise ShapeRuleError(f"sdpa takes {3 + want} inputs with these flags, got {len(ins)}")
    if attrs.get("kv_len") and (extra[0][0] != () or not extra[0][1].is_int):
        raise DTypeRuleError(f"sdpa: kv_len must be a 0-d integer array, got {extra[0]}")
    if attrs.get("kv_start"):
        ss, sd = extra[-1]
        if ss != sq[:1] or not sd.is_int:
            raise ShapeRuleError(f"sdpa: kv_start must be an integer array of shape {sq[:1]}")
    if len(sq) < 3 or len(sk) != len(sq) or len(sv) != len(sq):
        raise ShapeRuleError(f"sdpa: q {sq}, k {sk}, v {sv} must be [..., heads, seq, dim]")
    if sk[-1] != sq[-1] or sv[-2] != sk[-2] or sk[-3] != sv[-3]:
        raise ShapeRuleError(f"sdpa: q {sq}, k {sk}, v {sv} do not fit")
    if sq[-3] % sk[-3]:
        raise ShapeRuleError(f"sdpa: {sq[-3]} query heads not a multiple of {sk[-3]} kv heads")
    if attrs.get("seq_major"):
        return sq[:-3] + (sq[-2], sq[-3], sv[-1]), dq
    return sq[:-1] + (sv[-1],), dq


ROPE_LAYOUTS = ("none", "half", "interleaved")


def _sdpa_append(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # One decode step against a static cache that first takes this step's key and value:
    #   q [B, H, 1, D], k_cache/v_cache [B, KV, S, D], k_new/v_new [B, KV, 1, D], pos 0-d int,
    #   then cos, sin (one table row of D/2 each) when attrs["rope"] is "half"/"interleaved",
    #   then kv_len / kv_start as sdpa's.
    # k_cache[:, :, pos] = rope(k_new); v_cache[:, :, pos] = v_new (in the caches' own
    # memory: passes/fuse_kv_append.py makes it only where that memory is the caller's
    # to overwrite); then sdpa(rope(q), k_cache, v_cache, ...).
    rope = attrs.get("rope", "none")
    if rope not in ROPE_LAYOUTS:
        raise ShapeRuleError(f"sdpa_append: rope must be one of {ROPE_LAYOUTS}, got {rope!r}")
    n_rope = 2 if rope != "none" else 0
    if len(ins) < 6 + n_rope:
        raise ShapeRuleError(f"sdpa_append takes at least {6 + n_rope} inputs, got {len(ins)}")
    (sq, dq), (skc, dkc), (svc, dvc), (skn, dkn), (svn, dvn), (sp, dp) = ins[:6]
    tables, extra = ins[6 : 6 + n_rope], ins[6 + n_rope :]
    if len(sq) != 4 or sq[2] != 1:
        raise ShapeRuleError(f"sdpa_append: q {sq} must be [batch, heads, 1, dim]")
    b, _, _, d = sq
    if len(skc) != 4 or skc[0] != b or skc[3] != d or svc != skc:
        raise ShapeRuleError(f"sdpa_append: caches {skc}, {svc} must be [{b}, kv_heads, seq, {d}]")
    if skn != skc[:2] + (1, d) or svn != skn:
        raise ShapeRuleError(f"sdpa_append: k_new {skn} and v_new {svn} must be "
                             f"{list(skc[:2] + (1, d))}")  # fmt: skip
    if len({dq, dkc, dvc, dkn, dvn}) != 1:
        raise DTypeRuleError(f"sdpa_append: q, caches and new k/v must share one dtype, got "
                             f"{dq}, {dkc}, {dvc}, {dkn}, {dvn}")  # fmt: skip
    if sp != () or not dp.is_int:
        raise DTypeRuleError(f"sdpa_append: pos must be a 0-d integer array, got {dp}{list(sp)}")
    for ts, td in tables:
        if not ts or ts[-1] != d // 2 or math.prod(ts) != d // 2 or not td.is_float:
            raise ShapeRuleError(f"sdpa_append: cos/sin {td}{list(ts)} must be one float row "
                                 f"of {d // 2}")  # fmt: skip
    return _sdpa([(sq, dq), (skc, dkc), (svc, dvc), *extra], attrs)


def _rope_kv_write(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # A prefill chunk's rotary embedding and its KV-cache stores in one:
    #   x [B, Hq + KV, T, D] (q's heads, then k's), cos/sin as rope's for x,
    #   k_cache/v_cache [B, KV, S, D], v [B, KV, T, D], pos 0-d int (the chunk's first slot).
    # k_cache[:, :, pos:pos + T] = rope(x)[:, Hq:]; v_cache[:, :, pos:pos + T] = v (in the
    # caches' own memory: passes/fuse_rope_kv_write.py makes it only where that memory is
    # the caller's to overwrite); the result is rope(x)[:, :Hq], the rotated query.
    # attrs: layout ("half" / "interleaved"), q_heads (Hq >= 1).
    (sx, dx), cs, ss, (skc, dkc), (svc, dvc), (sv, dv), (sp, dp) = ins
    layout, hq = attrs.get("layout"), attrs.get("q_heads")
    if layout not in ROPE_LAYOUTS[1:]:
        raise ShapeRuleError(f"rope_kv_write: layout must be one of {ROPE_LAYOUTS[1:]}, "
                             f"got {layout!r}")  # fmt: skip
    _rope([(sx, dx), cs, ss], attrs)
    if len(sx) != 4 or isinstance(hq, bool) or not isinstance(hq, int) or not 0 < hq < sx[1]:
        raise ShapeRuleError(f"rope_kv_write: x {list(sx)} must be [batch, q_heads + kv_heads, "
                             f"seq, dim] with 0 < q_heads ({hq!r}) < its heads")  # fmt: skip
    b, h, t, d = sx
    kv = h - hq
    if len(skc) != 4 or skc[:2] != (b, kv) or skc[3] != d or skc[2] < t or svc != skc:
        raise ShapeRuleError(f"rope_kv_write: caches {list(skc)}, {list(svc)} must be "
                             f"[{b}, {kv}, seq >= {t}, {d}]")  # fmt: skip
    if sv != (b, kv, t, d):
        raise ShapeRuleError(f"rope_kv_write: v {list(sv)} must be {[b, kv, t, d]}")
    if len({dx, dkc, dvc, dv}) != 1:
        raise DTypeRuleError(f"rope_kv_write: x, caches and v must share one dtype, got "
                             f"{dx}, {dkc}, {dvc}, {dv}")  # fmt: skip
    if sp != () or not dp.is_int:
        raise DTypeRuleError(f"rope_kv_write: pos must be a 0-d integer array, got "
                             f"{dp}{list(sp)}")  # fmt: skip
    return (b, hq, t, d), dx


def _rope_mode(op: str, ins: list[Spec], attrs: dict[str, Any], plain: int) -> str:
    """A paged op's rope attr ("none", "half", "interleaved"), checked with its input count:
    `plain` inputs, two more (cos, sin) when it rotates."""
    rope = attrs.get("rope", "none")
    if rope not in ("none", "half", "interleaved"):
        raise ShapeRuleError(f"{op}: rope must be none, half or interleaved, got {rope!r}")
    n_in = plain if rope == "none" else plain + 2
    if len(ins) != n_in:
        raise ShapeRuleError(f"{op} with rope {rope} takes {n_in} inputs, got {len(ins)}")
    return str(rope)


def _rope_tables(op: str, tables: list[Spec], want: tuple[int, ...], dtype: DType) -> None:
    """cos and sin must each be `want` of `dtype`."""
    for name, (ts, td) in zip(("cos", "sin"), tables, strict=True):
        if ts != want or td != dtype:
            raise ShapeRuleError(f"{op}: {name} {td}{list(ts)} must be {dtype}{list(want)}")


def _paged_sdpa(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # Attention over a paged KV cache (pygpukit/llm/paged.py):
    #   q [B, H, T, D]; k_pool, v_pool [num_blocks, KV, block, D];
    #   block_table [B, max_blocks] int: row b's position p lives in block block_table[b, p //
    #   block] at slot p % block; seq_lens [B] int: row b's keys are positions 0..seq_lens[b]-1.
    # Query t of row b sits at position seq_lens[b] - T + t and sees the keys at or before it
    # (causal); a query at a negative position (front padding, or a padded row with
    # seq_lens 0) sees none and gets zeros. attrs: scale (None: 1/sqrt(D)); rope "half" /
    # "interleaved" (default "none"): two more inputs cos, sin [B, D/2] (q's dtype, one
    # query a row: T = 1), and q is rotated by row b's tables as rope rotates it before it
    # is attended (the serving step's query rotation done by the attention's own load).
    rope = _rope_mode("paged_sdpa", ins, attrs, 5)
    (sq, dq), (sk, dk), (sv, dv), (sb, db), (sl, dl) = ins[:5]
    _float_only("paged_sdpa", dq)
    if len(sq) != 4:
        raise ShapeRuleError(f"paged_sdpa: q {sq} must be [batch, heads, seq, dim]")
    b, h, _, d = sq
    if len(sk) != 4 or sk[3] != d or sv != sk:
        raise ShapeRuleError(f"paged_sdpa: pools {sk}, {sv} must both be "
                             f"[num_blocks, kv_heads, block, {d}]")  # fmt: skip
    if h % sk[1]:
        raise ShapeRuleError(f"paged_sdpa: {h} query heads not a multiple of {sk[1]} kv heads")
    if len({dq, dk, dv}) != 1:
        raise DTypeRuleError(f"paged_sdpa: q and the pools must share one dtype, got "
                             f"{dq}, {dk}, {dv}")  # fmt: skip
    if len(sb) != 2 or sb[0] != b or not db.is_int:
        raise ShapeRuleError(f"paged_sdpa: block_table {db}{list(sb)} must be [{b}, max_blocks] "
                             "integers")  # fmt: skip
    if sl != (b,) or not dl.is_int:
        raise ShapeRuleError(f"paged_sdpa: seq_lens {dl}{list(sl)} must be [{b}] integers")
    if rope != "none":
        if sq[2] != 1 or d % 2:
            raise ShapeRuleError(f"paged_sdpa: rope takes one query a row and an even head "
                                 f"dim, got q {list(sq)}")  # fmt: skip
        _rope_tables("paged_sdpa", ins[5:], (b, d // 2), dq)
    return sq, dq


def _paged_sdpa_append(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # A decode-only serving step's paged_write and paged_sdpa in one (passes/
    # fuse_paged_append.py): q [B, H, 1, D], pool [num_blocks, 2 KV, block, D] (keys, then
    # values), new_kv [B, 2 KV, D], slots [B] int, block_table, seq_lens, cos, sin [B, D/2].
    # Stores new_kv at slots into the pool's own memory as paged_write(rope, rope_heads KV)
    # would, then attends as paged_sdpa(q, pool[:, :KV], pool[:, KV:], ..., rope, pieces
    # False) over the stored pool; the pool's new value is after(pool, this). attrs: scale,
    # rope ("half" / "interleaved").
    if len(ins) != 8:
        raise ShapeRuleError(f"paged_sdpa_append takes 8 inputs, got {len(ins)}")
    q, pool, new, slots, table, lens, cos, sin = ins
    rope = attrs.get("rope", "none")
    if rope == "none":
        raise ShapeRuleError("paged_sdpa_append: rope must be half or interleaved")
    (sp, _) = pool
    if len(sp) != 4 or sp[1] % 2:
        raise ShapeRuleError(f"paged_sdpa_append: pool {list(sp)} must be [num_blocks, "
                             f"2 kv_heads, block, dim]")  # fmt: skip
    kv = sp[1] // 2
    _paged_write([pool, new, slots, cos, sin], {"rope": rope, "rope_heads": kv})
    half = ((sp[0], kv, sp[2], sp[3]), pool[1])
    out = _paged_sdpa([q, half, half, table, lens, cos, sin], {**attrs, "rope": rope})
    if q[0][2] != 1 or new[0][0] != q[0][0]:
        raise ShapeRuleError(f"paged_sdpa_append: q {list(q[0])} must be one query a row of "
                             f"the {new[0][0]} new rows")  # fmt: skip
    return out


def _paged_write(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # pool [num_blocks, KV, block, D] with new rows stored: pool[s // block, :, s % block] =
    # new[t] for each slot s = slots[t] >= 0 (a negative slot stores nothing: padding).
    # new [T, KV, D] (cast to the pool's dtype), slots [T] int. A scatter, as setitem.
    # attrs rope "half" / "interleaved" (default "none"): two more inputs cos, sin [T, D/2]
    # (float, the pool's dtype), and the first rope_heads heads of each row are stored
    # rotated as rope rotates them (the keys of a fused K/V pool: V heads stay as they are).
    rope = _rope_mode("paged_write", ins, attrs, 3)
    (sp, dp), (sn, _), (ss, ds) = ins[:3]
    if len(sp) != 4:
        raise ShapeRuleError(f"paged_write: pool {list(sp)} must be [num_blocks, kv_heads, "
                             "block, dim]")  # fmt: skip
    if len(sn) != 3 or sn[1:] != (sp[1], sp[3]):
        raise ShapeRuleError(f"paged_write: new rows {list(sn)} must be [T, {sp[1]}, {sp[3]}] "
                             f"for a pool {list(sp)}")  # fmt: skip
    if ss != sn[:1] or not ds.is_int:
        raise ShapeRuleError(f"paged_write: slots {ds}{list(ss)} must be [{sn[0]}] integers")
    if rope != "none":
        _float_only("paged_write", dp)
        heads = attrs.get("rope_heads")
        if not isinstance(heads, int) or not 0 < heads <= sp[1] or sp[3] % 2:
            raise ShapeRuleError(f"paged_write: rope_heads {heads!r} must be in [1, {sp[1]}] "
                                 f"with an even head dim, got pool {list(sp)}")  # fmt: skip
        _rope_tables("paged_write", ins[3:], (sn[0], sp[3] // 2), dp)
    return sp, dp


def _after(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # after(x, dep): x once dep's node has run (dep wrote into x's memory); a view of x.
    return ins[0]


def _linear(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    spec = LinearSpec.of(attrs, len(ins))
    parts = spec.split(ins)
    (sx, dx), (sw, dw) = parts.x, parts.w
    if parts.prologue is not None:
        if spec.prologue == "rms_norm":
            sx, dx = _norm("rms_norm")([(sx, dx), parts.prologue], attrs)
        else:
            sx, dx = _swiglu([(sx, dx), parts.prologue], attrs)
    if spec.quant is not None:
        out, dtype = _quant_linear(spec, parts, sx, dx)
    else:
        out = shapes.matmul_shape(sx, (sw[1], sw[0]) if len(sw) == 2 else sw)
        dtype = dt.result_type(dx, dw)
    if parts.bias is not None:
        shapes.broadcast_shapes(out, parts.bias[0])
    if spec.glu != "none":
        if spec.glu != "swiglu" or spec.activation != "none" or out[-1] % 2:
            raise ShapeRuleError(f"linear: glu={spec.glu!r} needs 'swiglu', no activation and "
                                 f"an even width (got {out[-1]})")  # fmt: skip
        out = out[:-1] + (out[-1] // 2,)
    if parts.residual is not None:
        rs, rd = parts.residual
        if rs != out or rd != dtype:
            raise ShapeRuleError(f"linear: residual {rd.short}{list(rs)} must be the result's "
                                 f"{dtype.short}{list(out)}")  # fmt: skip
    return out, dtype


def _quant_linear(spec: LinearSpec, parts: Any, sx: Shape, dx: DType) -> Spec:
    # x [.., K] against a quantized weight of logical shape [N, K] (ir/quant.py's layouts):
    # the result takes x's float dtype.
    q = spec.quant
    assert q is not None
    (sw, dw), (ss, ds) = parts.w, parts.scale
    want = "int8" if q.format == "int8" else "uint8"
    if not dx.is_float or dx.itemsize > 4:
        raise DTypeRuleError(f"linear: a {q.label} weight takes float16, bfloat16 or float32 "
                             f"x, got {dx}")  # fmt: skip
    if dw.name != want or ds != dt.float32:
        raise DTypeRuleError(f"linear: a {q.label} weight is {want} data and float32 scales, "
                             f"got {dw} and {ds}")  # fmt: skip
    if parts.zero is not None and parts.zero[1] != dt.uint8:
        raise DTypeRuleError(f"linear: int4 zero points must be uint8, got {parts.zero[1]}")
    if not sx or len(sw) != 2:
        raise ShapeRuleError(f"linear: x {list(sx)} and {q.label} data {list(sw)} must be "
                             f"[.., K] and [N, packed K]")  # fmt: skip
    n, k = sw[0], sx[-1]
    try:
        q.check(n, k, (sw, dw.name), ss, None if parts.zero is None else parts.zero[0])
    except ShapeRuleError as e:
        raise ShapeRuleError(f"linear: x {list(sx)} (K={k}) against {q.label} data "
                             f"{list(sw)}: {e}") from None  # fmt: skip
    return tuple(sx[:-1]) + (n,), dx


def _swiglu(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    (sg, dg), (su, du) = ins
    return shapes.broadcast_shapes(sg, su), dt.result_type(dg, du)


def _fused_elementwise(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    from .expr import dtype_of

    out_shape = tuple(attrs["out_shape"])
    for s, _ in ins:
        shapes.expand_shape(s, out_shape)
    return out_shape, dtype_of(attrs["expr"], [d for _, d in ins])


def _fused_reduce(ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    # An elementwise expression over out_shape, then a reduction (attrs reduce/axes/keepdims).
    shape, d = _fused_elementwise(ins, attrs)
    return _reduce(attrs["reduce"])([(shape, d)], attrs)


_register("softmax", "fused", _softmax, 1)
_register("log_softmax", "fused", _softmax, 1)
_register("rms_norm", "fused", _norm("rms_norm", residual=True), None)
_register("layer_norm", "fused", _norm("layer_norm"), 3)
_register("rope", "fused", _rope, 3)
_register("sdpa", "fused", _sdpa, None)
_register("sdpa_append", "fused", _sdpa_append, None)
_register("rope_kv_write", "fused", _rope_kv_write, 7)
_register("paged_sdpa", "fused", _paged_sdpa, None)
_register("paged_sdpa_append", "fused", _paged_sdpa_append, None)
_register("paged_write", "scatter", _paged_write, None)
_register("after", "movement", _after, 2)
_register("linear", "fused", _linear, None)
_register("swiglu", "fused", _swiglu, 2)
_register("fused_elementwise", "fused", _fused_elementwise, None)
_register("fused_reduce", "fused", _fused_reduce, None)


def infer(op: str, ins: list[Spec], attrs: dict[str, Any],
          attr_key: tuple[Any, ...] | None = None) -> Spec:  # fmt: skip
    """Shape and dtype of op(ins; attrs). Memoised: recording an op is a hot path.
    `attr_key`: the attrs as a hashable key when the caller has one (Node.make does)."""
    try:
        key = (op, tuple(ins), tuple(sorted(attrs.items())) if attr_key is None else attr_key)
        hit = _INFER_CACHE.get(key)
    except TypeError:
        return _infer(op, ins, attrs)
    if hit is None:
        hit = _infer(op, ins, attrs)
        if len(_INFER_CACHE) > 65536:
            _INFER_CACHE.clear()
        _INFER_CACHE[key] = hit
    return hit


_INFER_CACHE: dict[Any, Spec] = {}


def _infer(op: str, ins: list[Spec], attrs: dict[str, Any]) -> Spec:
    opdef = OPS.get(op)
    if opdef is None:
        raise KeyError(f"unknown op {op!r}")
    if opdef.n_inputs is not None and len(ins) != opdef.n_inputs:
        raise ShapeRuleError(f"{op} takes {opdef.n_inputs} inputs, got {len(ins)}")
    return opdef.infer(ins, attrs)


def numel(shape: Shape) -> int:
    return math.prod(shape)
