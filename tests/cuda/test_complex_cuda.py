"""Complex CUDA tensors in numba's simulator (docs/complex.md): storage, transfers and views
keep the values; every op that computes raises NotImplementedError naming the primitive (the
CUDA kernels compute in real arithmetic), never a result without the imaginary part.

Runs only in the simulator process (``NUMBA_ENABLE_CUDASIM=1``, see tests/test_cuda_suites.py)."""

from __future__ import annotations

import modes  # noqa: E402
import numpy as np
import pytest

modes.require_device()

import fusegrad  # noqa: E402

Z = np.array([[1 + 2j, 3 - 1j, -0.5j], [2.0, 1j, -1 - 1j]])


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_transfers_and_views_keep_the_values(dtype: str) -> None:
    z = fusegrad.tensor(Z, dtype=getattr(fusegrad, dtype))
    zc = z.cuda()
    assert zc.is_cuda and zc.dtype is z.dtype
    np.testing.assert_array_equal(zc.cpu().numpy(), z.numpy())
    np.testing.assert_array_equal(zc.T.cpu().numpy(), z.numpy().T)
    np.testing.assert_array_equal(zc[1].cpu().numpy(), z.numpy()[1])
    np.testing.assert_array_equal(zc.reshape(3, 2).cpu().numpy(), z.numpy().reshape(3, 2))
    assert "device='cuda:0'" in repr(zc)


def test_computing_ops_refuse_complex_operands() -> None:
    zc = fusegrad.tensor(Z).cuda()
    for fn in (
        lambda: zc + zc,
        lambda: zc * 2,
        lambda: zc.sum(),
        lambda: zc.exp(),
        lambda: zc @ zc.T,
    ):
        with pytest.raises(NotImplementedError, match="CUDA kernels take no complex operands"):
            fn()
