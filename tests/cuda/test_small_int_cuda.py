"""int16, int8 and uint8 on CUDA (issue 28), in numba's simulator: transfers, PyTorch's
promotion (uint8 + int8 is int16), wrapping arithmetic, reductions, comparisons, casts and
indexing give the CPU's results."""

from __future__ import annotations

import modes  # noqa: E402
import numpy as np
import pytest

modes.require_device()

import fusegrad  # noqa: E402

RNG = np.random.default_rng(11)

CASES = {
    "add uint8 int8": lambda a, b: a + b.to(fusegrad.int8),
    "mul wraps": lambda a, b: a * b,
    "sub": lambda a, b: a - b,
    "floor_divide": lambda a, b: a // (b + 1),
    "remainder": lambda a, b: a % (b + 1),
    "true divide": lambda a, b: a / (b + 1),
    "scalar": lambda a, b: a * 3 + 1,
    "sum": lambda a, b: a.sum(1),
    "max": lambda a, b: a.max(0).values,
    "compare": lambda a, b: (a > b) | (a == 0),
    "bitwise": lambda a, b: (a & b) ^ (a | b),
    "cast": lambda a, b: a.float() * 0.5,
    "where": lambda a, b: fusegrad.where(a > b, a, b),
    "index": lambda a, b: a[fusegrad.tensor([2, 0], device=a.device)],
    "cat": lambda a, b: fusegrad.cat([a, b]),
}


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
@pytest.mark.parametrize("case", list(CASES))
def test_small_integers_on_cuda_match_the_cpu(dtype: str, case: str) -> None:
    low, high = (0, 200) if dtype == "uint8" else (-60, 60)
    a = RNG.integers(low, high, (3, 4)).astype(dtype)
    b = RNG.integers(0, 50, (3, 4)).astype(dtype)
    on_cpu = CASES[case](fusegrad.tensor(a), fusegrad.tensor(b))
    on_gpu = CASES[case](fusegrad.tensor(a, device="cuda"), fusegrad.tensor(b, device="cuda"))
    assert on_gpu.is_cuda and on_gpu.dtype is on_cpu.dtype
    np.testing.assert_array_equal(on_gpu.cpu().numpy(), on_cpu.numpy())


def test_promotion_and_transfers() -> None:
    x = fusegrad.ones(3, dtype=fusegrad.uint8, device="cuda")
    y = fusegrad.ones(3, dtype=fusegrad.int8, device="cuda")
    assert (x + y).dtype is fusegrad.int16 and (x + y).is_cuda
    back = fusegrad.tensor(np.array([250, 7], np.uint8)).cuda().cpu()
    assert back.dtype is fusegrad.uint8 and back.tolist() == [250, 7]
    assert fusegrad.cuda.ByteTensor([1, 2]).is_cuda
    assert isinstance(
        fusegrad.zeros(2, dtype=fusegrad.uint8, device="cuda"), fusegrad.cuda.ByteTensor
    )
