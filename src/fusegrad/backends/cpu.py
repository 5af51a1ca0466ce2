"""``fusegrad.backends.cpu``: what PyTorch reports about its CPU kernels."""

from __future__ import annotations


def get_cpu_capability() -> str:
    """The vector instruction set fusegrad's kernels use: whatever numpy and numba (LLVM) pick
    for this CPU, which fusegrad does not choose; reported as "DEFAULT"."""
    return "DEFAULT"
