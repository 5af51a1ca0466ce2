"""The op table: one entry per public op (PyTorch's OpInfo idea, Chainer's FunctionTestCase).

Each ``OpInfo`` names an op, says how to call it (``op(lib, *args, **kwargs)``, where ``lib`` is
the fusegrad namespace ``FG`` or the same view of torch, so one lambda drives both libraries),
gives a numpy reference, and generates sample cases: broadcasting pairs, 0-d and empty (size-0)
shapes, non-contiguous inputs, keyword variants and domain restrictions.  Samples hold numpy
arrays; ``build`` turns them into tensors of either library.  Float arrays become leaves that
require grad (unless the entry is not differentiable or the sample says ``nograd``); integer and
bool arrays become constant tensors; everything else is passed through as a Python value.

A sample marked ``noncontig`` reaches the op as a strided, transposed *view* of its leaf
(``leaf[..., 0].permute(reversed)``), so kernels see non-contiguous arrays while gradcheck still
perturbs a contiguous leaf.

The generated tests live in ``test_op_table.py``; this module only holds data and helpers.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fusegrad
from fusegrad.autograd.forward_state import state as _fg_forward_state
from fusegrad.ops import functional as _fg_functional

# ---- the two libraries ------------------------------------------------------------------------


class Lib:
    """A library namespace the ops are written against (``lib.F`` is its functional module)."""

    def __init__(self, module: Any, functional: Any, name: str) -> None:
        self._module = module
        self.F = functional
        self.name = name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._module, item)


FG = Lib(fusegrad, _fg_functional, "fusegrad")


def torch_lib() -> Lib:
    import torch

    return Lib(torch, torch.nn.functional, "torch")


# ---- records ----------------------------------------------------------------------------------


@dataclass
class Sample:
    """One case: positional and keyword arguments (numpy arrays stand for tensors)."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    name: str = ""
    noncontig: bool = False  # float tensors reach the op as non-contiguous views
    nograd: frozenset = frozenset()  # positions / keyword names of float arrays without grad
    grad: bool = True  # gradcheck this case (False: at a kink, or forward-only)
    gradgrad: bool = True  # gradgradcheck this case (when the entry is twice differentiable)
    torch: bool = True  # cross-check this case against PyTorch


@dataclass
class OpInfo:
    name: str
    op: Callable[..., Any]
    ref: Callable[..., Any] | None
    samples: Callable[[np.random.Generator], list[Sample]]
    differentiable: bool = True
    twice: bool = True
    zero_grad: bool = False  # piecewise constant: the gradient is exactly zero
    f32_tol: tuple[float, float] = (2e-5, 2e-6)  # rtol, atol of float32 vs the float64 reference
    f64_tol: tuple[float, float] = (1e-9, 1e-12)
    torch: bool = True  # cross-check against PyTorch
    torch_grad: bool = True  # ... including gradients
    torch_op: Callable[..., Any] | None = None  # when torch spells the call differently
    out_dtype: str | None = None  # dtype of the float outputs when not the inputs' dtype
    ref_takes_dtype: bool = False  # the reference gets ``dtype=`` (the input float dtype)

    def get_samples(self) -> list[Sample]:
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        samples = self.samples(rng)
        for i, s in enumerate(samples):
            if not s.name:
                s.name = f"case{i}"
        return samples

    def call(self, lib: Lib, *args: Any, **kwargs: Any) -> Any:
        if lib.name == "torch" and self.torch_op is not None:
            return self.torch_op(lib, *args, **kwargs)
        return self.op(lib, *args, **kwargs)


# ---- turning samples into tensors ---------------------------------------------------------------


def _noncontig_layout(a: np.ndarray) -> np.ndarray:
    """Leaf data whose view ``leaf[..., 0].permute(reversed dims)`` equals ``a``."""
    base = np.full(a.shape[::-1] + (2,), 7.0, dtype=a.dtype)
    base[..., 0] = a.T
    return base


def _noncontig_view(t: Any) -> Any:
    v = t[..., 0]
    return v.permute(tuple(range(v.ndim))[::-1])


def _is_array_list(a: Any) -> bool:
    return isinstance(a, list) and bool(a) and all(isinstance(e, np.ndarray) for e in a)


def build(
    entry: OpInfo, lib: Lib, sample: Sample, dtype: str = "float64", requires_grad: bool = True
) -> tuple[list, Callable[..., Any]]:
    """``(leaves, fn)``: the leaf tensors that require grad, and ``fn(*leaves)`` running the op."""
    leaves: list = []

    def convert(a: Any, key: Any) -> tuple:
        if isinstance(a, np.ndarray):
            if a.dtype.kind == "f":
                nc = sample.noncontig and a.ndim > 0
                data = (_noncontig_layout(a) if nc else a).astype(dtype)
                grad = requires_grad and key not in sample.nograd
                t = lib.tensor(data, requires_grad=grad)
                if grad:
                    leaves.append(t)
                    return ("leaf", len(leaves) - 1, nc)
                return ("const", t, nc)
            return ("const", lib.tensor(a), False)
        if _is_array_list(a):
            return ("list", [convert(e, key) for e in a])
        return ("py", a)

    arg_specs = [convert(a, i) for i, a in enumerate(sample.args)]
    kw_specs = {k: convert(v, k) for k, v in sample.kwargs.items()}

    def realise(spec: tuple, values: tuple) -> Any:
        kind = spec[0]
        if kind == "leaf":
            t = values[spec[1]]
            return _noncontig_view(t) if spec[2] else t
        if kind == "const":
            return _noncontig_view(spec[1]) if spec[2] else spec[1]
        if kind == "list":
            return [realise(s, values) for s in spec[1]]
        return spec[1]

    def fn(*values: Any) -> Any:
        args = [realise(s, values) for s in arg_specs]
        kwargs = {k: realise(s, values) for k, s in kw_specs.items()}
        return entry.call(lib, *args, **kwargs)

    return leaves, fn


def ref_inputs(sample: Sample, dtype: str = "float64") -> tuple[list, dict]:
    """The sample's arguments for the numpy reference (float arrays rounded to ``dtype``, then
    computed in float64)."""

    def convert(a: Any) -> Any:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            return a.astype(dtype).astype(np.float64)
        if _is_array_list(a):
            return [convert(e) for e in a]
        return a

    return [convert(a) for a in sample.args], {k: convert(v) for k, v in sample.kwargs.items()}


def run_ref(entry: OpInfo, sample: Sample, dtype: str = "float64") -> list[np.ndarray]:
    args, kwargs = ref_inputs(sample, dtype)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if entry.ref_takes_dtype:
            kwargs = dict(kwargs, dtype=dtype)
        out = entry.ref(*args, **kwargs)  # type: ignore[misc]
    return [np.asarray(o) for o in flat_outputs(out)]


def flat_outputs(result: Any) -> list:
    if isinstance(result, (list, tuple)):
        out: list = []
        for r in result:
            out.extend(flat_outputs(r))
        return out
    return [result]


def to_numpy(t: Any) -> np.ndarray:
    return np.asarray(t.detach().numpy())


def is_float(t: Any) -> bool:
    return bool(t.is_floating_point())


# ---- value generators ---------------------------------------------------------------------------

Gen = Callable[[np.random.Generator, tuple], np.ndarray]


def uni(rng: np.random.Generator, shape: tuple, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.asarray(rng.uniform(lo, hi, shape), dtype=np.float64)


def pos(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return uni(rng, shape, 0.5, 2.0)


def away(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Values with |x| in [0.1, 2]: clear of the kink at 0."""
    return np.asarray(uni(rng, shape, 0.1, 2.0) * rng.choice([-1.0, 1.0], size=shape))


def nonint(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Values clear of integers and of halves (floor/round/trunc are smooth there)."""
    whole = rng.integers(-3, 3, shape).astype(np.float64)
    frac = uni(rng, shape, 0.15, 0.35) + rng.choice([0.0, 0.5], size=shape)
    return np.asarray(whole + frac)


def small(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return uni(rng, shape, -1.0, 1.0)


def intvals(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Integer-valued floats (so comparisons meet equal values)."""
    return rng.integers(-2, 3, shape).astype(np.float64)


def boolean(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return np.asarray(rng.random(shape) < 0.5)


def ints(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return np.asarray(rng.integers(-4, 5, shape), dtype=np.int64)


def perm_index(rng: np.random.Generator, shape: tuple, dim: int, size: int) -> np.ndarray:
    """An int64 index of ``shape`` with distinct values < ``size`` along ``dim``."""
    moved = list(shape)
    n = moved.pop(dim)
    flat = [rng.permutation(size)[:n] for _ in range(int(np.prod(moved)))]
    arr = np.array(flat, dtype=np.int64).reshape(tuple(moved) + (n,))
    return np.moveaxis(arr, -1, dim)


# ---- sample factories ---------------------------------------------------------------------------


def _arrays(gen: Gen) -> Gen:
    """Make a generator return arrays even for 0-d shapes (numpy arithmetic gives scalars)."""
    return lambda rng, shape: np.asarray(gen(rng, shape))


def unary(gen: Gen = uni, **kwargs: Any) -> Callable[[np.random.Generator], list[Sample]]:
    gen = _arrays(gen)

    def make(rng: np.random.Generator) -> list[Sample]:
        return [
            Sample((gen(rng, (3, 4)),), dict(kwargs), "2d"),
            Sample((gen(rng, ()),), dict(kwargs), "0d"),
            Sample((gen(rng, (0, 3)),), dict(kwargs), "empty"),
            Sample((gen(rng, (2, 3)),), dict(kwargs), "noncontig", noncontig=True),
            Sample((gen(rng, (5,)),), dict(kwargs), "1d"),
        ]

    return make


def binary(
    gen_a: Gen = uni, gen_b: Gen | None = None, scalars: bool = True, scalar_left: bool = True
) -> Callable[[np.random.Generator], list[Sample]]:
    gen_a, gb = _arrays(gen_a), _arrays(gen_b or gen_a)

    def make(rng: np.random.Generator) -> list[Sample]:
        s = [
            Sample((gen_a(rng, (3, 4)), gb(rng, (3, 4))), name="same"),
            Sample((gen_a(rng, (3, 1)), gb(rng, (1, 4))), name="bcast"),
            Sample((gen_a(rng, (2, 1, 4)), gb(rng, (3, 1))), name="bcast_rank"),
            Sample((gen_a(rng, ()), gb(rng, (3,))), name="0d_1d"),
            Sample((gen_a(rng, (0, 4)), gb(rng, (4,))), name="empty"),
            Sample((gen_a(rng, (2, 3)), gb(rng, (2, 3))), name="noncontig", noncontig=True),
        ]
        if scalars:
            s.append(Sample((gen_a(rng, (3, 2)), float(gb(rng, ()))), name="scalar_right"))
            if scalar_left:
                s.append(Sample((float(gen_a(rng, ())), gb(rng, (2, 3))), name="scalar_left"))
        return s

    return make


def exact_quotients(rng: np.random.Generator) -> list[Sample]:
    """(a, b) with a / b clear of integers: floor/trunc division is smooth there."""
    out = []
    for name, sa, sb, nc in [
        ("same", (3, 4), (3, 4), False),
        ("bcast", (3, 4), (1, 4), False),
        ("0d", (), (), False),
        ("noncontig", (2, 3), (2, 3), True),
    ]:
        b = away(rng, sb) + np.sign(away(rng, sb)) * 0.4
        q = nonint(rng, sa)
        out.append(Sample((np.asarray(q * b), b), name=name, noncontig=nc))
    out.append(Sample((nonint(rng, (3, 2)) * 1.5, 1.5), name="scalar_right"))
    return out


def _axis(x: np.ndarray, dim: Any) -> Any:
    return None if np.ndim(x) == 0 else dim


def reductions(
    gen: Gen = uni, multi_dim: bool = True, empty: bool = True, full: bool = True
) -> Callable[[np.random.Generator], list[Sample]]:
    def make(rng: np.random.Generator) -> list[Sample]:
        s = [
            Sample((gen(rng, (3, 4)),), {"dim": 1}, "dim1"),
            Sample((gen(rng, (3, 4)),), {"dim": -1, "keepdim": True}, "dim_neg_keep"),
            Sample((gen(rng, (2, 3, 2)),), {"dim": 0}, "3d_dim0"),
            Sample((gen(rng, ()),), {"dim": 0}, "0d_dim0"),
            Sample((gen(rng, (2, 3)),), {"dim": 0}, "noncontig", noncontig=True),
        ]
        if full:
            s += [
                Sample((gen(rng, (3, 4)),), {}, "full"),
                Sample((gen(rng, ()),), {}, "0d"),
            ]
        if multi_dim:
            s.append(Sample((gen(rng, (2, 3, 2)),), {"dim": (0, 2), "keepdim": True}, "dims"))
        if empty:
            s.append(Sample((gen(rng, (0, 3)),), {"dim": 0}, "empty_reduced"))
            s.append(Sample((gen(rng, (0, 3)),), {"dim": 1}, "empty_kept"))
            if full:
                s.append(Sample((gen(rng, (0, 3)),), {}, "empty_full"))
        return s

    return make


def promoted(make: Callable, arity: int, torch_ints: bool = True) -> Callable:
    """``make``'s samples plus one of integer operands, which these ops promote to the default
    float dtype (forward only; ``torch_ints=False`` where PyTorch refuses integers instead)."""

    def samples(rng: np.random.Generator) -> list[Sample]:
        ints = tuple(np.asarray(rng.integers(1, 5, (2, 3))) for _ in range(arity))
        return make(rng) + [Sample(ints, name="int", grad=False, torch=torch_ints)]

    return samples


# IEEE special values, poles and signed zeros, for unary ops and (as pairs) binary ones; samples
# named "special" are forward-only and also compared with PyTorch's signs of zero
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, -2.0, 0.5, -2.5, 1e-300, -1e-300]
SPECIAL_PAIRS = [
    (0.0, 0.0),
    (0.0, -0.0),
    (-0.0, 0.0),
    (-0.0, -0.0),
    (1.0, 0.0),
    (-0.0, -1.0),
    (1.0, math.inf),
    (-1.0, -math.inf),
    (math.inf, math.inf),
    (-math.inf, -math.inf),
    (math.inf, -math.inf),
    (-math.inf, 2.0),
    (math.nan, 1.0),
    (1.0, math.nan),
    (3.0, -math.inf),
]


def with_special(make: Callable, not_torch: tuple = ()) -> Callable:
    """``make``'s samples plus one of the ``SPECIAL`` values: forward and PyTorch (values and
    gradients) only, no gradcheck at infinities and poles.  Values in ``not_torch`` (where
    fusegrad deliberately differs from PyTorch, said at the entry) form a sample of their own,
    compared with the reference only."""

    def samples(rng: np.random.Generator) -> list[Sample]:
        out = make(rng)
        both = np.array([v for v in SPECIAL if v not in not_torch])
        out.append(Sample((both,), name="special", grad=False))
        if not_torch:
            out.append(Sample((np.array(not_torch),), name="special_ref", grad=False, torch=False))
        return out

    return samples


def with_special_pairs(make: Callable) -> Callable:
    """``with_special`` for binary ops: the operand pairs of ``SPECIAL_PAIRS``."""

    def samples(rng: np.random.Generator) -> list[Sample]:
        a, b = (np.array(column) for column in zip(*SPECIAL_PAIRS))
        return make(rng) + [Sample((a, b), name="special", grad=False)]

    return samples


# ---- numpy references ---------------------------------------------------------------------------

_erf_scalar = np.vectorize(math.erf, otypes=[np.float64])


def erf_ref(x: Any) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return _erf_scalar(x) if x.size else x.copy()


def _elementwise_ref(scalar: Callable[..., float]) -> Callable[..., np.ndarray]:
    """A numpy reference from a Python scalar function (float64, numpy broadcasting)."""
    vectorised = np.vectorize(scalar, otypes=[np.float64])

    def ref(*args: Any) -> np.ndarray:
        arrays = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in args])
        return vectorised(*arrays) if arrays[0].size else np.zeros(arrays[0].shape)

    return ref


def _pole(x: float) -> bool:
    return x <= 0 and (math.isinf(x) or x == math.floor(x))


def _lgamma_scalar_ref(x: float) -> float:
    if math.isnan(x):
        return x
    if math.isinf(x) or _pole(x):
        return math.inf
    return math.lgamma(x)  # CPython's own algorithm: independent of the C library's


def _mpmath() -> Any:
    try:
        import mpmath

        return mpmath
    except ImportError:  # pragma: no cover - mpmath comes with torch (sympy)
        return None


def _psi_series(x: float, order: int) -> float:
    """digamma (order 0) or trigamma (order 1) of x > 0 without mpmath: shifted past 30, then
    five terms of the asymptotic series (an independent cut of the same mathematics)."""
    shift = 0.0
    while x < 30.0:
        shift += -1.0 / x if order == 0 else 1.0 / (x * x)
        x += 1.0
    z = 1.0 / (x * x)
    if order == 0:
        tail = z * (1 / 12 - z * (1 / 120 - z * (1 / 252 - z * (1 / 240 - z / 132))))
        return shift + math.log(x) - 0.5 / x - tail
    tail = z * (1 / 6 - z * (1 / 30 - z * (1 / 42 - z * (1 / 30 - z * 5 / 66))))
    return shift + (1.0 + 0.5 / x + tail) / x


def _polygamma_scalar_ref(order: int) -> Callable[[float], float]:
    """digamma (order 0) or trigamma (order 1) with PyTorch's conventions at the poles
    (trigamma: +inf, the limit), from mpmath where importable."""

    def ref(x: float) -> float:
        if math.isnan(x) or x == -math.inf:
            return math.nan
        if x == math.inf:
            return math.inf if order == 0 else 0.0
        if x == 0 and order == 0:
            return math.copysign(math.inf, -x)
        if _pole(x):
            return math.nan if order == 0 else math.inf
        mp = _mpmath()
        if mp is not None:
            return float(mp.polygamma(order, mp.mpf(x)))
        if x > 0:
            return _psi_series(x, order)
        if order == 0:  # reflection: digamma(x) = digamma(1 - x) - pi cot(pi x)
            return _psi_series(1.0 - x, 0) - math.pi / math.tan(math.pi * x)
        return (math.pi / math.sin(math.pi * x)) ** 2 - _psi_series(1.0 - x, 1)

    return ref


lgamma_ref = _elementwise_ref(_lgamma_scalar_ref)
digamma_ref = _elementwise_ref(_polygamma_scalar_ref(0))
trigamma_ref = _elementwise_ref(_polygamma_scalar_ref(1))


def logaddexp_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.log(np.exp(a) + np.exp(b))  # the definition (samples stay far from overflow)


def sigmoid_ref(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def gelu_ref(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf_ref(x / math.sqrt(2)))


def softplus_ref(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    return np.where(beta * x > threshold, x, np.log1p(np.exp(beta * x)) / beta)


def reduce_ref(fn: Callable) -> Callable:
    def ref(x: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
        return fn(x, axis=_axis(x, dim), keepdims=keepdim)

    return ref


def var_ref(
    x: np.ndarray,
    dim: Any = None,
    keepdim: bool = False,
    correction: float = 1,
    unbiased: bool | None = None,
) -> np.ndarray:
    if unbiased is not None:
        correction = 1 if unbiased else 0
    ax = _axis(x, dim)
    n = x.size if ax is None else int(np.prod([x.shape[d] for d in np.atleast_1d(ax)]))
    mu = np.mean(x, axis=ax, keepdims=True)
    return np.sum((x - mu) ** 2, axis=ax, keepdims=keepdim) / (n - correction)


def norm_ref(x: np.ndarray, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> np.ndarray:
    a = np.abs(x)
    ax = _axis(x, dim)
    if p in ("fro", 2):
        return np.sqrt(np.sum(a * a, axis=ax, keepdims=keepdim))
    if p == math.inf:
        return np.max(a, axis=ax, keepdims=keepdim)
    if p == 1:
        return np.sum(a, axis=ax, keepdims=keepdim)
    return np.sum(a**p, axis=ax, keepdims=keepdim) ** (1.0 / p)


def logsumexp_ref(x: np.ndarray, dim: Any, keepdim: bool = False) -> np.ndarray:
    return np.log(np.sum(np.exp(x), axis=_axis(x, dim), keepdims=keepdim))


def softmax_ref(x: np.ndarray, dim: int) -> np.ndarray:
    ax = _axis(x, dim)
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    return e / np.sum(e, axis=ax, keepdims=True)


def log_softmax_ref(x: np.ndarray, dim: int) -> np.ndarray:
    ax = _axis(x, dim)
    return x - np.log(np.sum(np.exp(x), axis=ax, keepdims=True))


def max_dim_ref(fn: Callable, argfn: Callable) -> Callable:
    def ref(x: np.ndarray, dim: int, keepdim: bool = False) -> tuple:
        ax = _axis(x, dim)
        if ax is None:
            return x.copy(), np.array(0)
        return fn(x, axis=ax, keepdims=keepdim), argfn(x, axis=ax, keepdims=keepdim)

    return ref


def arg_ref(fn: Callable) -> Callable:
    def ref(x: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
        if dim is None or x.ndim == 0:
            out = np.asarray(fn(x.reshape(-1)))
            return out.reshape((1,) * x.ndim) if keepdim else out
        return fn(x, axis=dim, keepdims=keepdim)

    return ref


def pad_ref(x: np.ndarray, pad: tuple, mode: str = "constant", value: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    # negative padding crops
    x = x[tuple(slice(max(-b, 0), n - max(-a, 0)) for (b, a), n in zip(widths, x.shape))]
    widths = [(max(b, 0), max(a, 0)) for b, a in widths]
    np_mode = {
        "constant": "constant",
        "reflect": "reflect",
        "replicate": "edge",
        "circular": "wrap",
    }[mode]
    extra = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x, widths, mode=np_mode, **extra)


def scatter_key(index: np.ndarray, dim: int) -> tuple:
    dim %= index.ndim
    grids = np.indices(index.shape, sparse=True)
    return tuple(index if d == dim else grids[d] for d in range(index.ndim))


def _src_for(index: np.ndarray, src: Any) -> Any:
    if np.ndim(src) == 0:
        return np.full(index.shape, src)
    return src[tuple(slice(0, n) for n in index.shape)]


def gather_ref(x: np.ndarray, dim: int, index: np.ndarray) -> np.ndarray:
    return x[scatter_key(index, dim)]


def scatter_ref(x: np.ndarray, dim: int, index: np.ndarray, src: Any) -> np.ndarray:
    out = x.copy()
    out[scatter_key(index, dim)] = _src_for(index, src)
    return out


def scatter_add_ref(x: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray) -> np.ndarray:
    out = x.copy()
    np.add.at(out, scatter_key(index, dim), _src_for(index, src))
    return out


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)  # type: ignore[return-value]


def _windows_ref(x: np.ndarray, k: tuple, s: tuple, p: tuple, d: tuple, fill: float) -> tuple:
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    oh = (xp.shape[2] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (xp.shape[3] - d[1] * (k[1] - 1) - 1) // s[1] + 1

    def window(i: int, j: int) -> np.ndarray:
        r0, c0 = i * s[0], j * s[1]
        return xp[
            :, :, r0 : r0 + d[0] * (k[0] - 1) + 1 : d[0], c0 : c0 + d[1] * (k[1] - 1) + 1 : d[1]
        ]

    return oh, ow, window


def conv2d_ref(
    x: np.ndarray,
    w: np.ndarray,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    if x.ndim == 3:
        return conv2d_ref(x[None], w, bias, stride, padding, dilation, groups)[0]
    oc, cin_g, kh, kw = w.shape
    if padding == "valid":
        padding = 0
    elif padding == "same":
        dh, dw = _pair(dilation)
        th, tw = dh * (kh - 1), dw * (kw - 1)  # odd totals: the extra goes at the end
        x = np.pad(x, ((0, 0), (0, 0), (th // 2, th - th // 2), (tw // 2, tw - tw // 2)))
        padding = 0
    oh, ow, window = _windows_ref(x, (kh, kw), _pair(stride), _pair(padding), _pair(dilation), 0.0)
    out = np.zeros((x.shape[0], oc, oh, ow))
    per_group = oc // groups
    for i in range(oh):
        for j in range(ow):
            win = window(i, j)
            for o in range(oc):
                g = o // per_group
                out[:, o, i, j] = np.sum(win[:, g * cin_g : (g + 1) * cin_g] * w[o], axis=(1, 2, 3))
    if bias is not None:
        out += bias.reshape(1, oc, 1, 1)
    return out


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    n = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1  # the last window must start inside the input or the left padding
    return n


def max_pool2d_ref(
    x: np.ndarray,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> np.ndarray:
    batch = x.ndim == 4
    x = x if batch else x[None]
    k, p, d = _pair(kernel_size), _pair(padding), _pair(dilation)
    s = _pair(stride if stride is not None else kernel_size)
    size = [_pool_out(x.shape[2 + a], k[a], s[a], p[a], d[a], ceil_mode) for a in (0, 1)]
    out = np.zeros(x.shape[:2] + tuple(size))
    for i in range(size[0]):
        for j in range(size[1]):
            rows = [
                r for r in (i * s[0] - p[0] + d[0] * t for t in range(k[0])) if 0 <= r < x.shape[2]
            ]
            cols = [
                c for c in (j * s[1] - p[1] + d[1] * t for t in range(k[1])) if 0 <= c < x.shape[3]
            ]
            out[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
    return out if batch else out[0]


def max_pool2d_indices_ref(x: np.ndarray, k: int) -> np.ndarray:
    """Flat index into each (H, W) plane of every k x k window's maximum (stride k)."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, h // k, w // k), dtype=np.int64)
    for i in range(h // k):
        for j in range(w // k):
            arg = x[:, :, i * k : (i + 1) * k, j * k : (j + 1) * k].reshape(n, c, -1).argmax(-1)
            out[:, :, i, j] = (i * k + arg // k) * w + j * k + arg % k
    return out


def avg_pool2d_ref(
    x: np.ndarray,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> np.ndarray:
    """PyTorch's rule: a window is clipped to the padded input for the count_include_pad
    divisor and to the input itself for the sum (and the other divisor)."""
    batch = x.ndim == 4
    x = x if batch else x[None]
    k, p = _pair(kernel_size), _pair(padding)
    s = _pair(stride if stride is not None else kernel_size)
    H, W = x.shape[2:]
    size = [_pool_out(x.shape[2 + a], k[a], s[a], p[a], 1, ceil_mode) for a in (0, 1)]
    out = np.zeros(x.shape[:2] + tuple(size))
    for i in range(size[0]):
        for j in range(size[1]):
            h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
            h1, w1 = min(h0 + k[0], H + p[0]), min(w0 + k[1], W + p[1])
            pool_size = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
            total = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3))
            if divisor_override:
                n = divisor_override
            else:
                n = pool_size if count_include_pad else (h1 - h0) * (w1 - w0)
            out[:, :, i, j] = total / n
    return out if batch else out[0]


def nll_ref(
    logp: np.ndarray,
    t: np.ndarray,
    weight: Any = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> np.ndarray:
    """nll_loss of log-probabilities with class indices (and cross_entropy's smoothing)."""
    cdim = 0 if logp.ndim == 1 else 1
    lp = np.moveaxis(logp, cdim, -1)
    n_classes = lp.shape[-1]
    w = np.ones(n_classes) if weight is None else weight
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    picked = np.take_along_axis(lp, safe[..., None], -1)[..., 0]
    wt = w[safe] * valid
    loss = -picked * wt * (1 - label_smoothing)
    loss = loss - label_smoothing * np.sum(lp * w, -1) / n_classes * valid
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.sum(loss)
    return np.sum(loss) / np.sum(wt)


def cross_entropy_ref(
    x: np.ndarray,
    t: np.ndarray,
    weight: Any = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> np.ndarray:
    cdim = 0 if x.ndim == 1 else 1
    logp = log_softmax_ref(x, cdim)
    if t.dtype.kind != "f":
        return nll_ref(logp, t, weight, ignore_index, reduction, label_smoothing)
    n_classes = x.shape[cdim]
    tt = t * (1 - label_smoothing) + label_smoothing / n_classes
    if weight is not None:
        shape = [1] * x.ndim
        shape[cdim] = n_classes
        tt = tt * weight.reshape(shape)
    loss = -np.sum(logp * tt, axis=cdim)
    if reduction == "none":
        return loss
    return np.sum(loss) if reduction == "sum" else np.sum(loss) / max(loss.size, 1)


def _reduce_ref(loss: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "none":
        return loss
    return np.sum(loss) if reduction == "sum" else np.mean(loss)


def bce_ref(p: np.ndarray, t: np.ndarray, weight: Any = None, reduction: str = "mean") -> Any:
    loss = -(t * np.log(p) + (1 - t) * np.log(1 - p))
    return _reduce_ref(loss * (1 if weight is None else weight), reduction)


def bce_logits_ref(
    x: np.ndarray,
    t: np.ndarray,
    weight: Any = None,
    reduction: str = "mean",
    pos_weight: Any = None,
) -> Any:
    pw = 1.0 if pos_weight is None else pos_weight
    loss = -(pw * t * np.log(sigmoid_ref(x)) + (1 - t) * np.log(1 - sigmoid_ref(x)))
    return _reduce_ref(loss * (1 if weight is None else weight), reduction)


def layer_norm_ref(
    x: np.ndarray, shape: tuple, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> np.ndarray:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def setitem_op(m: Lib, x: Any, v: Any, key: Any) -> Any:
    y = x.clone()
    y[key] = v
    return y


def setitem_ref(x: np.ndarray, v: Any, key: Any) -> np.ndarray:
    y = x.copy()
    y[key] = v
    return y


# ---- the table ----------------------------------------------------------------------------------

S = Sample
OPS: list[OpInfo] = []


def add(name: str, op: Callable, ref: Callable | None, samples: Callable, **kw: Any) -> None:
    OPS.append(OpInfo(name, op, ref, samples, **kw))


# elementwise arithmetic ------------------------------------------------------------------------
add("add", lambda m, a, b: a + b, np.add, binary())
add(
    "add_alpha",
    lambda m, a, b: m.add(a, b, alpha=2.5),
    lambda a, b: a + 2.5 * b,
    binary(scalar_left=False),
)
add("sub", lambda m, a, b: a - b, np.subtract, binary())
add(
    "sub_alpha",
    lambda m, a, b: m.sub(a, b, alpha=-0.5),
    lambda a, b: a + 0.5 * b,
    binary(scalar_left=False),
)
add("mul", lambda m, a, b: a * b, np.multiply, binary())
add("div", lambda m, a, b: a / b, np.divide, binary(uni, away))
add(
    "div_floor",
    lambda m, a, b: m.div(a, b, rounding_mode="floor"),
    np.floor_divide,
    exact_quotients,
    zero_grad=True,
)
add(
    "div_trunc",
    lambda m, a, b: m.div(a, b, rounding_mode="trunc"),
    lambda a, b: np.trunc(np.divide(a, b)),
    exact_quotients,
    zero_grad=True,
)
# torch has no derivative for floor_divide (backward raises); fusegrad gives zeros, as for
# div(rounding_mode="floor"), so the torch check compares forward values only
add(
    "floor_divide",
    lambda m, a, b: a // b,
    np.floor_divide,
    exact_quotients,
    zero_grad=True,
    torch_grad=False,
)
add("remainder", lambda m, a, b: a % b, np.remainder, exact_quotients)
add("neg", lambda m, x: -x, np.negative, unary())
add("pow", lambda m, a, b: a**b, np.power, binary(pos, uni))
add("pow_int_exponent", lambda m, x: x**3, lambda x: x**3, unary())
add("pow_square", lambda m, x: m.pow(x, 2), lambda x: x**2, unary())
add("pow_fractional", lambda m, x: x**-1.5, lambda x: x**-1.5, unary(pos))
add("pow_scalar_base", lambda m, x: 2.5**x, lambda x: 2.5**x, unary())
add("abs", lambda m, x: m.abs(x), np.abs, unary(away))
add("sign", lambda m, x: m.sign(x), np.sign, unary(away), zero_grad=True)
add("exp", lambda m, x: m.exp(x), np.exp, unary())
add("exp2", lambda m, x: m.exp2(x), np.exp2, unary())
add("expm1", lambda m, x: m.expm1(x), np.expm1, unary())
add("log", lambda m, x: m.log(x), np.log, unary(pos))
add("log2", lambda m, x: m.log2(x), np.log2, unary(pos))
add("log1p", lambda m, x: m.log1p(x), np.log1p, unary(lambda r, s: uni(r, s, -0.5, 2.0)))
add("sqrt", lambda m, x: m.sqrt(x), np.sqrt, unary(pos))
add("rsqrt", lambda m, x: m.rsqrt(x), lambda x: 1 / np.sqrt(x), unary(pos))
add("reciprocal", lambda m, x: m.reciprocal(x), np.reciprocal, unary(away))
add("square", lambda m, x: m.square(x), np.square, unary())
add("sin", lambda m, x: m.sin(x), np.sin, unary())
add("cos", lambda m, x: m.cos(x), np.cos, unary())
add("tan", lambda m, x: m.tan(x), np.tan, unary(lambda r, s: uni(r, s, -1.2, 1.2)))
add("tanh", lambda m, x: m.tanh(x), np.tanh, unary())
add("sigmoid", lambda m, x: m.sigmoid(x), sigmoid_ref, unary(lambda r, s: uni(r, s, -4, 4)))
# inverse trigonometric and hyperbolic functions: samples inside their domains (clear of the
# poles at +-1 and 1), their special values forward and against PyTorch, integers promoted
_INSIDE_ONE = unary(lambda r, s: uni(r, s, -0.9, 0.9))
add("asin", lambda m, x: m.asin(x), np.arcsin, promoted(with_special(_INSIDE_ONE), 1))
add("acos", lambda m, x: m.acos(x), np.arccos, promoted(with_special(_INSIDE_ONE), 1))
add("atan", lambda m, x: m.atan(x), np.arctan, promoted(with_special(unary()), 1))
add("sinh", lambda m, x: m.sinh(x), np.sinh, promoted(with_special(unary()), 1))
add("cosh", lambda m, x: m.cosh(x), np.cosh, promoted(with_special(unary()), 1))
add("asinh", lambda m, x: m.asinh(x), np.arcsinh, promoted(with_special(unary()), 1))
add(
    "acosh",
    lambda m, x: m.acosh(x),
    np.arccosh,
    promoted(with_special(unary(lambda r, s: uni(r, s, 1.1, 3.0))), 1),
)
add("atanh", lambda m, x: m.atanh(x), np.arctanh, promoted(with_special(_INSIDE_ONE), 1))
add("arcsin", lambda m, x: x.arcsin(), np.arcsin, _INSIDE_ONE)
# (PyTorch 2.13 has no derivative for its in-place asinh_/atanh_: values only against it)
add("arcsinh_", lambda m, x: (x * 1.0).arcsinh_(), np.arcsinh, unary(), torch_grad=False)
add("cosh_", lambda m, x: (x * 1.0).cosh_(), np.cosh, unary())
add("erf", lambda m, x: m.erf(x), erf_ref, unary())
add(
    "erfc",
    lambda m, x: m.erfc(x),
    lambda x: 1.0 - erf_ref(x),
    promoted(with_special(unary()), 1),
)
add("erfc_", lambda m, x: (x * 1.0).erfc_(), lambda x: 1.0 - erf_ref(x), unary())


def erfinv_ref(y: Any) -> np.ndarray:
    """erfinv by bisection on math.erf (independent of fusegrad's Newton iteration): 200
    halvings of [-6, 6], where erf reaches 1 in float64."""
    y = np.asarray(y, dtype=np.float64)
    lo, hi = np.full(y.shape, -6.0), np.full(y.shape, 6.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        below = erf_ref(mid) < y
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    out = (lo + hi) / 2
    out = np.where(y == 0, y, out)
    out = np.where(np.abs(y) == 1, np.copysign(np.inf, y), out)
    return np.where(np.isnan(y) | (np.abs(y) > 1), np.nan, out)


add(
    "erfinv",
    lambda m, x: m.erfinv(x),
    erfinv_ref,
    promoted(with_special(unary(lambda r, s: uni(r, s, -0.95, 0.95))), 1, torch_ints=True),
)
add("erfinv_", lambda m, x: (x * 0.5).erfinv_(), lambda x: erfinv_ref(x * 0.5), unary())
add("lgamma", lambda m, x: m.lgamma(x), lgamma_ref, promoted(with_special(unary(nonint)), 1))
add("lgamma_", lambda m, x: (x * 1.0).lgamma_(), lgamma_ref, unary(nonint))
# digamma's derivative, polygamma(1, x), is not differentiable in fusegrad (no polygamma(2, x)):
# no gradgradcheck.  At the negative integers digamma is nan and its gradient g * +inf, where
# PyTorch's is g * 6.6e32 (see polygamma_1): those values are compared with the reference only
add(
    "digamma",
    lambda m, x: m.digamma(x),
    digamma_ref,
    promoted(with_special(unary(nonint), not_torch=(-1.0, -2.0)), 1),
    twice=False,
)
add("digamma_", lambda m, x: (x * 1.0).digamma_(), digamma_ref, unary(nonint), twice=False)
# forward only (on a detached input): polygamma(1, x) has no derivative in fusegrad.  At the
# negative integers fusegrad gives +inf (the limit), PyTorch pi^2 / sin(pi x)^2 of a rounded
# pi x (6.6e32 at -1)
add(
    "polygamma_1",
    lambda m, x: m.polygamma(1, x.detach()),
    trigamma_ref,
    promoted(with_special(unary(nonint), not_torch=(-1.0, -2.0)), 1),
    differentiable=False,
)
add(
    "atan2",
    lambda m, a, b: m.atan2(a, b),
    np.arctan2,
    promoted(with_special_pairs(binary(away, away, scalars=False)), 2),
)
add("arctan2", lambda m, a, b: a.arctan2(b), np.arctan2, binary(away, away, scalars=False))
# PyTorch implements hypot and logaddexp for floating tensors only; fusegrad promotes integers
add(
    "hypot",
    lambda m, a, b: m.hypot(a, b),
    np.hypot,
    promoted(with_special_pairs(binary(away, scalars=False)), 2, torch_ints=False),
)
add(
    "logaddexp",
    lambda m, a, b: m.logaddexp(a, b),
    logaddexp_ref,
    promoted(with_special_pairs(binary(scalars=False)), 2, torch_ints=False),
)
add("floor", lambda m, x: m.floor(x), np.floor, unary(nonint), zero_grad=True)
add("ceil", lambda m, x: m.ceil(x), np.ceil, unary(nonint), zero_grad=True)
add("round", lambda m, x: m.round(x), np.round, unary(nonint), zero_grad=True)
add(
    "round_decimals",
    lambda m, x: m.round(x, decimals=1),
    lambda x: np.round(x, 1),
    unary(lambda r, s: nonint(r, s) / 10 + 0.01),
    zero_grad=True,
    f32_tol=(1e-6, 1e-6),
)
add("trunc", lambda m, x: m.trunc(x), np.trunc, unary(nonint), zero_grad=True)

# activations -----------------------------------------------------------------------------------
add("relu", lambda m, x: m.relu(x), lambda x: np.maximum(x, 0), unary(away))
add("F.relu", lambda m, x: m.F.relu(x), lambda x: np.maximum(x, 0), unary(away))
add(
    "leaky_relu",
    lambda m, x: m.F.leaky_relu(x, 0.2),
    lambda x: np.where(x > 0, x, 0.2 * x),
    unary(away),
)
add("gelu", lambda m, x: m.F.gelu(x), gelu_ref, unary())
add(
    "gelu_tanh",
    lambda m, x: m.F.gelu(x, approximate="tanh"),
    lambda x: gelu_ref(x, "tanh"),
    unary(),
)
add("silu", lambda m, x: m.F.silu(x), lambda x: x * sigmoid_ref(x), unary())
add("softplus", lambda m, x: m.F.softplus(x), softplus_ref, unary())
add(
    "softplus_beta",
    lambda m, x: m.F.softplus(x, beta=2.0, threshold=1.5),
    lambda x: softplus_ref(x, 2.0, 1.5),
    unary(lambda r, s: away(r, s) + 0.75 * (away(r, s) > 0)),
)
add(
    "elu",
    lambda m, x: m.F.elu(x, alpha=0.7),
    lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)),
    unary(away),
)

add(
    "hardswish",
    lambda m, x: m.F.hardswish(x),
    lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    unary(lambda r, s: uni(r, s, -4.5, 4.5)),
)
add(
    "selu",
    lambda m, x: m.F.selu(x),
    lambda x: (
        1.0507009873554804934193349852946
        * np.where(x > 0, x, 1.6732632423543772848170429916717 * np.expm1(x))
    ),
    unary(away),
)
add(
    "celu",
    lambda m, x, **k: m.F.celu(x, **k),
    lambda x, alpha=1.0: np.where(x > 0, x, alpha * np.expm1(x / alpha)),
    lambda rng: unary(away)(rng) + [S((away(rng, (3, 4)),), {"alpha": 0.5}, "alpha")],
)


def glu_ref(x: np.ndarray, dim: int = -1) -> np.ndarray:
    a, b = np.split(x, 2, axis=dim)
    return a * sigmoid_ref(b)


add(
    "glu",
    lambda m, x, *a: m.F.glu(x, *a),
    glu_ref,
    lambda rng: [
        S((uni(rng, (3, 4)),), name="last"),
        S((uni(rng, (4, 3)), 0), name="dim0"),
        S((uni(rng, (2, 0, 2)), 1), name="empty"),
        S((uni(rng, (2, 6)), -1), name="noncontig", noncontig=True),
    ],
)


def _clear_of(*kinks: float) -> Gen:
    """Values in [-4, 4] at least 0.1 from each kink (piecewise activations are smooth there)."""

    def gen(rng: np.random.Generator, shape: tuple) -> np.ndarray:
        x = uni(rng, shape, -4.0, 4.0)
        for k in kinks:
            x = np.where(np.abs(x - k) < 0.1, x + 0.25, x)
        return np.asarray(x)

    return gen


add(
    "rrelu_eval",
    lambda m, x: m.F.rrelu(x, 0.1, 0.3),
    lambda x: np.where(x >= 0, x, 0.2 * x),
    unary(away),
)
add("softsign", lambda m, x: m.F.softsign(x), lambda x: x / (1 + np.abs(x)), unary(away))
add("tanhshrink", lambda m, x: m.F.tanhshrink(x), lambda x: x - np.tanh(x), unary())
add(
    "hardshrink",
    lambda m, x: m.F.hardshrink(x, 0.5),
    lambda x: np.where(np.abs(x) > 0.5, x, 0.0),
    unary(_clear_of(-0.5, 0.5)),
)
add(
    "softshrink",
    lambda m, x: m.F.softshrink(x, 0.5),
    lambda x: np.where(x > 0.5, x - 0.5, np.where(x < -0.5, x + 0.5, 0.0)),
    unary(_clear_of(-0.5, 0.5)),
)
add(
    "threshold",
    lambda m, x: m.F.threshold(x, 0.3, -2.0),
    lambda x: np.where(x > 0.3, x, -2.0),
    unary(_clear_of(0.3)),
)
add(
    "hardsigmoid",
    lambda m, x: m.F.hardsigmoid(x),
    lambda x: np.clip(x / 6 + 0.5, 0.0, 1.0),
    unary(_clear_of(-3.0, 3.0)),
)

# clamp, extrema, where, lerp ------------------------------------------------------------------


def _clamp_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)),), {"min": -0.5, "max": 0.7}, "both"),
        S((uni(rng, (3, 4)),), {"min": -0.5}, "min_only"),
        S((uni(rng, (3, 4)),), {"max": 0.3}, "max_only"),
        S((uni(rng, ()),), {"min": -0.5, "max": 0.7}, "0d"),
        S((uni(rng, (0, 2)),), {"min": -0.5, "max": 0.7}, "empty"),
        S((uni(rng, (2, 3)),), {"min": -0.5, "max": 0.7}, "noncontig", noncontig=True),
        S((uni(rng, (3, 4)), uni(rng, (3, 1), -1, 0), uni(rng, (4,), 0, 1)), {}, "tensor_bounds"),
        S((uni(rng, (2, 3)),), {"min": uni(rng, (2, 3), -1, 0)}, "tensor_min"),
        S((uni(rng, (2, 3)),), {"min": 0.5, "max": -0.5}, "min_gt_max"),
    ]


def _clamp_ref(x: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:
    out = x if min is None else np.maximum(x, min)
    return out if max is None else np.minimum(out, max)


add("clamp", lambda m, x, *a, **k: m.clamp(x, *a, **k), _clamp_ref, _clamp_samples)
add("clip", lambda m, x, *a, **k: x.clip(*a, **k), _clamp_ref, _clamp_samples)
add("maximum", lambda m, a, b: m.maximum(a, b), np.maximum, binary(scalars=False))
add("minimum", lambda m, a, b: m.minimum(a, b), np.minimum, binary(scalars=False))


def _where_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((boolean(rng, (3, 4)), uni(rng, (3, 4)), uni(rng, (3, 4))), name="same"),
        S((boolean(rng, (3, 1)), uni(rng, (1, 4)), uni(rng, (3, 4))), name="bcast"),
        S((boolean(rng, (2, 3)), uni(rng, (2, 3)), 0.5), name="scalar_other"),
        S((boolean(rng, ()), uni(rng, ()), uni(rng, (3,))), name="0d"),
        S((boolean(rng, (0, 2)), uni(rng, (0, 2)), uni(rng, (2,))), name="empty"),
        S(
            (boolean(rng, (2, 3)), uni(rng, (2, 3)), uni(rng, (2, 3))),
            name="noncontig",
            noncontig=True,
        ),
    ]


add("where", lambda m, c, a, b: m.where(c, a, b), np.where, _where_samples)


def _lerp_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), uni(rng, (3, 4)), 0.3), name="scalar_weight"),
        S((uni(rng, (3, 4)), uni(rng, (3, 4)), uni(rng, (3, 4), 0, 1)), name="tensor_weight"),
        S((uni(rng, (3, 1)), uni(rng, (4,)), uni(rng, (3, 4), 0, 1)), name="bcast"),
        S((uni(rng, ()), uni(rng, ()), 0.7), name="0d"),
        S((uni(rng, (2, 3)), uni(rng, (2, 3)), uni(rng, (2, 3))), name="noncontig", noncontig=True),
    ]


add("lerp", lambda m, a, b, w: m.lerp(a, b, w), lambda a, b, w: a + w * (b - a), _lerp_samples)

# comparisons, logic, predicates (bool results, no grad) ---------------------------------------
for _name, _fn, _ref in [
    ("eq", lambda m, a, b: a == b, np.equal),
    ("ne", lambda m, a, b: a != b, np.not_equal),
    ("lt", lambda m, a, b: a < b, np.less),
    ("le", lambda m, a, b: a <= b, np.less_equal),
    ("gt", lambda m, a, b: a > b, np.greater),
    ("ge", lambda m, a, b: a >= b, np.greater_equal),
]:
    add(_name, _fn, _ref, binary(intvals), differentiable=False)
add(
    "eq_int",
    lambda m, a, b: m.eq(a, b),
    np.equal,
    binary(ints, scalars=False),
    differentiable=False,
)
for _name, _fn, _ref in [
    ("logical_and", lambda m, a, b: m.logical_and(a, b), np.logical_and),
    ("logical_or", lambda m, a, b: m.logical_or(a, b), np.logical_or),
    ("logical_xor", lambda m, a, b: m.logical_xor(a, b), np.logical_xor),
    ("bitwise_and_bool", lambda m, a, b: a & b, np.bitwise_and),
    ("bitwise_or_bool", lambda m, a, b: a | b, np.bitwise_or),
    ("bitwise_xor_bool", lambda m, a, b: a ^ b, np.bitwise_xor),
]:
    add(_name, _fn, _ref, binary(boolean, scalars=False), differentiable=False)
add(
    "bitwise_and_int",
    lambda m, a, b: a & b,
    np.bitwise_and,
    binary(ints, scalars=False),
    differentiable=False,
)
add(
    "logical_and_float",
    lambda m, a, b: m.logical_and(a, b),
    np.logical_and,
    binary(intvals, scalars=False),
    differentiable=False,
)
add(
    "logical_not",
    lambda m, x: m.logical_not(x),
    np.logical_not,
    unary(boolean),
    differentiable=False,
)
add("bitwise_not", lambda m, x: ~x, np.invert, unary(ints), differentiable=False)


def _special(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    x = uni(rng, shape).reshape(-1)
    specials = [np.nan, np.inf, -np.inf]
    for i in range(min(x.size, 6)):
        if i % 2 == 0:
            x[i] = specials[(i // 2) % 3]
    return rng.permutation(x).reshape(shape)


def _method_call(name: str) -> Callable:
    def call(m: Lib, x: Any) -> Any:
        return getattr(m, name)(x)

    return call


for _name, _ref in [("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite)]:
    add(_name, _method_call(_name), _ref, unary(_special), differentiable=False)
add(
    "nan_to_num",
    lambda m, x: m.nan_to_num(x),
    lambda x, dtype: np.nan_to_num(x, posinf=np.finfo(dtype).max, neginf=np.finfo(dtype).min),
    unary(_special),
    ref_takes_dtype=True,
)
add(
    "nan_to_num_values",
    lambda m, x: m.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-8.0),
    lambda x: np.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-8.0),
    unary(_special),
)

# reductions ------------------------------------------------------------------------------------
add("sum", lambda m, x, **k: x.sum(**k), reduce_ref(np.sum), reductions())
add("sum_fn", lambda m, x, **k: m.sum(x, **k), reduce_ref(np.sum), reductions(empty=False))
add(
    "sum_dtype",
    lambda m, x: x.sum(dtype=m.float64),
    lambda x: np.sum(x),
    unary(),
    out_dtype="float64",
)
add("mean", lambda m, x, **k: x.mean(**k), reduce_ref(np.mean), reductions())


def _prod_samples(rng: np.random.Generator) -> list[Sample]:
    one_zero = uni(rng, (3, 4))
    one_zero[1, 2] = 0.0
    two_zeros = uni(rng, (3, 4))
    two_zeros[0, 1] = two_zeros[0, 3] = 0.0
    two_zeros[2, 0] = 0.0
    flat_zero = uni(rng, (2, 3))
    flat_zero[1, 1] = 0.0
    return reductions(multi_dim=False)(rng) + [
        S((one_zero,), {"dim": 1}, "one_zero_dim"),
        S((two_zeros,), {"dim": 1}, "two_zeros_dim"),
        S((two_zeros,), {"dim": 0, "keepdim": True}, "zeros_dim0_keep"),
        S((flat_zero,), {}, "one_zero_full"),
        S((two_zeros[:2, :3].copy(),), {}, "two_zeros_full"),
    ]


add("prod", lambda m, x, **k: x.prod(**k), reduce_ref(np.prod), _prod_samples)


def _max_full_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)),), name="2d"),
        S((uni(rng, ()),), name="0d"),
        S((uni(rng, (2, 3)),), name="noncontig", noncontig=True),
    ]


add("max", lambda m, x: x.max(), np.max, _max_full_samples)
add("min", lambda m, x: m.min(x), np.min, _max_full_samples)
add(
    "max_dim",
    lambda m, x, **k: m.max(x, **k),
    max_dim_ref(np.max, np.argmax),
    reductions(multi_dim=False, empty=False, full=False),
)
add(
    "min_dim",
    lambda m, x, **k: x.min(**k),
    max_dim_ref(np.min, np.argmin),
    reductions(multi_dim=False, empty=False, full=False),
)
add("amax", lambda m, x, **k: x.amax(**k), reduce_ref(np.max), reductions(empty=False))
add("amin", lambda m, x, **k: m.amin(x, **k), reduce_ref(np.min), reductions(empty=False))


def _arg_samples(rng: np.random.Generator) -> list[Sample]:
    return reductions(multi_dim=False, empty=False)(rng) + [
        S((uni(rng, (3, 4)),), {"keepdim": True}, "full_keepdim"),
        S((intvals(rng, (3, 4)),), {"dim": 1}, "ties"),
    ]


add(
    "argmax",
    lambda m, x, **k: x.argmax(**k),
    arg_ref(np.argmax),
    _arg_samples,
    differentiable=False,
)
add(
    "argmin",
    lambda m, x, **k: m.argmin(x, **k),
    arg_ref(np.argmin),
    _arg_samples,
    differentiable=False,
)


# sorting: sort / argsort / topk / kthvalue / median (values gather the selected positions) ------


def _np_order(x: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """Stable order along ``dim``; descending by sorting the negated values (no NaN here)."""
    return np.argsort(-x if descending else x, axis=dim, kind="stable")


def sort_ref(x: np.ndarray, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple:
    if x.ndim == 0:
        return x.copy(), np.array(0)
    idx = _np_order(x, dim, descending)
    return np.take_along_axis(x, idx, dim), idx


def argsort_ref(x: np.ndarray, dim: int = -1, descending: bool = False, stable: bool = False):
    return sort_ref(x, dim, descending)[1]


def topk_ref(x: np.ndarray, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    if x.ndim == 0:
        return x.copy(), np.array(0)
    idx = np.take(_np_order(x, dim, largest), np.arange(k), axis=dim)
    return np.take_along_axis(x, idx, dim), idx


def kthvalue_ref(x: np.ndarray, k: int, dim: int = -1, keepdim: bool = False) -> tuple:
    if x.ndim == 0:
        return x.copy(), np.array(0)
    idx = np.take(_np_order(x, dim, False), [k - 1], axis=dim)
    values = np.take_along_axis(x, idx, dim)
    if not keepdim:
        values, idx = values.squeeze(dim), idx.squeeze(dim)
    return values, idx


def median_ref(x: np.ndarray, dim: Any = None, keepdim: bool = False) -> Any:
    if dim is None:
        flat = np.sort(x.reshape(-1))
        return flat[(flat.size - 1) // 2]
    n = 1 if x.ndim == 0 else x.shape[dim]
    return kthvalue_ref(x, (n - 1) // 2 + 1, dim, keepdim)


def _sort_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)),), {}, "last_dim"),
        S((uni(rng, (3, 4)),), {"dim": 0, "descending": True}, "dim0_desc"),
        S((uni(rng, (2, 3, 4)),), {"dim": 1}, "3d"),
        S((intvals(rng, (3, 6)),), {"dim": 1, "stable": True}, "ties_stable", grad=False),
        S(
            (intvals(rng, (3, 6)),),
            {"dim": 1, "descending": True, "stable": True},
            "ties_stable_desc",
            grad=False,
        ),
        S((uni(rng, ()),), {"dim": 0}, "0d"),
        S((uni(rng, (0, 3)),), {"dim": 1}, "empty"),
        S((uni(rng, (2, 3)),), {"dim": 0}, "noncontig", noncontig=True),
    ]


def _topk_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 5)), 2), {}, "k2"),
        S((uni(rng, (3, 5)), 2), {"largest": False}, "smallest"),
        S((uni(rng, (4, 3)), 3), {"dim": 0}, "dim0_full"),
        S((uni(rng, (2, 6, 3)), 4), {"dim": 1, "largest": False}, "3d"),
        S((uni(rng, (3, 20)), 3), {"dim": -1}, "partial"),
        S((uni(rng, (3, 4)), 0), {}, "k0"),
        S((uni(rng, ()), 1), {}, "0d"),
        S((uni(rng, (0, 3)), 2), {}, "empty"),
        S((uni(rng, (3, 4)), 2), {"dim": 0}, "noncontig", noncontig=True),
    ]


def _kth_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 5)), 2), {}, "k2"),
        S((uni(rng, (4, 3)), 4), {"dim": 0, "keepdim": True}, "dim0_keep"),
        S((uni(rng, (2, 5, 3)), 1), {"dim": 1}, "3d_min"),
        S((uni(rng, ()), 1), {}, "0d"),
        S((uni(rng, (3, 4)), 3), {"dim": 0}, "noncontig", noncontig=True),
    ]


def _median_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 5)),), {}, "full_odd"),
        S((uni(rng, (2, 4)),), {}, "full_even"),
        S((uni(rng, (3, 5)),), {"dim": 1}, "dim1"),
        S((uni(rng, (4, 3)),), {"dim": 0, "keepdim": True}, "dim0_even_keep"),
        S((uni(rng, ()),), {"dim": 0}, "0d"),
        S((uni(rng, (3, 4)),), {"dim": 0}, "noncontig", noncontig=True),
    ]


add("sort", lambda m, x, **k: m.sort(x, **k), sort_ref, _sort_samples)
add(
    "argsort",
    lambda m, x, **k: x.argsort(**k),
    argsort_ref,
    _sort_samples,
    differentiable=False,
)
add("topk", lambda m, x, k, **kw: m.topk(x, k, **kw), topk_ref, _topk_samples)
add("kthvalue", lambda m, x, k, **kw: x.kthvalue(k, **kw), kthvalue_ref, _kth_samples)
add("median", lambda m, x, **k: m.median(x, **k), median_ref, _median_samples)
add(
    "msort",
    lambda m, x: m.msort(x),
    lambda x: np.sort(x, axis=0),
    lambda rng: [
        S((uni(rng, (4, 3)),), {}, "2d"),
        S((uni(rng, (3, 2)),), {}, "noncontig", noncontig=True),
    ],
)


def cummax_ref(x: np.ndarray, dim: int, largest: bool = True) -> tuple:
    """Running extreme and the latest position holding it (no NaN in the samples)."""
    if x.ndim == 0:
        return x.copy(), np.array(0)
    rows = np.moveaxis(x, dim, -1)
    values = (np.maximum if largest else np.minimum).accumulate(rows, axis=-1)
    idx = np.zeros(rows.shape, np.int64)
    for pos in np.ndindex(rows.shape[:-1]):
        for i in range(rows.shape[-1]):
            idx[pos + (i,)] = max(j for j in range(i + 1) if rows[pos + (j,)] == values[pos + (i,)])
    return np.moveaxis(values, -1, dim), np.moveaxis(idx, -1, dim)


def mode_ref(x: np.ndarray, dim: int = -1, keepdim: bool = False) -> tuple:
    if x.ndim == 0:
        return x.copy(), np.array(0)
    rows = np.moveaxis(x, dim, -1)
    values = np.zeros(rows.shape[:-1], x.dtype)
    idx = np.zeros(rows.shape[:-1], np.int64)
    for pos in np.ndindex(rows.shape[:-1]):
        row = list(rows[pos])
        best = min(row, key=lambda v: (-row.count(v), v))
        values[pos] = best
        idx[pos] = len(row) - 1 - row[::-1].index(best)
    if keepdim:
        values, idx = np.expand_dims(values, dim), np.expand_dims(idx, dim)
    return values, idx


def _cummax_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 5)), 1), {}, "dim1"),
        S((uni(rng, (4, 3)), 0), {}, "dim0"),
        S((uni(rng, (2, 4, 3)), -2), {}, "3d"),
        S((intvals(rng, (3, 6)), 1), {}, "ties", grad=False),
        S((uni(rng, ()), 0), {}, "0d"),
        S((uni(rng, (0, 3)), 1), {}, "empty"),
        S((uni(rng, (3, 4)), 0), {}, "noncontig", noncontig=True),
    ]


def _mode_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 5)),), {}, "distinct"),
        S((intvals(rng, (3, 7)),), {}, "ties", grad=False),
        S((intvals(rng, (6, 3)),), {"dim": 0, "keepdim": True}, "ties_dim0", grad=False),
        S((uni(rng, (2, 4, 3)),), {"dim": 1}, "3d"),
        S((uni(rng, ()),), {}, "0d"),
        S((uni(rng, (3, 4)),), {"dim": 0}, "noncontig", noncontig=True),
    ]


add("cummax", lambda m, x, dim: m.cummax(x, dim), cummax_ref, _cummax_samples)
add(
    "cummin",
    lambda m, x, dim: x.cummin(dim),
    lambda x, dim: cummax_ref(x, dim, largest=False),
    _cummax_samples,
)
add("mode", lambda m, x, **k: m.mode(x, **k), mode_ref, _mode_samples)
add(
    "Tensor.mode",
    lambda m, x, **k: x.mode(**k),
    mode_ref,
    lambda rng: [S((intvals(rng, (4, 9)),), {"dim": 1}, "ties", grad=False)],
)


def _var_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)),), {}, "full"),
        S((uni(rng, (3, 4)),), {"dim": 1}, "dim1"),
        S((uni(rng, (3, 4)),), {"dim": 0, "keepdim": True}, "dim0_keep"),
        S((uni(rng, (3, 4)),), {"dim": 1, "correction": 0}, "correction0"),
        S((uni(rng, (3, 4)),), {"dim": 1, "correction": 2}, "correction2"),
        S((uni(rng, (2, 3, 2)),), {"dim": (0, 2)}, "dims"),
        S((uni(rng, (3, 4)),), {"unbiased": False}, "unbiased_false"),
        S((uni(rng, (2, 3)),), {"dim": 0}, "noncontig", noncontig=True),
    ]


add("var", lambda m, x, **k: x.var(**k), var_ref, _var_samples)
add("std", lambda m, x, **k: m.std(x, **k), lambda *a, **k: np.sqrt(var_ref(*a, **k)), _var_samples)


def _norm_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)),), {}, "fro_default"),
        S((uni(rng, (3, 4)),), {"p": 2, "dim": 1}, "p2_dim"),
        S((away(rng, (3, 4)),), {"p": 1}, "p1"),
        S((uni(rng, (3, 4)),), {"p": math.inf}, "pinf"),
        S((uni(rng, (3, 4)),), {"p": math.inf, "dim": 0, "keepdim": True}, "pinf_dim"),
        S((uni(rng, (3, 4)),), {"p": "fro", "dim": (0, 1)}, "fro_dims"),
        S((away(rng, (3, 4)),), {"p": 3, "dim": 1}, "p3"),
        S((uni(rng, ()),), {}, "0d"),
        S((uni(rng, (2, 3)),), {"p": 2, "dim": 0}, "noncontig", noncontig=True),
    ]


add("norm", lambda m, x, **k: x.norm(**k), norm_ref, _norm_samples)


def _dim_samples(gen: Gen = uni, zero_d: bool = True) -> Callable:
    def make(rng: np.random.Generator) -> list[Sample]:
        s = [
            S((gen(rng, (3, 4)),), {"dim": 1}, "dim1"),
            S((gen(rng, (3, 4)),), {"dim": 0}, "dim0"),
            S((gen(rng, (2, 3, 2)),), {"dim": -2}, "3d"),
            S((gen(rng, (0, 3)),), {"dim": 1}, "empty"),
            S((gen(rng, (2, 3)),), {"dim": 1}, "noncontig", noncontig=True),
        ]
        if zero_d:
            s.append(S((gen(rng, ()),), {"dim": 0}, "0d"))
        return s

    return make


def _lse_samples(rng: np.random.Generator) -> list[Sample]:
    return _dim_samples()(rng)[:3] + [
        S((uni(rng, (2, 3, 2)),), {"dim": (0, 2), "keepdim": True}, "dims_keep"),
        S((uni(rng, (2, 3)),), {"dim": 1}, "noncontig", noncontig=True),
        S((uni(rng, (3, 2)) + 500.0,), {"dim": 1}, "large"),
    ]


add(
    "logsumexp",
    lambda m, x, **k: x.logsumexp(**k),
    lambda x, dim, keepdim=False: logsumexp_ref(x - 500, dim, keepdim) + 500,
    _lse_samples,
)
add("softmax", lambda m, x, dim: m.softmax(x, dim), softmax_ref, _dim_samples())
add("F.softmax", lambda m, x, dim: m.F.softmax(x, dim=dim), softmax_ref, _dim_samples())
add("log_softmax", lambda m, x, dim: x.log_softmax(dim), log_softmax_ref, _dim_samples())
add(
    "cumsum",
    lambda m, x, dim: x.cumsum(dim),
    lambda x, dim: np.cumsum(x, axis=dim) if x.ndim else x.copy(),
    _dim_samples(),
)


def _bool_reduce_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((boolean(rng, (3, 4)),), {}, "full"),
        S((boolean(rng, (3, 4)),), {"dim": 1}, "dim"),
        S((boolean(rng, (3, 4)),), {"dim": 0, "keepdim": True}, "keepdim"),
        S((boolean(rng, (0, 3)),), {}, "empty"),
        S((intvals(rng, (3, 4)),), {"dim": 1}, "float_input"),
    ]


add(
    "all",
    lambda m, x, **k: x.all(**k),
    reduce_ref(np.all),
    _bool_reduce_samples,
    differentiable=False,
)
add(
    "any",
    lambda m, x, **k: m.any(x, **k),
    reduce_ref(np.any),
    _bool_reduce_samples,
    differentiable=False,
)

# shape and views -------------------------------------------------------------------------------


def _shape_samples(*cases: tuple) -> Callable:
    """Cases ``(name, shape, args, kwargs[, noncontig])`` of a single-tensor op."""

    def make(rng: np.random.Generator) -> list[Sample]:
        out = []
        for case in cases:
            name, shape, args, kwargs = case[:4]
            nc = case[4] if len(case) > 4 else False
            out.append(S((uni(rng, shape),) + tuple(args), dict(kwargs), name, noncontig=nc))
        return out

    return make


add(
    "reshape",
    lambda m, x, *s: x.reshape(*s),
    lambda x, *s: x.reshape(*s),
    _shape_samples(
        ("2d", (3, 4), (2, 6), {}),
        ("infer", (3, 4), (-1, 2), {}),
        ("to_0d", (1, 1), ((),), {}),
        ("from_0d", (), (1, 1), {}),
        ("empty", (0, 4), (2, -1, 4), {}),
        ("same", (3, 4), (3, 4), {}),
        ("noncontig", (2, 3), (6,), {}, True),
    ),
)
add(
    "view",
    lambda m, x, *s: x.view(*s),
    lambda x, *s: x.reshape(*s),
    _shape_samples(
        ("2d", (3, 4), (2, 6), {}),
        ("infer", (3, 4), (-1,), {}),
        ("0d", (), (1,), {}),
        ("empty", (0, 4), (4, 0), {}),
        ("noncontig_split_dim", (2, 4), (2, 2, 2), {}, True),
    ),
)
add(
    "flatten",
    lambda m, x, *a: x.flatten(*a),
    lambda x, s=0, e=-1: (
        x.reshape(x.shape[: s % max(x.ndim, 1)] + (-1,) + x.shape[e % max(x.ndim, 1) + 1 :])
        if x.ndim
        else x.reshape(1)
    ),
    _shape_samples(
        ("all", (2, 3, 2), (), {}),
        ("start1", (2, 3, 2), (1,), {}),
        ("mid", (2, 3, 2), (0, 1), {}),
        ("0d", (), (), {}),
        ("empty", (2, 0, 3), (1,), {}),
        ("noncontig", (2, 3), (), {}, True),
    ),
)
add(
    "unflatten",
    lambda m, x, d, s: x.unflatten(d, s),
    lambda x, d, s: x.reshape(
        x.shape[: d % x.ndim]
        + tuple(x.shape[d] // -int(np.prod(s)) if v == -1 else v for v in s)
        + x.shape[d % x.ndim + 1 :]
    ),
    _shape_samples(
        ("dim1", (3, 4), (1, (2, 2)), {}),
        ("infer", (3, 4), (0, (-1, 1)), {}),
        ("noncontig", (2, 4), (-1, (2, 2)), {}, True),
    ),
)


def _squeeze_ref(x: np.ndarray, dim: Any = None) -> np.ndarray:
    if dim is None:
        return np.squeeze(x)
    dims = tuple(d % max(x.ndim, 1) for d in np.atleast_1d(dim) if x.ndim and x.shape[d] == 1)
    return np.squeeze(x, axis=dims) if dims else x


add(
    "squeeze",
    lambda m, x, *a: x.squeeze(*a),
    _squeeze_ref,
    _shape_samples(
        ("all", (3, 1, 2, 1), (), {}),
        ("dim", (3, 1, 2), (1,), {}),
        ("dim_not1", (3, 1, 2), (0,), {}),
        ("dims", (1, 3, 1), ((0, 2),), {}),
        ("0d", (), (), {}),
        ("0d_dim", (), (0,), {}),
        ("empty", (0, 1), (1,), {}),
        ("noncontig", (2, 1), (1,), {}, True),
    ),
)
add(
    "unsqueeze",
    lambda m, x, d: x.unsqueeze(d),
    lambda x, d: np.expand_dims(x, d),
    _shape_samples(
        ("front", (3, 4), (0,), {}),
        ("back", (3, 4), (-1,), {}),
        ("mid", (3, 4), (1,), {}),
        ("0d", (), (0,), {}),
        ("empty", (0,), (1,), {}),
        ("noncontig", (2, 3), (1,), {}, True),
    ),
)
add(
    "transpose",
    lambda m, x, a, b: x.transpose(a, b),
    lambda x, a, b: np.swapaxes(x, a, b),
    _shape_samples(
        ("2d", (3, 4), (0, 1), {}),
        ("3d", (2, 3, 2), (0, -1), {}),
        ("same", (3, 4), (1, 1), {}),
        ("empty", (0, 3), (0, 1), {}),
        ("noncontig", (2, 3), (1, 0), {}, True),
    ),
)
add(
    "permute",
    lambda m, x, *d: x.permute(*d),
    lambda x, *d: np.transpose(x, d),
    _shape_samples(
        ("3d", (2, 3, 2), (2, 0, 1), {}),
        ("neg", (2, 3, 2), (-1, 1, 0), {}),
        ("noncontig", (2, 3), (1, 0), {}, True),
    ),
)
add(
    "permute_tuple",
    lambda m, x, d: m.permute(x, d),
    lambda x, d: np.transpose(x, d),
    _shape_samples(
        ("3d", (2, 3, 2), ((1, 2, 0),), {}),
        ("identity", (3, 4), ((0, 1),), {}),
        ("0d", (), ((),), {}),
    ),
)
add(
    "t",
    lambda m, x: x.t(),
    lambda x: x.T,
    _shape_samples(
        ("2d", (3, 4), (), {}),
        ("1d", (4,), (), {}),
        ("0d", (), (), {}),
        ("noncontig", (2, 3), (), {}, True),
    ),
)
add(
    "T",
    lambda m, x: x.T,
    lambda x: x.T,
    _shape_samples(("2d", (3, 4), (), {}), ("noncontig", (2, 3), (), {}, True)),
)
add(
    "mT",
    lambda m, x: x.mT,
    lambda x: np.swapaxes(x, -1, -2),
    _shape_samples(
        ("3d", (2, 3, 2), (), {}), ("2d", (3, 4), (), {}), ("noncontig", (2, 3), (), {}, True)
    ),
)
add(
    "expand",
    lambda m, x, *s: x.expand(*s),
    lambda x, *s: np.broadcast_to(
        x, tuple(x.shape[i - len(s) + x.ndim] if v == -1 else v for i, v in enumerate(s))
    ),
    _shape_samples(
        ("bcast", (3, 1), (2, 3, 4), {}),
        ("minus1", (3, 1), (-1, 4), {}),
        ("0d", (), (3,), {}),
        ("empty", (1, 3), (0, 3), {}),
        ("noncontig", (2, 1), (2, 2, 3), {}, True),
    ),
)


def _expand_as_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 1)), uni(rng, (2, 3, 4))), name="bcast", nograd=frozenset({1})),
        S((uni(rng, ()), uni(rng, (2,))), name="0d", nograd=frozenset({1})),
    ]


add(
    "expand_as",
    lambda m, x, y: x.expand_as(y),
    lambda x, y: np.broadcast_to(x, y.shape),
    _expand_as_samples,
)
add(
    "broadcast_to",
    lambda m, x, s: m.broadcast_to(x, s),
    np.broadcast_to,
    _shape_samples(
        ("bcast", (3, 1), ((2, 3, 4),), {}),
        ("0d", (), ((2, 2),), {}),
        ("same", (2, 3), ((2, 3),), {}),
        ("noncontig", (2, 1), ((2, 3),), {}, True),
    ),
)
add(
    "narrow",
    lambda m, x, d, s, n: m.narrow(x, d, s, n),
    lambda x, d, s, n: np.take(x, range(s % x.shape[d], s % x.shape[d] + n), axis=d),
    _shape_samples(
        ("dim0", (4, 3), (0, 1, 2), {}),
        ("neg_start", (3, 4), (1, -3, 2), {}),
        ("empty", (3, 4), (1, 2, 0), {}),
        ("noncontig", (2, 3), (1, 1, 2), {}, True),
    ),
)
add(
    "select",
    lambda m, x, d, i: x.select(d, i),
    lambda x, d, i: np.take(x, i, axis=d),
    _shape_samples(
        ("dim0", (4, 3), (0, 1), {}),
        ("neg", (3, 4), (1, -1), {}),
        ("1d", (5,), (0, 2), {}),
        ("noncontig", (2, 3), (1, 2), {}, True),
    ),
)


def _split_ref(x: np.ndarray, size: Any, dim: int = 0) -> list:
    n = x.shape[dim]
    if isinstance(size, int):
        cuts = list(range(size, n, size))
    else:
        cuts = list(np.cumsum(size)[:-1])
    return np.split(x, cuts, axis=dim)


add(
    "split",
    lambda m, x, s, dim=0: m.split(x, s, dim=dim),
    _split_ref,
    _shape_samples(
        ("even", (4, 3), (2,), {}),
        ("uneven", (3, 5), (2,), {"dim": 1}),
        ("sections", (3, 4), ([1, 3],), {"dim": 1}),
        ("noncontig", (2, 3), (1,), {"dim": 1}, True),
    ),
)
add(
    "chunk",
    lambda m, x, c, dim=0: x.chunk(c, dim=dim),
    lambda x, c, dim=0: _split_ref(x, -(-x.shape[dim] // c), dim),
    _shape_samples(
        ("even", (4, 3), (2,), {}),
        ("uneven", (3, 5), (2,), {"dim": 1}),
        ("more_chunks", (3, 2), (5,), {}),
        ("noncontig", (2, 3), (3,), {"dim": 1}, True),
    ),
)
add(
    "unbind",
    lambda m, x, dim=0: x.unbind(dim),
    lambda x, dim=0: [np.take(x, i, axis=dim) for i in range(x.shape[dim])],
    _shape_samples(
        ("dim0", (3, 4), (), {}),
        ("dim1", (2, 3), (), {"dim": 1}),
        ("1d", (3,), (), {}),
        ("noncontig", (2, 3), (), {"dim": -1}, True),
    ),
)


def _cat_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S(([uni(rng, (2, 3)), uni(rng, (1, 3))],), {}, "dim0"),
        S(([uni(rng, (2, 1)), uni(rng, (2, 3)), uni(rng, (2, 2))],), {"dim": 1}, "dim1_three"),
        S(([uni(rng, (2, 3)), uni(rng, (0, 3))],), {}, "with_empty"),
        S(([uni(rng, (2, 3)), uni(rng, (0,))],), {}, "legacy_empty_1d"),
        S(([uni(rng, (2, 2))],), {"dim": -1}, "single"),
        S(([uni(rng, (2, 3)), uni(rng, (2, 3))],), {"dim": 1}, "noncontig", noncontig=True),
    ]


def _cat_ref(xs: list, dim: int = 0) -> np.ndarray:
    xs = [x for x in xs if not (x.ndim == 1 and x.shape[0] == 0)]
    return np.concatenate(xs, axis=dim)


add("cat", lambda m, xs, dim=0: m.cat(xs, dim=dim), _cat_ref, _cat_samples)


def _stack_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S(([uni(rng, (2, 3)), uni(rng, (2, 3))],), {}, "dim0"),
        S(([uni(rng, (2, 3)), uni(rng, (2, 3)), uni(rng, (2, 3))],), {"dim": 2}, "last"),
        S(([uni(rng, ()), uni(rng, ())],), {}, "0d"),
        S(([uni(rng, (0, 2)), uni(rng, (0, 2))],), {"dim": 1}, "empty"),
        S(([uni(rng, (2, 3)), uni(rng, (2, 3))],), {"dim": -1}, "noncontig", noncontig=True),
    ]


add(
    "stack",
    lambda m, xs, dim=0: m.stack(xs, dim=dim),
    lambda xs, dim=0: np.stack(xs, dim),
    _stack_samples,
)
add("contiguous", lambda m, x: x.contiguous(), lambda x: x, unary())
add("clone", lambda m, x: x.clone(), lambda x: x, unary())
add("detach", lambda m, x: x.detach(), lambda x: x, unary(), differentiable=False)
add(
    "flip",
    lambda m, x, d: x.flip(d),
    lambda x, d: np.flip(x, d),
    _shape_samples(
        ("dim0", (3, 4), ((0,),), {}),
        ("both", (3, 4), ((0, 1),), {}),
        ("neg", (2, 3, 2), ((-1,),), {}),
        ("empty", (0, 3), ((1,),), {}),
        ("noncontig", (2, 3), ((1,),), {}, True),
    ),
)
add(
    "roll",
    lambda m, x, s, d=None: m.roll(x, s, d),
    lambda x, s, d=None: np.roll(x, s, d),
    _shape_samples(
        ("dim", (3, 4), (1, 0), {}),
        ("neg", (3, 4), (-3, 1), {}),
        ("flat", (3, 4), (5,), {}),
        ("multi", (3, 4), ((1, 2), (0, 1)), {}),
        ("noncontig", (2, 3), (1, 1), {}, True),
    ),
)
add(
    "repeat",
    lambda m, x, *r: x.repeat(*r),
    lambda x, *r: np.tile(x, r),
    _shape_samples(
        ("2d", (2, 3), (2, 1), {}),
        ("more_dims", (2, 3), (2, 1, 2), {}),
        ("0d", (), (3,), {}),
        ("noncontig", (2, 3), (1, 2), {}, True),
    ),
)
add(
    "tile",
    lambda m, x, r: x.tile(r),
    np.tile,
    _shape_samples(
        ("2d", (2, 3), ((2, 1),), {}),
        ("short", (2, 3), ((2,),), {}),
        ("long", (3,), ((2, 2),), {}),
        ("noncontig", (2, 3), ((2, 1),), {}, True),
    ),
)
add(
    "pad",
    lambda m, x, p, **k: m.F.pad(x, p, **k),
    pad_ref,
    _shape_samples(
        ("constant", (3, 4), ((1, 2),), {}),
        ("constant_2d", (2, 3), ((1, 0, 2, 1),), {"value": 1.5}),
        ("constant_neg", (3, 4), ((-1, 2),), {}),
        ("reflect", (2, 5), ((2, 1),), {"mode": "reflect"}),
        ("reflect_2d", (1, 3, 4), ((1, 2, 2, 1),), {"mode": "reflect"}),
        ("replicate", (1, 2, 4), ((1, 2, 1, 0),), {"mode": "replicate"}),
        ("circular", (1, 2, 4), ((2, 1),), {"mode": "circular"}),
        ("noncontig", (2, 3), ((1, 1),), {"mode": "reflect"}, True),
    ),
)
add(
    "diagonal",
    lambda m, x, *a: x.diagonal(*a),
    lambda x, *a: np.diagonal(x, *a),
    _shape_samples(
        ("main", (3, 4), (), {}),
        ("offset", (3, 4), (1,), {}),
        ("neg_offset", (4, 3), (-2,), {}),
        ("3d", (2, 3, 3), (0, 1, 2), {}),
        ("3d_outer", (3, 2, 3), (-1, 0, 2), {}),
        ("empty", (3, 4), (5,), {}),
        ("noncontig", (2, 3), (), {}, True),
    ),
)
add(
    "tril",
    lambda m, x, k=0: m.tril(x, k),
    np.tril,
    _shape_samples(
        ("main", (3, 4), (), {}),
        ("k1", (3, 4), (1,), {}),
        ("k_neg", (4, 3), (-1,), {}),
        ("batched", (2, 3, 3), (), {}),
        ("noncontig", (2, 3), (), {}, True),
    ),
)
add(
    "triu",
    lambda m, x, k=0: x.triu(k),
    np.triu,
    _shape_samples(
        ("main", (3, 4), (), {}),
        ("k1", (3, 4), (1,), {}),
        ("k_neg", (4, 3), (-1,), {}),
        ("batched", (2, 3, 3), (), {}),
        ("noncontig", (2, 3), (), {}, True),
    ),
)

# indexing --------------------------------------------------------------------------------------
_getitem_cases: list[tuple[str, Callable, tuple, bool]] = [
    ("int", lambda x: x[1], (3, 4), False),
    ("neg_int", lambda x: x[-1, 2], (3, 4), False),
    ("int_1d", lambda x: x[2], (4,), False),
    ("slice", lambda x: x[1:3], (4, 3), False),
    ("slice_step", lambda x: x[::2, 1::2], (4, 5), False),
    ("slice_neg", lambda x: x[-3:-1, :-1], (4, 3), False),
    ("slice_out_of_range", lambda x: x[2:10], (4, 3), False),
    ("empty_slice", lambda x: x[2:1], (4, 3), False),
    ("none", lambda x: x[None, :, None], (3, 2), False),
    ("ellipsis", lambda x: x[..., 1], (2, 3, 2), False),
    ("ellipsis_none", lambda x: x[0, ..., None], (2, 3, 2), False),
    ("list", lambda x: x[[0, 2]], (3, 4), False),
    ("list_dup", lambda x: x[[0, 2, 0, 0]], (3, 4), False),
    ("list_2", lambda x: x[[0, 1], [1, 3]], (3, 4), False),
    ("empty_list", lambda x: x[[]], (3, 4), False),
    ("mixed_slice_list", lambda x: x[:, [2, 0, 2]], (3, 4), False),
    ("mixed_separated", lambda x: x[[0, 1], :, [1, 0]], (2, 3, 2), False),
    ("mixed_int_list", lambda x: x[1, [0, 2, 2]], (2, 3), False),
    ("0d_full", lambda x: x[()], (), False),
    ("0d_none", lambda x: x[None], (), False),
    ("noncontig", lambda x: x[1:, ::2], (3, 4), True),
    ("noncontig_adv", lambda x: x[[1, 1]], (2, 3), True),
]


def _getitem_entry(name: str, key: Callable, shape: tuple, noncontig: bool) -> None:
    def op(m: Lib, x: Any) -> Any:
        return key(x)

    def samples(rng: np.random.Generator) -> list[Sample]:
        return [S((uni(rng, shape),), name="case", noncontig=noncontig)]

    add(f"getitem_{name}", op, key, samples)


for _name, _key, _shape, _nc in _getitem_cases:
    _getitem_entry(_name, _key, _shape, _nc)


def _getitem_tensor_samples(rng: np.random.Generator) -> list[Sample]:
    x = uni(rng, (4, 3))
    return [
        S((x, np.array([3, 0, 3, 1])), name="int_tensor_dup"),
        S((x, np.array([[0, 1], [2, 0]])), name="int_tensor_2d"),
        S((x, np.array(2)), name="int_tensor_0d"),
        S((x, np.array([-1, -4])), name="negative"),
        S((x, np.array([True, False, True, True])), name="bool_rows"),
        S((x, x > 0), name="bool_full_mask"),
        S((uni(rng, (0, 3)), np.zeros((0,), dtype=np.int64)), name="empty"),
        S((uni(rng, (3, 2)), np.array([2, 0])), name="noncontig", noncontig=True),
    ]


add("getitem_tensor", lambda m, x, i: x[i], lambda x, i: x[i], _getitem_tensor_samples)


def _getitem_mixed_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), np.array([0, 3, 3])), name="slice_tensor"),
        S((uni(rng, (2, 4)), np.array([True, False, True, True])), name="slice_bool"),
    ]


add("getitem_mixed_tensor", lambda m, x, i: x[1:, i], lambda x, i: x[1:, i], _getitem_mixed_samples)


def _setitem_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), uni(rng, (4,)), 1), name="row"),
        S((uni(rng, (3, 4)), uni(rng, (3, 1)), (slice(None), slice(1, 3))), name="slice_bcast"),
        S((uni(rng, (3, 4)), 2.5, (slice(None), 0)), name="scalar"),
        S((uni(rng, (4, 3)), uni(rng, (2, 3)), np.array([0, 2])), name="int_tensor"),
        S(
            (uni(rng, (2, 3)), uni(rng, ()), np.array([[True, False, True], [False, True, True]])),
            name="bool_mask",
        ),
    ]


add("setitem", lambda m, x, v, key: setitem_op(m, x, v, key), setitem_ref, _setitem_samples)


def _gather_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), 1, rng.integers(0, 4, (3, 5))), name="dim1_dup"),
        S((uni(rng, (3, 4)), 0, rng.integers(0, 3, (2, 4))), name="dim0"),
        S((uni(rng, (3, 4)), -1, rng.integers(0, 4, (2, 2))), name="smaller_index"),
        S((uni(rng, (3, 4)), 1, np.zeros((3, 0), dtype=np.int64)), name="empty_index"),
        S((uni(rng, (2, 3)), 0, rng.integers(0, 2, (2, 3))), name="noncontig", noncontig=True),
    ]


add("gather", lambda m, x, d, i: x.gather(d, i), gather_ref, _gather_samples)
add(
    "take_along_dim",
    lambda m, x, d, i: m.take_along_dim(x, i, dim=d),
    lambda x, d, i: np.take_along_axis(x, i, axis=d),
    lambda rng: [
        S((uni(rng, (3, 4)), 1, rng.integers(0, 4, (3, 2))), name="dim1"),
        S((uni(rng, (3, 4)), 0, rng.integers(0, 3, (1, 4))), name="bcast_index"),
        S((uni(rng, (2, 3)), 1, rng.integers(0, 3, (2, 2))), name="noncontig", noncontig=True),
    ],
)
add(
    "take_along_dim_flat",
    lambda m, x, i: m.take_along_dim(x, i),
    lambda x, i: np.take(x.reshape(-1), i.reshape(-1)),
    lambda rng: [S((uni(rng, (3, 4)), rng.integers(0, 12, (5,))), name="flat")],
)


def _scatter_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), 1, perm_index(rng, (3, 2), 1, 4), uni(rng, (3, 2))), name="dim1"),
        # torch's own backward rejects a src larger than index ("invalid gradient at index 1")
        S(
            (uni(rng, (3, 4)), 0, perm_index(rng, (2, 4), 0, 3), uni(rng, (3, 4))),
            name="dim0_bigger_src",
            torch=False,
        ),
        S((uni(rng, (3, 4)), 1, perm_index(rng, (2, 3), 1, 4), 1.5), name="scalar_src"),
        S(
            (uni(rng, (2, 3)), 1, perm_index(rng, (2, 2), 1, 3), uni(rng, (2, 2))),
            name="noncontig",
            noncontig=True,
        ),
    ]


def _scatter_add_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), 1, rng.integers(0, 4, (3, 5)), uni(rng, (3, 5))), name="dim1_dup"),
        S(
            (uni(rng, (3, 4)), 0, rng.integers(0, 3, (2, 4)), uni(rng, (3, 4))),
            name="dim0_bigger_src",
            torch=False,
        ),
        S(
            (uni(rng, (2, 3)), 1, rng.integers(0, 3, (2, 4)), uni(rng, (2, 4))),
            name="noncontig",
            noncontig=True,
        ),
    ]


add("scatter", lambda m, x, d, i, s: x.scatter(d, i, s), scatter_ref, _scatter_samples)
add(
    "scatter_add",
    lambda m, x, d, i, s: m.scatter_add(x, d, i, s),
    scatter_add_ref,
    _scatter_add_samples,
)
add(
    "index_select",
    lambda m, x, d, i: m.index_select(x, d, i),
    lambda x, d, i: np.take(x, i.reshape(-1), axis=d),
    lambda rng: [
        S((uni(rng, (3, 4)), 1, np.array([3, 0, 3])), name="dim1_dup"),
        S((uni(rng, (3, 4)), 0, np.array([2])), name="dim0"),
        S((uni(rng, (3, 4)), 0, np.array(1)), name="0d_index"),
        S((uni(rng, (3, 4)), -1, np.zeros(0, dtype=np.int64)), name="empty_index"),
        S((uni(rng, (2, 3)), 1, np.array([2, 2, 0])), name="noncontig", noncontig=True),
    ],
)


def _masked_fill_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), boolean(rng, (3, 4)), 0.5), name="scalar"),
        S((uni(rng, (3, 4)), boolean(rng, (4,)), -1.0), name="bcast_mask"),
        S((uni(rng, (3, 4)), boolean(rng, (3, 4)), uni(rng, ())), name="tensor_value"),
        S((uni(rng, (2, 3)), boolean(rng, (2, 3)), 2.0), name="noncontig", noncontig=True),
    ]


add(
    "masked_fill",
    lambda m, x, mask, v: x.masked_fill(mask, v),
    lambda x, mask, v: np.where(mask, v, x),
    _masked_fill_samples,
)
add(
    "masked_select",
    lambda m, x, mask: m.masked_select(x, mask),
    lambda x, mask: np.broadcast_to(x, np.broadcast_shapes(x.shape, mask.shape))[
        np.broadcast_to(mask, np.broadcast_shapes(x.shape, mask.shape))
    ],
    lambda rng: [
        S((uni(rng, (3, 4)), boolean(rng, (3, 4))), name="same"),
        S((uni(rng, (3, 1)), boolean(rng, (3, 4))), name="bcast_input"),
        S((uni(rng, (2, 3)), boolean(rng, (3,))), name="bcast_mask"),
        S((uni(rng, (2, 3)), boolean(rng, (2, 3))), name="noncontig", noncontig=True),
    ],
)
add(
    "one_hot",
    lambda m, i, n=-1: m.F.one_hot(i, n),
    lambda i, n=-1: np.eye(n if n >= 0 else i.max() + 1, dtype=np.int64)[i],
    lambda rng: [
        S((rng.integers(0, 4, (3,)), 5), name="explicit"),
        S((rng.integers(0, 3, (2, 3)),), name="inferred"),
        S((np.array(2),), name="0d"),
    ],
    differentiable=False,
)


def _embedding_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((rng.integers(0, 5, (2, 3)), uni(rng, (5, 3))), name="2d_dup"),
        S((np.array([4, 0, 4]), uni(rng, (5, 2))), name="1d"),
        S(
            (np.array([1, 2, 1]), uni(rng, (4, 2))), {"padding_idx": 1}, "padding_idx", grad=False
        ),  # padding rows get no gradient by definition: torch check only
    ]


def _embedding_ref(i: np.ndarray, w: np.ndarray, padding_idx: Any = None) -> np.ndarray:
    return w[i]


add("embedding", lambda m, i, w, **k: m.F.embedding(i, w, **k), _embedding_ref, _embedding_samples)
# the fused backward kernel (``embedding_backward``) runs where no graph of the gradient is
# wanted: a first-order entry reaches it (the entry above differentiates its composite form)
add(
    "embedding_first_order",
    lambda m, i, w, **k: m.F.embedding(i, w, **k),
    _embedding_ref,
    _embedding_samples,
    twice=False,
)

# linear algebra --------------------------------------------------------------------------------


def _matmul_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3,)), uni(rng, (3,))), name="1d_1d"),
        S((uni(rng, (2, 3)), uni(rng, (3,))), name="2d_1d"),
        S((uni(rng, (3,)), uni(rng, (3, 2))), name="1d_2d"),
        S((uni(rng, (2, 3)), uni(rng, (3, 4))), name="2d_2d"),
        S((uni(rng, (2, 2, 3)), uni(rng, (2, 3, 2))), name="batched"),
        S((uni(rng, (2, 1, 2, 3)), uni(rng, (3, 3, 2))), name="bcast_batch"),
        S((uni(rng, (2, 2, 3)), uni(rng, (3,))), name="batched_1d"),
        S((uni(rng, (3,)), uni(rng, (2, 3, 2))), name="1d_batched"),
        S((uni(rng, (0, 3)), uni(rng, (3, 2))), name="empty"),
        S((uni(rng, (2, 0)), uni(rng, (0, 3))), name="empty_inner"),
        S((uni(rng, (3, 2)), uni(rng, (2, 3))), name="noncontig", noncontig=True),
    ]


add("matmul", lambda m, a, b: a @ b, np.matmul, _matmul_samples)
add("matmul_fn", lambda m, a, b: m.matmul(a, b), np.matmul, lambda rng: _matmul_samples(rng)[:6])
add(
    "mm",
    lambda m, a, b: m.mm(a, b),
    np.matmul,
    lambda rng: [
        S((uni(rng, (2, 3)), uni(rng, (3, 4))), name="2d"),
        S((uni(rng, (3, 2)), uni(rng, (2, 3))), name="noncontig", noncontig=True),
    ],
)
add(
    "bmm",
    lambda m, a, b: a.bmm(b),
    np.matmul,
    lambda rng: [
        S((uni(rng, (2, 2, 3)), uni(rng, (2, 3, 2))), name="3d"),
        S((uni(rng, (2, 3, 2)), uni(rng, (2, 2, 2))), name="noncontig", noncontig=True),
    ],
)
add(
    "dot",
    lambda m, a, b: m.dot(a, b),
    np.dot,
    lambda rng: [
        S((uni(rng, (4,)), uni(rng, (4,))), name="1d"),
        S((uni(rng, (0,)), uni(rng, (0,))), name="empty"),
        S((uni(rng, (3,)), uni(rng, (3,))), name="noncontig", noncontig=True),
    ],
)
add(
    "outer",
    lambda m, a, b: m.outer(a, b),
    np.outer,
    lambda rng: [
        S((uni(rng, (3,)), uni(rng, (4,))), name="1d"),
        S((uni(rng, (3,)), uni(rng, (2,))), name="noncontig", noncontig=True),
    ],
)


def _cdist_ref(a: np.ndarray, b: np.ndarray, p: float = 2.0, compute_mode: str = "") -> np.ndarray:
    diff = np.abs(a[..., :, None, :] - b[..., None, :, :])
    if p == 0:
        return (diff != 0).sum(-1).astype(a.dtype)
    if p == math.inf:
        return diff.max(-1)
    return (diff**p).sum(-1) ** (1.0 / p)


def _cdist_samples(rng: np.random.Generator) -> list[Sample]:
    mm = "use_mm_for_euclid_dist"
    return [
        S((uni(rng, (3, 4)), uni(rng, (5, 4))), {}, "p2"),
        S((uni(rng, (2, 3, 4)), uni(rng, (2, 2, 4))), {"compute_mode": mm}, "p2_mm"),
        S((uni(rng, (27, 2)), uni(rng, (3, 2))), {}, "p2_mm_if_necessary"),
        S((away(rng, (3, 2)), away(rng, (4, 2)) + 5.0), {"p": 1.0}, "p1"),
        S((uni(rng, (3, 3)), uni(rng, (2, 3))), {"p": 3.0}, "p3"),
        S((uni(rng, (3, 3)), uni(rng, (2, 3))), {"p": 0.5}, "p_half", gradgrad=False),
        S((uni(rng, (3, 3)), uni(rng, (2, 3))), {"p": math.inf}, "pinf"),
        S((uni(rng, (3, 3)), uni(rng, (2, 3))), {"p": 0.0}, "p0"),
        S((uni(rng, (2, 1, 3, 2)), uni(rng, (4, 2, 2))), {}, "batch_bcast"),
        S((uni(rng, (0, 3)), uni(rng, (2, 3))), {}, "empty"),
        S((uni(rng, (3, 2)), uni(rng, (2, 2))), {}, "noncontig", noncontig=True),
    ]


add("cdist", lambda m, a, b, **k: m.cdist(a, b, **k), _cdist_ref, _cdist_samples)


def _searchsorted_ref(seq: np.ndarray, v: Any, **kw: Any) -> np.ndarray:
    right = kw.get("right", False) or kw.get("side") == "right"
    side = "right" if right else "left"
    dt = np.int64  # (out_int32: tests/ops/test_search.py; the table expects int64 indices)
    if kw.get("sorter") is not None:
        seq = np.take_along_axis(seq, kw["sorter"], -1)
    if seq.ndim == 1:
        return np.searchsorted(seq, v, side=side).astype(dt)
    flat_s, flat_v = seq.reshape(-1, seq.shape[-1]), v.reshape(-1, v.shape[-1])
    out = [np.searchsorted(r, w, side=side) for r, w in zip(flat_s, flat_v)]
    return np.asarray(out, dt).reshape(v.shape)


def _searchsorted_samples(rng: np.random.Generator) -> list[Sample]:
    seq = np.sort(intvals(rng, (6,)))
    rows = np.sort(intvals(rng, (2, 3, 5)), -1)
    unsorted = intvals(rng, (5,))
    return [
        S((seq, intvals(rng, (3, 4))), {}, "1d_left"),
        S((seq, intvals(rng, (7,))), {"right": True}, "right"),
        S((seq, intvals(rng, (7,))), {"side": "right"}, "side"),
        S((rows, intvals(rng, (2, 3, 4))), {}, "batched"),
        S(
            (unsorted, intvals(rng, (4,))),
            {"sorter": np.argsort(unsorted, kind="stable")},
            "sorter",
        ),
        S((np.sort(ints(rng, (5,))), intvals(rng, (3,))), {}, "int_seq_float_values"),
        S((seq, 0.5), {}, "scalar_value"),
        S((seq, uni(rng, (0,))), {}, "empty"),
    ]


add(
    "searchsorted",
    lambda m, seq, v, **k: m.searchsorted(seq, v, **k),
    _searchsorted_ref,
    _searchsorted_samples,
    differentiable=False,
)


def _bucketize_samples(rng: np.random.Generator) -> list[Sample]:
    bounds = np.sort(intvals(rng, (5,)))
    return [
        S((intvals(rng, (3, 4)), bounds), {}, "left"),
        S((intvals(rng, (6,)), bounds), {"right": True}, "right"),
        S((uni(rng, (2, 3)), bounds), {}, "noncontig", noncontig=True),
    ]


add(
    "bucketize",
    lambda m, x, b, **k: m.bucketize(x, b, **k),
    lambda x, b, **k: _searchsorted_ref(b, x, **k),
    _bucketize_samples,
    differentiable=False,
)


def _histc_ref(x: np.ndarray, bins: int = 100, min: float = 0, max: float = 0) -> np.ndarray:
    lo, hi = float(min), float(max)
    if lo == hi and x.size:
        lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts, _ = np.histogram(x.reshape(-1), bins=bins, range=(lo, hi))
    return counts.astype(x.dtype)


def _histc_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (4, 5)),), {}, "default"),
        S((uni(rng, (20,)),), {"bins": 7}, "data_range"),
        S((uni(rng, (3, 6)),), {"bins": 5, "min": -1.0, "max": 1.0}, "range_clips"),
        S((np.full((4,), 0.5),), {"bins": 4}, "point"),
        S((uni(rng, (0,)),), {"bins": 3}, "empty"),
        S((uni(rng, (3, 4)),), {"bins": 6}, "noncontig", noncontig=True),
    ]


add(
    "histc",
    lambda m, x, **k: x.histc(**k),
    _histc_ref,
    _histc_samples,
    differentiable=False,
)


def _addmm_ref(c: np.ndarray, a: np.ndarray, b: np.ndarray, beta: float = 1, alpha: float = 1):
    return (beta * c if beta != 0 else 0.0) + alpha * (a @ b)


add(
    "addmm",
    lambda m, c, a, b, **k: m.addmm(c, a, b, **k),
    _addmm_ref,
    lambda rng: [
        S((uni(rng, (2, 4)), uni(rng, (2, 3)), uni(rng, (3, 4))), name="full"),
        S((uni(rng, (4,)), uni(rng, (2, 3)), uni(rng, (3, 4))), name="bcast"),
        S((uni(rng, ()), uni(rng, (2, 3)), uni(rng, (3, 4))), {"beta": 0.5, "alpha": 2.0}, "0d"),
        S((uni(rng, (2, 4)), uni(rng, (2, 0)), uni(rng, (0, 4))), name="empty_inner"),
        S((uni(rng, (1, 4)), uni(rng, (2, 3)), uni(rng, (3, 4))), {"beta": 0}, "beta0"),
        S((uni(rng, (2, 2)), uni(rng, (2, 3)), uni(rng, (3, 2))), name="noncontig", noncontig=True),
    ],
)
add(
    "Tensor.addmm",
    lambda m, c, a, b, **k: c.addmm(a, b, **k),
    _addmm_ref,
    lambda rng: [
        S((uni(rng, (2, 4)), uni(rng, (2, 3)), uni(rng, (3, 4))), {"alpha": -1.5}, "alpha"),
    ],
)
add(
    "baddbmm",
    lambda m, c, a, b, **k: m.baddbmm(c, a, b, **k),
    _addmm_ref,
    lambda rng: [
        S((uni(rng, (2, 2, 4)), uni(rng, (2, 2, 3)), uni(rng, (2, 3, 4))), name="full"),
        S(
            (uni(rng, (1, 4)), uni(rng, (2, 2, 3)), uni(rng, (2, 3, 4))),
            {"beta": 0.5, "alpha": 2.0},
            "bcast",
        ),
        S(
            (uni(rng, (2, 2, 2)), uni(rng, (2, 2, 3)), uni(rng, (2, 3, 2))),
            name="noncontig",
            noncontig=True,
        ),
    ],
)
add(
    "addbmm",
    lambda m, c, a, b, **k: c.addbmm(a, b, **k),
    lambda c, a, b, beta=1, alpha=1: (
        _addmm_ref(c, a, b, beta, alpha).sum(0)
        - (beta * c if beta != 0 else 0.0) * (a.shape[0] - 1)
    ),
    lambda rng: [
        S((uni(rng, (2, 4)), uni(rng, (3, 2, 3)), uni(rng, (3, 3, 4))), name="full"),
        S(
            (uni(rng, (4,)), uni(rng, (3, 2, 3)), uni(rng, (3, 3, 4))),
            {"beta": 2.0, "alpha": 0.5},
            "bcast",
        ),
    ],
)


def _cross_ref(a: np.ndarray, b: np.ndarray, dim: int = -1) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    return np.moveaxis(np.cross(np.moveaxis(a, dim, -1), np.moveaxis(b, dim, -1)), -1, dim)


add(
    "cross",
    lambda m, a, b, **k: m.cross(a, b, **k),
    _cross_ref,
    lambda rng: [
        S((uni(rng, (3,)), uni(rng, (3,))), name="1d"),
        S((uni(rng, (2, 3)), uni(rng, (1, 3))), {"dim": 1}, "bcast"),
        S((uni(rng, (3, 2)), uni(rng, (3, 2))), {"dim": 0}, "dim0"),
        S((uni(rng, (0, 3)), uni(rng, (0, 3))), {"dim": -1}, "empty"),
        S((uni(rng, (2, 3)), uni(rng, (2, 3))), {"dim": -1}, "noncontig", noncontig=True),
    ],
    # torch.cross's default dim is the first of size 3 (deprecated); fusegrad's is -1, as
    # torch.linalg.cross's
    torch_op=lambda m, a, b, dim=-1: m.linalg.cross(a, b, dim=dim),
)
add(
    "Tensor.cross",
    lambda m, a, b, **k: a.cross(b, **k),
    _cross_ref,
    lambda rng: [S((uni(rng, (2, 3)), uni(rng, (2, 3))), {"dim": 1}, "dim")],
)


def _diff_ref(x, n=1, dim=-1, prepend=None, append=None):  # type: ignore[no-untyped-def]
    ends = {k: v for k, v in (("prepend", prepend), ("append", append)) if v is not None}
    return np.diff(x, n, axis=dim, **ends) if n else x


add(
    "diff",
    lambda m, x, **k: m.diff(x, **k),
    _diff_ref,
    lambda rng: [
        S((uni(rng, (5,)),), name="1d"),
        S((uni(rng, (3, 4)),), {"dim": 0}, "dim0"),
        S((uni(rng, (3, 5)),), {"n": 2}, "n2"),
        S((uni(rng, (3,)),), {"n": 0}, "n0"),
        S((uni(rng, (3,)),), {"n": 5}, "n_past_length"),
        S(
            (uni(rng, (2, 3)),),
            {"prepend": uni(rng, (2, 1)), "append": uni(rng, (2, 2))},
            "prepend_append",
        ),
        S((uni(rng, (0, 3)),), {"dim": 0}, "empty"),
        S((uni(rng, (3, 4)),), {"dim": 1}, "noncontig", noncontig=True),
    ],
)
add(
    "Tensor.diff",
    lambda m, x, **k: x.diff(**k),
    _diff_ref,
    lambda rng: [S((uni(rng, (3, 4)),), {"n": 2, "dim": 1}, "n2")],
)


def _cumprod_samples(rng: np.random.Generator) -> list[Sample]:
    one_zero = uni(rng, (3, 4))
    one_zero[1, 2] = 0.0
    two_zeros = uni(rng, (2, 5))
    two_zeros[0, 1] = two_zeros[0, 3] = 0.0
    first_zero = uni(rng, (4,))
    first_zero[0] = 0.0
    return [
        S((uni(rng, (3, 4)),), {"dim": 1}, "dim1"),
        S((uni(rng, (3, 4)),), {"dim": 0}, "dim0"),
        S((uni(rng, (2, 3, 2)),), {"dim": -2}, "3d"),
        S((one_zero,), {"dim": 1}, "one_zero"),
        S((one_zero,), {"dim": 0}, "one_zero_dim0"),
        S((two_zeros,), {"dim": 1}, "two_zeros"),
        S((first_zero,), {"dim": 0}, "first_zero"),
        S((uni(rng, ()),), {"dim": 0}, "0d"),
        S((uni(rng, (0, 3)),), {"dim": 1}, "empty"),
        S((uni(rng, (3, 4)),), {"dim": 1}, "noncontig", noncontig=True),
    ]


add(
    "cumprod",
    lambda m, x, dim: x.cumprod(dim),
    lambda x, dim: np.cumprod(x, axis=dim) if x.ndim else x.copy(),
    _cumprod_samples,
)
add(
    "torch.cumprod",
    lambda m, x, dim: m.cumprod(x, dim=dim),
    lambda x, dim: np.cumprod(x, axis=dim),
    lambda rng: [S((uni(rng, (3, 4)),), {"dim": 1}, "dim1")],
)


def _logcumsumexp_ref(x: np.ndarray, dim: int) -> np.ndarray:
    if x.ndim == 0:
        return x.copy()
    return np.logaddexp.accumulate(x, axis=dim)


def _logcumsumexp_samples(rng: np.random.Generator) -> list[Sample]:
    spread = uni(rng, (2, 6))
    spread[:, 0] -= 800.0  # a prefix far below the row's maximum: log(cumsum(exp)) underflows
    return [
        S((uni(rng, (3, 5)), 1), {}, "dim1"),
        S((uni(rng, (4, 3)), 0), {}, "dim0"),
        S((uni(rng, (2, 9, 2)), 1), {}, "3d_9"),
        S((uni(rng, (2, 3)) + 500.0, 1), {}, "large"),
        S((spread, 1), {}, "spread"),
        S((uni(rng, ()), 0), {}, "0d"),
        S((uni(rng, (0, 3)), 1), {}, "empty"),
        S((uni(rng, (3, 4)), 1), {}, "noncontig", noncontig=True),
    ]


add(
    "logcumsumexp",
    lambda m, x, dim: m.logcumsumexp(x, dim),
    _logcumsumexp_ref,
    _logcumsumexp_samples,
)
add(
    "Tensor.logcumsumexp",
    lambda m, x, dim: x.logcumsumexp(dim),
    _logcumsumexp_ref,
    lambda rng: [S((uni(rng, (3, 4)), -1), {}, "last")],
)


def _sinc_ref(x: np.ndarray) -> np.ndarray:
    return np.sinc(x)


add(
    "sinc",
    lambda m, x: m.sinc(x),
    _sinc_ref,
    lambda rng: [
        S((uni(rng, (3, 4)),), name="2d"),
        S((np.array([0.0, 1.0, -2.0, 0.5]),), name="zero_and_integers", gradgrad=False),
        S((uni(rng, ()),), name="0d"),
        S((uni(rng, (0, 2)),), name="empty"),
        S((uni(rng, (2, 3)),), name="noncontig", noncontig=True),
    ],
)
add(
    "Tensor.sinc",
    lambda m, x: x.sinc(),
    _sinc_ref,
    lambda rng: [S((uni(rng, (3,)),), name="1d")],
)


def _repeat_interleave_ref(x, repeats, dim=None, output_size=None):  # type: ignore[no-untyped-def]
    return np.repeat(x, repeats, axis=dim)


add(
    "repeat_interleave",
    lambda m, x, r, **k: m.repeat_interleave(x, r, **k),
    _repeat_interleave_ref,
    lambda rng: [
        S((uni(rng, (2, 3)), 2), name="int_flat"),
        S((uni(rng, (2, 3)), 3), {"dim": 1}, "int_dim"),
        S((uni(rng, (3, 2)), np.array([1, 0, 2])), {"dim": 0}, "tensor"),
        S((uni(rng, (3, 2)), np.array([2, 1])), {"dim": -1, "output_size": 3}, "output_size"),
        S((uni(rng, (2, 2)), np.array(2)), {"dim": 0}, "tensor_0d"),
        S((uni(rng, ()), 3), name="0d"),
        S((uni(rng, (0, 2)), 2), {"dim": 0}, "empty"),
        S((uni(rng, (2, 3)), 2), {"dim": 0}, "noncontig", noncontig=True),
    ],
)
add(
    "Tensor.repeat_interleave",
    lambda m, x, r, **k: x.repeat_interleave(r, **k),
    _repeat_interleave_ref,
    lambda rng: [
        S((uni(rng, (2, 3)), np.array([1, 2])), {"dim": 0, "output_size": 3}, "output_size"),
        S((uni(rng, (2, 3)), np.array([1, 2])), {"dim": 0}, "tensor"),
    ],
)


def _einsum_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S(("ij,jk->ik", uni(rng, (2, 3)), uni(rng, (3, 4))), name="matmul"),
        S(("bij,bjk->bik", uni(rng, (2, 2, 3)), uni(rng, (2, 3, 2))), name="batch"),
        S(("ii->", uni(rng, (3, 3))), name="trace"),
        S(("ii->i", uni(rng, (3, 3))), name="diag"),
        S(("ij->ji", uni(rng, (2, 3))), name="transpose"),
        S(("ij", uni(rng, (2, 3))), name="implicit_identity"),
        S(("ji", uni(rng, (2, 3))), name="implicit_transpose"),
        S(("ij->", uni(rng, (2, 3))), name="sum_all"),
        S(("...ij,...jk->...ik", uni(rng, (2, 2, 3)), uni(rng, (3, 2))), name="ellipsis"),
        S(("i...->...", uni(rng, (3, 2, 2))), name="ellipsis_sum"),
        S(("ij,jk,kl->il", uni(rng, (2, 3)), uni(rng, (3, 2)), uni(rng, (2, 2))), name="three"),
        S(("i,j->ij", uni(rng, (3,)), uni(rng, (4,))), name="outer"),
        S(("i,i->", uni(rng, (4,)), uni(rng, (4,))), name="dot"),
        S(("bi,bi->b", uni(rng, (3, 2)), uni(rng, (3, 2))), name="batch_dot"),
        S(("ij,kj->ik", uni(rng, (2, 3)), uni(rng, (4, 3))), name="transposed_rhs"),
        S(("ij,ij->ij", uni(rng, (2, 3)), uni(rng, (2, 3))), name="hadamard"),
        S(("ij,jk->ik", uni(rng, (3, 2)), uni(rng, (2, 3))), name="noncontig", noncontig=True),
        S(("ab,ab->", uni(rng, (2, 1)), uni(rng, (2, 3))), name="bcast_contracted"),
        S(("ab,ab->ab", uni(rng, (1, 3)), uni(rng, (2, 3))), name="bcast_batch"),
        S(("...i,...i->...", uni(rng, (2, 3, 2)), uni(rng, (3, 2))), name="ellipsis_bcast"),
        S(("ii...->i...", uni(rng, (3, 3, 2))), name="diag_ellipsis"),
        S(("i,i,i->", uni(rng, (4,)), uni(rng, (4,)), uni(rng, (4,))), name="three_way"),
    ]


add("einsum", lambda m, eq, *ops: m.einsum(eq, *ops), np.einsum, _einsum_samples)


def _linear_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (2, 3)), uni(rng, (4, 3)), uni(rng, (4,))), name="bias"),
        S((uni(rng, (2, 3)), uni(rng, (4, 3))), name="no_bias"),
        S((uni(rng, (2, 2, 3)), uni(rng, (2, 3)), uni(rng, (2,))), name="3d_input"),
        S((uni(rng, (3,)), uni(rng, (2, 3)), uni(rng, (2,))), name="1d_input"),
        S((uni(rng, (2, 3)), uni(rng, (2, 3)), uni(rng, (2,))), name="noncontig", noncontig=True),
    ]


add(
    "linear",
    lambda m, x, w, b=None: m.F.linear(x, w, b),
    lambda x, w, b=None: x @ w.T + (0 if b is None else b),
    _linear_samples,
)

# in-place variants (on a non-leaf copy, so that gradients reach the leaves) ------------------


def _inplace_samples(gen_a: Gen = uni, gen_b: Gen = uni) -> Callable:
    gen_a, gen_b = _arrays(gen_a), _arrays(gen_b)

    def make(rng: np.random.Generator) -> list[Sample]:
        return [
            S((gen_a(rng, (3, 4)), gen_b(rng, (3, 4))), name="same"),
            S((gen_a(rng, (3, 4)), gen_b(rng, (4,))), name="bcast_other"),
            S((gen_a(rng, (2, 3)), float(gen_b(rng, ()))), name="scalar"),
            S((gen_a(rng, ()), gen_b(rng, ())), name="0d"),
            S((gen_a(rng, (2, 3)), gen_b(rng, (2, 3))), name="noncontig", noncontig=True),
        ]

    return make


for _name, _fn, _ref, _gens in [
    ("add_", lambda m, a, b: (a * 1.0).add_(b), np.add, (uni, uni)),
    (
        "add_alpha_",
        lambda m, a, b: (a * 1.0).add_(b, alpha=-2.0),
        lambda a, b: a - 2 * b,
        (uni, uni),
    ),
    ("sub_", lambda m, a, b: (a * 1.0).sub_(b), np.subtract, (uni, uni)),
    ("mul_", lambda m, a, b: (a * 1.0).mul_(b), np.multiply, (uni, uni)),
    ("div_", lambda m, a, b: (a * 1.0).div_(b), np.divide, (uni, away)),
    ("pow_", lambda m, a, b: (a * 1.0).pow_(b), np.power, (pos, uni)),
    ("iadd", lambda m, a, b: _iadd(a * 1.0, b), np.add, (uni, uni)),
    ("imul", lambda m, a, b: _imul(a * 1.0, b), np.multiply, (uni, uni)),
    (
        "copy_",
        lambda m, a, b: (a * 1.0).copy_(b),
        lambda a, b: np.broadcast_to(b, np.shape(a)),
        (uni, uni),
    ),
    (
        "lerp_",
        lambda m, a, b: (a * 1.0).lerp_(b, 0.25),
        lambda a, b: a + 0.25 * (b - a),
        (uni, uni),
    ),
]:
    add(_name, _fn, _ref, _inplace_samples(*_gens))
# torch's lerp_ takes no Python number as ``end``
OPS[-1].torch_op = lambda m, a, b: (a * 1.0).lerp_(
    b if not isinstance(b, float) else m.full_like(a, b), 0.25
)
# PyTorch's atan2_ and hypot_ take tensors only
for _name, _fn, _ref in [
    ("atan2_", lambda m, a, b: (a * 1.0).atan2_(b), np.arctan2),
    ("hypot_", lambda m, a, b: (a * 1.0).hypot_(b), np.hypot),
]:
    add(
        _name,
        _fn,
        _ref,
        lambda rng: [s for s in _inplace_samples(away, away)(rng) if s.name != "scalar"],
    )


def _iadd(a: Any, b: Any) -> Any:
    a += b
    return a


def _imul(a: Any, b: Any) -> Any:
    a *= b
    return a


for _name, _fn, _ref, _gen in [
    ("exp_", lambda m, x: (x * 1.0).exp_(), np.exp, uni),
    ("sigmoid_", lambda m, x: (x * 1.0).sigmoid_(), sigmoid_ref, uni),
    ("tanh_", lambda m, x: (x * 1.0).tanh_(), np.tanh, uni),
    ("sqrt_", lambda m, x: (x * 1.0).sqrt_(), np.sqrt, pos),
    ("relu_", lambda m, x: (x * 1.0).relu_(), lambda x: np.maximum(x, 0), away),
    ("clamp_", lambda m, x: (x * 1.0).clamp_(-0.5, 0.8), lambda x: np.clip(x, -0.5, 0.8), uni),
    ("neg_", lambda m, x: (x * 1.0).neg_(), np.negative, uni),
    ("fill_", lambda m, x: (x * 1.0).fill_(1.5), lambda x: np.full(np.shape(x), 1.5), uni),
    ("zero_", lambda m, x: (x * 1.0).zero_(), np.zeros_like, uni),
]:
    add(_name, _fn, _ref, unary(_gen))
add(
    "masked_fill_",
    lambda m, x, mask, v: (x * 1.0).masked_fill_(mask, v),
    lambda x, mask, v: np.where(mask, v, x),
    _masked_fill_samples,
)
add(
    "scatter_add_",
    lambda m, x, d, i, s: (x * 1.0).scatter_add_(d, i, s),
    scatter_add_ref,
    _scatter_add_samples,
)

# nn.functional ---------------------------------------------------------------------------------


def _ce_samples(rng: np.random.Generator) -> list[Sample]:
    tgt = np.array([0, 3, 1, 3])
    probs = softmax_ref(uni(rng, (4, 4)), 1)
    return [
        S((uni(rng, (4, 4)), tgt), name="indices"),
        S((uni(rng, (4, 4)), tgt), {"reduction": "sum"}, "sum"),
        S((uni(rng, (4, 4)), tgt), {"reduction": "none"}, "none"),
        S(
            (uni(rng, (4, 4)), tgt),
            {"weight": pos(rng, (4,))},
            "weight",
            nograd=frozenset({"weight"}),
        ),
        S((uni(rng, (4, 4)), np.array([0, -100, 1, 2])), name="ignore_index"),
        S((uni(rng, (4, 4)), np.array([0, 2, 2, 1])), {"ignore_index": 2}, "ignore_index_2"),
        S((uni(rng, (4, 4)), tgt), {"label_smoothing": 0.2}, "label_smoothing"),
        S(
            (uni(rng, (4, 4)), np.array([0, -100, 1, 2])),
            {"label_smoothing": 0.1, "weight": pos(rng, (4,))},
            "smoothing_weight_ignore",
            nograd=frozenset({"weight"}),
        ),
        S((uni(rng, (4, 4)), probs), name="probabilities", nograd=frozenset({1})),
        S(
            (uni(rng, (4, 4)), probs),
            {"label_smoothing": 0.3, "weight": pos(rng, (4,))},
            "probabilities_smoothing_weight",
            nograd=frozenset({1, "weight"}),
        ),
        S((uni(rng, (2, 3, 2)), np.array([[0, 2], [1, 1]])), name="spatial"),
        S((uni(rng, (3,)), np.array(1)), name="unbatched"),
        S((uni(rng, (3,)), np.array(1)), {"label_smoothing": 0.2}, "unbatched_smoothing"),
        # every target ignored: the loss is nan (0/0) but the gradient is 0, as in PyTorch
        S((uni(rng, (2, 3)), np.array([-100, -100])), name="all_ignored", grad=False),
        S(
            (uni(rng, (2, 3)), np.array([-100, -100])),
            {"label_smoothing": 0.1},
            "all_ignored_smoothing",
            grad=False,
        ),
        S(
            (uni(rng, (2, 4, 3)), np.array([[0, 3, 1], [2, 2, -100]])),
            {"weight": pos(rng, (4,)), "label_smoothing": 0.1, "reduction": "none"},
            "spatial_weight_smoothing_none",
            nograd=frozenset({"weight"}),
        ),
        S((uni(rng, (3, 4)), np.array([0, 3, 1])), name="noncontig", noncontig=True),
    ]


add(
    "cross_entropy",
    lambda m, x, t, **k: m.F.cross_entropy(x, t, **k),
    cross_entropy_ref,
    _ce_samples,
)


def _nll_samples(rng: np.random.Generator) -> list[Sample]:
    lp = lambda s: log_softmax_ref(uni(rng, s), 1)
    return [
        S((lp((4, 3)), np.array([0, 2, 1, 2])), name="mean"),
        S((lp((4, 3)), np.array([0, 2, 1, 2])), {"reduction": "none"}, "none"),
        S(
            (lp((4, 3)), np.array([0, 2, 1, 2])),
            {"weight": pos(rng, (3,)), "reduction": "sum"},
            "weight_sum",
            nograd=frozenset({"weight"}),
        ),
        S(
            (lp((4, 3)), np.array([0, -100, 1, 2])),
            {"weight": pos(rng, (3,))},
            "weight_ignore",
            nograd=frozenset({"weight"}),
        ),
        S((lp((2, 3, 2)), np.array([[0, 2], [1, 1]])), name="spatial"),
    ]


add("nll_loss", lambda m, x, t, **k: m.F.nll_loss(x, t, **k), nll_ref, _nll_samples)
# the fused backward kernel (``nll_loss_backward``) runs where no graph of the gradient is
# wanted: a first-order entry reaches it (the entry above differentiates its op-surface form)
add(
    "nll_loss_first_order",
    lambda m, x, t, **k: m.F.nll_loss(x, t, **k),
    nll_ref,
    _nll_samples,
    twice=False,
)


def _pair_loss_samples(gen_a: Gen = uni, gen_b: Gen = uni) -> Callable:
    gen_a, gen_b = _arrays(gen_a), _arrays(gen_b)

    def make(rng: np.random.Generator) -> list[Sample]:
        return [
            S((gen_a(rng, (3, 4)), gen_b(rng, (3, 4))), name="mean"),
            S((gen_a(rng, (3, 4)), gen_b(rng, (3, 4))), {"reduction": "sum"}, "sum"),
            S((gen_a(rng, (3, 4)), gen_b(rng, (3, 4))), {"reduction": "none"}, "none"),
            S((gen_a(rng, ()), gen_b(rng, ())), name="0d"),
            S((gen_a(rng, (2, 3)), gen_b(rng, (2, 3))), name="noncontig", noncontig=True),
        ]

    return make


def _offset(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return away(rng, shape) + 5.0


add(
    "mse_loss",
    lambda m, a, b, **k: m.F.mse_loss(a, b, **k),
    lambda a, b, reduction="mean": _reduce_ref((a - b) ** 2, reduction),
    _pair_loss_samples(),
)
add(
    "l1_loss",
    lambda m, a, b, **k: m.F.l1_loss(a, b, **k),
    lambda a, b, reduction="mean": _reduce_ref(np.abs(a - b), reduction),
    _pair_loss_samples(uni, _offset),
)


def smooth_l1_ref(a, b, reduction="mean", beta=1.0):  # type: ignore[no-untyped-def]
    d = np.abs(a - b)
    loss = d if beta == 0 else np.where(d < beta, 0.5 * d * d / max(beta, 1e-300), d - 0.5 * beta)
    return _reduce_ref(loss, reduction)


def huber_ref(a, b, reduction="mean", delta=1.0, weight=None):  # type: ignore[no-untyped-def]
    d = np.abs(a - b)
    loss = np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce_ref(loss if weight is None else loss * weight, reduction)


def _robust_loss_samples(param: str) -> Callable:
    def make(rng: np.random.Generator) -> list[Sample]:
        return _pair_loss_samples()(rng) + [
            S((uni(rng, (3, 4)), uni(rng, (3, 4))), {param: 0.5}, f"{param}_half"),
            S((uni(rng, (3, 4)), uni(rng, (3, 4))), {param: 2.5, "reduction": "sum"}, "wide"),
        ]

    return make


add(
    "smooth_l1_loss",
    lambda m, a, b, **k: m.F.smooth_l1_loss(a, b, **k),
    smooth_l1_ref,
    lambda rng: (
        _robust_loss_samples("beta")(rng)
        + [S((uni(rng, (3, 4)), _offset(rng, (3, 4))), {"beta": 0.0}, "beta0_l1")]
    ),
)
add(
    "huber_loss",
    lambda m, a, b, **k: m.F.huber_loss(a, b, **k),
    huber_ref,
    lambda rng: (
        _robust_loss_samples("delta")(rng)
        + [S((uni(rng, (3, 4)), uni(rng, (3, 4))), {"weight": pos(rng, (3, 4))}, "weight")]
    ),
)


def _signs(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return np.where(rng.random(shape) > 0.5, 1.0, -1.0)


def _reduced(loss: np.ndarray, reduction: str = "mean") -> np.ndarray:
    return {"mean": np.mean, "sum": np.sum, "none": np.asarray}[reduction](loss)


def _margin_ranking_ref(a, b, y, margin=0.0, reduction="mean"):  # type: ignore[no-untyped-def]
    return _reduced(np.maximum(0.0, -y * (a - b) + margin), reduction)


def _hinge_embedding_ref(x, y, margin=1.0, reduction="mean"):  # type: ignore[no-untyped-def]
    loss = np.where(y != 1, np.maximum(0.0, margin - x), 0.0) + np.where(y != -1, x, 0.0)
    return _reduced(loss, reduction)


def _soft_margin_ref(x, y, reduction="mean"):  # type: ignore[no-untyped-def]
    return _reduced(np.log1p(np.exp(-y * x)), reduction)


def _multilabel_soft_margin_ref(x, y, weight=None, reduction="mean"):  # type: ignore[no-untyped-def]
    loss = y * np.log1p(np.exp(-x)) + (1 - y) * np.log1p(np.exp(x))
    if weight is not None:
        loss = loss * weight
    return _reduced(loss.mean(-1), reduction)


def _cosine_embedding_ref(a, b, y, margin=0.0, reduction="mean"):  # type: ignore[no-untyped-def]
    cos = (a * b).sum(-1) / np.sqrt(((a * a).sum(-1) + 1e-12) * ((b * b).sum(-1) + 1e-12))
    loss = np.where(y == 1, 1 - cos, 0.0) + np.where(y == -1, np.maximum(0.0, cos - margin), 0.0)
    return _reduced(loss, reduction)


def _poisson_nll_ref(x, y, log_input=True, full=False, reduction="mean"):  # type: ignore[no-untyped-def]
    loss = np.exp(x) - y * x if log_input else x - y * np.log(x + 1e-8)
    if full:
        safe = np.where(y > 1, y, 2.0)
        stirling = safe * np.log(safe) - safe + 0.5 * np.log(2 * np.pi * safe)
        loss = loss + np.where(y > 1, stirling, 0.0)
    return _reduced(loss, reduction)


add(
    "margin_ranking_loss",
    lambda m, a, b, y, **k: m.F.margin_ranking_loss(a, b, y, **k),
    _margin_ranking_ref,
    lambda rng: [
        S(
            (uni(rng, (3, 4)), uni(rng, (3, 4)), _signs(rng, (3, 4))),
            {"margin": 0.2},
            "mean",
            nograd=frozenset({2}),
        ),
        S(
            (uni(rng, (5,)), uni(rng, (5,)), _signs(rng, (5,))),
            {"reduction": "sum"},
            "sum",
            nograd=frozenset({2}),
        ),
        S(
            (uni(rng, (5,)), uni(rng, (5,)), _signs(rng, (5,))),
            {"reduction": "none"},
            "none",
            nograd=frozenset({2}),
        ),
    ],
)
add(
    "hinge_embedding_loss",
    lambda m, x, y, **k: m.F.hinge_embedding_loss(x, y, **k),
    _hinge_embedding_ref,
    lambda rng: [
        S((uni(rng, (3, 4)), _signs(rng, (3, 4))), {"margin": 0.5}, "mean", nograd=frozenset({1})),
        S(
            (uni(rng, (6,)), _signs(rng, (6,))),
            {"reduction": "none"},
            "none",
            nograd=frozenset({1}),
        ),
    ],
)
add(
    "soft_margin_loss",
    lambda m, x, y, **k: m.F.soft_margin_loss(x, y, **k),
    _soft_margin_ref,
    lambda rng: [
        S((uni(rng, (3, 4)), _signs(rng, (3, 4))), name="mean", nograd=frozenset({1})),
        S((uni(rng, (5,)), _signs(rng, (5,))), {"reduction": "sum"}, "sum", nograd=frozenset({1})),
    ],
)
add(
    "multilabel_soft_margin_loss",
    lambda m, x, y, **k: m.F.multilabel_soft_margin_loss(x, y, **k),
    _multilabel_soft_margin_ref,
    lambda rng: [
        S((uni(rng, (3, 4)), (_signs(rng, (3, 4)) + 1) / 2), name="mean", nograd=frozenset({1})),
        S(
            (uni(rng, (3, 4)), (_signs(rng, (3, 4)) + 1) / 2),
            {"weight": pos(rng, (4,)), "reduction": "none"},
            "weight_none",
            nograd=frozenset({1, "weight"}),
        ),
    ],
)
add(
    "cosine_embedding_loss",
    lambda m, a, b, y, **k: m.F.cosine_embedding_loss(a, b, y, **k),
    _cosine_embedding_ref,
    lambda rng: [
        S(
            (uni(rng, (4, 3)), uni(rng, (4, 3)), _signs(rng, (4,))),
            {"margin": -0.5},
            "mean",
            nograd=frozenset({2}),
        ),
        S(
            (uni(rng, (4, 3)), uni(rng, (4, 3)), _signs(rng, (4,))),
            {"reduction": "none"},
            "none",
            nograd=frozenset({2}),
        ),
    ],
)
add(
    "poisson_nll_loss",
    lambda m, x, y, **k: m.F.poisson_nll_loss(x, y, **k),
    _poisson_nll_ref,
    lambda rng: [
        S(
            (uni(rng, (3, 4)), rng.poisson(2.0, (3, 4)).astype(np.float64)),
            name="log_input",
            nograd=frozenset({1}),
        ),
        S(
            (pos(rng, (3, 4)), rng.poisson(2.0, (3, 4)).astype(np.float64)),
            {"log_input": False, "full": True, "reduction": "sum"},
            "full",
            nograd=frozenset({1}),
        ),
    ],
)


def _rms_norm_ref(x, shape, weight=None, eps=None):  # type: ignore[no-untyped-def]
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    eps = np.finfo(x.dtype).eps if eps is None else eps
    out = x / np.sqrt((x * x).mean(axis=dims, keepdims=True) + eps)
    return out if weight is None else out * weight


def _prelu_ref(x, w):  # type: ignore[no-untyped-def]
    w = w if w.size == 1 else w.reshape((-1,) + (1,) * (x.ndim - 2))
    return np.where(x > 0, x, w * x)


def _gaussian_nll_ref(x, y, var, full=False, reduction="mean"):  # type: ignore[no-untyped-def]
    var = np.maximum(var, 1e-6)
    loss = 0.5 * (np.log(var) + (x - y) ** 2 / var) + (0.5 * np.log(2 * np.pi) if full else 0)
    return _reduced(loss, reduction)


def _away_from_zero(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return away(rng, shape)


def _lrn_ref(x, size, alpha=1e-4, beta=0.75, k=1.0):  # type: ignore[no-untyped-def]
    sq = np.moveaxis(x * x, 1, -1)
    padded = np.pad(sq, [(0, 0)] * (sq.ndim - 1) + [(size // 2, (size - 1) // 2)])
    window = sum(padded[..., j : j + x.shape[1]] for j in range(size))
    return x / np.moveaxis(k + alpha * window / size, -1, 1) ** beta


add(
    "local_response_norm",
    lambda m, x, size, **k: m.F.local_response_norm(x, size, **k),
    _lrn_ref,
    lambda rng: [
        S((uni(rng, (2, 5, 3)), 3), name="3d"),
        S((uni(rng, (1, 4, 2, 3)), 2), {"alpha": 0.1, "beta": 0.5, "k": 2.0}, "4d"),
    ],
)


def _adaptive_max_ref(x, sizes):  # type: ignore[no-untyped-def]
    for k, out in enumerate(sizes):
        dim = x.ndim - len(sizes) + k
        n = x.shape[dim]
        parts = [
            np.take(x, range((i * n) // out, -((-(i + 1) * n) // out)), axis=dim).max(
                axis=dim, keepdims=True
            )
            for i in range(out)
        ]
        x = np.concatenate(parts, axis=dim)
    return x


add(
    "adaptive_max_pool2d",
    lambda m, x, size: m.F.adaptive_max_pool2d(x, size),
    lambda x, size: _adaptive_max_ref(x, (size, size) if isinstance(size, int) else size),
    lambda rng: [
        S((uni(rng, (1, 2, 6, 4)), (3, 2)), name="even"),
        S((uni(rng, (2, 5, 7)), (2, 3)), name="uneven_unbatched"),
    ],
)
add(
    "adaptive_max_pool1d",
    lambda m, x, size: m.F.adaptive_max_pool1d(x, size),
    lambda x, size: _adaptive_max_ref(x, (size,)),
    lambda rng: [S((uni(rng, (2, 3, 7)), 3), name="uneven"), S((uni(rng, (3, 8)), 4), name="even")],
)


def _pdist_ref(x, p=2.0):  # type: ignore[no-untyped-def]
    i, j = np.triu_indices(x.shape[0], 1)
    return (np.abs(x[i] - x[j]) ** p).sum(-1) ** (1 / p)


add(
    "pdist",
    lambda m, x, *a: m.F.pdist(x, *a),
    _pdist_ref,
    lambda rng: [S((uni(rng, (5, 3)),), name="p2"), S((uni(rng, (4, 2)), 3.0), name="p3")],
)
add(
    "lp_pool2d",
    lambda m, x, p, k: m.F.lp_pool2d(x, p, k),
    lambda x, p, k: avg_pool2d_ref(x**p, k) ** (1 / p) * (k * k) ** (1 / p),
    lambda rng: [S((pos(rng, (1, 2, 4, 6)), 2.0, 2), name="p2")],
)
add(
    "rms_norm",
    lambda m, x, shape, *a, **k: m.F.rms_norm(x, shape, *a, **k),
    _rms_norm_ref,
    lambda rng: [
        S((uni(rng, (3, 4)), (4,)), name="last"),
        S((uni(rng, (2, 3, 4)), (3, 4), pos(rng, (3, 4))), {"eps": 1e-5}, "weight"),
        S((uni(rng, (2, 5)), (5,)), name="noncontig", noncontig=True),
    ],
)
add(
    "prelu",
    lambda m, x, w: m.F.prelu(x, w),
    _prelu_ref,
    lambda rng: [
        S((_away_from_zero(rng, (3, 4)), np.array([0.2])), name="shared"),
        S((_away_from_zero(rng, (2, 3, 4)), pos(rng, (3,)) / 4), name="channels"),
    ],
)
add(
    "bilinear",
    lambda m, a, b, w, *bias: m.F.bilinear(a, b, w, *bias),
    lambda a, b, w, *bias: np.einsum("...i,oij,...j->...o", a, w, b) + (bias[0] if bias else 0),
    lambda rng: [
        S((uni(rng, (5, 3)), uni(rng, (5, 4)), uni(rng, (2, 3, 4)), uni(rng, (2,))), name="bias"),
        S((uni(rng, (2, 5, 3)), uni(rng, (2, 5, 4)), uni(rng, (2, 3, 4))), name="batched"),
    ],
)
add(
    "gaussian_nll_loss",
    lambda m, x, y, var, **k: m.F.gaussian_nll_loss(x, y, var, **k),
    _gaussian_nll_ref,
    lambda rng: [
        S(
            (uni(rng, (3, 4)), uni(rng, (3, 4)), pos(rng, (3, 4))),
            name="mean",
            nograd=frozenset({1}),
        ),
        S(
            (uni(rng, (3, 4)), uni(rng, (3, 4)), pos(rng, (3, 1))),
            {"full": True, "reduction": "sum"},
            "full_sum",
            nograd=frozenset({1}),
        ),
    ],
)


def _prob(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return uni(rng, shape, 0.05, 0.95)


def _bce_samples(rng: np.random.Generator) -> list[Sample]:
    return _pair_loss_samples(_prob, _prob)(rng) + [
        S(
            (_prob(rng, (3, 4)), _prob(rng, (3, 4))),
            {"weight": pos(rng, (4,))},
            "weight",
            nograd=frozenset({"weight"}),
        ),
    ]


add(
    "binary_cross_entropy",
    lambda m, p, t, **k: m.F.binary_cross_entropy(p, t, **k),
    bce_ref,
    _bce_samples,
)


def _kl_div_ref(x, t, reduction="mean", log_target=False):  # type: ignore[no-untyped-def]
    if log_target:
        loss = np.exp(t) * (t - x)
    else:
        loss = np.where(t == 0, 0.0, t * np.log(np.where(t == 0, 1.0, t))) - t * x
    if reduction == "batchmean":
        return loss.sum() / (x.shape[0] if x.ndim else 1)
    return _reduce_ref(loss, reduction)


def _kl_div_samples(rng: np.random.Generator) -> list[Sample]:
    def logp(shape: tuple) -> np.ndarray:
        return np.asarray(np.log(_prob(rng, shape)))

    zero_target = _prob(rng, (3, 4))
    zero_target[1, 2] = 0.0  # 0 * log 0 is 0 (the target's own gradient is nan there)
    return [
        S((logp((3, 4)), _prob(rng, (3, 4))), {"reduction": "batchmean"}, "batchmean"),
        S((logp((3, 4)), _prob(rng, (3, 4))), {"reduction": "sum"}, "sum"),
        S((logp((2, 3, 2)), _prob(rng, (2, 3, 2))), {"reduction": "none"}, "none"),
        S((logp((3, 4)), logp((3, 4))), {"reduction": "batchmean", "log_target": True}, "log_t"),
        S((logp((3, 4)), logp((4,))), {"reduction": "sum", "log_target": True}, "bcast"),
        S(
            (logp((3, 4)), zero_target),
            {"reduction": "batchmean"},
            "zero_target",
            nograd=frozenset({1}),
        ),
        S((logp(()), _prob(rng, ())), {"reduction": "batchmean"}, "0d"),
        S((logp((3, 2)), _prob(rng, (3, 2))), {"reduction": "sum"}, "noncontig", noncontig=True),
    ]


add(
    "kl_div",
    lambda m, x, t, **k: m.F.kl_div(x, t, **k),
    _kl_div_ref,
    _kl_div_samples,
)


def _cosine_ref(a, b, dim=1, eps=1e-8):  # type: ignore[no-untyped-def]
    a, b = np.broadcast_arrays(a, b)
    na = np.maximum(np.sqrt((a * a).sum(dim, keepdims=True)), eps)
    nb = np.maximum(np.sqrt((b * b).sum(dim, keepdims=True)), eps)
    return ((a / na) * (b / nb)).sum(dim)


def _cosine_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), uni(rng, (3, 4))), {}, "dim1"),
        S((uni(rng, (3, 4)), uni(rng, (3, 4))), {"dim": 0}, "dim0"),
        S((uni(rng, (2, 3, 4)), uni(rng, (4,))), {"dim": -1}, "bcast"),
        # PyTorch's clamp is outside autograd: not the derivative of the clamped function
        # (tests/nn/test_distance_losses.py compares that gradient with torch's)
        S((uni(rng, (3, 4)) * 1e-9, uni(rng, (3, 4))), {}, "tiny_norm_clamped", grad=False),
        S((uni(rng, (3, 4)), uni(rng, (3, 4))), {"eps": 2.0}, "large_eps", grad=False),
        S((uni(rng, (3, 2)), uni(rng, (3, 2))), {}, "noncontig", noncontig=True),
    ]


add(
    "cosine_similarity",
    lambda m, a, b, **k: m.F.cosine_similarity(a, b, **k),
    _cosine_ref,
    _cosine_samples,
)


def _pairwise_ref(a, b, p=2.0, eps=1e-6, keepdim=False):  # type: ignore[no-untyped-def]
    d = np.abs(a - b + eps)
    out = (
        d.max(-1, keepdims=keepdim)
        if p == math.inf
        else (d**p).sum(-1, keepdims=keepdim) ** (1 / p)
    )
    return out


def _triplet_ref(a, pos, neg, margin=1.0, p=2, eps=1e-6, swap=False, reduction="mean"):  # type: ignore[no-untyped-def]
    d_pos = _pairwise_ref(a, pos, p, eps)
    d_neg = _pairwise_ref(a, neg, p, eps)
    if swap:
        d_neg = np.minimum(d_neg, _pairwise_ref(pos, neg, p, eps))
    return _reduce_ref(np.maximum(margin + d_pos - d_neg, 0.0), reduction)


add(
    "pairwise_distance",
    lambda m, a, b, **k: m.F.pairwise_distance(a, b, **k),
    _pairwise_ref,
    lambda rng: [
        S((uni(rng, (3, 4)), uni(rng, (3, 4))), {}, "p2"),
        S((uni(rng, (3, 4)), uni(rng, (4,))), {"p": 3.0, "keepdim": True}, "p3_keep"),
        S((uni(rng, (3, 4)), uni(rng, (3, 4))), {"p": math.inf}, "pinf"),
    ],
)


def _triplet_samples(rng: np.random.Generator) -> list[Sample]:
    def trio(shape: tuple) -> tuple:
        return uni(rng, shape), uni(rng, shape), uni(rng, shape)

    return [
        S(trio((5, 4)), {}, "default"),
        S(trio((5, 4)), {"margin": 2.5, "reduction": "sum"}, "margin_sum"),
        S(trio((5, 4)), {"p": 1.0, "margin": 3.0, "reduction": "none"}, "p1"),
        S(trio((5, 4)), {"swap": True, "margin": 2.0}, "swap"),
        S(trio((5, 4)), {"p": 3.0, "eps": 1e-3, "margin": 2.0}, "p3_eps"),
        S(trio((4,)), {"margin": 3.0}, "unbatched"),
        S(trio((3, 2)), {"margin": 2.0}, "noncontig", noncontig=True),
    ]


add(
    "triplet_margin_loss",
    lambda m, anchor, pos, neg, **k: m.F.triplet_margin_loss(anchor, pos, neg, **k),
    _triplet_ref,
    _triplet_samples,
)


def _bce_logits_samples(rng: np.random.Generator) -> list[Sample]:
    return _pair_loss_samples(uni, _prob)(rng) + [
        # torch refuses a pos_weight that requires grad
        S(
            (uni(rng, (3, 4)), _prob(rng, (3, 4))),
            {"pos_weight": pos(rng, (4,))},
            "pos_weight",
            nograd=frozenset({"pos_weight"}),
        ),
        S(
            (uni(rng, (3, 4)), _prob(rng, (3, 4))),
            {"weight": pos(rng, (3, 1)), "pos_weight": pos(rng, (4,)), "reduction": "sum"},
            "weight_pos_weight",
            nograd=frozenset({"weight", "pos_weight"}),
        ),
    ]


add(
    "binary_cross_entropy_with_logits",
    lambda m, x, t, **k: m.F.binary_cross_entropy_with_logits(x, t, **k),
    bce_logits_ref,
    _bce_logits_samples,
)
add("dropout_p0", lambda m, x: m.F.dropout(x, p=0.0), lambda x: x, unary())
add("dropout_eval", lambda m, x: m.F.dropout(x, 0.5, training=False), lambda x: x, unary())


def _layer_norm_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (3, 4)), (4,)), name="plain"),
        S((uni(rng, (3, 4)), (4,), pos(rng, (4,)), uni(rng, (4,))), name="affine"),
        S((uni(rng, (2, 2, 3)), (2, 3), pos(rng, (2, 3)), uni(rng, (2, 3))), name="2d_shape"),
        S(
            (uni(rng, (2, 3)), (3,), pos(rng, (3,)), uni(rng, (3,))),
            name="noncontig",
            noncontig=True,
        ),
    ]


add(
    "layer_norm",
    lambda m, x, s, *a: m.F.layer_norm(x, s, *a),
    layer_norm_ref,
    _layer_norm_samples,
    f32_tol=(1e-4, 1e-5),
)
# the norms' fused backward kernel (``norm_backward``) runs where no graph of the gradient is
# wanted: first-order entries reach it (the entries above differentiate its composite form)
add(
    "layer_norm_first_order",
    lambda m, x, s, *a: m.F.layer_norm(x, s, *a),
    layer_norm_ref,
    _layer_norm_samples,
    f32_tol=(1e-4, 1e-5),
    twice=False,
)


def sdpa_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Any = None,
    enable_gqa: bool = False,
) -> np.ndarray:
    if enable_gqa:
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = np.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    scores = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    keep = np.ones(scores.shape[-2:], dtype=bool)
    if is_causal:
        keep = np.tri(*scores.shape[-2:], dtype=bool)
    if attn_mask is not None and attn_mask.dtype == bool:
        keep = keep & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask
    scores = np.where(keep, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    weights = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)  # safe softmax
    return weights @ v


def _sdpa_samples(rng: np.random.Generator) -> list[Sample]:
    keep = rng.random((3, 5)) > 0.4
    keep[:, 0] = True
    some_rows_empty = keep.copy()
    some_rows_empty[1] = False
    bias = uni(rng, (3, 5))
    bias[1, 2] = -np.inf
    return [
        S((uni(rng, (2, 3, 4)), uni(rng, (2, 5, 4)), uni(rng, (2, 5, 3))), name="plain"),
        S((uni(rng, (3, 4)), uni(rng, (5, 4)), uni(rng, (5, 2))), name="unbatched"),
        S(
            (uni(rng, (2, 2, 3, 4)), uni(rng, (2, 1, 5, 4)), uni(rng, (1, 5, 3))),
            name="broadcast_batch",
        ),
        S((uni(rng, (2, 3, 4)), uni(rng, (2, 5, 4)), uni(rng, (2, 5, 3)), keep), name="bool"),
        S(
            (uni(rng, (2, 3, 4)), uni(rng, (2, 5, 4)), uni(rng, (2, 5, 3)), some_rows_empty),
            name="bool_empty_row",
        ),
        S(
            (uni(rng, (2, 3, 4)), uni(rng, (2, 5, 4)), uni(rng, (2, 5, 3)), bias),
            name="float_mask",
            nograd=frozenset({3}),
        ),
        S(
            (uni(rng, (2, 3, 4)), uni(rng, (2, 5, 4)), uni(rng, (2, 5, 3))),
            {"is_causal": True, "scale": 0.7},
            name="causal_scale",
        ),
        S(
            (uni(rng, (1, 4, 3, 2)), uni(rng, (1, 2, 3, 2)), uni(rng, (1, 2, 3, 2))),
            {"enable_gqa": True},
            name="gqa",
        ),
        S(
            (uni(rng, (2, 3, 4)), uni(rng, (2, 5, 4)), uni(rng, (2, 5, 3))),
            name="noncontig",
            noncontig=True,
        ),
    ]


add(
    "scaled_dot_product_attention",
    lambda m, q, k, v, *a, **kw: m.F.scaled_dot_product_attention(q, k, v, *a, **kw),
    sdpa_ref,
    _sdpa_samples,
    f32_tol=(1e-4, 1e-5),
)


def _sdpa_fused_samples(rng: np.random.Generator) -> list[Sample]:
    """Cases for the fused kernel (``attention``): equal head dims, one batch shape; masks
    shared, per batch, broadcast over heads or queries, with rows that attend to nothing."""
    keep = rng.random((3, 5)) < 0.7
    keep[:, 0] = True
    empty_row = np.broadcast_to(keep, (2, 2, 3, 5)).copy()
    empty_row[1, 0, 2] = False
    padding = np.ones((2, 1, 1, 5), dtype=bool)
    padding[0, ..., 3:] = False
    bias = uni(rng, (2, 1, 3, 5))
    bias[1, 0, 1] = -np.inf
    qkv = (uni(rng, (2, 2, 3, 4)), uni(rng, (2, 2, 5, 4)), uni(rng, (2, 2, 5, 4)))
    return [
        S(qkv, {"scale": 0.5}, name="plain"),
        S((uni(rng, (3, 4)), uni(rng, (5, 4)), uni(rng, (5, 4))), name="unbatched"),
        S(qkv, {"is_causal": True}, name="causal"),
        S(
            (uni(rng, (2, 6, 3)), uni(rng, (2, 4, 3)), uni(rng, (2, 4, 3))),
            {"is_causal": True},
            name="causal_short_keys",
        ),
        S(qkv + (keep,), name="bool_shared"),
        S(qkv + (empty_row,), name="bool_empty_row"),
        S(qkv + (padding,), name="key_padding"),
        S(qkv + (bias,), name="float_bias", nograd=frozenset({3})),
        S(qkv, {"is_causal": True}, name="noncontig", noncontig=True),
    ]


def _sdpa_fused(
    m: Any, q: Any, k: Any, v: Any, mask: Any = None, *, is_causal: bool = False, scale: Any = None
) -> Any:
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if m.name == "torch" or _fg_forward_state.level is not None or q.device.type != "cpu":
        # (under forward AD and on CUDA the public function runs the composite, never the
        # kernel, which is the CPU's)
        return m.F.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, scale=scale)
    return _fg_functional._fused_attention(q, k, v, mask, scale, is_causal)


# the fused CPU kernel (the ``attention`` primitive) called directly, masks included (the public
# function runs it for causal attention only, where it pays: see ops/functional.py); its double
# backward is the rule's op-surface form
add(
    "sdpa_fused_kernel",
    _sdpa_fused,
    lambda q, k, v, mask=None, is_causal=False, scale=None: sdpa_ref(
        q, k, v, mask, is_causal=is_causal, scale=scale
    ),
    _sdpa_fused_samples,
    f32_tol=(1e-4, 1e-5),
)
add(
    "sdpa_causal_public",
    lambda m, q, k, v: m.F.scaled_dot_product_attention(q, k, v, is_causal=True),
    lambda q, k, v: sdpa_ref(q, k, v, is_causal=True),
    lambda rng: [S(tuple(uni(rng, (2, 3, 6, 4)) for _ in range(3)))],
    f32_tol=(1e-4, 1e-5),
)


# ---- recurrent layers: the fused kernel of one layer and direction (``rnn_sequence``) ----------

_RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _rnn_fused_ref(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr=None, mode="LSTM", reverse=False):  # type: ignore[no-untyped-def]
    """One layer and direction in numpy, PyTorch's gate order: (output, h_n[, c_n]); an LSTM's
    projection ``w_hr`` maps ``o tanh(c)`` to h."""

    def sig(v: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-v))

    hidden = w_hh.shape[0] // _RNN_GATES[mode]
    b_ih = 0.0 if b_ih is None else b_ih
    b_hh = 0.0 if b_hh is None else b_hh
    h, c = h0, c0
    outs = [None] * x.shape[0]
    for t in range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0]):
        xg = x[t] @ w_ih.T + b_ih
        hg = h @ w_hh.T + b_hh
        if mode == "LSTM":
            gates = xg + hg
            i, f = sig(gates[:, :hidden]), sig(gates[:, hidden : 2 * hidden])
            g, o = np.tanh(gates[:, 2 * hidden : 3 * hidden]), sig(gates[:, 3 * hidden :])
            c = f * c + i * g
            h = o * np.tanh(c)
            if w_hr is not None:
                h = h @ w_hr.T
        elif mode == "GRU":
            r = sig(xg[:, :hidden] + hg[:, :hidden])
            z = sig(xg[:, hidden : 2 * hidden] + hg[:, hidden : 2 * hidden])
            n = np.tanh(xg[:, 2 * hidden :] + r * hg[:, 2 * hidden :])
            h = (1 - z) * n + z * h
        else:
            pre = xg + hg
            h = np.tanh(pre) if mode == "RNN_TANH" else np.maximum(pre, 0.0)
        outs[t] = h
    result = (np.stack(outs), h)
    return result + (c,) if mode == "LSTM" else result


def _rnn_per_step(m, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse):  # type: ignore[no-untyped-def]
    """fusegrad's per-step ops (nn.rnn's step functions): forward AD and CUDA tensors."""
    from fusegrad.nn import rnn as _rnn

    x_gates = m.F.linear(x, w_ih, b_ih).unbind(0)
    h, c = h0, c0
    outs = [None] * x.shape[0]
    for t in range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0]):
        if mode == "LSTM":
            h, c = _rnn._lstm_step(x_gates[t], h, c, w_hh, b_hh, w_hr)
        elif mode == "GRU":
            h = _rnn._gru_step(x_gates[t], h, w_hh, b_hh)
        else:
            h = _rnn._rnn_step(mode, x_gates[t], h, w_hh, b_hh)
        outs[t] = h
    return (m.stack(outs, 0), h) + ((c,) if mode == "LSTM" else ())


def _rnn_fused(m, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr=None, mode="LSTM", reverse=False):  # type: ignore[no-untyped-def]
    if m.name == "torch":
        # one layer of PyTorch's fused op, the reverse direction as the forward one over the
        # flipped sequence
        params = [w_ih, w_hh] + ([b_ih, b_hh] if b_ih is not None else [])
        params += [] if w_hr is None else [w_hr]  # (a projection: told by h0's size)
        seq = x.flip(0) if reverse else x
        vf = m._VF
        h0b = h0.unsqueeze(0)
        if mode == "LSTM":
            out, h_n, c_n = vf.lstm(
                seq, (h0b, c0.unsqueeze(0)), params, b_ih is not None, 1, 0.0, False, False, False
            )
        else:
            fn = {"GRU": vf.gru, "RNN_TANH": vf.rnn_tanh, "RNN_RELU": vf.rnn_relu}[mode]
            out, h_n = fn(seq, h0b, params, b_ih is not None, 1, 0.0, False, False, False)
            c_n = None
        out = out.flip(0) if reverse else out
        return (out, h_n[0]) + ((c_n[0],) if mode == "LSTM" else ())
    if _fg_forward_state.level is not None or x.device.type != "cpu":
        # (nn.LSTM & co. run their per-step ops there: forward AD and CUDA never meet the kernel)
        return _rnn_per_step(m, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse)
    from fusegrad.ops.recurrent import rnn_layer

    out, h_n, c_n = rnn_layer(
        mode, x, w_ih, w_hh, b_ih, b_hh, h0, c0 if mode == "LSTM" else None, reverse, w_hr
    )
    return (out, h_n) + ((c_n,) if mode == "LSTM" else ())


def _rnn_fused_samples(rng: np.random.Generator) -> list[Sample]:
    """(x, h0, c0, w_ih, w_hh, b_ih, b_hh): T=3 steps, batch 2, input 3, hidden 2."""
    cases = []
    for mode in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU"):
        size = _RNN_GATES[mode] * 2
        for reverse in (False, True):
            args = (
                uni(rng, (3, 2, 3), -1, 1), uni(rng, (2, 2), -1, 1), uni(rng, (2, 2), -1, 1),
                uni(rng, (size, 3), -1, 1), uni(rng, (size, 2), -1, 1),
                uni(rng, (size,), -1, 1), uni(rng, (size,), -1, 1),
            )  # fmt: skip
            if mode != "LSTM":
                args = args[:2] + (None,) + args[3:]
            name = mode.lower() + ("_reverse" if reverse else "")
            cases.append(S(args, {"mode": mode, "reverse": reverse}, name=name))
    x, h0, c0, w_ih, w_hh = (
        uni(rng, s, -1, 1) for s in ((4, 1, 2), (1, 3), (1, 3), (12, 2), (12, 3))
    )
    cases.append(S((x, h0, c0, w_ih, w_hh, None, None), {"mode": "LSTM"}, name="lstm_no_bias"))
    # proj_size 2 of hidden 3: h0 (N, 2), w_hh (12, 2), w_hr (2, 3)
    proj = (
        uni(rng, (4, 2, 2), -1, 1), uni(rng, (2, 2), -1, 1), uni(rng, (2, 3), -1, 1),
        uni(rng, (12, 2), -1, 1), uni(rng, (12, 2), -1, 1), uni(rng, (12,), -1, 1),
        uni(rng, (12,), -1, 1), uni(rng, (2, 3), -1, 1),
    )  # fmt: skip
    cases.append(S(proj, {"mode": "LSTM"}, name="lstm_proj"))
    cases.append(S(proj, {"mode": "LSTM", "reverse": True}, name="lstm_proj_reverse"))
    cases.append(
        S(
            (x, h0, c0, w_ih, w_hh, uni(rng, (12,), -1, 1), uni(rng, (12,), -1, 1)),
            {"mode": "LSTM", "reverse": True},
            name="noncontig",
            noncontig=True,
        )
    )
    return cases


# nn.LSTM / GRU / RNN's fused CPU kernel (``ops/recurrent.py``), one layer and direction: every
# gate's values and gradients through the kernels; its double backward is the rule's
# op-surface form (``rnn_sequence_grads``)
add(
    "rnn_fused_kernel",
    _rnn_fused,
    _rnn_fused_ref,
    _rnn_fused_samples,
    f32_tol=(1e-4, 1e-5),
)


def _channel(v: Any, ndim: int) -> Any:
    return None if v is None else np.asarray(v).reshape([1, -1] + [1] * (ndim - 2))


def _affine_ref(out: np.ndarray, weight: Any, bias: Any) -> np.ndarray:
    if weight is not None:
        out = out * _channel(weight, out.ndim)
    if bias is not None:
        out = out + _channel(bias, out.ndim)
    return out


def batch_norm_ref(
    x: np.ndarray,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> np.ndarray:
    if training:
        axes = (0,) + tuple(range(2, x.ndim))
        mu, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    else:
        mu, var = _channel(running_mean, x.ndim), _channel(running_var, x.ndim)
    return _affine_ref((x - mu) / np.sqrt(var + eps), weight, bias)


def instance_norm_ref(
    x: np.ndarray,
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> np.ndarray:
    if use_input_stats:
        axes = tuple(range(2, x.ndim))
        mu, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    else:
        mu, var = _channel(running_mean, x.ndim), _channel(running_var, x.ndim)
    return _affine_ref((x - mu) / np.sqrt(var + eps), weight, bias)


def group_norm_ref(
    x: np.ndarray, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> np.ndarray:
    g = x.reshape(x.shape[0], groups, -1)
    out = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    return _affine_ref(out.reshape(x.shape), weight, bias)


_STATS = frozenset({1, 2})  # running statistics: buffers, not differentiable inputs


def _batch_norm_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (4, 3)), None, None), {"training": True}, "train_2d"),
        S(
            (uni(rng, (3, 2, 4)), np.zeros(2), np.ones(2), pos(rng, (2,)), uni(rng, (2,))),
            {"training": True, "momentum": 0.3},
            "train_running_affine",
            nograd=_STATS,
        ),
        S(
            (
                uni(rng, (2, 3, 3, 2)),
                uni(rng, (3,)),
                pos(rng, (3,)),
                pos(rng, (3,)),
                uni(rng, (3,)),
            ),
            name="eval_4d",
            nograd=_STATS,
        ),
        S(
            (uni(rng, (2, 3, 2, 2)), None, None, None, uni(rng, (3,))),
            {"training": True, "eps": 0.1},
            "train_4d_bias_eps",
        ),
        S(
            (uni(rng, (2, 3, 3)), np.zeros(3), np.ones(3)),
            {"training": True},
            "noncontig",
            noncontig=True,
            nograd=_STATS,
        ),
    ]


add(
    "batch_norm",
    lambda m, x, rm, rv, *a, **k: m.F.batch_norm(x, rm, rv, *a, **k),
    batch_norm_ref,
    _batch_norm_samples,
    f32_tol=(1e-4, 1e-5),
)


def _instance_norm_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (2, 3, 4)),), name="plain"),
        S(
            (uni(rng, (2, 2, 3, 3)), np.zeros(2), np.ones(2), pos(rng, (2,)), uni(rng, (2,))),
            name="running_affine",
            nograd=_STATS,
        ),
        S(
            (uni(rng, (2, 2, 3)), uni(rng, (2,)), pos(rng, (2,))),
            {"use_input_stats": False},
            "running_stats",
            nograd=_STATS,
        ),
    ]


add(
    "instance_norm",
    lambda m, x, *a, **k: m.F.instance_norm(x, *a, **k),
    instance_norm_ref,
    _instance_norm_samples,
    f32_tol=(1e-4, 1e-5),
)


def _group_norm_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (2, 6, 3)), 3, pos(rng, (6,)), uni(rng, (6,))), name="affine"),
        S((uni(rng, (3, 4)), 2), name="2d"),
        S((uni(rng, (2, 4, 2, 3)), 1), {"eps": 0.1}, "one_group_eps"),
        S((uni(rng, (2, 2, 3)), 2, pos(rng, (2,))), name="per_channel", noncontig=True),
    ]


add(
    "group_norm",
    lambda m, x, g, *a, **k: m.F.group_norm(x, g, *a, **k),
    group_norm_ref,
    _group_norm_samples,
    f32_tol=(1e-4, 1e-5),
)
# (first-order entries: see layer_norm_first_order)
add(
    "batch_norm_first_order",
    lambda m, x, rm, rv, *a, **k: m.F.batch_norm(x, rm, rv, *a, **k),
    batch_norm_ref,
    _batch_norm_samples,
    f32_tol=(1e-4, 1e-5),
    twice=False,
)
add(
    "group_norm_first_order",
    lambda m, x, g, *a, **k: m.F.group_norm(x, g, *a, **k),
    group_norm_ref,
    _group_norm_samples,
    f32_tol=(1e-4, 1e-5),
    twice=False,
)
add(
    "instance_norm_first_order",
    lambda m, x, *a, **k: m.F.instance_norm(x, *a, **k),
    instance_norm_ref,
    _instance_norm_samples,
    f32_tol=(1e-4, 1e-5),
    twice=False,
)


def _conv_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (1, 2, 4, 4)), uni(rng, (2, 2, 2, 2)), uni(rng, (2,))), name="bias"),
        S((uni(rng, (2, 1, 4, 3)), uni(rng, (2, 1, 2, 2))), name="no_bias"),
        S(
            (uni(rng, (1, 1, 5, 5)), uni(rng, (1, 1, 3, 3))),
            {"stride": 2, "padding": 1},
            "stride_padding",
        ),
        S((uni(rng, (1, 1, 5, 5)), uni(rng, (1, 1, 2, 2))), {"dilation": 2}, "dilation"),
        S(
            (uni(rng, (1, 2, 3, 3)), uni(rng, (2, 1, 2, 2)), uni(rng, (2,))),
            {"groups": 2},
            "groups",
        ),
        S(
            (uni(rng, (1, 1, 3, 4)), uni(rng, (1, 1, 2, 3))),
            {"stride": (1, 2), "padding": (1, 0)},
            "asymmetric",
        ),
        S((uni(rng, (1, 1, 3, 4)), uni(rng, (1, 1, 2, 2))), {"padding": "same"}, "same_even"),
        S(
            (uni(rng, (1, 1, 4, 4)), uni(rng, (1, 1, 3, 2))),
            {"padding": "same", "dilation": 2},
            "same_dilation",
        ),
        S((uni(rng, (1, 2, 3, 3)), uni(rng, (1, 2, 2, 2))), {"padding": "valid"}, "valid"),
        S((uni(rng, (1, 3, 2, 3)), uni(rng, (3, 1, 1, 2))), {"groups": 3}, "depthwise"),
        S((uni(rng, (2, 3, 3)), uni(rng, (1, 2, 2, 2)), uni(rng, (1,))), name="unbatched"),
        S(
            (uni(rng, (1, 4, 6, 5)), uni(rng, (4, 2, 2, 3)), uni(rng, (4,))),
            {"stride": (2, 1), "padding": (1, 2), "dilation": (2, 1), "groups": 2},
            "groups_dilation_stride",
        ),
        S((uni(rng, (2, 3, 2, 3)), uni(rng, (2, 3, 1, 1))), name="pointwise"),
    ]


add(
    "conv2d",
    lambda m, x, w, b=None, **k: m.F.conv2d(x, w, b, **k),
    conv2d_ref,
    _conv_samples,
    f32_tol=(1e-4, 1e-5),
)


def _fg_nn_functional_mha() -> Any:
    import fusegrad.nn.functional

    return fusegrad.nn.functional.multi_head_attention_forward


def _mha_op(
    m: Any, q: Any, k: Any, v: Any, in_w: Any, in_b: Any, out_w: Any, out_b: Any, **kw: Any
) -> Any:
    """multi_head_attention_forward with 2 heads (E = 4), no bias_k/v, no dropout; the weights
    are returned only when asked for (a None output is not a tensor)."""
    # fusegrad's lives in nn.functional (the op table's FG.F is fusegrad.ops.functional)
    fn = m.F.multi_head_attention_forward if m.name == "torch" else _fg_nn_functional_mha()
    out = fn(q, k, v, 4, 2, in_w, in_b, None, None, False, 0.0, out_w, out_b, **kw)
    return out if kw.get("need_weights", True) else out[0]


def mha_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    in_w: np.ndarray,
    in_b: np.ndarray,
    out_w: np.ndarray,
    out_b: np.ndarray,
    key_padding_mask: Any = None,
    need_weights: bool = True,
    attn_mask: Any = None,
    average_attn_weights: bool = True,
) -> Any:
    """(L, N, E) inputs, 2 heads; bool masks are True where masked."""
    heads, (L, N, E) = 2, q.shape
    wq, wk, wv = np.split(in_w, 3)
    bq, bk, bv = np.split(in_b, 3)

    def split(x: np.ndarray) -> np.ndarray:  # (len, N, E) -> (N, heads, len, E / heads)
        return x.reshape(x.shape[0], N, heads, E // heads).transpose(1, 2, 0, 3)

    qh, kh, vh = split(q @ wq.T + bq), split(k @ wk.T + bk), split(v @ wv.T + bv)
    scores = qh @ kh.swapaxes(-1, -2) / np.sqrt(E // heads)
    if attn_mask is not None:
        bias = np.where(attn_mask, -np.inf, 0.0) if attn_mask.dtype == bool else attn_mask
        scores = scores + bias
    if key_padding_mask is not None:
        scores = scores + np.where(key_padding_mask, -np.inf, 0.0)[:, None, None, :]
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    out = (weights @ vh).transpose(2, 0, 1, 3).reshape(L, N, E) @ out_w.T + out_b
    if not need_weights:
        return out
    return out, (weights.mean(1) if average_attn_weights else weights)


def _mha_samples(rng: np.random.Generator) -> list[Sample]:
    def weights() -> tuple:
        return (uni(rng, (12, 4)), uni(rng, (12,)), uni(rng, (4, 4)), uni(rng, (4,)))

    padding = np.zeros((2, 4), dtype=bool)
    padding[1, 2:] = True
    keep_one = rng.random((3, 4)) > 0.5
    keep_one[:, 0] = False
    return [
        S(
            (uni(rng, (3, 2, 4)), uni(rng, (4, 2, 4)), uni(rng, (4, 2, 4))) + weights(),
            name="plain",
        ),
        S(
            (uni(rng, (3, 2, 4)), uni(rng, (4, 2, 4)), uni(rng, (4, 2, 4))) + weights(),
            {"key_padding_mask": padding, "attn_mask": keep_one, "average_attn_weights": False},
            "masks_per_head_weights",
        ),
        S(
            (uni(rng, (3, 2, 4)), uni(rng, (4, 2, 4)), uni(rng, (4, 2, 4))) + weights(),
            {"need_weights": False, "key_padding_mask": padding, "attn_mask": uni(rng, (3, 4))},
            "sdpa_path",
            nograd=frozenset({"attn_mask"}),
        ),
    ]


add(
    "multi_head_attention_forward",
    _mha_op,
    mha_ref,
    _mha_samples,
    f32_tol=(1e-4, 1e-5),
)


def conv_transpose2d_ref(
    x: np.ndarray,
    w: np.ndarray,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> np.ndarray:
    """By the definition: input pixel (i, j) adds w[c_in, :, a, b] at output
    (i * s + a * d - p, j * s + b * d - p)."""
    if x.ndim == 3:
        return conv_transpose2d_ref(
            x[None], w, bias, stride, padding, output_padding, groups, dilation
        )[0]
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    (oph, opw), (dh, dw) = _pair(output_padding), _pair(dilation)
    n, cin, H, W = x.shape
    _, cout_g, kh, kw = w.shape
    full_h = (H - 1) * sh + dh * (kh - 1) + 1 + oph
    full_w = (W - 1) * sw + dw * (kw - 1) + 1 + opw
    out = np.zeros((n, cout_g * groups, full_h + ph, full_w + pw), dtype=np.result_type(x, w))
    cin_g = cin // groups
    for g in range(groups):
        xs = x[:, g * cin_g : (g + 1) * cin_g]
        ws = w[g * cin_g : (g + 1) * cin_g]
        for a in range(kh):
            for b in range(kw):
                contrib = np.einsum("nchw,co->nohw", xs, ws[:, :, a, b])
                rows = slice(a * dh, a * dh + (H - 1) * sh + 1, sh)
                cols = slice(b * dw, b * dw + (W - 1) * sw + 1, sw)
                out[:, g * cout_g : (g + 1) * cout_g, rows, cols] += contrib
    out = out[:, :, ph : full_h - ph, pw : full_w - pw]
    if bias is not None:
        out = out + np.asarray(bias).reshape(1, -1, 1, 1)
    return out


def _conv_transpose_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (1, 2, 3, 3)), uni(rng, (2, 3, 2, 2)), uni(rng, (3,))), name="bias"),
        S(
            (uni(rng, (2, 2, 3, 2)), uni(rng, (2, 1, 3, 3))),
            {"stride": 2, "padding": 1, "output_padding": 1},
            "stride_padding_output_padding",
        ),
        S(
            (uni(rng, (1, 4, 3, 3)), uni(rng, (4, 1, 2, 3)), uni(rng, (2,))),
            {"stride": (2, 1), "padding": (0, 1), "dilation": (1, 2), "groups": 2},
            "groups_dilation",
        ),
        S(
            (uni(rng, (1, 1, 2, 2)), uni(rng, (1, 1, 2, 2))),
            {"stride": 3, "dilation": 2, "output_padding": (2, 1)},
            "output_padding_below_stride",
        ),
        S((uni(rng, (1, 3, 3)), uni(rng, (1, 2, 2, 2))), {"padding": 1}, "unbatched"),
        S(
            (uni(rng, (1, 2, 3, 2)), uni(rng, (2, 2, 2, 2))),
            {"stride": 2},
            "noncontig",
            noncontig=True,
        ),
    ]


add(
    "conv_transpose2d",
    lambda m, x, w, b=None, **k: m.F.conv_transpose2d(x, w, b, **k),
    conv_transpose2d_ref,
    _conv_transpose_samples,
    f32_tol=(1e-4, 1e-5),
)


def conv_transpose1d_ref(
    x: np.ndarray, w: np.ndarray, bias: Any = None, stride: int = 1, padding: int = 0,
    output_padding: int = 0, groups: int = 1, dilation: int = 1,
) -> np.ndarray:  # fmt: skip
    out = conv_transpose2d_ref(
        x[..., None, :], w[..., None, :], bias, (1, stride), (0, padding),
        (0, output_padding), groups, (1, dilation),
    )  # fmt: skip
    return out[..., 0, :]


add(
    "conv_transpose1d",
    lambda m, x, w, b=None, **k: m.F.conv_transpose1d(x, w, b, **k),
    conv_transpose1d_ref,
    lambda rng: [
        S((uni(rng, (2, 2, 4)), uni(rng, (2, 3, 3)), uni(rng, (3,))), name="bias"),
        S(
            (uni(rng, (1, 4, 3)), uni(rng, (4, 1, 2))),
            {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2, "dilation": 2},
            "stride_padding_groups_dilation",
        ),
        S((uni(rng, (2, 3)), uni(rng, (2, 2, 2))), {"stride": 3}, "unbatched"),
    ],
    f32_tol=(1e-4, 1e-5),
)


def conv1d_ref(
    x: np.ndarray,
    w: np.ndarray,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    # a 1-D convolution is a 2-D one over a unit height (padding 0 and stride, dilation 1 there)
    padding = padding if isinstance(padding, str) else (0, _pair(padding)[0])
    stride, dilation = (1, _pair(stride)[0]), (1, _pair(dilation)[0])
    out = conv2d_ref(x[..., None, :], w[..., None, :], bias, stride, padding, dilation, groups)
    return out[..., 0, :]


def _conv1d_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (2, 2, 6)), uni(rng, (3, 2, 3)), uni(rng, (3,))), name="bias"),
        S(
            (uni(rng, (1, 4, 9)), uni(rng, (6, 2, 2))),
            {"stride": 2, "padding": 1, "dilation": 2, "groups": 2},
            "stride_padding_dilation_groups",
        ),
        S((uni(rng, (1, 2, 5)), uni(rng, (1, 2, 2))), {"padding": "same"}, "same_even"),
        S(
            (uni(rng, (1, 3, 5)), uni(rng, (3, 1, 3))),
            {"groups": 3, "padding": "valid"},
            "depthwise",
        ),
        S((uni(rng, (2, 4)), uni(rng, (1, 2, 2)), uni(rng, (1,))), name="unbatched"),
        S(
            (uni(rng, (1, 2, 5)), uni(rng, (2, 2, 2))),
            {"stride": (2,)},
            "noncontig",
            noncontig=True,
        ),
    ]


add(
    "conv1d",
    lambda m, x, w, b=None, **k: m.F.conv1d(x, w, b, **k),
    conv1d_ref,
    _conv1d_samples,
    f32_tol=(1e-4, 1e-5),
)


def adaptive_avg_pool2d_ref(x: np.ndarray, output_size: Any) -> np.ndarray:
    sizes = output_size if isinstance(output_size, tuple) else (output_size, output_size)
    H, W = x.shape[-2:]
    oh, ow = (H if sizes[0] is None else sizes[0]), (W if sizes[1] is None else sizes[1])
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for i in range(oh):
        h0, h1 = math.floor(i * H / oh), math.ceil((i + 1) * H / oh)
        for j in range(ow):
            w0, w1 = math.floor(j * W / ow), math.ceil((j + 1) * W / ow)
            out[..., i, j] = x[..., h0:h1, w0:w1].mean(axis=(-2, -1))
    return out


def _resample_ref(x: np.ndarray, dim: int, out: int, taps: Callable[[int], list]) -> np.ndarray:
    """Output j along ``dim`` is sum(w * x[i]) over ``taps(j)`` = [(i, w), ...]."""
    moved = np.moveaxis(x, dim, -1)
    res = np.zeros(moved.shape[:-1] + (out,))
    for j in range(out):
        for i, w in taps(j):
            res[..., j] += w * moved[..., i]
    return np.moveaxis(res, -1, dim)


def interpolate_ref(
    x: np.ndarray,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: Any = None,
) -> np.ndarray:
    spatial = x.ndim - 2
    if size is not None:
        outs = list(size) if isinstance(size, tuple) else [size] * spatial
        scales: list = [None] * spatial
    else:
        scales = list(scale_factor) if isinstance(scale_factor, tuple) else [scale_factor] * spatial
        outs = [math.floor(n * f) for n, f in zip(x.shape[2:], scales)]
    for k in range(spatial):
        n, out, sc = x.shape[2 + k], outs[k], scales[k]
        step = 1 / sc if sc else n / out
        if mode in ("nearest", "nearest-exact"):
            half = 0.5 if mode == "nearest-exact" else 0.0
            # PyTorch's kernels compute the source index in float32
            idx = [
                min(int(np.floor(np.float32(j + half) * np.float32(step))), n - 1)
                for j in range(out)
            ]
            x = _resample_ref(x, 2 + k, out, lambda j, idx=idx: [(idx[j], 1.0)])
        elif mode == "area":
            x = _resample_ref(
                x,
                2 + k,
                out,
                lambda j, n=n, out=out: [
                    (i, 1.0 / (math.ceil((j + 1) * n / out) - math.floor(j * n / out)))
                    for i in range(math.floor(j * n / out), math.ceil((j + 1) * n / out))
                ],
            )
        else:

            def taps(j: int, n: int = n, out: int = out, step: float = step) -> list:
                if align_corners:
                    src = j * (n - 1) / (out - 1) if out > 1 else 0.0
                else:
                    src = max(step * (j + 0.5) - 0.5, 0.0)
                lo = min(int(src), n - 1)
                return [(lo, 1.0 - (src - lo)), (min(lo + 1, n - 1), src - lo)]

            x = _resample_ref(x, 2 + k, out, taps)
    return x


add(
    "adaptive_avg_pool2d",
    lambda m, x, size: m.F.adaptive_avg_pool2d(x, size),
    adaptive_avg_pool2d_ref,
    lambda rng: [
        S((uni(rng, (1, 2, 5, 7)), 3), name="uneven"),
        S((uni(rng, (2, 1, 6, 4)), (3, None)), name="none_keeps"),
        S((uni(rng, (1, 1, 4, 6)), (2, 3)), name="even"),
        S((uni(rng, (2, 3, 3)), (2, 5)), name="unbatched_larger"),
        S((uni(rng, (1, 2, 3, 5)), 1), name="global", noncontig=True),
    ],
)


add(
    "adaptive_avg_pool1d",
    lambda m, x, size: m.F.adaptive_avg_pool1d(x, size),
    lambda x, size: adaptive_avg_pool2d_ref(x[..., None, :], (1, size))[..., 0, :],
    lambda rng: [
        S((uni(rng, (2, 3, 7)), 3), name="uneven"),
        S((uni(rng, (3, 6)), 2), name="unbatched_even"),
        S((uni(rng, (1, 2, 3)), 5), name="larger", noncontig=True),
    ],
)


def _interpolate_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (1, 2, 3, 4)),), {"size": (5, 7)}, "nearest_size"),
        S((uni(rng, (1, 1, 3, 2)),), {"scale_factor": 2}, "nearest_repeat"),
        S((uni(rng, (1, 1, 4, 6)),), {"scale_factor": 0.5}, "nearest_slice"),
        S((uni(rng, (1, 2, 5)),), {"scale_factor": 1.7, "mode": "nearest-exact"}, "nearest_exact"),
        S(
            (uni(rng, (1, 2, 3, 4)),),
            {"size": (5, 3), "mode": "bilinear", "align_corners": True},
            "bilinear_corners",
        ),
        S(
            (uni(rng, (2, 1, 4, 3)),),
            {"scale_factor": (1.5, 2.0), "mode": "bilinear"},
            "bilinear_scale",
        ),
        S((uni(rng, (1, 2, 4)),), {"size": 7, "mode": "linear"}, "linear", noncontig=True),
        S((uni(rng, (1, 1, 5, 7)),), {"size": (3, 2), "mode": "area"}, "area"),
    ]


add(
    "interpolate",
    lambda m, x, **k: m.F.interpolate(x, **k),
    interpolate_ref,
    _interpolate_samples,
)
# the nearest and linear modes' fused backward kernel (``resample_backward``) runs where no
# graph of the gradient is wanted: a first-order entry reaches it
add(
    "interpolate_first_order",
    lambda m, x, **k: m.F.interpolate(x, **k),
    interpolate_ref,
    _interpolate_samples,
    twice=False,
)


def _pool_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (1, 2, 4, 4)), 2), name="k2"),
        S((uni(rng, (1, 1, 5, 5)), 3), {"stride": 2, "padding": 1}, "stride_padding"),
        S((uni(rng, (2, 1, 3, 4)), (2, 3)), {"stride": 1}, "overlap"),
    ]


add(
    "max_pool2d",
    lambda m, x, k, **kw: m.F.max_pool2d(x, k, **kw),
    max_pool2d_ref,
    lambda rng: (
        _pool_samples(rng)
        + [
            S((uni(rng, (1, 1, 5, 5)), 2), {"dilation": 2}, "dilation"),
            S((uni(rng, (1, 1, 5, 5)), 2), {"ceil_mode": True}, "ceil_mode"),
            S(
                (uni(rng, (1, 1, 5, 4)), (3, 2)),
                {"stride": 2, "padding": 1, "ceil_mode": True},
                "ceil_mode_padding",
            ),
            S((uni(rng, (2, 3, 4)), 2), name="unbatched"),
        ]
    ),
)


def _pool1d_ref(ref2d: Callable) -> Callable:
    """A 1-D pooling reference: the 2-D one over a unit height."""

    def ref(x: np.ndarray, k: int, **kw: Any) -> np.ndarray:
        kw = {
            key: ((1, v) if key in ("stride", "dilation") else (0, v) if key == "padding" else v)
            for key, v in kw.items()
        }
        return ref2d(x[..., None, :], (1, k), **kw)[..., 0, :]

    return ref


def _pool1d_samples(rng: np.random.Generator) -> list[Sample]:
    return [
        S((uni(rng, (2, 3, 9)), 3), name="k3"),
        S((uni(rng, (3, 8)), 2), name="unbatched"),
        S((uni(rng, (1, 2, 9)), 3), {"stride": 2, "padding": 1}, "stride_padding"),
        S((uni(rng, (1, 2, 8)), 3), {"stride": 2, "ceil_mode": True}, "ceil_mode"),
        S((uni(rng, (1, 2, 6)), 2), name="noncontig", noncontig=True),
    ]


add(
    "max_pool1d",
    lambda m, x, k, **kw: m.F.max_pool1d(x, k, **kw),
    _pool1d_ref(max_pool2d_ref),
    lambda rng: _pool1d_samples(rng) + [S((uni(rng, (1, 2, 9)), 2), {"dilation": 2}, "dilation")],
)
add(
    "avg_pool1d",
    lambda m, x, k, **kw: m.F.avg_pool1d(x, k, **kw),
    _pool1d_ref(avg_pool2d_ref),
    lambda rng: (
        _pool1d_samples(rng)
        + [
            S(
                (uni(rng, (1, 2, 9)), 4),
                {"stride": 2, "padding": 2, "count_include_pad": False},
                "exclude_pad",
            )
        ]
    ),
)


def pixel_shuffle_ref(x: np.ndarray, r: int) -> np.ndarray:
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    y = np.moveaxis(y, (n + 1, n + 2), (n + 2, n + 4))  # (*, C, H, r, W, r)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle_ref(x: np.ndarray, r: int) -> np.ndarray:
    *lead, c, h, w = x.shape
    n = len(lead)
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    y = np.moveaxis(y, (n + 2, n + 4), (n + 1, n + 2))  # (*, C, r, r, H, W)
    return y.reshape(*lead, c * r * r, h // r, w // r)


def channel_shuffle_ref(x: np.ndarray, g: int) -> np.ndarray:
    n, c, *rest = x.shape
    return np.swapaxes(x.reshape(n, g, c // g, *rest), 1, 2).reshape(x.shape)


add(
    "pixel_shuffle",
    lambda m, x, r: m.F.pixel_shuffle(x, r),
    pixel_shuffle_ref,
    lambda rng: [
        S((uni(rng, (2, 8, 2, 3)), 2), name="r2"),
        S((uni(rng, (9, 2, 2)), 3), name="unbatched"),
        S((uni(rng, (1, 4, 2, 2)), 2), name="noncontig", noncontig=True),
    ],
)
add(
    "pixel_unshuffle",
    lambda m, x, r: m.F.pixel_unshuffle(x, r),
    pixel_unshuffle_ref,
    lambda rng: [
        S((uni(rng, (2, 2, 4, 6)), 2), name="r2"),
        S((uni(rng, (1, 3, 3, 6)), 3), name="r3"),
    ],
)
add(
    "channel_shuffle",
    lambda m, x, g: m.F.channel_shuffle(x, g),
    channel_shuffle_ref,
    lambda rng: [
        S((uni(rng, (2, 6, 3, 2)), 2), name="g2"),
        S((uni(rng, (1, 6, 4)), 3), name="g3"),
    ],
)
add(
    "max_pool2d_indices",
    lambda m, x, k: m.F.max_pool2d(x, k, return_indices=True)[1],
    lambda x, k: max_pool2d_indices_ref(x, k),
    lambda rng: [S((uni(rng, (1, 2, 4, 4)), 2), name="k2")],
    differentiable=False,
)
add(
    "avg_pool2d",
    lambda m, x, k, **kw: m.F.avg_pool2d(x, k, **kw),
    avg_pool2d_ref,
    lambda rng: (
        _pool_samples(rng)
        + [
            S(
                (uni(rng, (1, 1, 5, 5)), 3),
                {"stride": 2, "padding": 1, "count_include_pad": False},
                "exclude_pad",
            ),
            S((uni(rng, (1, 1, 5, 5)), 2), {"ceil_mode": True}, "ceil_mode"),
            S(
                (uni(rng, (1, 1, 5, 6)), 3),
                {"stride": 2, "padding": 1, "ceil_mode": True},
                "ceil_mode_padding",
            ),
            S(
                (uni(rng, (1, 1, 5, 6)), 3),
                {"stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
                "ceil_mode_exclude_pad",
            ),
            S((uni(rng, (1, 2, 4, 4)), 2), {"divisor_override": 3}, "divisor_override"),
            S(
                (
                    uni(rng, (2, 4, 3)),
                    (2, 3),
                ),
                {"stride": (1, 2)},
                "unbatched",
            ),
        ]
    ),
)


# top-level composites (ops/composites.py) -------------------------------------------------------
def _one(*shapes: tuple, gen: Gen = uni, noncontig: bool = False, **kw: Any) -> Callable:
    """One sample of arrays of ``shapes`` (with keyword arguments ``kw``)."""
    return lambda rng: [S(tuple(_arrays(gen)(rng, s) for s in shapes), kw, noncontig=noncontig)]


def _cases(*makers: Callable) -> Callable:
    return lambda rng: [s for make in makers for s in make(rng)]


add("frac", lambda m, x: m.frac(x), lambda x: x - np.trunc(x), unary(nonint))
add(
    "fmod",
    lambda m, a, b: m.fmod(a, b),
    np.fmod,
    exact_quotients,
)
add("deg2rad", lambda m, x: m.deg2rad(x), np.deg2rad, unary())
add("rad2deg", lambda m, x: m.rad2deg(x), np.rad2deg, unary())
# (at input == other == 0 PyTorch's gradient for other is 0 / 0 = nan, fusegrad's 0: the
# "zeros" sample is compared with the reference only)
add(
    "xlogy",
    lambda m, a, b: m.xlogy(a, b),
    lambda a, b: np.where((a == 0) & ~np.isnan(b), 0.0, a * np.log(np.where(a == 0, 1.0, b))),
    _cases(
        binary(uni, pos, scalars=False),
        lambda rng: [
            S(
                (np.array([0.0, 0.0, 2.0]), np.array([0.0, -1.0, 3.0])),
                name="zeros",
                grad=False,
                torch=False,
            )
        ],
    ),
)
add(
    "logit",
    lambda m, x: m.logit(x),
    lambda x: np.log(x / (1 - x)),
    unary(lambda r, s: uni(r, s, 0.1, 0.9)),
)
add(
    "logit_eps",
    lambda m, x: m.logit(x, eps=0.2),
    lambda x: np.log(np.clip(x, 0.2, 0.8) / (1 - np.clip(x, 0.2, 0.8))),
    _one(
        (3, 4),
        gen=lambda r, s: np.where(r.random(s) < 0.5, uni(r, s, 0.05, 0.15), uni(r, s, 0.3, 0.7)),
    ),
)
add(
    "copysign",
    lambda m, a, b: m.copysign(a, b),
    np.copysign,
    binary(away, away, scalar_left=False),
)
add(
    "fmax",
    lambda m, a, b: m.fmax(a, b),
    np.fmax,
    _cases(
        binary(scalars=False),
        lambda rng: [
            S(
                (np.array([1.0, np.nan, np.nan]), np.array([np.nan, 2.0, np.nan])),
                name="nan",
                grad=False,
            )
        ],
    ),
)
add(
    "fmin",
    lambda m, a, b: m.fmin(a, b),
    np.fmin,
    _cases(
        binary(scalars=False),
        lambda rng: [
            S(
                (np.array([1.0, np.nan, np.nan]), np.array([np.nan, 2.0, np.nan])),
                name="nan",
                grad=False,
            )
        ],
    ),
)
add(
    "float_power",
    lambda m, a, b: m.float_power(a, b),
    np.power,
    binary(pos, scalars=False),
    out_dtype="float64",
)
add("logaddexp2", lambda m, a, b: m.logaddexp2(a, b), np.logaddexp2, binary(scalars=False))
add("clamp_min", lambda m, x: m.clamp_min(x, 0.3), lambda x: np.maximum(x, 0.3), unary(away))
add("clamp_max", lambda m, x: m.clamp_max(x, 0.3), lambda x: np.minimum(x, 0.3), unary(away))
add("nansum", lambda m, x: m.nansum(x, 1), lambda x: np.nansum(x, 1), _one((3, 4)))
add(
    "nanmean",
    lambda m, x: m.nanmean(x, 0),
    lambda x: np.nanmean(x, 0),
    lambda rng: [S((np.array([[1.0, np.nan, 2.0], [3.0, 4.0, np.nan]]),), nograd=frozenset({0}))],
    torch_grad=False,
)
add(
    "aminmax",
    lambda m, x: tuple(m.aminmax(x, dim=1)),
    lambda x: (x.min(1), x.max(1)),
    _one((3, 4)),
)
add(
    "std_mean",
    lambda m, x: m.std_mean(x, 1),
    lambda x: (x.std(1, ddof=1), x.mean(1)),
    _one((3, 4)),
)
add("trace", lambda m, x: m.trace(x), np.trace, _cases(_one((3, 4)), _one((3, 3), noncontig=True)))
add(
    "dist",
    lambda m, a, b: m.dist(a, b, 3),
    lambda a, b: np.sum(np.abs(a - b) ** 3) ** (1 / 3),
    _one((3, 4), (3, 4)),
)
add("ravel", lambda m, x: m.ravel(x), np.ravel, _one((3, 4), noncontig=True))
add("fliplr", lambda m, x: m.fliplr(x), np.fliplr, _one((3, 4)))
add(
    "rot90",
    lambda m, x: (m.rot90(x), m.rot90(x, 2), m.rot90(x, -1, (2, 0))),
    lambda x: (np.rot90(x), np.rot90(x, 2), np.rot90(x, -1, (2, 0))),
    _one((2, 3, 4)),
)
add(
    "atleast_3d",
    lambda m, a, b: m.atleast_3d(a, b),
    lambda a, b: (a[None, :, None], b[:, :, None]),
    _one((3,), (2, 3)),
)
add(
    "tensor_split",
    lambda m, x: m.tensor_split(x, 3, 1) + m.tensor_split(x, [1, 3], 0),
    lambda x: tuple(np.array_split(x, 3, 1)) + tuple(np.split(x, [1, 3], 0)),
    _one((4, 5)),
)
add(
    "column_stack",
    lambda m, a, b: m.column_stack([a, b]),
    lambda a, b: np.column_stack([a, b]),
    _one((3,), (3, 2)),
)
add(
    "dstack", lambda m, a, b: m.dstack([a, b]), lambda a, b: np.dstack([a, b]), _one((2, 3), (2, 3))
)
add(
    "diag_embed",
    lambda m, x: (m.diag_embed(x), m.diag_embed(x, 1, 0, 2)),
    lambda x: (
        np.stack([np.diag(r) for r in x]),
        np.moveaxis(np.stack([np.diag(r, 1) for r in x]), 0, 1),
    ),
    _one((2, 3)),
)
add("diagflat", lambda m, x: m.diagflat(x, -1), lambda x: np.diagflat(x, -1), _one((2, 2)))
add(
    "block_diag",
    lambda m, a, b: m.block_diag(a, b),
    lambda a, b: np.block([[a, np.zeros((2, 2))], [np.zeros((1, 3)), b[None]]]),
    _one((2, 3), (2,)),
)
add(
    "cartesian_prod",
    lambda m, a, b: m.cartesian_prod(a, b),
    lambda a, b: np.stack([np.repeat(a, len(b)), np.tile(b, len(a))], 1),
    _one((2,), (3,)),
)
add(
    "meshgrid",
    lambda m, a, b: m.meshgrid(a, b, indexing="xy"),
    lambda a, b: tuple(np.meshgrid(a, b, indexing="xy")),
    _one((2,), (3,)),
)
add(
    "take",
    lambda m, x, i: m.take(x, i),
    lambda x, i: np.take(x, i),
    lambda rng: [S((uni(rng, (3, 4)), np.array([[0, -1], [5, 3]])))],
)
add(
    "tensordot",
    lambda m, a, b: m.tensordot(a, b, dims=([1, 0], [0, 2])),
    lambda a, b: np.tensordot(a, b, axes=([1, 0], [0, 2])),
    _one((3, 4, 2), (4, 5, 3)),
)
add("kron", lambda m, a, b: m.kron(a, b), np.kron, _one((2, 3), (3, 1, 2)))
add(
    "addmv",
    lambda m, x, a, v: m.addmv(x, a, v, beta=0.5, alpha=2.0),
    lambda x, a, v: 0.5 * x + 2.0 * (a @ v),
    _one((3,), (3, 4), (4,)),
)
add(
    "addr",
    lambda m, x, a, b: m.addr(x, a, b, alpha=3.0),
    lambda x, a, b: x + 3.0 * np.outer(a, b),
    _one((1, 4), (3,), (4,)),
)

add("adjoint", lambda m, x: m.adjoint(x), lambda x: np.swapaxes(x, -1, -2), _one((2, 3, 4)))
add(
    "fill",
    lambda m, x, v: m.fill(x, v),
    lambda x, v: np.broadcast_to(v, x.shape),
    _one((2, 3), ()),
)
add(
    "ldexp",
    lambda m, x, e: m.ldexp(x, e),
    lambda x, e: x * 2.0**e,
    lambda rng: [S((uni(rng, (3, 4)), uni(rng, (3, 4)))), S((uni(rng, (3, 1)), uni(rng, (4,))))],
)
add(
    "mvlgamma",
    lambda m, x: m.mvlgamma(x, 3),
    lambda x: sum(lgamma_ref(x - j / 2) for j in range(3)) + 1.5 * np.log(np.pi),
    # (above 1 also at 3/4 of the values: the whole-step test replays on scaled inputs)
    unary(lambda r, s: uni(r, s, 1.4, 4.0)),
)
add(
    "trapezoid",
    lambda m, y, x: (m.trapezoid(y, x), m.trapezoid(y, dx=0.5, dim=0), m.trapz(y)),
    lambda y, x: (np.trapezoid(y, x), np.trapezoid(y, dx=0.5, axis=0), np.trapezoid(y)),
    lambda rng: [S((uni(rng, (3, 5)), np.cumsum(pos(rng, (5,)))), nograd=frozenset({1}))],
)
add(
    "cumulative_trapezoid",
    lambda m, y, x: m.cumulative_trapezoid(y, x),
    lambda y, x: np.cumsum((y[:, 1:] + y[:, :-1]) / 2 * np.diff(x), 1),
    lambda rng: [S((uni(rng, (3, 5)), np.cumsum(pos(rng, (3, 5)), 1)))],
)
add(
    "cov",
    lambda m, x, a: (m.cov(x), m.cov(x, correction=0, fweights=m.tensor([1, 2, 1, 3]), aweights=a)),
    lambda x, a: (np.cov(x), np.cov(x, ddof=0, fweights=[1, 2, 1, 3], aweights=a)),
    lambda rng: [S((uni(rng, (3, 4)), pos(rng, (4,))))],
)
add("corrcoef", lambda m, x: m.corrcoef(x), np.corrcoef, _one((3, 5)))
add(
    "vander",
    lambda m, x: (m.vander(x), m.vander(x, 2, increasing=True)),
    lambda x: (np.vander(x), np.vander(x, 2, increasing=True)),
    _one((4,)),
    torch_grad=False,  # (PyTorch 2.13's vander backward fails: a tensor it saved is modified)
)
add(
    "combinations",
    lambda m, x: m.combinations(x, 2, with_replacement=True),
    lambda x: np.array(list(__import__("itertools").combinations_with_replacement(x, 2))),
    _one((4,)),
)
add(
    "quantile",
    lambda m, x: (
        m.quantile(x, m.tensor([0.1, 0.5, 1.0], dtype=x.dtype), dim=1, keepdim=True),
        m.quantile(x, 0.3, interpolation="midpoint"),
    ),
    lambda x: (
        np.moveaxis(np.quantile(x, [0.1, 0.5, 1.0], axis=1, keepdims=True), 0, 0),
        np.quantile(x, 0.3, method="midpoint"),
    ),
    _one((3, 5)),
)
add(
    "nanquantile",
    lambda m, x: m.nanquantile(x, 0.4, dim=0),
    lambda x: np.nanquantile(x, 0.4, axis=0),
    lambda rng: [S((np.where(rng.random((4, 3)) < 0.3, np.nan, uni(rng, (4, 3))),))],
)

# complex numbers (docs/complex.md): real leaves in and real values out, complex in between, so
# that every case runs through the table's float machinery (gradients reach the real leaves
# through the complex rules); tests/ops/test_complex.py checks complex leaves themselves
add(
    "complex_abs",
    lambda m, a, b: m.complex(a, b).abs(),
    lambda a, b: np.abs(a + 1j * b),
    binary(away, away, scalars=False),
)
add(
    "complex_exp_parts",
    lambda m, a, b: (m.complex(a, b).exp().real, m.complex(a, b).sin().imag),
    lambda a, b: (np.exp(a + 1j * b).real, np.sin(a + 1j * b).imag),
    binary(scalars=False),
)


def _torch_fails_empty(make: Callable) -> Callable:
    """PyTorch 2.13's view_as_real backward refuses an empty gradient (its strides): those
    cases are checked against numpy only."""

    def samples(rng: np.random.Generator) -> list[Sample]:
        out = make(rng)
        for s in out:
            if s.name == "empty":
                s.torch = False
        return out

    return samples


add(
    "complex_mul_conj",
    lambda m, a, b: m.view_as_real(m.complex(a, b) * m.complex(b, a).conj_physical()),
    lambda a, b: np.stack(
        [((a + 1j * b) * (b - 1j * a)).real, ((a + 1j * b) * (b - 1j * a)).imag], -1
    ),
    _torch_fails_empty(binary(scalars=False)),
)
add(
    "view_as_complex",
    lambda m, x: m.view_as_real(m.view_as_complex(x) * m.view_as_complex(x).sqrt()),
    lambda x: np.stack(
        [
            ((x[..., 0] + 1j * x[..., 1]) ** 1.5).real,
            ((x[..., 0] + 1j * x[..., 1]) ** 1.5).imag,
        ],
        -1,
    ),
    lambda rng: [S((away(rng, (3, 2)),)), S((away(rng, (2, 4, 2)),)), S((away(rng, (2,)),))],
)
add(
    "complex_angle_sgn",
    lambda m, a, b: (m.complex(a, b).angle(), m.view_as_real(m.complex(a, b).sgn())),
    lambda a, b: (
        np.angle(a + 1j * b),
        np.stack([(a + 1j * b).real / np.abs(a + 1j * b), b / np.abs(a + 1j * b)], -1),
    ),
    _torch_fails_empty(binary(away, away, scalars=False)),
)
add(
    "polar",
    lambda m, r, theta: m.view_as_real(m.polar(r, theta)),
    lambda r, theta: np.stack([r * np.cos(theta), r * np.sin(theta)], -1),
    _torch_fails_empty(binary(pos, uni, scalars=False)),
)
add("angle_real", lambda m, x: m.angle(x), np.angle, unary(away), zero_grad=True)

# fusegrad.fft (tests/test_fft.py covers every function, norm and size): real in, real out
add(
    "fft_circular_convolution",
    lambda m, a, b: m.fft.irfft(m.fft.rfft(a) * m.fft.rfft(b), n=a.shape[-1]),
    lambda a, b: np.fft.irfft(np.fft.rfft(a) * np.fft.rfft(b), n=a.shape[-1]),
    lambda rng: [S((uni(rng, (3, 6)), uni(rng, (3, 6)))), S((uni(rng, (5,)), uni(rng, (5,))))],
)
add(
    "fft_magnitude",
    lambda m, x: m.fft.fftn(x, s=(4, 3), norm="ortho").abs(),
    lambda x: np.abs(np.fft.fftn(x, s=(4, 3), axes=(-2, -1), norm="ortho")),
    lambda rng: [S((uni(rng, (3, 5)),)), S((uni(rng, (2, 3, 2)),), noncontig=True)],
)

# fusegrad.linalg (tests/test_linalg.py covers every function, real and complex, batched):
# well-conditioned inputs, and outputs that do not depend on the sign of eigen- or singular
# vectors


def _square(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return uni(rng, shape) + 3 * np.eye(shape[-1])


_LINALG = {"f32_tol": (2e-4, 2e-5)}
add(
    "linalg_solve",
    lambda m, A, B: m.linalg.solve(A, B),
    np.linalg.solve,
    lambda rng: [
        S((_square(rng, (2, 3, 3)), uni(rng, (2, 3, 2)))),
        S((_square(rng, (3, 3)), uni(rng, (3, 1)))),
    ],
    **_LINALG,
)
add(
    "linalg_solve_triangular",
    lambda m, A, B: m.linalg.solve_triangular(A, B, upper=False),
    lambda A, B: np.linalg.solve(np.tril(A), B),
    lambda rng: [S((_square(rng, (2, 3, 3)), uni(rng, (2, 3, 2))))],
    **_LINALG,
)
add(
    "linalg_cholesky",
    lambda m, x: m.linalg.cholesky(x @ x.mT + m.eye(x.shape[-1], dtype=x.dtype, device=x.device)),
    lambda x: np.linalg.cholesky(x @ np.swapaxes(x, -1, -2) + np.eye(x.shape[-1])),
    lambda rng: [S((uni(rng, (2, 3, 3)),))],
    **_LINALG,
)
add(
    "linalg_lu",
    lambda m, A: tuple(m.linalg.lu(A)),
    lambda A: _lu_reference(A),
    lambda rng: [S((uni(rng, (3, 3)),))],
    **_LINALG,
)
add(
    "linalg_det_slogdet",
    lambda m, A: (m.linalg.det(A), *m.linalg.slogdet(A)),
    lambda A: (np.linalg.det(A), *np.linalg.slogdet(A)),
    lambda rng: [S((_square(rng, (2, 3, 3)),))],
    **_LINALG,
)
add(
    "linalg_eigh",
    lambda m, x: (lambda L, V: (L, V**2))(*m.linalg.eigh(x + x.mT)),
    lambda x: (lambda L, V: (L, V**2))(*np.linalg.eigh(x + np.swapaxes(x, -1, -2))),
    lambda rng: [S((uni(rng, (2, 3, 3)),))],
    **_LINALG,
)
add(
    "linalg_eig",
    lambda m, x: (lambda L, V: ((L**2).sum(-1).real, (V.abs() ** 2).sum()))(
        *m.linalg.eig(x + x.mT)
    ),
    lambda x: (lambda L, V: ((L**2).sum(-1).real, (np.abs(V) ** 2).sum()))(
        *np.linalg.eig(x + np.swapaxes(x, -1, -2))
    ),
    lambda rng: [S((uni(rng, (3, 3)),))],
    **_LINALG,
)
add(
    "linalg_svd",
    lambda m, A: (lambda U, S_, Vh: (U**2, S_, Vh**2))(*m.linalg.svd(A, full_matrices=False)),
    lambda A: (lambda U, S_, Vh: (U**2, S_, Vh**2))(*np.linalg.svd(A, full_matrices=False)),
    lambda rng: [S((uni(rng, (2, 4, 3)),)), S((uni(rng, (3, 5)),))],
    **_LINALG,
)
add(
    "linalg_qr",
    lambda m, A: tuple(m.linalg.qr(A)),
    lambda A: tuple(np.linalg.qr(A)),
    lambda rng: [S((uni(rng, (2, 4, 3)),)), S((uni(rng, (3, 5)),))],
    **_LINALG,
)
add(
    "linalg_pinv_matrix_exp",
    lambda m, A: (m.linalg.pinv(A), m.linalg.matrix_exp(A[..., :3, :])),
    lambda A: (np.linalg.pinv(A), _expm_reference(A[..., :3, :])),
    lambda rng: [S((uni(rng, (2, 4, 3)),))],
    **_LINALG,
)


def _lu_reference(A: np.ndarray) -> tuple:
    """P, L, U by Doolittle elimination with partial pivoting (as LAPACK's getrf)."""
    n = A.shape[-1]
    U, L, perm = A.astype(np.float64).copy(), np.eye(n), np.arange(n)
    for j in range(n):
        p = j + int(np.argmax(np.abs(U[j:, j])))
        U[[j, p]], perm[[j, p]], L[[j, p], :j] = U[[p, j]], perm[[p, j]], L[[p, j], :j]
        for i in range(j + 1, n):
            L[i, j] = U[i, j] / U[j, j]
            U[i] -= L[i, j] * U[j]
    P = np.zeros((n, n))
    P[perm, np.arange(n)] = 1
    return P, L, np.triu(U)


def _expm_reference(A: np.ndarray) -> np.ndarray:
    """exp(A) by a long Taylor series after scaling by 2**-6, then squaring."""
    x = A / 64.0
    term = total = np.broadcast_to(np.eye(A.shape[-1]), A.shape)
    for k in range(1, 25):
        term = term @ x / k
        total = total + term
    for _ in range(6):
        total = total @ total
    return total


# ---- the convolution and pooling kernels' first-order backward ------------------------------
# The entries above are twice differentiable, so their gradients run the rules' op-surface
# form (create_graph); these run the backward kernels (``convolution_backward_input`` /
# ``_weight``) that an ordinary backward uses.
add(
    "conv2d_kernels",
    lambda m, x, w, b=None, **k: m.F.conv2d(x, w, b, **k),
    conv2d_ref,
    _conv_samples,
    twice=False,
    f32_tol=(1e-4, 1e-5),
)
add(
    "conv_transpose2d_kernels",
    lambda m, x, w, b=None, **k: m.F.conv_transpose2d(x, w, b, **k),
    conv_transpose2d_ref,
    _conv_transpose_samples,
    twice=False,
    f32_tol=(1e-4, 1e-5),
)

import op_table_special  # noqa: E402,F401  (fusegrad.special's entries, added to OPS)

OPS_BY_NAME = {e.name: e for e in OPS}
assert len(OPS_BY_NAME) == len(OPS), "duplicate op table names"
