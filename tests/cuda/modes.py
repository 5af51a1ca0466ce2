"""Which CUDA test process this is.  tests/cuda runs in processes of its own (see conftest.py):

* ``NUMBA_ENABLE_CUDASIM=1``: numba's CUDA simulator (CI, no GPU);
* ``FUSEGRAD_CUDA_DEVICE=1``: a real GPU (``python -m benchmarks.gpu_check`` sets it);
* ``FUSEGRAD_CUDA_PTX=1`` (no simulator): kernels compiled to PTX only, nothing launched.

Each module calls one of these before it imports ``numba.cuda``; in any other process (the main
suite) the module skips itself with the reason."""

from __future__ import annotations

import os

import pytest


def require_device() -> None:
    """Skip unless kernels can run: the simulator or a real GPU."""
    if (
        os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
        or os.environ.get("FUSEGRAD_CUDA_DEVICE") == "1"
    ):
        return
    pytest.skip(
        "CUDA tests run in their own process, in numba's simulator (NUMBA_ENABLE_CUDASIM=1, set "
        "before numba is imported; tests/test_cuda_suites.py starts it) or on a GPU "
        "(FUSEGRAD_CUDA_DEVICE=1)",
        allow_module_level=True,
    )


def require_ptx() -> None:
    """Skip unless this is the PTX-compilation process."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("FUSEGRAD_CUDA_PTX") != "1":
        pytest.skip(
            "PTX compilation runs in its own process, without the CUDA simulator and with "
            "FUSEGRAD_CUDA_PTX=1 (tests/test_cuda_suites.py starts it)",
            allow_module_level=True,
        )
