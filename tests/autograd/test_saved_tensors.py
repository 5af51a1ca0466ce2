"""Saved tensors: version checks on use, the error text, what each rule saves."""

from __future__ import annotations

import numpy as np
import pytest

import fusegrad as fg

MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace"


def test_in_place_under_no_grad_on_a_saved_leaf_is_detected() -> None:
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = fg.tensor([4.0, 5.0, 6.0], requires_grad=True)
    y = (x * w).sum()
    with fg.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    msg = str(info.value)
    assert "[float32 [3]] is at version 1; expected version 0 instead" in msg
    assert "MulBackward0" in msg and "anomaly" in msg
    assert x.grad is None and w.grad is None


def test_error_names_the_node_that_produced_the_saved_tensor() -> None:
    a = fg.tensor([[1.0, 2.0]], dtype=fg.float64, requires_grad=True)
    h = a.exp()  # ExpBackward0 produces h
    y = (h * h).sum()  # MulBackward0 saves h
    with fg.no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    msg = str(info.value)
    assert "[float64 [1, 2]], which is output 0 of ExpBackward0," in msg
    assert "is at version 1; expected version 0 instead" in msg


def test_modified_saved_output_is_detected() -> None:
    a = fg.tensor([1.0, 2.0], requires_grad=True)
    h = a.exp()  # exp saves its output
    y = h.sum()
    with fg.no_grad():
        h.zero_()
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    assert "output 0 of ExpBackward0" in str(info.value)


def test_in_place_through_a_detached_alias_is_detected() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    x.detach().mul_(2.0)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.backward()


def test_versions_count_every_in_place_op() -> None:
    x = fg.tensor([1.0, 2.0])
    y = (x * fg.tensor([1.0, 1.0], requires_grad=True)).sum()
    x.add_(1.0)
    x.mul_(2.0)
    assert x._version == 2
    with pytest.raises(RuntimeError, match="is at version 2; expected version 0"):
        y.backward()


def test_rules_save_only_what_they_use() -> None:
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    c = fg.tensor([3.0, 4.0])
    y = x + c  # add saves nothing: changing c afterwards is fine
    c.add_(1.0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])
    h = x.tanh()  # tanh saves its output, not its input
    z = h.sum()
    with fg.no_grad():
        x.add_(1.0)
    z.backward()


def test_unmodified_values_after_a_restore_still_fail() -> None:
    # the check is on versions, not values
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    with fg.no_grad():
        x.add_(1.0)
        x.sub_(1.0)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.backward()


@pytest.mark.parametrize("dtype", ["float64", "float16"], ids=["fused", "composite"])
def test_writing_into_a_log_softmax_result_fails_its_backward(dtype: str) -> None:
    """The fused primitive (CPU float32/float64) and the composite (here float16; also CUDA
    and compiled recordings) both save the result, as PyTorch's LogSoftmaxBackward0."""
    x = fg.tensor([0.1, 0.2, -0.3], dtype=getattr(fg, dtype), requires_grad=True)
    y = fg.log_softmax(x, 0)
    assert y.grad_fn.name() == "LogSoftmaxBackward0"
    with fg.no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16"], ids=["fused32", "fused64", "composite"]
)
@pytest.mark.parametrize("shape", [(3,), (2, 3), ()], ids=["1d", "2d", "0d"])
def test_writing_into_a_softmax_result_fails_its_backward(dtype: str, shape: tuple) -> None:
    """The fused primitive (CPU float32/float64) and the composite (here float16, and 0-d
    inputs in every dtype; also CUDA and compiled recordings) both save the result, as
    PyTorch's SoftmaxBackward0: the composite's own nodes saved ``exp(x - max)`` and the sum,
    and the write went unnoticed."""
    values = np.array([[0.1, 0.2, -0.3], [1.0, -2.0, 0.5]]).reshape(-1)[: int(np.prod(shape))]
    x = fg.tensor(values.reshape(shape), dtype=getattr(fg, dtype), requires_grad=True)
    y = fg.softmax(x, -1)
    assert y.grad_fn.name() == "SoftmaxBackward0"
    with fg.no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.sum().backward()
    assert "output 0 of SoftmaxBackward0" in str(info.value)
    assert x.grad is None


@pytest.mark.parametrize("dtype", ["float64", "float16"], ids=["fused", "composite"])
def test_softmax_saves_its_result_not_its_input(dtype: str) -> None:
    """As PyTorch's SoftmaxBackward0: writing into the input afterwards leaves the backward
    working, with the gradient of the values it had (``diag(s) - s s^T``)."""
    x = fg.tensor([0.1, 0.2, -0.3], dtype=getattr(fg, dtype), requires_grad=True)
    y = fg.softmax(x, 0)
    with fg.no_grad():
        x.mul_(5.0)
    (y * fg.tensor([1.0, 0.0, 0.0], dtype=x.dtype)).sum().backward()
    s = y.detach().numpy().astype(np.float64)
    want = s[0] * (np.eye(3)[0] - s)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-2 if dtype == "float16" else 1e-12)
