"""F.hardswish/selu/celu/glu and their modules (inplace forms, reprs, errors, gradients at
hardswish's kinks as PyTorch's), and nn.ParameterList / nn.ParameterDict (registration, Tensors
becoming Parameters, state_dict keys, slicing, dict methods, training through them)."""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn


@pytest.mark.parametrize(
    "name,args",
    [("hardswish", ()), ("selu", ()), ("celu", ()), ("celu", (0.5,)), ("glu", (0,))],
)
def test_activations_match_torch(name: str, args: tuple) -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).uniform(-5, 5, (4, 6))
    x[0, :3] = [-3.0, 3.0, 0.0]  # hardswish's kinks and 0
    xt, xf = torch.tensor(x, requires_grad=True), fg.tensor(x, requires_grad=True)
    yt = getattr(torch.nn.functional, name)(xt, *args)
    yf = getattr(F, name)(xf, *args)
    g = np.random.default_rng(1).standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(g))
    yf.backward(fg.tensor(g))
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "module,function",
    [
        (lambda: nn.Hardswish(inplace=True), F.hardswish),
        (lambda: nn.SELU(inplace=True), F.selu),
        (lambda: nn.CELU(0.7, inplace=True), lambda x: F.celu(x, 0.7)),
    ],
)
def test_inplace_modules_write_into_their_input(module: Any, function: Any) -> None:
    x = fg.tensor(np.linspace(-4, 4, 9))
    want = function(x).numpy()
    y = module()(x)
    assert y is x and x._version == 1
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-12)


def test_activation_reprs_and_errors() -> None:
    assert [repr(m) for m in (nn.Hardswish(), nn.SELU(inplace=True), nn.CELU(0.5), nn.GLU(1))] == [
        "Hardswish()",
        "SELU(inplace=True)",
        "CELU(alpha=0.5)",
        "GLU(dim=1)",
    ]
    assert nn.GLU()(fg.randn(3, 4)).shape == (3, 2)
    with pytest.raises(RuntimeError, match="Halving dimension must be even, but dimension 1"):
        F.glu(fg.randn(3, 5), 1)
    with pytest.raises(RuntimeError, match="does not support scalars"):
        F.glu(fg.tensor(1.0))
    with pytest.raises(IndexError, match=re.escape("Dimension out of range")):
        F.glu(fg.randn(4), 1)
    with pytest.raises(RuntimeError, match="alpha cannot be 0"):
        F.celu(fg.randn(3), 0.0)


# ---- ParameterList / ParameterDict ---------------------------------------------------------------


def test_parameter_list() -> None:
    pl = nn.ParameterList([nn.Parameter(fg.ones(2, 3)), fg.zeros(4)])
    pl.append(fg.randn(1))
    pl.extend([fg.ones(2)])
    pl += [fg.ones(3)]
    assert len(pl) == 5 and all(isinstance(p, nn.Parameter) for p in pl)
    assert pl[1].requires_grad and pl[-1].shape == (3,)
    assert [n for n, _ in pl.named_parameters()] == ["0", "1", "2", "3", "4"]
    part = pl[1:3]
    assert isinstance(part, nn.ParameterList) and part[0] is pl[1]
    pl[0] = fg.ones(1)
    assert isinstance(pl[0], nn.Parameter) and pl[0].shape == (1,)
    assert repr(pl).splitlines()[1] == "    (0): Parameter containing: [fusegrad.float32 of size 1]"
    with pytest.raises(IndexError):
        pl[5]
    with pytest.raises(TypeError, match="iterable"):
        pl.extend(fg.ones(2))
    with pytest.raises(RuntimeError, match="should not be called"):
        pl()


def test_parameter_dict() -> None:
    pd = nn.ParameterDict({"b": fg.ones(2), "a": nn.Parameter(fg.zeros(1))})
    pd["c"] = fg.ones(3)
    pd.update([("d", fg.ones(1))])
    assert list(pd) == ["a", "b", "c", "d"]  # a plain dict's keys are sorted, as in PyTorch
    assert list(pd.state_dict()) == ["a", "b", "c", "d"]
    assert "a" in pd and pd.get("z") is None and isinstance(pd["b"], nn.Parameter)
    assert pd.pop("d").shape == (1,) and len(pd) == 3 and "d" not in pd
    assert [k for k, _ in pd.items()] == ["a", "b", "c"] and len(pd.values()) == 3
    assert pd.setdefault("e", fg.zeros(2)).shape == (2,)
    merged = pd | nn.ParameterDict({"f": fg.ones(1)})
    assert list(merged) == ["a", "b", "c", "e", "f"] and merged["a"] is pd["a"]
    assert pd.popitem()[0] == "e"
    pd.clear()
    assert len(pd) == 0 and list(pd.parameters()) == []
    with pytest.raises(KeyError):
        pd["a"]
    with pytest.raises(RuntimeError, match="should not be called"):
        pd()


class _Mixture(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList([fg.randn(3, 3, dtype=fg.float64) for _ in range(2)])
        self.biases = nn.ParameterDict({"first": fg.zeros(3, dtype=fg.float64)})

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        for w in self.weights:
            x = (x @ w).tanh()
        return x + self.biases["first"]


def test_containers_train_copy_and_load() -> None:
    fg.manual_seed(0)
    model = _Mixture()
    assert [n for n, _ in model.named_parameters()] == ["weights.0", "weights.1", "biases.first"]
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().numpy().copy() for p in model.parameters()]
    loss = model(fg.randn(4, 3, dtype=fg.float64)).square().sum()
    loss.backward()
    opt.step()
    assert all(not np.allclose(b, p.detach().numpy()) for b, p in zip(before, model.parameters()))
    clone = copy.deepcopy(model)
    assert clone.weights[0] is not model.weights[0]
    other = _Mixture()
    other.load_state_dict(model.state_dict())
    for p, q in zip(other.parameters(), model.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    assert other.double().weights[1].dtype == fg.float64
