"""``fusegrad.fft``: PyTorch's ``torch.fft``, differentiable (docs/fft.md).

Every transform is one of three primitives (``ops/spectral.py``: ``fft_c2c``, ``fft_r2c``,
``fft_c2r``, whose kernels are numpy's FFT and whose derivative rules are in
``autograd/derivatives.py``) after the input is cropped (``narrow``) or zero-padded (``pad``)
to the requested sizes ``n`` / ``s``; the Hermitian transforms are those of the real ones with
conjugation and the other scaling (``hfft(x) = irfft(conj(x))`` scaled the other way), and the
shifts are rolls.  So gradients of any order come from the rules of those primitives, and the
values and gradients are PyTorch's.

Real inputs of the complex transforms are made complex first, integers and bools the default
float dtype first (PyTorch's promotion); float16 and bfloat16 are refused, as PyTorch does on
the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import dtypes as _dt
from ..autograd.node_names import torch_node_name as _torch_node_name
from ..errors import FusegradError, describe
from ..ops import REGISTRY, apply, creation, pad, to_tensor
from ..ops._util import cast, wrap_dim
from ..ops.spectral import NORMS, dual_norm
from ..tensor import Tensor

__all__ = [
    "fft",
    "ifft",
    "fft2",
    "ifft2",
    "fftn",
    "ifftn",
    "rfft",
    "irfft",
    "rfft2",
    "irfft2",
    "rfftn",
    "irfftn",
    "hfft",
    "ihfft",
    "hfft2",
    "ihfft2",
    "hfftn",
    "ihfftn",
    "fftfreq",
    "rfftfreq",
    "fftshift",
    "ifftshift",
]


class FFTError(FusegradError, RuntimeError):
    """Bad arguments of an FFT (sizes, dims, norm, dtypes): RuntimeErrors in PyTorch."""


# ---- argument handling ------------------------------------------------------------------------


def _norm(norm: str | None) -> str:
    if norm is None:
        return "backward"
    if norm not in NORMS:
        raise FFTError(f'Invalid normalization mode: "{norm}"')
    return norm


def _floating(op: str, x: Tensor) -> Tensor:
    """``x`` in a dtype the transforms take: integers and bools promoted to the default float
    dtype; half dtypes refused; CUDA tensors refused (no CUDA kernel yet, and CUDA kernels take
    no complex operands: docs/complex.md)."""
    if x.is_cuda:
        raise NotImplementedError(f"{op}: CUDA tensors are not supported yet (got {describe(x)})")
    if x._dtype in _dt.HALF:
        raise FFTError(f"{op}: Unsupported dtype {x._dtype.name} (got {describe(x)})")
    if x._dtype.category < 2:
        return cast(x, _dt.get_default_dtype())
    return x


def _complex(op: str, x: Tensor) -> Tensor:
    x = _floating(op, x)
    return x if x._dtype.is_complex else cast(x, x._dtype.to_complex())


def _real(op: str, x: Tensor) -> Tensor:
    if x._dtype.is_complex:
        raise FFTError(f"{op} expects a real input tensor, but got {x._dtype.name}")
    return _floating(op, x)


def _dims_and_sizes(
    op: str, x: Tensor, s: Sequence[int] | None, dim: Any, default_dim: tuple | None
) -> tuple[tuple[int, ...], list[int | None]]:
    """The (wrapped, unique) dims a transform runs over and the size requested along each
    (None: the input's), with PyTorch's rules: ``dim`` None means ``default_dim`` (None: the
    last ``len(s)`` dims when ``s`` is given, else all dims); an ``s`` entry of -1 means the
    input's size."""
    if isinstance(dim, int):
        dim = (dim,)
    if s is not None:
        s = [int(n) for n in s]
        if dim is None and default_dim is None:
            dim = tuple(range(x.ndim - len(s), x.ndim))
        elif dim is not None and len(s) != len(dim):
            raise FFTError("When given, dim and shape arguments must have the same length")
    if dim is None:
        dim = default_dim if default_dim is not None else tuple(range(x.ndim))
    dims = tuple(wrap_dim(op, d, x.ndim) for d in dim)
    if len(set(dims)) != len(dims):
        raise FFTError("FFT dims must be unique")
    if s is not None and len(s) != len(dims):
        raise FFTError("When given, dim and shape arguments must have the same length")
    sizes: list[int | None] = [None] * len(dims)
    if s is not None:
        for i, n in enumerate(s):
            if n == -1:
                continue
            if n < 1:
                raise FFTError(f"Invalid number of data points ({n}) specified")
            sizes[i] = n
    return dims, sizes


def _resize(x: Tensor, dims: Sequence[int], sizes: Sequence[int | None]) -> Tensor:
    """``x`` cropped or zero-padded at the end along each of ``dims`` to ``sizes``."""
    for d, n in zip(dims, sizes):
        if n is None:
            continue
        size = x.shape[d]
        if n < size:
            x = x.narrow(d, 0, n)
        elif n > size:
            widths = [0, 0] * (x.ndim - 1 - d) + [0, n - size]
            x = pad(x, widths)
    return x


def _check_points(x: Tensor, dims: Sequence[int]) -> None:
    for d in dims:
        if x.shape[d] < 1:
            raise FFTError(f"Invalid number of data points ({x.shape[d]}) specified")


def _c2c(
    op: str, x: Any, s: Any, dim: Any, norm: str | None, forward: bool, default: Any
) -> Tensor:
    x = _complex(op, to_tensor(x))
    dims, sizes = _dims_and_sizes(op, x, s, dim, default)
    x = _resize(x, dims, sizes)
    _check_points(x, dims)
    attrs = {"dims": dims, "norm": _norm(norm), "forward": forward}
    return apply(REGISTRY["fft_c2c"], (x,), attrs)


def _r2c(op: str, x: Any, s: Any, dim: Any, norm: str | None, default: Any) -> Tensor:
    x = _real(op, to_tensor(x))
    dims, sizes = _dims_and_sizes(op, x, s, dim, default)
    if not dims:
        raise FFTError(f"{op} must transform at least one axis")
    x = _resize(x, dims, sizes)
    _check_points(x, dims)
    return apply(REGISTRY["fft_r2c"], (x,), {"dims": dims, "norm": _norm(norm)})


def _c2r(op: str, x: Any, s: Any, dim: Any, norm: str | None, default: Any) -> Tensor:
    x = _complex(op, to_tensor(x))
    dims, sizes = _dims_and_sizes(op, x, s, dim, default)
    if not dims:
        raise FFTError(f"{op} must transform at least one axis")
    last = sizes[-1]
    if last is None:
        last = 2 * (x.shape[dims[-1]] - 1)
    if last < 1:
        raise FFTError(f"Invalid number of data points ({last}) specified")
    x = _resize(x, dims, list(sizes[:-1]) + [last // 2 + 1])
    _check_points(x, dims)
    attrs = {"dims": dims, "norm": _norm(norm), "last_dim_size": last}
    return apply(REGISTRY["fft_c2r"], (x,), attrs)


def _one(n: int | None) -> list[int] | None:
    return None if n is None else [n]


# ---- complex transforms -----------------------------------------------------------------------


@_torch_node_name("FftC2CBackward0")
def fft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The 1-D discrete Fourier transform along ``dim`` (``n`` points: cropped or
    zero-padded)."""
    return _c2c("fft", input, _one(n), (dim,), norm, True, None)


@_torch_node_name("FftC2CBackward0")
def ifft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The 1-D inverse discrete Fourier transform along ``dim``."""
    return _c2c("ifft", input, _one(n), (dim,), norm, False, None)


@_torch_node_name("FftC2CBackward0")
def fft2(
    input: Any, s: Sequence[int] | None = None, dim: Any = (-2, -1), norm: str | None = None
) -> Tensor:
    """The 2-D discrete Fourier transform over ``dim`` (the last two by default)."""
    return _c2c("fft2", input, s, dim, norm, True, (-2, -1))


@_torch_node_name("FftC2CBackward0")
def ifft2(
    input: Any, s: Sequence[int] | None = None, dim: Any = (-2, -1), norm: str | None = None
) -> Tensor:
    """The 2-D inverse discrete Fourier transform over ``dim``."""
    return _c2c("ifft2", input, s, dim, norm, False, (-2, -1))


@_torch_node_name("FftC2CBackward0")
def fftn(
    input: Any, s: Sequence[int] | None = None, dim: Any = None, norm: str | None = None
) -> Tensor:
    """The N-D discrete Fourier transform over ``dim`` (all dims, or the last ``len(s)``)."""
    return _c2c("fftn", input, s, dim, norm, True, None)


@_torch_node_name("FftC2CBackward0")
def ifftn(
    input: Any, s: Sequence[int] | None = None, dim: Any = None, norm: str | None = None
) -> Tensor:
    """The N-D inverse discrete Fourier transform over ``dim``."""
    return _c2c("ifftn", input, s, dim, norm, False, None)


# ---- real transforms ----------------------------------------------------------------------------


@_torch_node_name("FftR2CBackward0")
def rfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The 1-D DFT of real values: the ``n // 2 + 1`` non-negative frequencies."""
    return _r2c("rfft", input, _one(n), (dim,), norm, None)


@_torch_node_name("FftC2RBackward0")
def irfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The inverse of ``rfft``: ``n`` real values (default ``2 * (m - 1)`` for ``m`` input
    frequencies)."""
    return _c2r("irfft", input, _one(n), (dim,), norm, None)


@_torch_node_name("FftR2CBackward0")
def rfft2(
    input: Any, s: Sequence[int] | None = None, dim: Any = (-2, -1), norm: str | None = None
) -> Tensor:
    return _r2c("rfft2", input, s, dim, norm, (-2, -1))


@_torch_node_name("FftC2RBackward0")
def irfft2(
    input: Any, s: Sequence[int] | None = None, dim: Any = (-2, -1), norm: str | None = None
) -> Tensor:
    return _c2r("irfft2", input, s, dim, norm, (-2, -1))


@_torch_node_name("FftR2CBackward0")
def rfftn(
    input: Any, s: Sequence[int] | None = None, dim: Any = None, norm: str | None = None
) -> Tensor:
    """The N-D DFT of real values, halved along the last of ``dim``."""
    return _r2c("rfftn", input, s, dim, norm, None)


@_torch_node_name("FftC2RBackward0")
def irfftn(
    input: Any, s: Sequence[int] | None = None, dim: Any = None, norm: str | None = None
) -> Tensor:
    """The inverse of ``rfftn``."""
    return _c2r("irfftn", input, s, dim, norm, None)


# ---- Hermitian transforms: the real ones, conjugated and scaled the other way -----------------


@_torch_node_name("FftC2RBackward0")
def hfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The DFT of a Hermitian-symmetric signal given by its first half: ``n`` real values."""
    x = _complex("hfft", to_tensor(input)).conj()
    return _c2r("hfft", x, _one(n), (dim,), dual_norm(_norm(norm)), None)


def ihfft(input: Any, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The inverse of ``hfft``: the half spectrum of real values."""
    x = _r2c("ihfft", input, _one(n), (dim,), dual_norm(_norm(norm)), None)
    return x.conj()


@_torch_node_name("FftC2RBackward0")
def hfft2(
    input: Any, s: Sequence[int] | None = None, dim: Any = (-2, -1), norm: str | None = None
) -> Tensor:
    x = _complex("hfft2", to_tensor(input)).conj()
    return _c2r("hfft2", x, s, dim, dual_norm(_norm(norm)), (-2, -1))


def ihfft2(
    input: Any, s: Sequence[int] | None = None, dim: Any = (-2, -1), norm: str | None = None
) -> Tensor:
    return _r2c("ihfft2", input, s, dim, dual_norm(_norm(norm)), (-2, -1)).conj()


@_torch_node_name("FftC2RBackward0")
def hfftn(
    input: Any, s: Sequence[int] | None = None, dim: Any = None, norm: str | None = None
) -> Tensor:
    x = _complex("hfftn", to_tensor(input)).conj()
    return _c2r("hfftn", x, s, dim, dual_norm(_norm(norm)), None)


def ihfftn(
    input: Any, s: Sequence[int] | None = None, dim: Any = None, norm: str | None = None
) -> Tensor:
    return _r2c("ihfftn", input, s, dim, dual_norm(_norm(norm)), None).conj()


# ---- frequencies and shifts -------------------------------------------------------------------


def _frequencies(
    op: str, values: list, n: int, d: float, dtype: Any, device: Any, requires_grad: bool
) -> Tensor:
    if n < 0:
        raise FFTError(f"{op}: expected a non-negative number of points, got {n}")
    dt = _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    out = creation.tensor(values, dtype=_dt.float64) / (d * n) if n else creation.zeros(0)
    out = out.to(dt)
    if device is not None:
        out = out.to(device)
    return out.requires_grad_(requires_grad) if requires_grad else out


def fftfreq(
    n: int,
    d: float = 1.0,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **_: Any,
) -> Tensor:
    """The sample frequencies of an ``n``-point DFT with spacing ``d``: ``[0, 1, ...,
    (n - 1) // 2, -(n // 2), ..., -1] / (d n)``."""
    values = list(range((n - 1) // 2 + 1)) + list(range(-(n // 2), 0))
    return _frequencies("fftfreq", values, n, d, dtype, device, requires_grad)


def rfftfreq(
    n: int,
    d: float = 1.0,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    **_: Any,
) -> Tensor:
    """The sample frequencies of ``rfft``: ``[0, 1, ..., n // 2] / (d n)``."""
    values = list(range(n // 2 + 1))
    return _frequencies("rfftfreq", values, n, d, dtype, device, requires_grad)


def _shift(op: str, input: Any, dim: Any, sign: int) -> Tensor:
    x = to_tensor(input)
    if dim is None:
        dims = tuple(range(x.ndim))
    else:
        dims = tuple(wrap_dim(op, d, x.ndim) for d in ((dim,) if isinstance(dim, int) else dim))
    if not dims:
        return x.clone()
    shifts = tuple(sign * (x.shape[d] // 2) for d in dims)
    return x.roll(shifts, dims)


def fftshift(input: Any, dim: Any = None) -> Tensor:
    """Frequency 0 moved to the middle: a roll by ``n // 2`` along ``dim`` (all dims)."""
    return _shift("fftshift", input, dim, 1)


def ifftshift(input: Any, dim: Any = None) -> Tensor:
    """The inverse of ``fftshift``: a roll by ``-(n // 2)``."""
    return _shift("ifftshift", input, dim, -1)
