"""The discrete Fourier transform primitives behind ``fusegrad.fft``: ``fft_c2c`` (complex to
complex, either direction), ``fft_r2c`` (real to the non-redundant half of a complex spectrum)
and ``fft_c2r`` (that half back to real values).  Their kernels are numpy's FFT (pocketfft),
over given dims with sizes the surface has already padded or cropped; every public function of
``fusegrad.fft`` is one of them plus padding, cropping, conjugation or rolls.

Where this sits: beside ``primitives.py`` (records and shape/dtype rules); the derivative rules
are in ``autograd/derivatives.py``.  ``norm`` is numpy's and PyTorch's word for the scaling:
``"backward"`` scales the inverse direction by ``1/n``, ``"forward"`` the forward one,
``"ortho"`` both by ``1/sqrt(n)``.  The adjoint of a transform is the transform in the other
direction with the other scaling word (``dual_norm``), which is what the rules use.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .registry import primitive, set_meta

NORMS = ("backward", "forward", "ortho")


def dual_norm(norm: str) -> str:
    """The scaling of the adjoint transform: the same factor, applied in the other direction."""
    return {"backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]


@primitive("fft_c2c", "opaque", "x")
def _fft_c2c(x, dims, norm, forward):  # type: ignore[no-untyped-def]
    """The DFT of complex ``x`` over ``dims`` (``forward``: exponent -2 pi i, else the inverse
    transform's +2 pi i), scaled as ``norm`` says."""
    if not dims:
        return np.array(x, copy=True)
    fn = np.fft.fftn if forward else np.fft.ifftn
    return fn(x, axes=dims, norm=norm).astype(x.dtype, copy=False)


@primitive("fft_r2c", "opaque", "x")
def _fft_r2c(x, dims, norm):  # type: ignore[no-untyped-def]
    """The forward DFT of real ``x`` over ``dims``, keeping along the last of them the
    ``n // 2 + 1`` entries that the rest mirror (numpy's ``rfftn``)."""
    out = np.fft.rfftn(x, axes=dims, norm=norm)
    return out.astype(_dt.as_dtype(x.dtype).to_complex().np, copy=False)


@primitive("fft_c2r", "opaque", "x")
def _fft_c2r(x, dims, norm, last_dim_size):  # type: ignore[no-untyped-def]
    """The inverse of ``fft_r2c``: real values of ``last_dim_size`` along the last of ``dims``
    from the half spectrum ``x`` (``last_dim_size // 2 + 1`` entries there), the other half
    taken as its Hermitian mirror (numpy's ``irfftn``; imaginary parts that the mirror
    contradicts, as at frequency 0, are ignored)."""
    sizes = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    out = np.fft.irfftn(x, s=sizes, axes=dims, norm=norm)
    return out.astype(_dt.as_dtype(x.dtype).to_real().np, copy=False)


def _r2c_meta(shapes, dtypes, dims, norm):  # type: ignore[no-untyped-def]
    shape = list(shapes[0])
    if dims:
        shape[dims[-1]] = shape[dims[-1]] // 2 + 1
    return tuple(shape), dtypes[0].to_complex()


def _c2r_meta(shapes, dtypes, dims, norm, last_dim_size):  # type: ignore[no-untyped-def]
    shape = list(shapes[0])
    shape[dims[-1]] = last_dim_size
    return tuple(shape), dtypes[0].to_real()


set_meta("fft_c2c", lambda shapes, dtypes, dims, norm, forward: (tuple(shapes[0]), dtypes[0]))
set_meta("fft_r2c", _r2c_meta)
set_meta("fft_c2r", _c2r_meta, ("last_dim_size",))
