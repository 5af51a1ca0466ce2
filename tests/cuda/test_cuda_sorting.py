"""The CUDA ``argsort`` kernel (sort, topk, kthvalue, median on CUDA tensors) against the CPU:
NaN order, stable ties, descending, partial topk, every dim of a 3-d tensor, empty rows."""

from __future__ import annotations

import modes
import numpy as np
import pytest

modes.require_device()

import fusegrad as fg  # noqa: E402

NAN = float("nan")
CASES = {
    "nan_ties": np.array([[3.0, 1.0, NAN, 2.0, 1.0, NAN], [0.0, 5.0, -1.0, 5.0, 2.0, 0.0]]),
    "int_ties": np.random.default_rng(0).integers(0, 4, (2, 3, 5)),
    "float32": np.random.default_rng(1).integers(0, 3, (3, 7)).astype(np.float32),
    "bool": np.array([[True, False, True, False]]),
    "empty_rows": np.zeros((0, 4)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_the_cpu(name: str, descending: bool) -> None:
    data = CASES[name]
    for dim in range(data.ndim):
        want = fg.sort(fg.tensor(data), dim=dim, descending=descending)
        got = fg.sort(fg.tensor(data, device="cuda"), dim=dim, descending=descending)
        assert got.indices.device.type == "cuda"
        np.testing.assert_array_equal(got.indices.cpu().numpy(), want.indices.numpy())
        np.testing.assert_array_equal(got.values.cpu().numpy(), want.values.numpy())


def test_topk_kthvalue_median_match_the_cpu() -> None:
    data = np.random.default_rng(2).standard_normal((4, 9))  # distinct values: no ties
    cpu, gpu = fg.tensor(data), fg.tensor(data, device="cuda")
    for largest in (True, False):
        want, got = fg.topk(cpu, 3, largest=largest), fg.topk(gpu, 3, largest=largest)
        np.testing.assert_array_equal(got.indices.cpu().numpy(), want.indices.numpy())
    np.testing.assert_array_equal(
        gpu.kthvalue(4, dim=0).indices.cpu().numpy(), cpu.kthvalue(4, dim=0).indices.numpy()
    )
    assert fg.median(gpu).item() == fg.median(cpu).item()
    x = fg.tensor(data, device="cuda", requires_grad=True)
    fg.topk(x, 2).values.sum().backward()
    assert x.grad.device.type == "cuda" and x.grad.cpu().numpy().sum() == 8.0
