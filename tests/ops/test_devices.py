"""Device records and what happens without a GPU (the main suite's process: no simulator).

CUDA tensors themselves are tested in tests/cuda, in processes of their own."""

from __future__ import annotations

import os

import pytest

import fusegrad
from fusegrad.device import as_device


def test_device_records_compare_like_torch() -> None:
    assert fusegrad.device("cpu") == "cpu"
    assert str(fusegrad.device("cuda", 0)) == "cuda:0"
    assert fusegrad.device("cuda") == fusegrad.device("cuda", 0)
    assert repr(fusegrad.device("cuda", 0)) == "device(type='cuda', index=0)"
    assert fusegrad.ones(2).device == "cpu" and not fusegrad.ones(2).is_cuda
    assert fusegrad.ones(2).get_device() == -1


def test_unknown_device_type_is_refused() -> None:
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda device type"):
        as_device("tpu")
    with pytest.raises(TypeError, match="expected a device"):
        as_device(3)


@pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or fusegrad.cuda.is_available(),
    reason="this machine has CUDA (a GPU or the simulator)",
)
def test_without_a_gpu_cuda_tensors_are_refused_with_the_reason() -> None:
    assert not fusegrad.cuda.is_available() and fusegrad.cuda.device_count() == 0
    for make in (
        lambda: fusegrad.zeros(2, device="cuda"),
        lambda: fusegrad.ones(2).to("cuda"),
        lambda: fusegrad.ones(2).cuda(),
        lambda: fusegrad.tensor([1.0], device="cuda:0"),
    ):
        with pytest.raises(RuntimeError, match="device 'cuda(:0)?' is not available: .+"):
            make()
    x = fusegrad.ones(2)
    with pytest.raises(RuntimeError, match="not available"):
        x.to("cuda")
    assert x.device == "cpu"  # unchanged
