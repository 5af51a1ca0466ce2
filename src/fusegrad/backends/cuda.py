"""``fusegrad.backends.cuda``: PyTorch's CUDA math switches (``matmul.allow_tf32``, the
scaled-dot-product-attention kernel choice), stored and otherwise ignored: fusegrad's CUDA
matmul computes in the tensors' own dtype, and ``F.scaled_dot_product_attention`` has one
implementation (see ``fusegrad.backends``).  Defaults are PyTorch's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..cuda import is_available as _cuda_available


class _MatmulFlags:
    """``backends.cuda.matmul``: attributes written and read back, nothing else."""

    def __init__(self) -> None:
        self.allow_tf32 = False
        self.allow_fp16_reduced_precision_reduction = True
        self.allow_bf16_reduced_precision_reduction = True

    def __repr__(self) -> str:
        return f"fusegrad.backends.cuda.matmul({vars(self)})"


matmul = _MatmulFlags()

_sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def is_built() -> bool:
    """Whether fusegrad can run on CUDA here (numba-cuda and a GPU, or its simulator)."""
    return _cuda_available()


def flash_sdp_enabled() -> bool:
    return _sdp["flash"]


def enable_flash_sdp(enabled: bool) -> None:
    _sdp["flash"] = bool(enabled)


def mem_efficient_sdp_enabled() -> bool:
    return _sdp["mem_efficient"]


def enable_mem_efficient_sdp(enabled: bool) -> None:
    _sdp["mem_efficient"] = bool(enabled)


def math_sdp_enabled() -> bool:
    return _sdp["math"]


def enable_math_sdp(enabled: bool) -> None:
    _sdp["math"] = bool(enabled)


def cudnn_sdp_enabled() -> bool:
    return _sdp["cudnn"]


def enable_cudnn_sdp(enabled: bool) -> None:
    _sdp["cudnn"] = bool(enabled)


@contextlib.contextmanager
def sdp_kernel(
    enable_flash: bool = True,
    enable_math: bool = True,
    enable_mem_efficient: bool = True,
    enable_cudnn: bool = True,
) -> Iterator[None]:
    """The flags set for the ``with`` block, then restored (they select nothing here)."""
    saved = dict(_sdp)
    _sdp.update(
        flash=bool(enable_flash),
        math=bool(enable_math),
        mem_efficient=bool(enable_mem_efficient),
        cudnn=bool(enable_cudnn),
    )
    try:
        yield
    finally:
        _sdp.update(saved)
