"""dot and einsum, lowered to transposes, reshapes, sums and (batched) matmuls.

einsum contracts its operands left to right: for each pair, the labels both share and
nothing later needs are the matmul's inner dimension, the shared ones still needed its
batch, the rest its rows and columns; a label only one operand has and nothing later
needs is summed out first. Nothing loops over elements in Python.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

from pygpukit import errors
from pygpukit.ir import dtypes

from .array import ArrayLike, GPUArray, _operand, broadcast_to, matmul, reduce

_LETTERS = frozenset(string.ascii_letters)


def _arr(x: ArrayLike, op: str) -> GPUArray:
    return x if isinstance(x, GPUArray) else _operand(x, op)


def _bool_matmul(a: GPUArray, b: GPUArray) -> GPUArray:
    """matmul, with NumPy's meaning for two bool arrays (any over and-ed pairs)."""
    if a.dtype == dtypes.bool_ and b.dtype == dtypes.bool_:
        return matmul(a.astype(dtypes.int64), b.astype(dtypes.int64)) != 0
    return matmul(a, b)


def dot(a: ArrayLike, b: ArrayLike) -> GPUArray:
    """np.dot: a product for a 0-d operand, the inner product of two vectors, the matrix
    product of 2-D arrays, and for N-D arrays the sum over a's last axis and b's
    second-to-last (dot(a, b)[i, j, k, m] = sum(a[i, j, :] * b[k, :, m]); not matmul's
    batching)."""
    x, y = _arr(a, "dot"), _arr(b, "dot")
    if x.ndim == 0 or y.ndim == 0:
        return x * y
    k_axis = 0 if y.ndim == 1 else y.ndim - 2
    if x.shape[-1] != y.shape[k_axis]:
        raise errors.user_error(errors.ShapeError, "dot", f"shapes {x.shape} and {y.shape} not "
                                f"aligned: {x.shape[-1]} (dim {x.ndim - 1}) != "
                                f"{y.shape[k_axis]} (dim {k_axis})")  # fmt: skip
    if x.ndim <= 2 and y.ndim <= 2 or y.ndim == 1 or x.ndim == 1:
        return _bool_matmul(x, y)  # matmul's own rules are np.dot's here
    k = x.shape[-1]
    perm = (k_axis, *[d for d in range(y.ndim) if d != k_axis])
    y2 = y.transpose(perm).reshape(k, -1)
    out = _bool_matmul(x.reshape(-1, k), y2)
    return out.reshape(x.shape[:-1] + y.shape[:-2] + y.shape[-1:])


# -- einsum ---------------------------------------------------------------------------------


def _bad(message: str) -> errors.GPUKitError:
    return errors.user_error(errors.GPUKitValueError, "einsum", message)


def _parse(subscripts: str, ndims: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """Each operand's labels and the output's, ellipsis dims spelled as private labels
    ("0", "1", ...: one per broadcast dim, aligned from the right)."""
    if not isinstance(subscripts, str):
        raise errors.user_error(errors.DTypeError, "einsum", f"subscripts must be a str, got "
                                f"{subscripts!r}")  # fmt: skip
    spec = subscripts.replace(" ", "")
    if spec.count("->") > 1:
        raise _bad(f"{subscripts!r}: more than one '->'")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise _bad(f"{subscripts!r} names {len(terms)} operands, {len(ndims)} given")
    n_ell = 0
    for t, nd in zip(terms, ndims, strict=True):
        _check_term(subscripts, t)
        if "..." in t:
            n_ell = max(n_ell, nd - (len(t) - 3))
    ell = [str(i) for i in range(n_ell)]
    ins: list[list[str]] = []
    for i, (t, nd) in enumerate(zip(terms, ndims, strict=True)):
        if "..." in t:
            head, tail = t.split("...")
            n = nd - len(head) - len(tail)
            if n < 0:
                raise _bad(f"{subscripts!r}: operand {i} has {nd} dims, fewer than its labels")
            labels = [*head, *ell[n_ell - n :], *tail]
        else:
            labels = list(t)
        if len(labels) != nd:
            raise _bad(f"{subscripts!r}: operand {i} has {nd} dims but its term {t!r} names "
                       f"{len(labels)}")  # fmt: skip
        if len(set(labels)) != len(labels):
            raise errors.user_error(errors.UnsupportedError, "einsum", f"{subscripts!r}: a "
                                    f"label repeated within operand {i} (a diagonal) is not "
                                    "supported; take the diagonal first")  # fmt: skip
        ins.append(labels)
    if arrow:
        _check_term(subscripts, rhs)
        if "..." in rhs:
            head, tail = rhs.split("...")
            out = [*head, *ell, *tail]
        elif n_ell:
            raise _bad(
                f"{subscripts!r}: the operands have broadcast dims ('...') but the "
                "output does not say where they go"
            )
        else:
            out = list(rhs)
        known = {lab for labels in ins for lab in labels}
        for lab in out:
            if lab not in known:
                raise _bad(f"{subscripts!r}: output label {lab!r} appears in no operand")
        if len(set(out)) != len(out):
            raise _bad(f"{subscripts!r}: output label repeated")
    else:
        counts: dict[str, int] = {}
        for labels in ins:
            for lab in labels:
                counts[lab] = counts.get(lab, 0) + 1
        once = sorted(lab for lab, c in counts.items() if c == 1 and lab in _LETTERS)
        out = [*ell, *once]
    return ins, out


def _check_term(subscripts: str, term: str) -> None:
    rest = term.replace("...", "", 1)
    if "." in rest:
        raise _bad(f"{subscripts!r}: '.' only in an ellipsis '...', once per term")
    for ch in rest:
        if ch not in _LETTERS:
            raise _bad(f"{subscripts!r}: {ch!r} is not a label (letters a-z, A-Z)")


def _sizes(ins: list[list[str]], ops: list[GPUArray], subscripts: str) -> dict[str, int]:
    size: dict[str, int] = {}
    for labels, x in zip(ins, ops, strict=True):
        for lab, n in zip(labels, x.shape, strict=True):
            old = size.get(lab, 1)
            if old != n and 1 not in (old, n):
                raise errors.user_error(errors.ShapeError, "einsum", f"{subscripts!r}: label "
                                        f"{lab!r} has sizes {old} and {n} (operand shapes "
                                        f"{[o.shape for o in ops]})")  # fmt: skip
            size[lab] = max(old, n)
    return size


def _sum_out(x: GPUArray, labels: list[str], drop: set[str]) -> tuple[GPUArray, list[str]]:
    axes = tuple(i for i, lab in enumerate(labels) if lab in drop)
    if not axes:
        return x, labels
    summed = reduce("sum", x, axes, False, "einsum")
    if summed.dtype != x.dtype:
        summed = summed.astype(x.dtype)  # einsum keeps the operands' dtype, as NumPy's
    return summed, [lab for lab in labels if lab not in drop]


def _contract(a: GPUArray, la: list[str], b: GPUArray, lb: list[str],
              keep: set[str]) -> tuple[GPUArray, list[str]]:  # fmt: skip
    """The pair's product, summed over shared labels not in keep, as one batched matmul."""
    batch = [lab for lab in la if lab in lb and lab in keep]
    inner = [lab for lab in la if lab in lb and lab not in keep]
    rows = [lab for lab in la if lab not in lb]
    cols = [lab for lab in lb if lab not in la]
    size = dict(zip(la, a.shape, strict=True)) | dict(zip(lb, b.shape, strict=True))

    def arrange(x: GPUArray, labels: list[str], order: list[str]) -> GPUArray:
        perm = [labels.index(lab) for lab in order]
        return x.transpose(perm) if perm != list(range(len(perm))) else x

    nb = [size[lab] for lab in batch]
    m, k, n = (math.prod(size[lab] for lab in g) for g in (rows, inner, cols))
    a3 = arrange(a, la, batch + rows + inner).reshape(*nb, m, k)
    b3 = arrange(b, lb, batch + inner + cols).reshape(*nb, k, n)
    out = _bool_matmul(a3, b3)
    return out.reshape(*nb, *[size[lab] for lab in rows + cols]), batch + rows + cols


def einsum(subscripts: str, *operands: ArrayLike) -> GPUArray:
    """np.einsum over letter labels, implicit ("ij,jk") or explicit ("ij,jk->ik") output,
    with '...' for broadcast dims: lowered to transposes, reshapes, sums and batched
    matmuls. A label repeated within one operand (a diagonal, "ii->i") raises
    UnsupportedError."""
    if not operands:
        raise _bad("no operands given")
    ops = [_arr(x, "einsum") for x in operands]
    ins, out = _parse(subscripts, [x.ndim for x in ops])
    size = _sizes(ins, ops, subscripts)
    # Size-1 dims broadcast against the label's size elsewhere, as NumPy's einsum does.
    ops = [x if x.shape == tuple(size[lab] for lab in labels)
           else broadcast_to(x, tuple(size[lab] for lab in labels))
           for x, labels in zip(ops, ins, strict=True)]  # fmt: skip
    cur, cl = _sum_out(ops[0], ins[0], set(ins[0]) - _later(ins, 0, out))
    for i in range(1, len(ops)):
        later = _later(ins, i, out)
        nxt, nl = _sum_out(ops[i], ins[i], set(ins[i]) - later - set(cl))
        cur, cl = _contract(cur, cl, nxt, nl, later)
    cur, cl = _sum_out(cur, cl, set(cl) - set(out))
    if cl != out:
        cur = cur.transpose([cl.index(lab) for lab in out])
    return cur


def _later(ins: list[list[str]], i: int, out: list[str]) -> set[str]:
    """Labels operands after i or the output still need."""
    need = set(out)
    for labels in ins[i + 1 :]:
        need |= set(labels)
    return need
