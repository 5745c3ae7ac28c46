"""Every public function and GPUArray method, called with a table of bad arguments, raises a
gpk.GPUKitError that is also the builtin NumPy raises for the same call (computed here by
calling NumPy), and the message names the op and the user's line (this file).

A row is (label, pygpukit call, NumPy call or the builtin class where NumPy has no
equivalent, op named in the message). Both calls take a namespace `m` (gpk or np) and an
array maker `arr`; the same lambda usually serves both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk

F = np.arange(6, dtype=np.float32).reshape(2, 3) / 7 + 0.5
I8 = np.arange(6, dtype=np.int8).reshape(2, 3)
I32 = np.arange(6, dtype=np.int32).reshape(2, 3)
S = np.array(1.5, np.float32)


def _g(a: np.ndarray) -> gpk.GPUArray:
    return gpk.from_numpy(a)


def _n(a: np.ndarray) -> np.ndarray:
    return a.copy()


Call = Callable[[Any, Callable[[np.ndarray], Any]], Any]


def same(label: str, fn: Call, op: str) -> tuple[str, Call, Call | type, str]:
    """A call written once for both libraries."""
    return (label, fn, fn, op)


def _setitem(x: Any, index: Any, value: Any) -> None:
    x[index] = value


ROWS: list[tuple[str, Call, Call | type, str]] = [
    # -- creation ---------------------------------------------------------------------------
    same("zeros negative dim", lambda m, a: m.zeros((2, -1)), "zeros"),
    same("zeros float dim", lambda m, a: m.zeros((2, 1.5)), "zeros"),
    same("zeros str shape", lambda m, a: m.zeros("ab"), "zeros"),
    same("zeros bad dtype", lambda m, a: m.zeros(3, dtype="float7"), "zeros"),
    ("zeros object dtype", lambda m, a: m.zeros(3, dtype=object), TypeError, "zeros"),
    same("ones negative", lambda m, a: m.ones(-3), "ones"),
    same("full bad dtype", lambda m, a: m.full(3, 1.0, dtype="nope"), "full"),
    same("full str value", lambda m, a: m.full(3, "x", dtype="float32"), "full"),
    same("full int8 overflow", lambda m, a: m.full(3, 300, dtype="int8"), "full"),
    same("empty negative", lambda m, a: m.empty((-1,)), "empty"),
    same("empty huge", lambda m, a: m.empty((2**62,), dtype="float32"), "empty"),
    same("zeros huge", lambda m, a: m.zeros((2**40, 2**30), dtype="float32"), "zeros"),
    same("ones huge", lambda m, a: m.ones((2**62, 2**62)), "ones"),
    same("arange zero step", lambda m, a: m.arange(0, 5, 0), "arange"),
    same("arange str", lambda m, a: m.arange("a"), "arange"),
    same("arange inf", lambda m, a: m.arange(0, float("inf")), "arange"),
    same("arange nan", lambda m, a: m.arange(0, float("nan")), "arange"),
    same("asarray bad dtype", lambda m, a: m.asarray([1, 2], dtype="float7"), "asarray"),
    same("asarray ragged", lambda m, a: m.asarray([[1, 2], [3]]), "asarray"),
    ("from_numpy list", lambda m, a: m.from_numpy([1, 2]), TypeError, "from_numpy"),
    ("from_numpy str", lambda m, a: m.from_numpy("abc"), TypeError, "from_numpy"),
    ("from_numpy object", lambda m, a: m.from_numpy(np.array([None])), TypeError, "from_numpy"),
    same("zeros_like bad dtype", lambda m, a: m.zeros_like(a(F), dtype="x"), "zeros_like"),
    # -- elementwise ------------------------------------------------------------------------
    same("add int8 300", lambda m, a: m.add(a(I8), 300), "add"),
    same("add int8 -200", lambda m, a: m.add(a(I8), -200), "add"),
    same("subtract int8 1000", lambda m, a: m.subtract(a(I8), 1000), "sub"),
    same("multiply int32 2**40", lambda m, a: m.multiply(a(I32), 2**40), "mul"),
    same("maximum int8 999", lambda m, a: m.maximum(a(I8), 999), "maximum"),
    same("operator + int8 300", lambda m, a: a(I8) + 300, "add"),
    same("operator radd int8", lambda m, a: 300 + a(I8), "add"),
    same("add str", lambda m, a: m.add(a(F), "x"), "add"),
    same("add None", lambda m, a: m.add(a(F), None), "add"),
    same("add broadcast", lambda m, a: m.add(a(F), a(np.ones(4, np.float32))), "add"),
    same("mul broadcast", lambda m, a: a(F) * a(np.ones((3, 2), np.float32)), "mul"),
    same("exp str", lambda m, a: m.exp("abc"), "exp"),
    same("exp object", lambda m, a: m.exp(object()), "exp"),
    same("sqrt list str", lambda m, a: m.sqrt(["a"]), "sqrt"),
    same("power neg int", lambda m, a: m.power(a(I32), -1), "pow"),
    same("bitwise float", lambda m, a: m.bitwise_and(a(F), a(F)), "bitwise_and"),
    same("invert float", lambda m, a: m.invert(a(F)), "invert"),
    same("where broadcast", lambda m, a: m.where(a(F) > 1, a(F), a(np.ones(4))), "where"),
    same("where str", lambda m, a: m.where(a(F) > 1, a(F), "x"), "where"),
    same("clip str", lambda m, a: m.clip(a(F), "a", 1.0), "clip"),
    same("astype bad", lambda m, a: a(F).astype("float7"), "astype"),
    ("astype object", lambda m, a: a(F).astype(object), TypeError, "astype"),
    # -- reductions -------------------------------------------------------------------------
    same("sum axis 2", lambda m, a: m.sum(a(F), axis=2), "sum"),
    same("sum axis -3", lambda m, a: a(F).sum(axis=-3), "sum"),
    same("sum axis str", lambda m, a: a(F).sum(axis="a"), "sum"),
    same("sum axis float", lambda m, a: a(F).sum(axis=1.5), "sum"),
    same("sum axis dup", lambda m, a: a(F).sum(axis=(0, 0)), "sum"),
    same("mean axis 5", lambda m, a: m.mean(a(F), axis=5), "mean"),
    same("max axis 9", lambda m, a: m.max(a(F), axis=9), "max"),
    same("min empty", lambda m, a: m.min(a(np.zeros((0, 3), np.float32)), axis=0), "min"),
    same("max empty", lambda m, a: a(np.zeros(0, np.float32)).max(), "max"),
    same("argmax 0-d axis 1", lambda m, a: m.argmax(a(S), axis=1), "argmax"),
    same("argmax axis 2", lambda m, a: a(F).argmax(axis=2), "argmax"),
    same("argmax axis tuple", lambda m, a: a(F).argmax(axis=(0, 1)), "argmax"),
    same("argmax empty", lambda m, a: a(np.zeros(0, np.float32)).argmax(), "argmax"),
    same("sum 0-d axis 1", lambda m, a: a(S).sum(axis=1), "sum"),
    # -- views ------------------------------------------------------------------------------
    same("reshape size", lambda m, a: a(F).reshape(5), "reshape"),
    same("reshape two -1", lambda m, a: a(F).reshape(-1, -1), "reshape"),
    same("reshape str", lambda m, a: a(F).reshape("ab"), "reshape"),
    same("reshape float", lambda m, a: a(F).reshape(6.0), "reshape"),
    same("reshape None", lambda m, a: a(F).reshape(None, 6), "reshape"),
    same("reshape fn", lambda m, a: m.reshape(a(F), (4, 2)), "reshape"),
    same("transpose dup", lambda m, a: a(F).transpose(0, 0), "transpose"),
    same("transpose axis 2", lambda m, a: a(F).transpose(0, 2), "transpose"),
    same("transpose short", lambda m, a: a(F).transpose(0), "transpose"),
    same("transpose str", lambda m, a: a(F).transpose("a", 0), "transpose"),
    same("transpose fn", lambda m, a: m.transpose(a(F), (1, 1)), "transpose"),
    same("swapaxes 3", lambda m, a: m.swapaxes(a(F), 0, 3), "swapaxes"),
    same("squeeze size 2", lambda m, a: m.squeeze(a(F), axis=0), "squeeze"),
    same("squeeze axis 4", lambda m, a: a(F).squeeze(axis=4), "squeeze"),
    same("expand_dims 4", lambda m, a: m.expand_dims(a(F), 4), "expand_dims"),
    same("expand_dims str", lambda m, a: m.expand_dims(a(F), "a"), "expand_dims"),
    same("broadcast_to bad", lambda m, a: m.broadcast_to(a(F), (2, 4)), "broadcast_to"),
    same("broadcast_to fewer", lambda m, a: m.broadcast_to(a(F), (3,)), "broadcast_to"),
    same("broadcast_to neg", lambda m, a: m.broadcast_to(a(F), (-1, 3)), "broadcast_to"),
    same("broadcast_to str", lambda m, a: m.broadcast_to(a(F), "ab"), "broadcast_to"),
    # -- indexing ---------------------------------------------------------------------------
    same("index 10", lambda m, a: a(F)[10], "index"),
    same("index -3", lambda m, a: a(F)[-3], "index"),
    same("index 1, 7", lambda m, a: a(F)[1, 7], "index"),
    same("index too many", lambda m, a: a(F)[0, 0, 0], "index"),
    same("index float", lambda m, a: a(F)[1.5], "index"),
    same("index str", lambda m, a: a(F)["a"], "index"),
    same("index two ellipsis", lambda m, a: a(F)[..., ...], "index"),
    same("index 0-d", lambda m, a: a(S)[0], "index"),
    same("index step 0", lambda m, a: a(F)[::0], "index"),
    same("index list oob", lambda m, a: a(F)[[0, 5]], "take"),
    same("index list neg oob", lambda m, a: a(F)[:, [-4]], "take"),
    same("index float list", lambda m, a: a(F)[[0.5]], "index"),
    same("index bool mask", lambda m, a: a(F)[np.array([True, False, True])], "index"),
    same(
        "setitem bool mask", lambda m, a: _setitem(a(F), np.ones((2, 2), bool), 1.0), "setitem"
    ),  # fmt: skip
    same("setitem 10", lambda m, a: _setitem(a(F), 10, 1.0), "setitem"),
    same("setitem 1, -4", lambda m, a: _setitem(a(F), (1, -4), 1.0), "setitem"),
    same(
        "setitem shape",
        lambda m, a: _setitem(a(F), slice(None), a(np.ones(4, np.float32))),
        "setitem",
    ),  # fmt: skip
    same("setitem str", lambda m, a: _setitem(a(F), 0, "x"), "setitem"),
    same("setitem None into int", lambda m, a: _setitem(a(I32), 0, None), "setitem"),
    same("setitem too many", lambda m, a: _setitem(a(F), (0, 0, 0), 1.0), "setitem"),
    same("setitem float index", lambda m, a: _setitem(a(F), 0.5, 1.0), "setitem"),
    same("setitem int8 300", lambda m, a: _setitem(a(I8), 0, 300), "setitem"),
    same("setitem int32 nan", lambda m, a: _setitem(a(I32), 0, float("nan")), "setitem"),
    same("setitem int32 inf", lambda m, a: _setitem(a(I32), (1, 1), float("inf")), "setitem"),
    same("setitem step 0", lambda m, a: _setitem(a(F), slice(None, None, 0), 1.0), "setitem"),
    # -- matmul, join, take -----------------------------------------------------------------
    same("matmul inner", lambda m, a: m.matmul(a(F), a(F)), "matmul"),
    same("matmul 0-d", lambda m, a: m.matmul(a(S), a(F)), "matmul"),
    same("matmul op", lambda m, a: a(F) @ a(np.ones((2, 2), np.float32)), "matmul"),
    same(
        "matmul batch",
        lambda m, a: m.matmul(a(np.ones((2, 2, 3), np.float32)), a(np.ones((3, 3, 1), np.float32))),
        "matmul",
    ),
    same("matmul str", lambda m, a: m.matmul(a(F), "x"), "matmul"),
    same(
        "concatenate shapes", lambda m, a: m.concatenate([a(F), a(np.ones((2, 2, 1)))]), "concat"
    ),  # fmt: skip
    same(
        "concatenate dims", lambda m, a: m.concatenate([a(F), a(np.ones((3, 2)))], axis=1), "concat"
    ),  # fmt: skip
    same("concatenate axis 5", lambda m, a: m.concatenate([a(F), a(F)], axis=5), "concat"),
    same("concatenate empty", lambda m, a: m.concatenate([]), "concatenate"),
    same("concatenate 0-d", lambda m, a: m.concatenate([a(S), a(S)]), "concat"),
    same("stack shapes", lambda m, a: m.stack([a(F), a(np.ones((3, 2)))]), "stack"),
    same("stack empty", lambda m, a: m.stack([]), "stack"),
    same("stack axis 4", lambda m, a: m.stack([a(F), a(F)], axis=4), "stack"),
    same("take oob", lambda m, a: m.take(a(F), a(np.array([7])), axis=1), "take"),
    same("take neg oob", lambda m, a: m.take(a(F), a(np.array([-7]))), "take"),
    same("take axis 3", lambda m, a: m.take(a(F), a(np.array([0])), axis=3), "take"),
    same("take float idx", lambda m, a: m.take(a(F), a(np.array([0.5]))), "take"),
    # -- conversions ------------------------------------------------------------------------
    same("item size 6", lambda m, a: a(F).item(), "item"),
    same("float size 6", lambda m, a: float(a(F)), "float"),
    same("int size 6", lambda m, a: int(a(F)), "int"),
    same("bool size 6", lambda m, a: bool(a(F)), "bool"),
    same("index float arr", lambda m, a: [1, 2][a(S)], "index"),
    same("len 0-d", lambda m, a: len(a(S)), "len"),
    same("iter 0-d", lambda m, a: list(iter(a(S))), "iter"),
    # -- nn (no NumPy equivalent: torch's class) ----------------------------------------------
    ("softmax axis 2", lambda m, a: gpk.nn.softmax(a(F), axis=2), IndexError, "softmax"),
    ("softmax int", lambda m, a: gpk.nn.softmax(a(I32)), TypeError, "softmax"),
    (
        "log_softmax axis",
        lambda m, a: gpk.nn.log_softmax(a(F), axis=-3),
        IndexError,
        "log_softmax",
    ),  # fmt: skip
    (
        "rms_norm weight",
        lambda m, a: gpk.nn.rms_norm(a(F), a(np.ones(4, np.float32))),
        ValueError,
        "rms_norm",
    ),  # fmt: skip
    (
        "layer_norm int",
        lambda m, a: gpk.nn.layer_norm(a(I32), a(I32[0]), a(I32[0])),
        TypeError,
        "layer_norm",
    ),  # fmt: skip
    ("gelu approx", lambda m, a: gpk.nn.gelu(a(F), approximate="fast"), ValueError, "gelu"),
    (
        "linear shapes",
        lambda m, a: gpk.nn.linear(a(F), a(np.ones((4, 4), np.float32))),
        ValueError,
        "linear",
    ),  # fmt: skip
    (
        "linear activation",
        lambda m, a: gpk.nn.linear(a(F), a(F), activation="relu"),
        ValueError,
        "linear",
    ),  # fmt: skip
    ("rope odd", lambda m, a: gpk.nn.rope(a(F), a(F), a(F)), ValueError, "rope"),
    (
        "swiglu shapes",
        lambda m, a: gpk.nn.swiglu(a(F), a(np.ones(4, np.float32))),
        ValueError,
        "swiglu",
    ),  # fmt: skip
    (
        "sdpa rank",
        lambda m, a: gpk.nn.scaled_dot_product_attention(a(F), a(F), a(F)),
        ValueError,
        "scaled_dot_product_attention",
    ),  # fmt: skip
    (
        "sdpa scale str",
        lambda m, a: gpk.nn.scaled_dot_product_attention(
            a(np.ones((1, 1, 2, 4))), a(np.ones((1, 1, 2, 4))), a(np.ones((1, 1, 2, 4))), scale="x"
        ),
        TypeError,
        "scaled_dot_product_attention",
    ),  # fmt: skip
    (
        "sdpa kv_len",
        lambda m, a: gpk.nn.scaled_dot_product_attention(
            a(np.ones((1, 1, 2, 4))), a(np.ones((1, 1, 2, 4))), a(np.ones((1, 1, 2, 4))), kv_len=3
        ),
        ValueError,
        "scaled_dot_product_attention",
    ),  # fmt: skip
    # -- NumPy breadth: creation, reductions, scans, sorts, dot, einsum, // and % ----------
    same("linspace negative num", lambda m, a: m.linspace(0, 1, -1), "linspace"),
    same("linspace str start", lambda m, a: m.linspace("a", 1, 3), "linspace"),
    same("eye negative", lambda m, a: m.eye(-2), "eye"),
    same("prod axis", lambda m, a: m.prod(a(F), axis=5), "prod"),
    same("any axis", lambda m, a: m.any(a(F), axis=-3), "any"),
    same("all axis", lambda m, a: m.all(a(F), axis=(0, 2)), "all"),
    same("argmin axis", lambda m, a: m.argmin(a(F), axis=2), "argmin"),
    same("argmin empty", lambda m, a: m.argmin(a(F)[:, :0], axis=1), "argmin"),
    same("var axis", lambda m, a: m.var(a(F), axis=2), "var"),
    same("std axis", lambda m, a: m.std(a(F), axis=-3), "std"),
    same("cumsum axis", lambda m, a: m.cumsum(a(F), axis=2), "cumsum"),
    same("cumprod axis", lambda m, a: m.cumprod(a(F), axis=-3), "cumprod"),
    same("sort axis", lambda m, a: m.sort(a(F), axis=2), "sort"),
    same("sort bad kind", lambda m, a: m.sort(a(F), kind="bogo"), "sort"),
    same("argsort axis", lambda m, a: m.argsort(a(F), axis=-3), "argsort"),
    ("topk k past the axis", lambda m, a: gpk.topk(a(F), 4), ValueError, "topk"),
    ("topk str k", lambda m, a: gpk.topk(a(F), "2"), TypeError, "topk"),
    same("dot not aligned", lambda m, a: m.dot(a(F), a(F)), "dot"),
    same("einsum operand count", lambda m, a: m.einsum("ij,jk->ik", a(F)), "einsum"),
    same("einsum bad label", lambda m, a: m.einsum("i1->i", a(F)), "einsum"),
    same("einsum dims", lambda m, a: m.einsum("ijk->i", a(F)), "einsum"),
    same("floor_divide str", lambda m, a: m.floor_divide(a(F), "x"), "floor_divide"),
    same("mod str", lambda m, a: m.mod(a(I8), "x"), "remainder"),
    same("remainder str", lambda m, a: m.remainder(a(I8), "x"), "remainder"),
    ("random normal neg", lambda m, a: gpk.random.normal((-1, 2)), ValueError, "normal"),
    (
        "random randint dtype",
        lambda m, a: gpk.random.randint(0, 5, (2,), dtype="float32"),
        TypeError,
        "randint",
    ),  # fmt: skip
]


def _builtins_of(cls: type) -> set[type]:
    """The most derived builtin classes in cls's MRO (AxisError: ValueError and IndexError)."""
    found = [c for c in cls.__mro__ if c.__module__ == "builtins" and c not in (
        Exception, BaseException, object)]  # fmt: skip
    return {c for c in found if not any(o is not c and issubclass(o, c) for o in found)}


def _numpy_error(np_call: Call | type) -> type:
    if isinstance(np_call, type):
        return np_call
    try:
        with np.errstate(all="raise"):
            out = np_call(np, _n)
            if isinstance(out, np.ndarray):
                out + 0
    except Exception as e:  # noqa: BLE001 - any class NumPy raises is the one we compare to
        return type(e)
    raise AssertionError("NumPy accepted this call: the row is wrong")


def _realize(out: Any) -> None:
    if isinstance(out, gpk.GPUArray):
        out.to_numpy()


@pytest.mark.parametrize(("label", "call", "np_call", "op"), ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_raises_the_numpy_builtin(label: str, call: Call, np_call: Call | type,
                                            op: str) -> None:  # fmt: skip
    want = _numpy_error(np_call)
    with pytest.raises(Exception) as err:  # noqa: PT011 - the class is checked below
        _realize(call(gpk, _g))
    e = err.value
    assert isinstance(e, gpk.GPUKitError), f"{type(e).__name__}: {e}"
    for cls in _builtins_of(want):
        assert isinstance(e, cls), f"{type(e).__name__} is not a {cls.__name__} ({e})"
    msg = str(e)
    assert op in msg, msg
    assert "test_bad_inputs.py" in msg, msg


def test_table_covers_the_public_api() -> None:
    """Every public function of gpk appears in some row (the skipped ones share a rule of a
    row above: the same unary, binary or comparison path)."""
    text = " ".join(f"{r[0]} {r[3]}" for r in ROWS)
    skip = {"realize", "logical_and", "logical_or", "logical_not", "negative", "abs", "cos",
            "sin", "tanh", "sigmoid", "erf", "log", "rsqrt", "softplus", "divide", "equal",
            "not_equal", "greater", "greater_equal", "less_equal", "minimum", "permute",
            "bitwise_or", "bitwise_xor", "bitwise_invert", "less"}  # fmt: skip
    missing = [n for n in gpk.ops.__all__ if n not in skip and n not in text]
    assert not missing, missing


# -- what NumPy accepts, pygpukit accepts with NumPy's result --------------------------------


def test_comparison_with_out_of_range_int_is_exact() -> None:
    x = np.arange(-3, 4, dtype=np.int8)
    for value in (300, -300, 2**70, 127, -128):
        for op in ("less", "greater_equal", "equal", "not_equal"):
            want = getattr(np, op)(x, value)
            got = getattr(gpk, op)(gpk.from_numpy(x), value).to_numpy()
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal((value > gpk.from_numpy(x)).to_numpy(), value > x)


def test_reductions_of_a_0d_array_follow_numpy() -> None:
    """NumPy takes an int axis 0 or -1 of a 0-d array as no axis (not mean's, not tuples)."""
    s = np.array(2.5, np.float32)
    for op in ("sum", "max", "mean", "argmax"):
        for axis in (0, -1, (0,), 1):
            try:
                want = getattr(np, op)(s, axis=axis)
            except Exception as e:  # noqa: BLE001 - the class is compared below
                with pytest.raises(gpk.GPUKitError) as err:
                    getattr(gpk, op)(gpk.from_numpy(s), axis=axis)
                assert all(isinstance(err.value, c) for c in _builtins_of(type(e)))
                continue
            got = getattr(gpk, op)(gpk.from_numpy(s), axis=axis).to_numpy()
            np.testing.assert_allclose(got, want)
            assert got.shape == np.shape(want)


def test_none_stored_into_a_float_array_is_nan() -> None:
    ref = np.ones(3, np.float32)
    ref[1] = None
    a = gpk.ones(3)
    a[1] = None
    np.testing.assert_array_equal(a.to_numpy(), ref)
