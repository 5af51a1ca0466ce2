"""Top-level queries and settings (``fusegrad.runtime``) against PyTorch's."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad as fg

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_finfo_matches_torch(name: str) -> None:
    ours, theirs = fg.finfo(getattr(fg, name)), torch.finfo(getattr(torch, name))
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"):
        assert getattr(ours, field) == getattr(theirs, field), field


def test_finfo_defaults_to_the_default_dtype_and_refuses_integers() -> None:
    assert fg.finfo().eps == torch.finfo().eps
    with pytest.raises(TypeError, match="floating point"):
        fg.finfo(fg.int64)


@pytest.mark.parametrize("name", ["int32", "int64"])
def test_iinfo_matches_torch(name: str) -> None:
    ours, theirs = fg.iinfo(getattr(fg, name)), torch.iinfo(getattr(torch, name))
    assert (ours.bits, ours.min, ours.max) == (theirs.bits, theirs.min, theirs.max)


def test_constants() -> None:
    assert (fg.pi, fg.e, fg.inf) == (torch.pi, torch.e, torch.inf)
    assert math.isnan(fg.nan) and fg.newaxis is None
    assert fg.ones(3)[fg.newaxis].shape == (1, 3)


def test_dtype_queries_match_torch() -> None:
    names = ["bool", "int32", "int64", "float16", "float32", "float64"]
    for a in names:
        x, tx = fg.ones(1, dtype=getattr(fg, a)), torch.ones(1, dtype=getattr(torch, a))
        assert fg.is_floating_point(x) == torch.is_floating_point(tx)
        assert fg.is_signed(x) == torch.is_signed(tx)
        assert fg.is_complex(x) is torch.is_complex(tx) is False
        assert fg.typename(x) == torch.typename(tx)
        for b in names:
            fa, fb, ta, tb = (getattr(m, n) for m in (fg, torch) for n in (a, b))
            assert fg.promote_types(fa, fb).name == str(torch.promote_types(ta, tb))[6:]
            assert fg.can_cast(fa, fb) == torch.can_cast(ta, tb), (a, b)
    assert fg.result_type(fg.ones(2, dtype=fg.int32), 2.5) is fg.float32


def test_shape_and_value_queries() -> None:
    assert fg.broadcast_shapes((2, 1), (3,), 1) == torch.broadcast_shapes((2, 1), (3,), 1)
    with pytest.raises(RuntimeError):
        fg.broadcast_shapes((2,), (3,))
    assert fg.is_same_size(fg.ones(2, 3), fg.zeros(2, 3)) and not fg.is_same_size(
        fg.ones(2), fg.ones(3)
    )
    assert fg.is_nonzero(fg.tensor([0.5])) and not fg.is_nonzero(fg.tensor(0))
    with pytest.raises(RuntimeError, match="more than one value"):
        fg.is_nonzero(fg.ones(2))
    with fg.inference_mode():
        assert fg.is_inference(fg.ones(1))


def test_seed_and_threads() -> None:
    fg.manual_seed(123)
    assert fg.initial_seed() == 123
    before = fg.get_num_threads()
    try:
        fg.set_num_threads(1)
        assert fg.get_num_threads() == 1
    finally:
        fg.set_num_threads(before)
    with pytest.raises(RuntimeError):
        fg.set_num_threads(0)
    fg.set_num_interop_threads(3)
    assert fg.get_num_interop_threads() == 3


def test_flags_are_stored_and_checked() -> None:
    try:
        fg.use_deterministic_algorithms(True, warn_only=True)
        assert fg.are_deterministic_algorithms_enabled()
        assert fg.is_deterministic_algorithms_warn_only_enabled()
        assert fg.get_deterministic_debug_mode() == 1
        fg.set_deterministic_debug_mode("error")
        assert fg.get_deterministic_debug_mode() == 2
        with pytest.raises(RuntimeError, match="debug_mode"):
            fg.set_deterministic_debug_mode("loud")
    finally:
        fg.use_deterministic_algorithms(False)
    assert fg.get_deterministic_debug_mode() == 0
    fg.set_float32_matmul_precision("high")
    assert fg.get_float32_matmul_precision() == "high"
    fg.set_float32_matmul_precision("highest")
    with pytest.raises(RuntimeError, match="Invalid precision"):
        fg.set_float32_matmul_precision("low")
    try:
        fg.set_anomaly_enabled(True, check_nan=False)
        assert fg.is_anomaly_enabled() and not fg.is_anomaly_check_nan_enabled()
    finally:
        fg.set_anomaly_enabled(False)
    assert not fg.is_anomaly_enabled()


def test_functional_names_at_top_level_are_nn_functional_s() -> None:
    import fusegrad.nn.functional as F

    for name in ("selu", "celu", "conv1d", "pixel_shuffle", "cosine_similarity", "rms_norm"):
        assert getattr(fg, name) is getattr(F, name)
    x = fg.randn(2, 3)
    assert fg.allclose(fg.selu(x), F.selu(x))


@pytest.mark.parametrize(
    "options",
    [
        {"precision": 2},
        {"sci_mode": False},
        {"sci_mode": True},
        {"profile": "short"},
        {"profile": "full"},
        {"threshold": 5, "edgeitems": 1},
        {"linewidth": 30},
        {"precision": 6, "sci_mode": False},
    ],
)
def test_set_printoptions_prints_as_pytorch(options: dict) -> None:
    arrays = [
        np.array([[1.23456789, 1e-5, 300.0], [2, 3, 4]]),
        np.arange(12.0).reshape(3, 4) * 1.5,
        np.array([1e10, 1.0]),
        np.arange(2000.0),
        np.array([np.nan, 1.5, -np.inf]),
    ]
    try:
        fg.set_printoptions(**options)
        torch.set_printoptions(**options)
        for a in arrays:  # float32, the default dtype: no dtype suffix whose name differs
            a = a.astype(np.float32)
            assert repr(fg.tensor(a)) == repr(torch.tensor(a)), (options, a)
    finally:
        fg.set_printoptions(profile="default")
        torch.set_printoptions(profile="default")
    assert repr(fg.tensor([1.5, 2.0])) == "tensor([1.5000, 2.0000])"
