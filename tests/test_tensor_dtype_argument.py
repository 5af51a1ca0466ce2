"""``fusegrad.tensor(data, dtype=...)`` converts Python numbers straight to the requested dtype,
as ``torch.tensor`` does: no detour through the default float32 (which lost float64 precision
and overflowed large values to inf)."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None


@pytest.mark.parametrize(
    "data", [0.1, [0.1, 1e-300], [[1e200, -2.5]], [1, 2.5], (0.3, [0.7])[0:1], [True, 2.0]]
)
def test_python_floats_reach_float64_exactly(data) -> None:  # type: ignore[no-untyped-def]
    got = fg.tensor(data, dtype=fg.float64)
    want = np.array(data, dtype=np.float64)
    assert got.dtype is fg.float64
    assert got.numpy().tobytes() == want.tobytes()
    if torch is not None:
        assert got.numpy().tobytes() == torch.tensor(data, dtype=torch.float64).numpy().tobytes()


def test_inference_without_dtype_is_unchanged() -> None:
    assert fg.tensor([0.1]).dtype is fg.float32
    assert fg.tensor([1, 2]).dtype is fg.int64
    assert fg.tensor([np.float64(0.1)]).dtype is fg.float64
    assert fg.tensor([1, 2], dtype=fg.int32).dtype is fg.int32
    assert fg.tensor([0.5, 1.5], dtype=fg.float16).numpy().tolist() == [0.5, 1.5]
    with pytest.raises(TypeError):
        fg.tensor([object()], dtype=fg.float64)
