"""THE derivative table: one vector-Jacobian rule per differentiable primitive.

Each rule is ``fn(node, g, *saved) -> tuple`` with one entry per forward input (None where the
input gets no gradient).  Rules are written only with the op surface (``fusegrad.ops`` functions
and Tensor methods), never raw numpy, so that they are differentiable again (double backward,
``create_graph``) and traceable by the compiler (docs/ARCHITECTURE.md, contracts 1 and 3).  Rules
return
gradients in the *output's* shape where that is natural: undoing broadcasting (sum-to-shape) and
summing fan-in is the engine's job (contract 2).

Complex values follow PyTorch's convention (docs/complex.md): the gradient of a real loss ``L``
with respect to ``z = x + iy`` is ``dL/dx + i dL/dy``, the conjugate Wirtinger derivative (times
2).  A rule maps the output's gradient ``g`` to ``g * conj(f'(z))`` for a holomorphic ``f``, so
the rules of ``exp``, ``mul``, ``matmul``, ... conjugate their factors; ``conj()`` of a real
tensor is the tensor itself, so for real values they are the real rules unchanged.  A gradient
that reaches a real input from complex values is its real part (the engine takes it).

``node.attrs`` are the primitive's keyword attributes, ``node.input_shapes`` /
``node.input_dtypes`` describe the forward inputs, and ``node.needs_input_grad[i]`` says whether
input ``i`` wants a gradient (skip work for the ones that do not).  ``save={"a": "b"}`` saves
``a`` only when input ``b`` requires grad (the rule then gets None for an unsaved ``a`` and
must not use it), as PyTorch saves only what the gradients it will compute need.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from .. import dtypes as _dt
from .. import ops as F
from ..errors import AutogradError
from ..ops.classification import log_softmax_grad, softmax_grad
from ..ops.convolution import convolution_grads
from ..ops.indexing import embedding_grad
from ..ops.norms import norm_grads
from ..ops.recurrent import STATE_WIDTH, packed_parts, rnn_sequence_grads
from ..ops.registry import vjp, vjp_arrays
from ..ops.resample import resample_grad, resample_input_grad
from ..ops.spectral import dual_norm
from .grad_mode import is_grad_enabled
from .tracer import state as _tracer_state

# A real tensor is its own conjugate: the hottest rules (``mul``, ``exp``, ``tanh``, ``sigmoid``)
# check the dtype in line and call ``.conj()`` for complex values only, since the method's frames
# cost a tenth of a microsecond per call, a few calls per node in a backward of small tensors.
# (``_dtype`` is metadata that every tensor, symbolic ones included, has.)
_COMPLEX = 3  # ``dtype.category`` of complex dtypes

# The array forms (``vjp_arrays``) make their tensor forms' kernel calls: the same ufuncs on the
# same operands, a wrapped Python number being a 0-d array of the operand's dtype
# (``_no_grad_scalar``); the engine calls them for float32 and float64 arrays only.
_ONE = {np.dtype(t): np.array(1.0, t) for t in (np.float32, np.float64)}
_TWO = {np.dtype(t): np.array(2.0, t) for t in (np.float32, np.float64)}

# ---- elementwise unary -------------------------------------------------------------------------


@vjp("neg")
def _neg(node, g):
    return (-g,)


@vjp_arrays("neg")
def _neg_arrays(node, g):
    return (np.negative(g),)


@vjp("exp", save="out")
def _exp(node, g, out):
    return (g * (out if out._dtype.category != _COMPLEX else out.conj()),)


@vjp_arrays("exp")
def _exp_arrays(node, g, out):
    return (np.multiply(g, out),)


@vjp("expm1", save="out")
def _expm1(node, g, out):
    return (g * (out + 1.0).conj(),)


@vjp("log", save="x")
def _log(node, g, x):
    return (g / x.conj(),)


@vjp_arrays("log")
def _log_arrays(node, g, x):
    return (np.true_divide(g, x),)


@vjp("log1p", save="x")
def _log1p(node, g, x):
    return (g / (x + 1.0).conj(),)


@vjp("sin", save="x")
def _sin(node, g, x):
    return (g * x.cos().conj(),)


@vjp("cos", save="x")
def _cos(node, g, x):
    return (-(g * x.sin().conj()),)


@vjp("tanh", save="out")
def _tanh(node, g, out):
    d = 1.0 - out * out
    return (g * (d if d._dtype.category != _COMPLEX else d.conj()),)


@vjp_arrays("tanh")
def _tanh_arrays(node, g, out):
    return (np.multiply(g, np.subtract(_ONE[out.dtype], np.multiply(out, out))),)


@vjp("asin", save="x")
def _asin(node, g, x):
    return (g * (1.0 - x * x).rsqrt().conj(),)


@vjp("acos", save="x")
def _acos(node, g, x):
    return (-(g * (1.0 - x * x).rsqrt().conj()),)


@vjp("atan", save="x")
def _atan(node, g, x):
    return (g / (x * x + 1.0).conj(),)


@vjp("sinh", save="x")
def _sinh(node, g, x):
    return (g * x.cosh().conj(),)


@vjp("cosh", save="x")
def _cosh(node, g, x):
    return (g * x.sinh().conj(),)


@vjp("asinh", save="x")
def _asinh(node, g, x):
    return (g * (x * x + 1.0).rsqrt().conj(),)


@vjp("acosh", save="x")
def _acosh(node, g, x):
    if x.is_complex():
        # the principal branch's derivative 1 / (sqrt(z - 1) sqrt(z + 1)), which differs from
        # rsqrt(z^2 - 1) by a sign in half the plane (PyTorch's complex formula)
        return (g / ((x - 1.0).sqrt() * (x + 1.0).sqrt()).conj(),)
    return (g * (x * x - 1.0).rsqrt(),)


@vjp("atanh", save="x")
def _atanh(node, g, x):
    return (g / (1.0 - x * x).conj(),)


@vjp("sigmoid", save="out")
def _sigmoid(node, g, out):
    d = out * (1.0 - out)
    return (g * (d if d._dtype.category != _COMPLEX else d.conj()),)


@vjp_arrays("sigmoid")
def _sigmoid_arrays(node, g, out):
    return (np.multiply(g, np.multiply(out, np.subtract(_ONE[out.dtype], out))),)


@vjp("sqrt", save="out")
def _sqrt(node, g, out):
    return (g / (out * 2.0).conj(),)


@vjp_arrays("sqrt")
def _sqrt_arrays(node, g, out):
    return (np.true_divide(g, np.multiply(out, _TWO[out.dtype])),)


@vjp("reciprocal", save="out")
def _reciprocal(node, g, out):
    return (-(g * (out * out).conj()),)


@vjp("abs", save="x")
def _abs(node, g, x):
    # sgn is sign for real x, z / |z| (0 at 0) for complex z
    return (g * x.sgn(),)


@vjp("erf", save="x")
def _erf(node, g, x):
    return (g * ((-(x * x)).exp() * (2.0 / math.sqrt(math.pi))),)


@vjp("erfc", save="x")
def _erfc(node, g, x):
    return (g * ((-(x * x)).exp() * (-2.0 / math.sqrt(math.pi))),)


@vjp("erfinv", save="out")
def _erfinv(node, g, out):
    return (g * ((out * out).exp() * (math.sqrt(math.pi) / 2.0)),)


@vjp("lgamma", save="x")
def _lgamma(node, g, x):
    return (g * x.digamma(),)


@vjp("digamma", save="x")
def _digamma(node, g, x):
    return (g * F.polygamma(1, x),)


@vjp("trigamma", save="x")
def _trigamma(node, g, x):
    return (g * F.polygamma(2, x),)


# ---- special functions (fusegrad.special; records in ops/special_functions.py) -------------
# Each rule is PyTorch's formula (derivatives.yaml), so gradients agree to rounding.


@vjp("polygamma", save="x")
def _polygamma(node, g, x):
    return (g * F.polygamma(node.attrs["n"] + 1, x),)


@vjp("i0", save="x")
def _i0(node, g, x):
    return (g * F.special_ops.i1(x),)


@vjp("i0e", save="x out")
def _i0e(node, g, x, out):
    return (g * (F.special_ops.i1e(x) - x.sign() * out),)


def _tiny_to_eps(x):
    """(|x| > eps, x with the others replaced by eps): i1 and i1e's derivatives divide by x,
    and PyTorch gives them their limit 1/2 wherever |x| <= eps (nan included)."""
    eps = float(np.finfo(x.dtype.np).eps)
    not_tiny = x.abs() > eps
    return not_tiny, F.where(not_tiny, x, eps)


def _i1_slope(x, out):
    """i1'(x) = i0(x) - i1(x) / x (also forward mode's)."""
    not_tiny, safe = _tiny_to_eps(x)
    return F.where(not_tiny, F.special_ops.i0(safe) - out / safe, 0.5)


def _i1e_slope(x, out):
    """i1e'(x) = i0e(x) - i1e(x) (sign(x) + 1 / x) (also forward mode's)."""
    not_tiny, safe = _tiny_to_eps(x)
    return F.where(not_tiny, F.special_ops.i0e(safe) - out * (safe.sign() + safe.reciprocal()), 0.5)


@vjp("i1", save="x out")
def _i1(node, g, x, out):
    return (g * _i1_slope(x, out),)


@vjp("i1e", save="x out")
def _i1e(node, g, x, out):
    return (g * _i1e_slope(x, out),)


@vjp("erfcx", save="x out")
def _erfcx(node, g, x, out):
    return (g * (2.0 * x * out - 2.0 / math.sqrt(math.pi)),)


@vjp("ndtri", save="out")
def _ndtri(node, g, out):
    return (g * (math.sqrt(2.0 * math.pi) * (out * out / 2.0).exp()),)


@vjp("log_ndtr", save="x out")
def _log_ndtr(node, g, x, out):
    return (g * ((-(out + x * x / 2.0)).exp() / math.sqrt(2.0 * math.pi)),)


def _not_differentiable_in(node, name: str, index: int) -> None:
    if node.needs_input_grad[index]:
        raise AutogradError(f"the derivative for '{name}' is not implemented.")


@vjp("gammainc", save="a x")
def _gammainc(node, g, a, x):
    _not_differentiable_in(node, "igamma: input", 0)
    return (None, g * (-x + (a - 1.0) * x.log() - a.lgamma()).exp())


@vjp("gammaincc", save="a x")
def _gammaincc(node, g, a, x):
    _not_differentiable_in(node, "igammac: input", 0)
    return (None, -(g * (-x + (a - 1.0) * x.log() - a.lgamma()).exp()))


@vjp("zeta", save="x q")
def _zeta(node, g, x, q):
    _not_differentiable_in(node, "zeta", 0)
    return (None, g * (-x) * F.special_ops.zeta(x + 1.0, q))


@vjp("entr", save="x")
def _entr(node, g, x):
    return (g * (-(x.log() + 1.0)),)


def _zero_grad(node, g):
    """Piecewise-constant ops: the gradient is zero almost everywhere (PyTorch gives zeros)."""
    return (F.zeros_like(g),)


for _name in ("sign", "floor", "ceil", "trunc", "round"):
    vjp(_name)(_zero_grad)


@vjp("cast")
def _cast(node, g):
    src = node.input_dtypes[0]
    if src.category < 2:
        return (None,)
    if g.is_complex() and not src.is_complex:
        g = g.real  # a real value cast to complex: the gradient's real part
    return (g.to(src),)


@vjp("to_device")
def _to_device(node, g):
    return (g.to(node.attrs["source"]),)


@vjp("clone")
def _clone(node, g):
    return (g,)


# ---- elementwise binary ------------------------------------------------------------------------


@vjp("add")
def _add(node, g):
    return (g, g)


@vjp("sub")
def _sub(node, g):
    return (g, -g if node.needs_input_grad[1] else None)


@vjp_arrays("sub")
def _sub_arrays(node, g):
    return (g, np.negative(g) if node.needs_input_grad[1] else None)


@vjp("mul", save={"a": "b", "b": "a"})  # each operand only for the other's gradient
def _mul(node, g, a, b):
    need = node.needs_input_grad
    ga = gb = None
    if need[0]:
        ga = g * (b if b._dtype.category != _COMPLEX else b.conj())
    if need[1]:
        gb = g * (a if a._dtype.category != _COMPLEX else a.conj())
    return (ga, gb)


@vjp_arrays("mul")
def _mul_arrays(node, g, a, b):
    need = node.needs_input_grad
    return (np.multiply(g, b) if need[0] else None, np.multiply(g, a) if need[1] else None)


@vjp("div", save={"a": "b", "b": "a b"})
def _div(node, g, a, b):
    need = node.needs_input_grad
    ga = g / b.conj() if need[0] else None
    gb = -(g * a.conj()) / (b * b).conj() if need[1] else None
    return (ga, gb)


@vjp_arrays("div")
def _div_arrays(node, g, a, b):
    need = node.needs_input_grad
    ga = np.true_divide(g, b) if need[0] else None
    gb = np.true_divide(np.negative(np.multiply(g, a)), np.multiply(b, b)) if need[1] else None
    return (ga, gb)


@vjp("pow", save={"a": "a b", "b": "a b", "out": "b"})
def _pow(node, g, a, b, out):
    need = node.needs_input_grad
    ga = gb = None
    if need[0]:
        # d/da a**b = b * a**(b-1), defined as 0 where b == 0 (PyTorch's convention)
        ga = F.where(b == 0, 0.0, g * (b * a ** (b - 1.0)).conj())
    if need[1]:
        # d/db a**b = a**b * log(a), defined as 0 where a == 0 and b >= 0 (for complex b:
        # where a == 0 and the real part of b is >= 0)
        nonnegative = (b.real if b.is_complex() else b) >= 0
        gb = F.where((a == 0) & nonnegative, 0.0, g * (out * a.log()).conj())
    return (ga, gb)


@vjp("atan2", save="a b")
def _atan2(node, g, a, b):
    # d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2); 0 where a^2 + b^2 is 0 (PyTorch's rule:
    # its reciprocal's infinities are zeroed)
    need = node.needs_input_grad
    recip = (a * a + b * b).reciprocal()
    recip = F.where(recip.isinf(), 0.0, recip)
    return (g * b * recip if need[0] else None, g * -a * recip if need[1] else None)


@vjp("hypot", save={"a": "a", "b": "b", "out": "a b"})
def _hypot(node, g, a, b, out):
    need = node.needs_input_grad
    return (g * a / out if need[0] else None, g * b / out if need[1] else None)


@vjp("logaddexp", save="a b")
def _logaddexp(node, g, a, b):
    # the softmax weights exp(a - out), exp(b - out), as sigmoids of the difference: exact 0 and
    # 1 when one operand is infinite and the other is not (nan when both are, as in PyTorch)
    need = node.needs_input_grad
    return (
        g * (a - b).sigmoid() if need[0] else None,
        g * (b - a).sigmoid() if need[1] else None,
    )


def _tie_weights(a, b, dtype):
    """1 where a wins, 0.5 on ties (the gradient is split evenly), 0 where b wins."""
    return F.where(a == b, 0.5, (a > b).to(dtype))


@vjp("floor_divide")
def _floor_divide(node, g):
    # piecewise constant in both operands
    zero = F.zeros_like(g)
    return (zero, zero)


@vjp("maximum", save="a b")
def _maximum(node, g, a, b):
    w = _tie_weights(a, b, g.dtype)
    return (g * w, g * (1.0 - w))


@vjp("minimum", save="a b")
def _minimum(node, g, a, b):
    w = _tie_weights(b, a, g.dtype)
    return (g * w, g * (1.0 - w))


@vjp("remainder", save={"a": "b", "b": "b"})
def _remainder(node, g, a, b):
    need = node.needs_input_grad
    return (g if need[0] else None, -(g * (a / b).floor()) if need[1] else None)


@vjp("where", save="cond")
def _where(node, g, cond):
    # the unselected side gets an exact 0 (a weak Python zero: g's dtype), never g * 0
    need = node.needs_input_grad
    return (
        None,
        F.where(cond, g, 0.0) if need[1] else None,
        F.where(cond, 0.0, g) if need[2] else None,
    )


# ---- binary cross entropy (ops/primitives.py, "binary cross entropy") --------------------------
#
# PyTorch's formulas, including its second derivatives, which it writes with ``p + eps`` and a
# float64 ``eps`` where the first derivative (the primitive's kernel) has ``max(., eps)`` with
# float32's 1e-12: the two agree to about 1e-12 relative away from saturation, and at a
# saturated point each gives what PyTorch's does.  The loss's weight and reduction are ops of
# their own around the primitive, so they never appear here.

BCE_EPSILON = 1e-12


def bce_target_gradient(g, p):
    """The target's gradient ``-g logit(p)``, as ``-(log p - log1p(-p))``: +-inf where ``p``
    is 0 or 1 and -0 at 1/2, as PyTorch's; its own derivative there is -inf, also PyTorch's."""
    return g * -(p.log() - (-p).log1p())


def bce_input_curvature(p, t):
    """The derivative of ``(p - t) / max((1 - p) p, eps)`` with respect to ``p``, PyTorch's
    ``(p^2 - 2 p t + t) / ((p + eps)^2 (1 - p + eps)^2)``."""
    eps = BCE_EPSILON
    return (p * p - 2.0 * p * t + t) / ((p + eps).pow(2) * (1.0 - p + eps).pow(2))


def bce_target_curvature(p):
    """The derivative of ``(p - t) / max((1 - p) p, eps)`` with respect to ``t``."""
    return -(1.0 / F.maximum((1.0 - p) * p, BCE_EPSILON))


@vjp("binary_cross_entropy", save={"p": "p t", "t": "p"})
def _binary_cross_entropy(node, g, p, t):
    """The input's gradient is the ``binary_cross_entropy_backward`` primitive (finite where
    ``p`` saturates: 0 when the target agrees), the target's ``-g logit(p)``."""
    needs = node.needs_input_grad
    gp = F.apply(F.REGISTRY["binary_cross_entropy_backward"], (g, p, t), {}) if needs[0] else None
    return gp, (bce_target_gradient(g, p) if needs[1] else None)


@vjp("binary_cross_entropy_backward", save={"g": "p t", "p": "g p t", "t": "g p"})
def _binary_cross_entropy_backward(node, gg, g, p, t):
    """``g (p - t) / max((1 - p) p, eps)`` differentiated: with respect to ``g`` PyTorch's
    ``(p - t) / ((p + eps) (1 - p + eps))``, to ``p`` and ``t`` the curvatures above, times
    ``g``."""
    needs = node.needs_input_grad
    eps = BCE_EPSILON
    return (
        (p - t) / ((p + eps) * (1.0 - p + eps)) * gg if needs[0] else None,
        bce_input_curvature(p, t) * (gg * g) if needs[1] else None,
        bce_target_curvature(p) * (gg * g) if needs[2] else None,
    )


# ---- reductions --------------------------------------------------------------------------------


def _keepdim_shape(shape: tuple, dim: tuple | None) -> tuple:
    if dim is None:
        return (1,) * len(shape)
    return tuple(1 if i in dim else s for i, s in enumerate(shape))


@vjp("sum")
def _sum(node, g):
    shape = node.input_shapes[0]
    dim, keepdim = node.attrs["dim"], node.attrs["keepdim"]
    if not keepdim and dim is not None:  # (a full sum's 0-d gradient broadcasts as it is)
        g = g.reshape(_keepdim_shape(shape, dim))
    return (g.broadcast_to(shape),)


@vjp_arrays("sum")
def _sum_arrays(node, g):
    shape = node.input_shapes[0]
    dim, keepdim = node.attrs["dim"], node.attrs["keepdim"]
    if not keepdim and dim is not None:
        g = g.reshape(_keepdim_shape(shape, dim))
    return (np.broadcast_to(g, shape),)


@vjp("sum_to")
def _sum_to(node, g):
    return (g.broadcast_to(node.input_shapes[0]),)


@vjp_arrays("sum_to")
def _sum_to_arrays(node, g):
    return (np.broadcast_to(g, node.input_shapes[0]),)


def _extremum(node, g, x, out):
    """amax/amin: the gradient is split evenly between tied extrema."""
    shape = node.input_shapes[0]
    dim, keepdim = node.attrs["dim"], node.attrs["keepdim"]
    if not keepdim:
        kshape = _keepdim_shape(shape, dim)
        g, out = g.reshape(kshape), out.reshape(kshape)
    mask = (x == out).to(g.dtype)
    count = (
        mask.sum(dim=dim, keepdim=True)
        if dim is not None
        else mask.sum().reshape((1,) * len(shape))
    )
    return (g * mask / count,)


vjp("amax", save="x out")(_extremum)
vjp("amin", save="x out")(_extremum)


@vjp("prod", save="x out")
def _prod(node, g, x, out):
    shape = node.input_shapes[0]
    dim, keepdim = node.attrs["dim"], node.attrs["keepdim"]
    kshape = _keepdim_shape(shape, dim)
    if not keepdim:
        g, out = g.reshape(kshape), out.reshape(kshape)
    red = {"dim": dim, "keepdim": True} if dim is not None else {}
    # Exact with zeros, and exact again when differentiated (double backward).  Per slice:
    #   no zero:     d prod / dx_i = prod / x_i
    #   one zero:    the zero element gets the product P of the others; every other element
    #                gets P / x_j * z, where z (the sum of the slice's zeros) is 0 in value but
    #                carries the derivative with respect to the zero element
    #   two zeros:   each zero gets P * (z - x_i), i.e. 0 with derivative P w.r.t. the other zero
    #   three+:      0 (all first and second derivatives vanish)
    # Every branch is computed (rules never branch on data) and where() picks per element.
    is_zero = x == 0
    nonzero = F.where(is_zero, 1.0, x)
    count = is_zero.to(g.dtype).sum(**red).reshape(kshape)
    prod_nonzero = nonzero.prod(**red).reshape(kshape)
    zero_sum = F.where(is_zero, x, 0.0).sum(**red).reshape(kshape)
    one_zero = prod_nonzero * F.where(is_zero, 1.0, zero_sum / nonzero)
    two_zeros = F.where(is_zero, prod_nonzero * (zero_sum - x), 0.0)
    grad = F.where(
        count == 0,
        out / nonzero,
        F.where(count == 1, one_zero, F.where(count == 2, two_zeros, 0.0)),
    )
    return (g * grad.conj(),)


@vjp("cumsum")
def _cumsum(node, g):
    d = node.attrs["dim"]
    return (g.flip((d,)).cumsum(d).flip((d,)),)


# ---- movement ----------------------------------------------------------------------------------


@vjp("reshape")
def _reshape(node, g):
    return (g.reshape(node.input_shapes[0]),)


@vjp("permute")
def _permute(node, g):
    dims = node.attrs["dims"]
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return (g.permute(tuple(inverse)),)


@vjp("broadcast_to")
def _broadcast_to(node, g):
    return (F.sum_to(g, node.input_shapes[0]),)


@vjp("flip")
def _flip(node, g):
    return (g.flip(node.attrs["dims"]),)


@vjp("cat")
def _cat(node, g):
    d = node.attrs["dim"]
    grads = []
    start = 0
    for shape, need in zip(node.input_shapes, node.needs_input_grad):
        size = shape[d]
        grads.append(g.narrow(d, start, size) if need else None)
        start += size
    return tuple(grads)


@vjp("pad")
def _pad(node, g):
    shape = node.input_shapes[0]
    key = tuple(slice(b, b + s) for (b, _), s in zip(node.attrs["widths"], shape))
    return (g[key],)


@vjp("diagonal")
def _diagonal(node, g):
    shape = node.input_shapes[0]
    a = node.attrs
    return (F.diagonal_backward(g, shape, a["offset"], a["dim1"], a["dim2"]),)


@vjp("attention", save="q k v out mask*")
def _attention(node, g, q, k, v, out, *mask):
    """The fused kernel's gradients (``attention_backward``); where a graph of the gradient is
    wanted (grad mode on: ``create_graph``), the same formulas in the op surface instead, with
    the weights recomputed from the saved logsumexp, so that they differentiate again."""
    scale, causal = node.attrs["scale"], node.attrs["causal"]
    length, source, width = q.shape[1], k.shape[1], q.shape[2]
    need = node.needs_input_grad
    if not is_grad_enabled():
        attrs = {"scale": scale, "causal": causal}
        grads = F.apply(F.REGISTRY["attention_backward"], (g, q, k, v, out, *mask), attrs)
        dq = grads.narrow(1, 0, length)
        dk = grads.narrow(1, length, source)
        dv = grads.narrow(1, length + source, source)
    else:
        scores = (q @ k.mT) * scale
        if causal:
            keep = F.tensor(np.tri(length, source, 0, dtype=bool))
            scores = F.where(keep, scores, -math.inf)
        if mask:
            bias = mask[0]
            scores = (
                F.where(bias, scores, -math.inf) if bias.dtype.name == "bool" else scores + bias
            )
        o, lse = out.narrow(2, 0, width), out.narrow(2, width, 1)
        go, glse = g.narrow(2, 0, width), g.narrow(2, width, 1)
        p = (scores - lse).exp()  # 0 in rows with nothing to attend to (lse = +inf)
        delta = (go * o).sum(2, keepdim=True) - glse
        ds = p * ((go @ v.mT) - delta) * scale
        dq, dk, dv = ds @ k, ds.mT @ q, p.mT @ go
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + (
        None,
    ) * len(mask)


@vjp("norm", save={"x": "x weight", "mean": "x weight", "var": "x weight", "weight": "x"})
def _norm(node, g, x, mean, var, weight):
    """The normalisation layers' fused kernel (``norm_backward``: the input's, weight's and
    bias's gradients in one pass pair); where a graph of the gradient is wanted (grad mode on:
    ``create_graph``), the same formulas in the op surface (``ops.norms.norm_grads``), which
    recompute the statistics from the input and differentiate again.  A compiler's capture of
    a layer norm's backward takes that form too (``Tracer.prefers_composites``: it fuses the
    composite into row kernels, and batches it for ``jacobian(vectorize=True)``).  The input
    and the statistics are saved for the input's and the weight's gradients, the weight for
    the input's; the bias's needs neither."""
    attrs = node.attrs
    has_w = attrs["weight"]
    need_in = node.needs_input_grad
    need = (bool(need_in[0]), bool(has_w and need_in[3]), bool(attrs["bias"] and need_in[4]))
    w = weight if has_w else None
    shapes = node.input_shapes
    gx = gw = gb = None
    tracer = _tracer_state.tracer
    rows = attrs["layout"] == "layer" and tracer is not None and tracer.prefers_composites
    if is_grad_enabled() or rows:
        gx, gw, gb = norm_grads(g, x, mean, var, w, attrs, need)
    else:
        keys = ("layout", "groups", "dims", "eps", "training")
        kernel_attrs = {k: attrs[k] for k in keys}
        kernel_attrs["need"] = need
        kernel_attrs["weight"] = bool(has_w and need[0])
        operands = (g, x, mean, var) if need[0] or need[1] else (g,)
        if has_w and need[0]:
            operands += (w,)
        flat = F.apply(F.REGISTRY["norm_backward"], operands, kernel_attrs)
        x_shape = shapes[0]
        if attrs["layout"] == "layer":
            params = 1
            for d in x_shape[len(x_shape) - attrs["dims"] :]:
                params = params * d
        else:
            params = x_shape[1]
        start = 0
        if need[0]:
            size = 1
            for d in x_shape:
                size = size * d
            gx = flat.narrow(0, 0, size).reshape(x_shape)
            start = size
        if need[1]:
            gw = flat.narrow(0, start, params)
            start = start + params
        if need[2]:
            gb = flat.narrow(0, start, params)
    return (
        gx,
        None,
        None,
        None if gw is None else gw.reshape(shapes[3]),
        None if gb is None else gb.reshape(shapes[4]),
    )


@vjp("resample")
def _resample(node, g):
    """interpolate's nearest and linear modes: one kernel that adds each output's gradient
    into its sources (``resample_backward``); under ``create_graph`` the transposed per-dim
    matrices in the op surface (``ops.resample.resample_grad``), which a compiler's capture of
    the linear modes takes too (``Tracer.prefers_composites``: matrix products, which it
    batches for ``jacobian(vectorize=True)``)."""
    input_size = tuple(node.input_shapes[0][2:])
    tracer = _tracer_state.tracer
    linear = node.attrs["mode"] == "linear"
    if is_grad_enabled() or (linear and tracer is not None and tracer.prefers_composites):
        return (resample_grad(g, node.attrs, input_size),)
    return (resample_input_grad(g, node.attrs, input_size),)


@vjp("convolution", save={"x": "w", "w": "x"})
def _convolution(node, g, x, w):
    """The kernels' gradients (``convolution_backward_input`` / ``_weight``: im2col and BLAS);
    where a graph of the gradient is wanted (grad mode on: ``create_graph``), the same
    products in the op surface (``ops.convolution.convolution_grads``), which differentiate
    again.  The input is saved only for the weight's gradient, the weight only for the
    input's."""
    attrs = node.attrs
    need = node.needs_input_grad
    geometry = {
        "stride": attrs["stride"],
        "padding": attrs["padding"],
        "dilation": attrs["dilation"],
        "groups": attrs["groups"],
        "transposed": attrs["transposed"],
    }
    x_shape, w_shape = node.input_shapes[0], node.input_shapes[1]
    if is_grad_enabled():
        gx, gw = convolution_grads(g, x, w, need[0], need[1], x_shape, w_shape, **geometry)
    else:
        gx = gw = None
        if need[0]:
            prim = F.REGISTRY["convolution_backward_input"]
            gx = F.apply(prim, (g, w), {"sizes": tuple(x_shape[2:]), **geometry})
        if need[1]:
            prim = F.REGISTRY["convolution_backward_weight"]
            gw = F.apply(prim, (g, x), {"kernel": tuple(w_shape[2:]), **geometry})
    if len(need) == 2:
        return gx, gw
    gb = g.sum((0, *range(2, g.ndim))) if need[2] else None
    return gx, gw, gb


@vjp("avg_pool")
def _avg_pool(node, g):
    """The transpose of the pooling (``avg_pool_backward``), itself differentiable."""
    attrs = {"window": node.attrs["window"], "sizes": tuple(node.input_shapes[0][2:])}
    return (F.apply(F.REGISTRY["avg_pool_backward"], (g,), attrs),)


@vjp("avg_pool_backward")
def _avg_pool_backward(node, g):
    """Linear in its input, whose gradient is the transpose of the transpose: the pooling."""
    return (F.apply(F.REGISTRY["avg_pool"], (g,), {"window": node.attrs["window"]}),)


@vjp("pool_take", save="index")
def _pool_take(node, g, index):
    """Max pooling's values' gradient: ``g`` added at the maxima (``pool_scatter``)."""
    attrs = {"sizes": tuple(node.input_shapes[0][2:])}
    return F.apply(F.REGISTRY["pool_scatter"], (g, index), attrs), None


@vjp("pool_scatter", save="index")
def _pool_scatter(node, g, index):
    """The transpose of the transpose: ``g`` read at the positions (``pool_take``)."""
    return F.apply(F.REGISTRY["pool_take"], (g, index), {}), None


@vjp("rnn_sequence", save="w_hh h0 out state*")
def _rnn_sequence(node, g, w_hh, h0, out, *state):
    """The fused kernel's backpropagation through time (``rnn_sequence_backward``); where a
    graph of the gradient is wanted (grad mode on: ``create_graph``), the same formulas in the
    op surface (``ops.recurrent.rnn_sequence_grads``), which differentiate again."""
    mode, reverse = node.attrs["mode"], node.attrs["reverse"]
    bias, proj, batch_sizes = node.attrs["bias"], node.attrs["proj"], node.attrs["batch_sizes"]
    input_bias = node.attrs["input_bias"]
    lstm = mode == "LSTM"
    c0 = state[0] if lstm else None
    w_hr = state[1] if proj else None
    if is_grad_enabled():
        lead = tuple(node.input_shapes[0][:-1])
        grads = rnn_sequence_grads(mode, reverse, g, out, w_hh, h0, c0, w_hr, batch_sizes, lead)
        dx, dh0, dc0, dw_hh, dw_hr, db_hh = grads
    else:
        x_shape = node.input_shapes[0]
        rows = x_shape[0] if batch_sizes is not None else x_shape[0] * x_shape[1]
        batch = h0.shape[0]
        gates, size = w_hh.shape[0], w_hh.shape[1]
        hidden = c0.shape[1] if lstm else size
        attrs = {"mode": mode, "reverse": reverse, "proj": proj, "batch_sizes": batch_sizes}
        # the gradient and the result in their two parts, views (rows, P) and (rows, S H)
        width = STATE_WIDTH[mode] * hidden
        g_h, g_s = packed_parts(g, (rows,), size, width)
        out_h, out_s = packed_parts(out, (rows,), size, width)
        inputs = (g_h, g_s, out_h, out_s, w_hh, h0)
        inputs += ((c0,) if lstm else ()) + ((w_hr,) if proj else ())
        flat = F.apply(F.REGISTRY["rnn_sequence_backward"], inputs, attrs)
        sizes = [rows * gates, batch * size, batch * hidden if lstm else 0]
        sizes += [gates * size, size * hidden if proj else 0, gates]
        parts, start = [], 0
        for length in sizes:
            parts.append(flat.narrow(0, start, length))
            start += length
        dx = parts[0].reshape(x_shape)
        dh0 = parts[1].reshape(batch, size)
        dc0 = parts[2].reshape(batch, hidden) if lstm else None
        dw_hh = parts[3].reshape(gates, size)
        dw_hr = parts[4].reshape(size, hidden) if proj else None
        db_hh = parts[5]
    need = node.needs_input_grad
    result = [dx if need[0] else None, dw_hh if need[1] else None, dh0 if need[2] else None]
    if lstm:
        result.append(dc0 if need[3] else None)
    if proj:
        result.append(dw_hr if need[4] else None)
    if bias:
        result.append(db_hh if need[len(result)] else None)
    if input_bias and need[len(result)]:
        # b_ih is added with x_gates: its gradient sums x_gates's over the rows, which is
        # b_hh's for an LSTM and an RNN (the same gates' gradients; a copy, as .grad is its
        # own tensor), the GRU's differs in the n gate
        if bias and mode != "GRU":
            result.append(db_hh.clone())
        else:
            result.append(dx.reshape(-1, dx.shape[-1]).sum(0))
    elif input_bias:
        result.append(None)
    return tuple(result)


@vjp("embedding", save="idx")
def _embedding(node, g, idx):
    """One scatter-add kernel (``embedding_backward``); under ``create_graph`` the same sum in
    differentiable ops (``ops.indexing.embedding_grad``)."""
    rows = node.input_shapes[0][0]
    padding, by_freq = node.attrs["padding_idx"], node.attrs["scale_grad_by_freq"]
    if is_grad_enabled():
        return embedding_grad(g, idx, rows, padding, by_freq), None
    attrs = {"num_weights": rows, "padding_idx": padding, "scale_grad_by_freq": by_freq}
    return F.apply(F.REGISTRY["embedding_backward"], (g, idx), attrs), None


@vjp("log_softmax", save="out")
def _log_softmax(node, g, out):
    """``g - exp(out) sum(g)`` along the dim: one kernel (``log_softmax_backward``); in the
    op surface where a graph of the gradient is wanted (``create_graph``: ``out`` carries the
    forward's history) or a compiler captures the backward (it fuses the row sum and the
    elementwise work with their neighbours)."""
    dim = node.attrs["dim"]
    tracer = _tracer_state.tracer
    if is_grad_enabled() or (tracer is not None and tracer.prefers_composites):
        return (log_softmax_grad(g, out, dim),)
    return (F.apply(F.REGISTRY["log_softmax_backward"], (g, out), {"dim": dim}),)


@vjp("softmax", save="out")
def _softmax(node, g, out):
    """``out (g - sum(g out))`` along the dim, PyTorch's formula: one kernel
    (``softmax_backward``); in the op surface where a graph of the gradient is wanted
    (``create_graph``: ``out`` carries the forward's history) or a compiler captures the
    backward (it fuses the row sum and the elementwise work with their neighbours)."""
    dim = node.attrs["dim"]
    tracer = _tracer_state.tracer
    if is_grad_enabled() or (tracer is not None and tracer.prefers_composites):
        return (softmax_grad(g, out, dim),)
    return (F.apply(F.REGISTRY["softmax_backward"], (g, out), {"dim": dim}),)


@vjp("nll_loss", save="target weight")
def _nll_loss(node, g, target, weight):
    """``-weight[t] g`` (over the sum of the weights for ``mean``) at each target's class:
    one kernel (``nll_loss_backward``), or its scatter in the op surface where a graph of the
    gradient is wanted (``create_graph``) or a compiler captures the backward.  The target
    and the weight get none (PyTorch's does not differentiate the weight; ``F.nll_loss`` runs
    the composite when it requires grad)."""
    attrs = node.attrs
    shape = node.input_shapes[0]
    classes = shape[0] if len(shape) == 1 else shape[1]
    ignore, reduction = attrs["ignore_index"], attrs["reduction"]
    tracer = _tracer_state.tracer
    if not is_grad_enabled() and not (tracer is not None and tracer.prefers_composites):
        kernel_attrs = {
            "ignore_index": ignore,
            "reduction": reduction,
            "weighted": attrs["weighted"],
            "classes": classes,
        }
        return (
            F.apply(F.REGISTRY["nll_loss_backward"], (g, target, weight), kernel_attrs),
            None,
            None,
        )
    ignored = F.eq(target, ignore)
    safe = F.where(ignored, 0, target)
    if attrs["weighted"]:
        w = F.where(ignored, 0.0, weight[safe])
    else:  # (no index into the placeholder ones: a capture keeps symbolic sizes then)
        w = F.ne(target, ignore).to(g.dtype)
    coef = -(w * g)
    if reduction == "mean":
        coef = coef / w.sum()
    coef = F.where(ignored, 0.0, coef)
    # (the input's shape from the node, as gather's rule takes it: a capture keeps its sizes
    # symbolic; a scatter-add, one index per row, so that a compiler's batching of the
    # backward for ``jacobian(vectorize=True)`` has a rule for it)
    zeros = F.zeros(shape, dtype=g.dtype, device=g.device)
    if len(shape) == 1:  # (C,) with a 0-d target
        return F.scatter_spec(zeros, 0, safe.reshape(1), coef.reshape(1), add=True), None, None
    gx = F.scatter_spec(zeros, 1, safe.unsqueeze(1), coef.unsqueeze(1), add=True)
    return gx, None, None


@vjp("getitem", save="idx*")
def _getitem(node, g, *idx):
    shape = node.input_shapes[0]
    return (F.index_add_at(g, idx, node.attrs["key"], shape),) + (None,) * len(idx)


@vjp("index_put", save="idx*")
def _index_put(node, g, *idx):
    need = node.needs_input_grad
    key = node.attrs["key"]
    gx = (
        F.index_put_spec(g, F.zeros((), dtype=g.dtype, device=g.device), idx, key)
        if need[0]
        else None
    )
    gv = F.getitem_spec(g, idx, key) if need[1] else None
    return (gx, gv) + (None,) * len(idx)


@vjp("index_add_at", save="idx*")
def _index_add_at(node, g, *idx):
    return (F.getitem_spec(g, idx, node.attrs["key"]),) + (None,) * len(idx)


@vjp("gather", save="index")
def _gather(node, g, index):
    shape = node.input_shapes[0]
    zeros = F.zeros(shape, dtype=g.dtype, device=g.device)
    return (F.scatter_spec(zeros, node.attrs["dim"], index, g, add=True), None)


@vjp("scatter_add", save="index")
def _scatter_add(node, g, index):
    need = node.needs_input_grad
    d = node.attrs["dim"]
    return (g if need[0] else None, None, F.gather_spec(g, d, index) if need[2] else None)


@vjp("scatter", save="index")
def _scatter(node, g, index):
    need = node.needs_input_grad
    d = node.attrs["dim"]
    gx = (
        F.scatter_spec(g, d, index, F.zeros(index.shape, dtype=g.dtype, device=g.device))
        if need[0]
        else None
    )
    return (gx, None, F.gather_spec(g, d, index) if need[2] else None)


# ---- opaque ------------------------------------------------------------------------------------


@vjp("matmul", save={"a": "b", "b": "a"})
def _matmul(node, g, a, b):
    need = node.needs_input_grad
    ga = g @ b.mH if need[0] else None
    if need[1] and len(node.input_shapes[1]) == 2 and len(node.input_shapes[0]) > 2:
        # a matrix applied over a batch (a linear layer on (B, T, C)): its gradient is one
        # product over all B T rows, as PyTorch's addmm on the flattened input computes it,
        # not B products summed afterwards
        return (ga, a.flatten(0, -2).mH @ g.flatten(0, -2))
    gb = a.mH @ g if need[1] else None
    return (ga, gb)


# ---- complex numbers ---------------------------------------------------------------------------


@vjp("conj_physical")
def _conj_physical(node, g):
    return (g.conj(),)


@vjp("real")
def _real(node, g):
    # L depends on x = Re z only: dL/dx + i 0 (the engine casts the real g to z's dtype)
    return (g,)


@vjp("imag")
def _imag(node, g):
    # L depends on y = Im z only: 0 + i dL/dy
    return (F.complex(F.zeros_like(g), g),)


@vjp("complex")
def _complex(node, g):
    need = node.needs_input_grad
    return (g.real if need[0] else None, g.imag if need[1] else None)


@vjp("view_as_real")
def _view_as_real(node, g):
    return (F.view_as_complex(g.contiguous()),)


@vjp("view_as_complex")
def _view_as_complex(node, g):
    return (F.view_as_real(g),)


# ---- discrete Fourier transforms (ops/spectral.py) --------------------------------------------
# Each transform is linear; its adjoint is the transform in the other direction with the other
# scaling word (``dual_norm``: the same factor, applied in the other direction).


@vjp("fft_c2c")
def _fft_c2c(node, g):
    a = node.attrs
    attrs = {"dims": a["dims"], "norm": dual_norm(a["norm"]), "forward": not a["forward"]}
    return (F.apply(F.REGISTRY["fft_c2c"], (g,), attrs),)


@vjp("fft_r2c")
def _fft_r2c(node, g):
    # rfft keeps the first n // 2 + 1 entries of the full transform: the adjoint pads the
    # gradient back with zeros, transforms it back, and a real input takes the real part
    a = node.attrs
    dims = a["dims"]
    last, n = dims[-1], node.input_shapes[0][dims[-1]]
    missing = n - g.shape[last]
    if missing > 0:
        g = F.pad(g, [0, 0] * (g.ndim - 1 - last) + [0, missing])
    attrs = {"dims": dims, "norm": dual_norm(a["norm"]), "forward": False}
    return (F.apply(F.REGISTRY["fft_c2c"], (g,), attrs).real,)


@vjp("fft_c2r")
def _fft_c2r(node, g):
    # irfft fills the missing half of the spectrum with the mirror of the given one: the
    # adjoint transforms the gradient forward and adds each mirrored entry's share, i.e.
    # doubles the entries 1 .. n - (n // 2 + 1) along the last dim (those whose mirror is not
    # among the given ones)
    a = node.attrs
    dims = a["dims"]
    last, n = dims[-1], a["last_dim_size"]
    out = F.apply(F.REGISTRY["fft_r2c"], (g,), {"dims": dims, "norm": dual_norm(a["norm"])})
    doubled = n - (n // 2 + 1)
    if doubled > 0:
        weights = np.ones(out.shape[last])
        weights[1 : 1 + doubled] = 2.0
        shape = [1] * out.ndim
        shape[last] = out.shape[last]
        out = out * F.tensor(weights.reshape(shape), dtype=g.dtype, device=g.device)
    return (out,)


# ---- linear algebra (ops/decompositions.py) ---------------------------------------------------
# PyTorch's formulas (FunctionsManual.cpp), in the op surface.  A factorization with several
# outputs is one primitive per output: each rule is the part of the joint formula that its
# output's gradient contributes (the joint formula is linear in the outputs' gradients), and
# recomputes the sibling outputs it needs from the saved input.


def _zero_grad_like_input(node, g):
    """A piecewise-constant function of a matrix (the sign of its determinant): zeros."""
    return (F.zeros(node.input_shapes[0], dtype=node.input_dtypes[0], device=g.device),)


def _lin(name, *inputs, **attrs):
    return F.apply(F.REGISTRY[name], inputs, attrs)


def _eye_like(A):
    n = A.shape[-1]
    return F.eye(n, dtype=A.dtype, device=A.device).expand(tuple(A.shape))


def _solve_unchecked(A, B):
    """``A^-1 B`` that gives inf / nan for a singular ``A`` instead of raising (rules run on
    whatever the forward accepted)."""
    return _lin("linalg_solve", A, B, check=None)


def _tri(A, B, upper, left=True, unitriangular=False):
    return _lin(
        "linalg_solve_triangular", A, B, upper=upper, left=left, unitriangular=unitriangular
    )


@vjp("linalg_solve", save={"A": "A B", "out": "A"})
def _linalg_solve(node, g, A, out):
    gB = _solve_unchecked(A.mH, g)
    need = node.needs_input_grad
    return (-(gB @ out.mH) if need[0] else None, gB if need[1] else None)


@vjp("linalg_solve_triangular", save={"A": "A B", "out": "A"})
def _linalg_solve_triangular(node, g, A, out):
    a = node.attrs
    upper, left, unit = a["upper"], a["left"], a["unitriangular"]
    gB = _tri(A.mH, g, not upper, left, unit)
    gA = None
    if node.needs_input_grad[0]:
        gA = -(gB @ out.mH) if left else -(out.mH @ gB)
        gA = gA.triu(int(unit)) if upper else gA.tril(-int(unit))
    return (gA, gB if node.needs_input_grad[1] else None)


@vjp("linalg_cholesky", save="out")
def _linalg_cholesky(node, g, L):
    # tril(L^H gL), made Hermitian with half its diagonal, conjugated by L^-1
    gA = (L.mH @ g).tril()
    gA = (gA + gA.tril(-1).mH) * 0.5
    gA = _tri(L.mH, gA, True, True)
    return (_tri(L, gA, False, False),)


@vjp("linalg_lu_factor", save="A out")
def _linalg_lu_factor(node, g, A, LU):
    m, n = A.shape[-2], A.shape[-1]
    if m != n:
        raise AutogradError(
            f"lu_factor: the derivative is implemented for square matrices; got {m} x {n}"
        )
    pivots = _lin("linalg_lu_pivots", A.detach())
    P = _lin("linalg_lu_permutation", pivots, m=m, dtype=A.dtype)
    L = LU.tril(-1) + _eye_like(LU)
    U = LU.triu()
    # A = P L U: gA = P L^-H [tril(L^H gL, -1) + triu(gU U^H)] U^-H
    gR = (L.mH @ g.tril(-1)).tril(-1) + (g.triu() @ U.mH).triu()
    gA = _tri(L.mH, gR, True, True, True)
    gA = _tri(U.mH, gA, False, False)
    return (P @ gA,)


@vjp("linalg_det", save="A")
def _linalg_det(node, g, A):
    # the adjugate from the SVD A = U S Vh: adj(A)^H = conj(det U det Vh) U diag(prod_{j!=i}
    # s_j) Vh, exact for singular A as well (PyTorch's singular-case formula)
    U = _lin("linalg_svd_u", A, full_matrices=False)
    S = _lin("linalg_svd_s", A)
    Vh = _lin("linalg_svd_vh", A, full_matrices=False)
    phase = (_lin("linalg_det", U) * _lin("linalg_det", Vh)).conj()
    prod = S.prod(-1)
    node_like = SimpleNamespace(
        input_shapes=(tuple(S.shape),), attrs={"dim": (S.ndim - 1,), "keepdim": False}
    )
    (others,) = _prod(node_like, F.ones_like(prod), S, prod)  # prod_{j != i} s_j, exact with zeros
    cofactor = (U * others.unsqueeze(-2).to(U.dtype)) @ Vh
    return (cofactor * (g * phase).unsqueeze(-1).unsqueeze(-1),)


vjp("linalg_slogdet_sign")(_zero_grad_like_input)


@vjp("linalg_logabsdet", save="A")
def _linalg_logabsdet(node, g, A):
    return (_solve_unchecked(A.mH, _eye_like(A)) * g.unsqueeze(-1).unsqueeze(-1),)


def _eigh_parts(node, A):
    upper = node.attrs["upper"]
    return (
        _lin("linalg_eigh_values", A, upper=upper),
        _lin("linalg_eigh_vectors", A, upper=upper),
    )


@vjp("linalg_eigh_values", save="A")
def _linalg_eigh_values(node, g, A):
    V = _lin("linalg_eigh_vectors", A, upper=node.attrs["upper"])
    return ((V * g.unsqueeze(-2).to(V.dtype)) @ V.mH,)


def _off_diagonal_reciprocal(E):
    """1 / E off the diagonal (inf where E is 0: PyTorch's nan gradients for repeated
    eigenvalues or singular values), 0 on it."""
    n = E.shape[-1]
    eye = F.eye(n, dtype=_dt.bool_, device=E.device)
    return F.where(eye, 0.0, (F.where(eye, 1.0, E)).reciprocal())


@vjp("linalg_eigh_vectors", save="A")
def _linalg_eigh_vectors(node, g, A):
    L, V = _eigh_parts(node, A)
    VhgV = V.mH @ g
    skew = (VhgV - VhgV.mH) * 0.5
    E = L.unsqueeze(-2) - L.unsqueeze(-1)  # E[i, j] = L[j] - L[i]
    inner = skew * _off_diagonal_reciprocal(E).to(skew.dtype)
    return (V @ inner @ V.mH,)


@vjp("linalg_eig_values", save="A")
def _linalg_eig_values(node, g, A):
    V = _lin("linalg_eig_vectors", A)
    return (_solve_unchecked(V.mH, g.unsqueeze(-1) * V.mH),)


@vjp("linalg_eig_vectors", save="A")
def _linalg_eig_vectors(node, g, A):
    L = _lin("linalg_eig_values", A)
    V = _lin("linalg_eig_vectors", A)
    VhgV = V.mH @ g
    diagonal = VhgV.diagonal(0, -2, -1).real.to(V.dtype)
    # project onto the tangent space of matrices with unit-norm columns
    VhgV = VhgV - V.mH @ (V * diagonal.unsqueeze(-2))
    Lc = L.conj()
    E = Lc.unsqueeze(-2) - Lc.unsqueeze(-1)
    n = E.shape[-1]
    eye = F.eye(n, dtype=_dt.bool_, device=E.device)
    inner = VhgV / F.where(eye, 1.0, E)
    return (_solve_unchecked(V.mH, inner @ V.mH),)


def _svd_parts(A):
    return (
        _lin("linalg_svd_u", A, full_matrices=False),
        _lin("linalg_svd_s", A),
        _lin("linalg_svd_vh", A, full_matrices=False),
    )


@vjp("linalg_svd_s", save="A")
def _linalg_svd_s(node, g, A):
    U, _, Vh = _svd_parts(A)
    return ((U * g.unsqueeze(-2).to(U.dtype)) @ Vh,)


def _svd_denominator(S):
    S2 = S * S
    return S2.unsqueeze(-2) - S2.unsqueeze(-1)  # E[i, j] = s_j^2 - s_i^2


@vjp("linalg_svd_u", save="A")
def _linalg_svd_u(node, g, A):
    U, S, Vh = _svd_parts(A)
    k = S.shape[-1]
    if node.attrs["full_matrices"]:
        g = g.narrow(-1, 0, k)  # (the extra columns of a full U are not differentiable)
    m = U.shape[-2]
    UhgU = U.mH @ g
    UhgU = UhgU - UhgU.mH
    Sc = S.to(U.dtype)
    inner = (UhgU * _off_diagonal_reciprocal(_svd_denominator(S)).to(U.dtype)) * Sc.unsqueeze(-2)
    if U.is_complex():
        inner = inner + F.diag_embed(UhgU.diagonal(0, -2, -1) / (Sc * 2.0))
    gA = U @ inner
    if m > k:
        gUSinv = g / Sc.unsqueeze(-2)
        gA = gA + gUSinv - U @ (U.mH @ gUSinv)
    return (gA @ Vh,)


@vjp("linalg_svd_vh", save="A")
def _linalg_svd_vh(node, g, A):
    U, S, Vh = _svd_parts(A)
    k = S.shape[-1]
    if node.attrs["full_matrices"]:
        g = g.narrow(-2, 0, k)
    n = Vh.shape[-1]
    VhgV = Vh @ g.mH
    VhgV = VhgV - VhgV.mH
    Sc = S.to(U.dtype)
    inner = Sc.unsqueeze(-1) * (VhgV * _off_diagonal_reciprocal(_svd_denominator(S)).to(U.dtype))
    gA = inner @ Vh
    if n > k:
        SinvgVh = g / Sc.unsqueeze(-1)
        gA = gA + SinvgVh - (SinvgVh @ Vh.mH) @ Vh
    return (U @ gA,)


def _copyltu(M):
    """The Hermitian matrix with ``M``'s strictly lower triangle and the real part of its
    diagonal."""
    low = M.tril(-1)
    diagonal = M.diagonal(0, -2, -1)
    if M.is_complex():
        diagonal = diagonal.real.to(M.dtype)
    return low + low.mH + F.diag_embed(diagonal)


def _qr_square_backward(gQ, gR, Q, R):
    """gA of A = Q R with R square (k x k) and Q (m x k), m >= k."""
    M = 0.0
    if gR is not None:
        M = R @ gR.mH
    if gQ is not None:
        M = M - gQ.mH @ Q
    b = Q @ _copyltu(M)
    if gQ is not None:
        b = b + gQ
    return _tri(R.mH, b, False, False)  # b R^-H


def _linalg_qr(node, A, gQ, gR):
    mode = node.attrs["mode"]
    m, n = A.shape[-2], A.shape[-1]
    if mode == "complete" and m > n:
        raise AutogradError(
            "The QR decomposition is not differentiable when mode='complete' and nrows > ncols."
        )
    Q = _lin("linalg_qr_q", A, mode="reduced")
    R = _lin("linalg_qr_r", A, mode="reduced")
    if m >= n:
        return _qr_square_backward(gQ, gR, Q, R)
    # A = Q [X Y] with X m x m: X's factorization, and Y = Q R2 passes through
    R1 = R.narrow(-1, 0, m)
    Y = A.narrow(-1, m, n - m)
    gR1 = gR.narrow(-1, 0, m) if gR is not None else None
    gR2 = gR.narrow(-1, m, n - m) if gR is not None else None
    gQ_eff = gQ
    if gR2 is not None:
        extra = Y @ gR2.mH
        gQ_eff = extra if gQ_eff is None else gQ_eff + extra
    gX = _qr_square_backward(gQ_eff, gR1, Q, R1)
    gY = Q @ gR2 if gR2 is not None else F.zeros_like(Y)
    return F.cat([gX, gY], -1)


@vjp("linalg_qr_q", save="A")
def _linalg_qr_q(node, g, A):
    return (_linalg_qr(node, A, g, None),)


@vjp("linalg_qr_r", save="A")
def _linalg_qr_r(node, g, A):
    return (_linalg_qr(node, A, None, g),)


@vjp("linalg_pinv", save="A out")
def _linalg_pinv(node, g, A, pinvA):
    m, n = A.shape[-2], A.shape[-1]
    pinvAh = pinvA.mH
    gh = g.mH
    if m <= n:
        K = gh @ pinvA
        KpinvAh = K @ pinvAh
        gA = -(pinvA @ K).mH + KpinvAh - (A @ pinvA) @ KpinvAh + (pinvAh @ pinvA) @ (gh - K @ A)
    else:
        K = pinvA @ gh
        pinvAhK = pinvAh @ K
        gA = -(K @ pinvA).mH + (gh - A @ K) @ pinvA @ pinvAh + pinvAhK - pinvAhK @ pinvA @ A
    return (gA,)


@vjp("linalg_matrix_exp", save="A")
def _linalg_matrix_exp(node, g, A):
    # the gradient of exp at A along g is the upper right block of exp([[A^H, g], [0, A^H]])
    n = A.shape[-1]
    Ah = A.mH
    top = F.cat([Ah, g], -1)
    bottom = F.cat([F.zeros_like(Ah), Ah], -1)
    big = _lin("linalg_matrix_exp", F.cat([top, bottom], -2))
    return (big.narrow(-2, 0, n).narrow(-1, n, n),)
