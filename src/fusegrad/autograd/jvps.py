"""THE forward-mode table: one Jacobian-vector product (JVP) rule per differentiable primitive,
beside the VJP rules of ``derivatives.py`` and found by name the same way
(``ops.registry.JVPS``).

A rule is ``fn(p, t, out, attrs) -> tangent``: ``p`` are the primitive's inputs (primals),
``t`` their tangents (None for an input without one -- at least one is not None), ``out`` the
primal result and ``attrs`` the primitive's attributes.  It returns the output's tangent (None:
none).  ``forward_ad.apply_dual`` casts it to ``out``'s dtype and materialises it to ``out``'s
shape where it only broadcasts, so rules may return e.g. ``ta`` for ``add(a, b)`` as it is.

Rules are written in the op surface, as the VJP rules are: they are ordinary ops, so a tangent
computation is recorded by reverse mode when grad mode is on and fuses when a compiler traces
it.  Linear primitives (movement, sums, ``add``) apply themselves to the tangents
(``_linear``); view primitives thereby give views of the input's tangent.

``UNSUPPORTED`` names the differentiable primitives without a rule on purpose, with the reason;
forward AD through them raises ``NotImplementedError`` naming the primitive
(``tests/autograd/test_forward_ad.py`` checks every differentiable primitive is in one of the
two).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from .. import ops as F
from ..ops.registry import REGISTRY, jvp
from ..ops.registry import apply as _apply
from . import derivatives as _derivatives

# differentiable primitives deliberately left without a JVP rule: name -> why
UNSUPPORTED: dict[str, str] = {}


def _zeros(x: Any) -> Any:
    return F.zeros_like(x)


def _add(*terms: Any) -> Any:
    """The sum of the terms that are not None (None when all are)."""
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else total + term
    return total


def _linear(name: str, differentiable: tuple[int, ...] | None = (0,)) -> None:
    """A primitive linear in its inputs at positions ``differentiable`` (None: all; the
    others, index tensors, are passed through): its JVP is the primitive applied to the
    tangents (zeros for inputs without one)."""
    prim = REGISTRY[name]

    @jvp(name)
    def rule(p: tuple, t: tuple, out: Any, attrs: dict) -> Any:
        args = tuple(
            (t[i] if t[i] is not None else _zeros(x))
            if differentiable is None or i in differentiable
            else x
            for i, x in enumerate(p)
        )
        return _apply(prim, args, attrs)


def _unary(name: str, derivative: Any) -> None:
    """An elementwise ``f(x)``: tangent ``t * f'(x)``, ``derivative(x, out)`` giving f'."""

    @jvp(name)
    def rule(p: tuple, t: tuple, out: Any, attrs: dict) -> Any:
        return t[0] * derivative(p[0], out)


# ---- elementwise unary -------------------------------------------------------------------------


@jvp("neg")
def _neg(p, t, out, attrs):
    return -t[0]


_unary("exp", lambda x, out: out)
_unary("expm1", lambda x, out: out + 1.0)
_unary("log", lambda x, out: x.reciprocal())
_unary("log1p", lambda x, out: (x + 1.0).reciprocal())
_unary("sin", lambda x, out: x.cos())
_unary("tanh", lambda x, out: 1.0 - out * out)
_unary("sigmoid", lambda x, out: out * (1.0 - out))
_unary("asin", lambda x, out: (1.0 - x * x).rsqrt())
_unary("acos", lambda x, out: -(1.0 - x * x).rsqrt())
_unary("atan", lambda x, out: (x * x + 1.0).reciprocal())
_unary("sinh", lambda x, out: x.cosh())
_unary("cosh", lambda x, out: x.sinh())
_unary("asinh", lambda x, out: (x * x + 1.0).rsqrt())
_unary(
    "acosh",
    lambda x, out: (
        ((x - 1.0).sqrt() * (x + 1.0).sqrt()).reciprocal()
        if x.is_complex()
        else (x * x - 1.0).rsqrt()
    ),
)
_unary("atanh", lambda x, out: (1.0 - x * x).reciprocal())
_unary("sqrt", lambda x, out: (out * 2.0).reciprocal())


@jvp("abs")
def _abs(p, t, out, attrs):
    # d|z| along t is Re(conj(sgn z) t); sign(x) t for real x
    x = p[0]
    if x.is_complex():
        return (x.sgn().conj() * t[0]).real
    return t[0] * x.sign()


_unary("erf", lambda x, out: (-(x * x)).exp() * (2.0 / math.sqrt(math.pi)))
_unary("erfc", lambda x, out: (-(x * x)).exp() * (-2.0 / math.sqrt(math.pi)))
_unary("lgamma", lambda x, out: x.digamma())
_unary("erfinv", lambda x, out: (out * out).exp() * (math.sqrt(math.pi) / 2.0))
_unary("digamma", lambda x, out: F.polygamma(1, x))
_unary("trigamma", lambda x, out: F.polygamma(2, x))
# special functions (fusegrad.special): the derivatives of derivatives.py's rules
_unary("i0", lambda x, out: F.special_ops.i1(x))
_unary("i0e", lambda x, out: F.special_ops.i1e(x) - x.sign() * out)
_unary("i1", _derivatives._i1_slope)
_unary("i1e", _derivatives._i1e_slope)
_unary("erfcx", lambda x, out: 2.0 * x * out - 2.0 / math.sqrt(math.pi))
_unary("ndtri", lambda x, out: math.sqrt(2.0 * math.pi) * (out * out / 2.0).exp())
_unary("log_ndtr", lambda x, out: (-(out + x * x / 2.0)).exp() / math.sqrt(2.0 * math.pi))
_unary("entr", lambda x, out: -(x.log() + 1.0))


@jvp("polygamma")
def _polygamma(p, t, out, attrs):
    return t[0] * F.polygamma(attrs["n"] + 1, p[0])


def _second_argument_only(name: str, message: str, derivative: Any) -> None:
    """A binary primitive differentiable in its second input only (as in PyTorch)."""

    @jvp(name)
    def rule(p: tuple, t: tuple, out: Any, attrs: dict) -> Any:
        if t[0] is not None:
            raise NotImplementedError(f"the derivative for '{message}' is not implemented.")
        return t[1] * derivative(*p)


def _gammainc_derivative(a: Any, x: Any) -> Any:
    return (-x + (a - 1.0) * x.log() - a.lgamma()).exp()


_second_argument_only("gammainc", "igamma: input", _gammainc_derivative)
_second_argument_only("gammaincc", "igammac: input", lambda a, x: -_gammainc_derivative(a, x))
_second_argument_only("zeta", "zeta", lambda x, q: -x * F.special_ops.zeta(x + 1.0, q))


@jvp("cos")
def _cos(p, t, out, attrs):
    return -(t[0] * p[0].sin())


@jvp("reciprocal")
def _reciprocal(p, t, out, attrs):
    return -(t[0] * (out * out))


@jvp("log_softmax")
def _log_softmax(p, t, out, attrs):
    # (cross_entropy runs its composite while a dual level is active; a direct call is exact)
    dim = attrs["dim"]
    return t[0] - (out.exp() * t[0]).sum(dim, keepdim=True)


@jvp("softmax")
def _softmax(p, t, out, attrs):
    # (softmax runs its composite while a dual level is active; a direct call is exact)
    dim = attrs["dim"]
    return out * (t[0] - (out * t[0]).sum(dim, keepdim=True))


@jvp("nll_loss")
def _nll_loss(p, t, out, attrs):
    # linear in the input; the target and the weight carry no tangent
    return _apply(REGISTRY["nll_loss"], (t[0], p[1], p[2]), attrs)


UNSUPPORTED["attention"] = (
    "scaled_dot_product_attention uses its composite (matmul, softmax) while a dual level is "
    "active, so forward AD never meets the fused kernel"
)
UNSUPPORTED["embedding"] = (
    "embedding indexes (getitem) while a dual level is active, so forward AD never meets the "
    "fused kernel"
)
UNSUPPORTED["resample"] = (
    "interpolate uses its composite while a dual level is active, so forward AD never meets "
    "the fused kernel"
)
UNSUPPORTED["norm"] = (
    "batch / instance / group / layer norm use their composites while a dual level is active, "
    "so forward AD never meets the fused kernel"
)
UNSUPPORTED["rnn_sequence"] = (
    "nn.LSTM / GRU / RNN run their per-step ops while a dual level is active, so forward AD "
    "never meets the fused kernel"
)

UNSUPPORTED["convolution"] = (
    "convolutions run their composite (im2col and a matmul) while a dual level is active, so "
    "forward AD never meets the kernel"
)
UNSUPPORTED["avg_pool"] = (
    "pooling runs its composite (windows and a mean) while a dual level is active, so forward "
    "AD never meets the kernel"
)
UNSUPPORTED["avg_pool_backward"] = "the average pooling kernel's backward (see avg_pool)"
UNSUPPORTED["pool_take"] = (
    "max pooling runs its composite (windows and a max) while a dual level is active, so "
    "forward AD never meets the kernel"
)
UNSUPPORTED["pool_scatter"] = "max pooling's kernel backward (see pool_take)"


def _zero_tangent(p, t, out, attrs):
    """Piecewise-constant ops: a zero tangent (PyTorch gives zeros, not None)."""
    return F.zeros_like(out)


for _name in ("sign", "floor", "ceil", "trunc", "round"):
    jvp(_name)(_zero_tangent)


@jvp("cast")
def _cast(p, t, out, attrs):
    if not (out.is_floating_point() or out.is_complex()):
        return None
    tangent = t[0]
    if tangent.is_complex() and not out.is_complex():
        tangent = tangent.real  # complex to real keeps the real part, of the tangent too
    return F.cast(tangent, out.dtype)


@jvp("to_device")
def _to_device(p, t, out, attrs):
    return t[0].to(out.device)


_linear("clone")

# ---- elementwise binary ------------------------------------------------------------------------


@jvp("add")
def _add_rule(p, t, out, attrs):
    return _add(t[0], t[1])


@jvp("sub")
def _sub(p, t, out, attrs):
    return _add(t[0], -t[1] if t[1] is not None else None)


@jvp("mul")
def _mul(p, t, out, attrs):
    a, b = p
    ta, tb = t
    return _add(ta * b if ta is not None else None, a * tb if tb is not None else None)


@jvp("div")
def _div(p, t, out, attrs):
    a, b = p
    ta, tb = t
    return _add(ta / b if ta is not None else None, -(tb * a) / (b * b) if tb is not None else None)


@jvp("pow")
def _pow(p, t, out, attrs):
    # the VJP's partial derivatives, with its conventions (0 where b == 0, resp. where a == 0
    # and b >= 0)
    a, b = p
    ta, tb = t
    da = F.where(b == 0, 0.0, ta * (b * a ** (b - 1.0))) if ta is not None else None
    db = F.where((a == 0) & (b >= 0), 0.0, tb * (out * a.log())) if tb is not None else None
    return _add(da, db)


@jvp("atan2")
def _atan2(p, t, out, attrs):
    a, b = p
    ta, tb = t
    recip = (a * a + b * b).reciprocal()
    recip = F.where(recip.isinf(), 0.0, recip)
    return _add(
        ta * b * recip if ta is not None else None, tb * -a * recip if tb is not None else None
    )


@jvp("hypot")
def _hypot(p, t, out, attrs):
    a, b = p
    ta, tb = t
    return _add(ta * a / out if ta is not None else None, tb * b / out if tb is not None else None)


@jvp("logaddexp")
def _logaddexp(p, t, out, attrs):
    a, b = p
    ta, tb = t
    return _add(
        ta * (a - b).sigmoid() if ta is not None else None,
        tb * (b - a).sigmoid() if tb is not None else None,
    )


def _extremum2(first_wins: bool):
    def rule(p, t, out, attrs):
        a, b = p
        ta, tb = t
        # ties split evenly, as the VJP rule does
        w = (
            _derivatives._tie_weights(a, b, out.dtype)
            if first_wins
            else (_derivatives._tie_weights(b, a, out.dtype))
        )
        return _add(ta * w if ta is not None else None, tb * (1.0 - w) if tb is not None else None)

    return rule


jvp("maximum")(_extremum2(True))
jvp("minimum")(_extremum2(False))
jvp("floor_divide")(_zero_tangent)


@jvp("remainder")
def _remainder(p, t, out, attrs):
    a, b = p
    ta, tb = t
    return _add(ta, -(tb * (a / b).floor()) if tb is not None else None)


@jvp("where")
def _where(p, t, out, attrs):
    cond = p[0]
    ta = t[1] if t[1] is not None else 0.0
    tb = t[2] if t[2] is not None else 0.0
    return F.where(cond, ta, tb)


# ---- reductions --------------------------------------------------------------------------------

_linear("sum")
_linear("sum_to")
_linear("cumsum")


def _extremum(p, t, out, attrs):
    """amax/amin: the mean of the tangents at the tied extrema (the VJP splits evenly too)."""
    x = p[0]
    dim, keepdim = attrs["dim"], attrs["keepdim"]
    kshape = _derivatives._keepdim_shape(tuple(x.shape), dim)
    mask = (x == out.reshape(kshape)).to(t[0].dtype)
    red = {"dim": dim, "keepdim": keepdim} if dim is not None else {}
    return (t[0] * mask).sum(**red) / mask.sum(**red)


jvp("amax")(_extremum)
jvp("amin")(_extremum)


@jvp("prod")
def _prod(p, t, out, attrs):
    # the VJP rule with a cotangent of ones gives every element's partial derivative (exact
    # with zeros); the tangent is their sum weighted by the input's tangent
    x = p[0]
    node = SimpleNamespace(input_shapes=(tuple(x.shape),), attrs=attrs)
    (partials,) = _derivatives._prod(node, F.ones_like(out), x, out)
    partials = partials.conj()  # (the VJP conjugates them for complex x)
    dim, keepdim = attrs["dim"], attrs["keepdim"]
    red = {"dim": dim, "keepdim": keepdim} if dim is not None else {}
    return (t[0] * partials).sum(**red)


# ---- movement ----------------------------------------------------------------------------------

for _name in ("reshape", "permute", "broadcast_to", "flip", "diagonal", "getitem"):
    _linear(_name)
_linear("cat", None)  # every input
_linear("index_add_at")
_linear("gather")
_linear("index_put", (0, 1))
_linear("scatter_add", (0, 2))
_linear("scatter", (0, 2))


@jvp("pad")
def _pad(p, t, out, attrs):
    # the padding is a constant: its tangent is 0 whatever the fill value
    return _apply(REGISTRY["pad"], (t[0],), {**attrs, "value": 0})


# ---- opaque ------------------------------------------------------------------------------------


@jvp("matmul")
def _matmul(p, t, out, attrs):
    a, b = p
    ta, tb = t
    return _add(ta @ b if ta is not None else None, a @ tb if tb is not None else None)


# ---- binary cross entropy: PyTorch's forward-mode formulas, from the reverse rules' parts ----


@jvp("binary_cross_entropy")
def _binary_cross_entropy(p, t, out, attrs):
    prob, target = p
    tp, tt = t
    from_input = None
    if tp is not None:
        from_input = _apply(REGISTRY["binary_cross_entropy_backward"], (tp, prob, target), {})
    from_target = _derivatives.bce_target_gradient(tt, prob) if tt is not None else None
    return _add(from_input, from_target)


@jvp("binary_cross_entropy_backward")
def _binary_cross_entropy_backward(p, t, out, attrs):
    g, prob, target = p
    tg, tp, tt = t
    return _add(
        _apply(REGISTRY["binary_cross_entropy_backward"], (tg, prob, target), {})
        if tg is not None
        else None,
        _derivatives.bce_input_curvature(prob, target) * (tp * g) if tp is not None else None,
        _derivatives.bce_target_curvature(prob) * (tt * g) if tt is not None else None,
    )


# ---- complex numbers ---------------------------------------------------------------------------

for _name in ("conj_physical", "real", "imag", "view_as_real", "view_as_complex"):
    _linear(_name)
_linear("complex", None)

# ---- discrete Fourier transforms: linear ------------------------------------------------------

for _name in ("fft_c2c", "fft_r2c", "fft_c2r"):
    _linear(_name)

# ---- linear algebra ------------------------------------------------------------------------------


@jvp("linalg_solve")
def _linalg_solve(p, t, out, attrs):
    # A X = B: A dX = dB - dA X
    A, _ = p
    tA, tB = t
    rhs = _add(tB, -(tA @ out) if tA is not None else None)
    return _apply(REGISTRY["linalg_solve"], (A, rhs), {"check": None})


@jvp("linalg_solve_triangular")
def _linalg_solve_triangular(p, t, out, attrs):
    A, _ = p
    tA, tB = t
    if tA is not None:  # only the triangle the solve reads
        upper, unit = attrs["upper"], attrs["unitriangular"]
        tA = tA.triu(int(unit)) if upper else tA.tril(-int(unit))
        tA = -(tA @ out) if attrs["left"] else -(out @ tA)
    return _apply(REGISTRY["linalg_solve_triangular"], (A, _add(tB, tA)), attrs)


jvp("linalg_slogdet_sign")(_zero_tangent)


@jvp("linalg_logabsdet")
def _linalg_logabsdet(p, t, out, attrs):
    # d log|det A| = Re tr(A^-1 dA)
    A = p[0]
    X = _apply(REGISTRY["linalg_solve"], (A, t[0]), {"check": None})
    trace = X.diagonal(0, -2, -1).sum(-1)
    return trace.real if trace.is_complex() else trace


@jvp("linalg_matrix_exp")
def _linalg_matrix_exp(p, t, out, attrs):
    # the upper right block of exp([[A, dA], [0, A]])
    A = p[0]
    n = A.shape[-1]
    top = F.cat([A, t[0]], -1)
    bottom = F.cat([F.zeros_like(A), A], -1)
    big = _apply(REGISTRY["linalg_matrix_exp"], (F.cat([top, bottom], -2),), {})
    return big.narrow(-2, 0, n).narrow(-1, n, n)


for _name in (
    "linalg_cholesky linalg_lu_factor linalg_det linalg_eigh_values linalg_eigh_vectors "
    "linalg_eig_values linalg_eig_vectors linalg_svd_u linalg_svd_s linalg_svd_vh linalg_qr_q "
    "linalg_qr_r linalg_pinv"
).split():
    UNSUPPORTED[_name] = (
        "forward-mode rules of the factorizations are not written yet (their reverse-mode rules "
        "are, and differentiate twice)"
    )
