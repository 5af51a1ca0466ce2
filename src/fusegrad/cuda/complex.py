"""Complex values on CUDA: the kernels of the elementwise primitives for complex operands, the
views between complex and real storage, and complex sums (docs/complex.md, "CUDA").

The generated one-op kernels (``fusegrad.cuda.generated``) come from the lowering table, whose
scalar expressions are written for real numbers; complex operands come here instead.  numba-cuda
has complex64/complex128 scalars with complex arithmetic, ``abs``, ``.conjugate()`` and the
``cmath`` functions, so each primitive is one device expression on complex scalars, in a
grid-stride kernel over broadcast views of the operands (``arith``'s pattern): one kernel per
(primitive, operand dtypes, result dtype, rank).  numpy computes the same primitives on the CPU;
the device's complex functions may differ from numpy's in the last bits.  Under numba's
simulator the kernels run as Python on numpy scalars, with numpy's functions for ``cmath``
(which return inf/nan where Python's ``cmath`` raises).

Views are geometry only, as numpy's: ``real``, ``imag`` and ``view_as_real`` see a complex
array's memory as its real dtype (the real part first), ``view_as_complex`` a float array's
last dim of 2 as complex numbers -- a ``CudaArray`` whose dtype differs from its buffer's.

``sum`` and ``sum_to`` of complex values are the real reduction over ``view_as_real`` (the real
and the imaginary parts summed alike, as numpy sums them) seen as complex again.

Primitives not listed here (``pow``, ``expm1``, ``log1p``, ``sigmoid``, matmul, ...) refuse
complex operands with ``NotImplementedError`` naming the primitive (``fusegrad.cuda.ops``).
"""

from __future__ import annotations

import cmath
import functools
import math
import re
from typing import Any

import numpy as np

from .array import CudaArray, contiguous, empty, from_probe, probe_view
from .kernels import build, grid_loop, index, launch_config

# one device expression per primitive, on the operands ``a`` (and ``b``), converted to the
# complex dtype the primitive computes in
_UNARY = {
    "neg": "-a",
    "conj_physical": "a.conjugate()",
    "clone": "a",
    "reciprocal": "ONE / a",
    "exp": "cmath.exp(a)",
    "log": "cmath.log(a)",
    "sqrt": "cmath.sqrt(a)",
    "sin": "csin(a)",
    "cos": "ccos(a)",
    "sinh": "csinh(a)",
    "cosh": "ccosh(a)",
    "tanh": "ctanh(a)",
    "asin": "cmath.asin(a)",
    "acos": "cmath.acos(a)",
    "atan": "cmath.atan(a)",
    "asinh": "cmath.asinh(a)",
    "acosh": "cmath.log(a + cmath.sqrt(a + ONE) * cmath.sqrt(a - ONE))",
    "atanh": "cmath.atanh(a)",
    # real or bool results
    "abs": "abs(a)",
    "isnan": "cmath.isnan(a)",
    "isinf": "cmath.isinf(a)",
}
_BINARY = {
    "add": "a + b",
    "sub": "a - b",
    "mul": "a * b",
    "div": "a / b",
    "eq": "a == b",
    "ne": "a != b",
}
# numba-cuda's cmath sin, cos, sinh, cosh, tanh and acosh do not compile to PTX without a
# driver; these are the textbook formulas in real arithmetic (tanh: Kahan's, as C libraries
# compute it: no overflow of sinh and cosh for large real parts)
_HELPERS = {
    "csin": [
        "def csin(z):",
        "    x = z.real",
        "    y = z.imag",
        "    return complex(rmath.sin(x) * rmath.cosh(y), rmath.cos(x) * rmath.sinh(y))",
    ],
    "ccos": [
        "def ccos(z):",
        "    x = z.real",
        "    y = z.imag",
        "    return complex(rmath.cos(x) * rmath.cosh(y), -(rmath.sin(x) * rmath.sinh(y)))",
    ],
    "csinh": [
        "def csinh(z):",
        "    x = z.real",
        "    y = z.imag",
        "    return complex(rmath.sinh(x) * rmath.cos(y), rmath.cosh(x) * rmath.sin(y))",
    ],
    "ccosh": [
        "def ccosh(z):",
        "    x = z.real",
        "    y = z.imag",
        "    return complex(rmath.cosh(x) * rmath.cos(y), rmath.sinh(x) * rmath.sin(y))",
    ],
    "ctanh": [
        "def ctanh(z):",
        "    x = np.float64(z.real)",
        "    y = np.float64(z.imag)",
        "    if abs(x) >= 22.0:  # tanh(x) is +-1 in float64; the imaginary part underflows",
        "        e = rmath.exp(-abs(x))",
        "        return complex(rmath.copysign(1.0, x), 4.0 * rmath.sin(y) * rmath.cos(y) * e * e)",
        "    t = rmath.tan(y)",
        "    beta = 1.0 + t * t",
        "    s = rmath.sinh(x)",
        "    rho = rmath.sqrt(1.0 + s * s)",
        "    denom = 1.0 + beta * s * s",
        "    return complex(beta * rho * s / denom, t / denom)",
    ],
}
SUPPORTED = frozenset(_UNARY) | frozenset(_BINARY) | {"cast", "complex", "where"}


class _SimulatorCmath:
    """``cmath`` for kernels run by the simulator: numpy's functions, which return inf/nan where
    the device does instead of raising like Python's ``cmath`` (``log(0)``)."""

    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    sqrt = staticmethod(np.sqrt)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    sinh = staticmethod(np.sinh)
    cosh = staticmethod(np.cosh)
    tanh = staticmethod(np.tanh)
    asin = staticmethod(np.arcsin)
    acos = staticmethod(np.arccos)
    atan = staticmethod(np.arctan)
    asinh = staticmethod(np.arcsinh)
    acosh = staticmethod(np.arccosh)
    atanh = staticmethod(np.arctanh)
    isnan = staticmethod(np.isnan)
    isinf = staticmethod(np.isinf)


class _SimulatorMath:
    """``math`` for the formulas of ``_HELPERS`` under the simulator: numpy's functions (inf
    where Python's ``math`` raises OverflowError)."""

    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    tan = staticmethod(np.tan)
    sinh = staticmethod(np.sinh)
    cosh = staticmethod(np.cosh)
    exp = staticmethod(np.exp)
    sqrt = staticmethod(np.sqrt)
    copysign = staticmethod(np.copysign)


def _modules() -> dict[str, Any]:
    """The ``cmath`` and ``rmath`` (real ``math``) of the kernels' source."""
    from numba import config  # numba-cuda: loaded on the first kernel build

    if config.ENABLE_CUDASIM:
        return {"cmath": _SimulatorCmath, "rmath": _SimulatorMath}
    return {"cmath": cmath, "rmath": math}


def involves_complex(name: str, arrays: list, attrs: dict) -> bool:
    """Whether the call of primitive ``name`` computes with or makes complex values."""
    if any(a.dtype.kind == "c" for a in arrays):
        return True
    if name == "complex":
        return True
    return name == "cast" and attrs["dtype"].is_complex


def _compute_dtype(name: str, dtypes: tuple, out_dtype: np.dtype) -> np.dtype:
    """The complex dtype the operands are converted to (the widest complex one involved)."""
    if name == "complex":
        return out_dtype
    complexes = [d for d in (*dtypes, out_dtype) if d.kind == "c"]
    return max(complexes, key=lambda d: d.itemsize)


@functools.cache
def _kernel(name: str, dtypes: tuple, out_dtype: np.dtype, rank: int) -> Any:
    idx = index(rank)
    ins = ", ".join(f"in{k}" for k in range(len(dtypes)))
    operands = [f"in{k}[{idx}]" for k in range(len(dtypes))]
    compute = _compute_dtype(name, dtypes, out_dtype)
    if name in _UNARY or name in _BINARY:
        # the operands converted to the complex dtype the primitive computes in, as ``A``/``B``
        body = [
            f"{letter} = {_cast_expr(dtypes[k], compute, operands[k])}"
            for k, letter in zip(range(len(dtypes)), "AB")
        ]
        expr = re.sub(
            r"\b([ab])\b", lambda m: m.group(1).upper(), _UNARY.get(name) or _BINARY[name]
        )
        body.append(f"out[{idx}] = {expr}")
    elif name == "where":  # (cond, a, b): a and b of the result's dtype
        a = _cast_expr(dtypes[1], out_dtype, operands[1])
        b = _cast_expr(dtypes[2], out_dtype, operands[2])
        body = [f"out[{idx}] = {a} if {operands[0]} else {b}"]
    elif name == "complex":
        body = [
            f"out[{idx}] = np.{out_dtype.name}(complex(np.float64({operands[0]}), "
            f"np.float64({operands[1]})))"
        ]
    else:  # cast
        body = [f"out[{idx}] = {_cast_expr(dtypes[0], out_dtype, operands[0])}"]
    helpers = []
    for helper, source in _HELPERS.items():
        if any(f"{helper}(" in line for line in body):
            helpers += ['@cuda.jit(device=True, inline="always")', *source, ""]
    lines = [
        f"ONE = np.{compute.name}(1)",
        "",
        *helpers,
        grid_loop(f"def elementwise(out, {ins}, n):", rank, body, "out"),
    ]
    label = f"complex {name} {tuple(str(d) for d in dtypes)} -> {out_dtype}"
    return build("\n".join(lines), "elementwise", label, **_modules())


def _cast_expr(src: np.dtype, dst: np.dtype, operand: str) -> str:
    """numba source converting ``operand`` (of ``src``) to ``dst`` as the CPU's ``cast`` does:
    a real number gets a zero imaginary part; complex to real keeps the real part, to bool
    tests for nonzero (PyTorch's casts)."""
    if dst.kind == "c":
        if src.kind == "c":
            return operand if src == dst else f"np.{dst.name}({operand})"
        return f"np.{dst.name}(complex(np.float64({operand}), 0.0))"
    if src.kind != "c":
        return f"np.{dst.name}({operand})" if dst != np.bool_ else f"({operand} != 0)"
    if dst == np.bool_:
        return f"({operand} != 0)"
    return f"np.{dst.name}({operand}.real)"


def run(prim: Any, arrays: list[CudaArray], attrs: dict, out_dtype: np.dtype) -> CudaArray:
    """Primitive ``prim`` on ``arrays`` (complex operands or a complex result), broadcast."""
    name = prim.name
    shape = tuple(np.broadcast_shapes(*[a.shape for a in arrays]))
    views = [
        a if a.shape == shape else probe_view(a, lambda p: np.broadcast_to(p, shape))
        for a in arrays
    ]
    rank = max(len(shape), 1)
    if not shape:  # one element: index the (1,) views below
        views = [v.reshape((1,)) for v in views]
    out = empty(shape if shape else (1,), out_dtype)
    if out.size:
        kernel = _kernel(name, tuple(a.dtype for a in arrays), np.dtype(out_dtype), rank)
        blocks, threads = launch_config(out.size)
        kernel[blocks, threads](out.kernel_array(), *(v.kernel_array() for v in views), out.size)
    return out.reshape(shape)


# ---- views ------------------------------------------------------------------------------------
def as_real(a: CudaArray) -> CudaArray:
    """``view_as_real``: a complex array's memory as its real dtype, with a last dim of 2."""
    real = np.empty(0, a.dtype).real.dtype  # (complex64 -> float32, complex128 -> float64)
    return CudaArray(
        a.buffer, (*a.shape, 2), (*a.strides, real.itemsize), a.offset, real, a.writeable
    )


def part(a: CudaArray, imaginary: bool) -> CudaArray:
    """``real`` / ``imag``: the real or imaginary parts of a complex array, as a view."""
    pairs = as_real(a)
    probe = pairs.probe()
    return from_probe(pairs, probe, probe[..., 1 if imaginary else 0])


def as_complex(a: CudaArray) -> CudaArray:
    """``view_as_complex``: a float array's last dim of 2 (stride one element) as complex."""
    cdt = np.result_type(a.dtype, np.complex64)
    return CudaArray(a.buffer, a.shape[:-1], a.strides[:-1], a.offset, cdt, a.writeable)


# ---- sums -------------------------------------------------------------------------------------
def complex_sum(real_sum: Any, a: CudaArray, attrs: dict, name: str) -> CudaArray:
    """``sum`` / ``sum_to`` of complex ``a`` with ``real_sum(name, pairs, attrs)``, the real
    reduction, run on ``view_as_real(a)``: its last dim (the parts) kept apart."""
    pairs = as_real(a)
    if name == "sum":
        dim = attrs["dim"]
        dims = tuple(range(a.ndim)) if dim is None else tuple(d % max(a.ndim, 1) for d in dim)
        if not a.ndim:
            dims = ()
        summed = real_sum(name, pairs, {**attrs, "dim": dims})
    else:
        summed = real_sum(name, pairs, {**attrs, "shape": (*attrs["shape"], 2)})
    return as_complex(contiguous(summed))
