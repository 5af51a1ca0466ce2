"""issue 28's smaller API additions, against PyTorch where it is importable: numpy's argument
names and ``out=``, factory keywords, layouts and memory formats, the default device,
``asarray``/``frombuffer``/DLPack, ``nn.modules`` paths (also in pickles of whole models),
``nn.grad``, ``nn.attention.sdpa_kernel``, ``nn.factory_kwargs``, ``optim.swa_utils``,
``serialization.safe_globals``, ``fusegrad.onnx`` and sparse COO tensors (a graph-convolution
layer's forward and backward)."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import serialization

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch cross-check")
RNG = np.random.default_rng(2828)


def _torch() -> Any:
    import torch

    return torch


SPELLINGS = {
    "sum": lambda m, x: m.sum(x, axis=1, keepdims=True),
    "mean method": lambda m, x: x.mean(axis=0),
    "max": lambda m, x: x.max(axis=1, keepdims=True).values,
    "std_mean": lambda m, x: m.std_mean(x, axis=1)[0],
    "any": lambda m, x: (x > 0).any(axis=1),
    "cat": lambda m, x: m.cat([x, x], axis=0),
    "argmax": lambda m, x: x.argmax(axis=1, keepdims=True),
    "logsumexp": lambda m, x: m.logsumexp(x, axis=1),
    "cumsum": lambda m, x: x.cumsum(axis=1),
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_numpy_argument_names(name: str) -> None:
    x = RNG.standard_normal((3, 4))
    got = SPELLINGS[name](fg, fg.tensor(x))
    if HAVE_TORCH:
        torch = _torch()
        want = SPELLINGS[name](torch, torch.tensor(x))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    with pytest.raises(TypeError, match="alias"):
        fg.sum(fg.tensor(x), dim=0, axis=0)


def test_out_arguments() -> None:
    a = fg.randn(2, 3)
    out = fg.empty(2, 3)
    assert fg.add(a, 1, out=out) is out and fg.allclose(out, a + 1)
    small = fg.empty(0)
    fg.sum(a, 1, out=small)
    assert tuple(small.shape) == (2,) and fg.allclose(small, a.sum(1))
    values, indices = fg.empty(2), fg.empty(2, dtype=fg.int64)
    got = fg.max(a, 1, out=(values, indices))
    assert got.values is values and fg.equal(indices, a.argmax(1))
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic"):
        fg.mul(fg.ones(2, requires_grad=True), 2, out=fg.empty(2))


def test_factory_keywords() -> None:
    base = fg.ones(2, 3, dtype=fg.float64)
    for factory in (fg.zeros_like, fg.ones_like, fg.empty_like, fg.rand_like, fg.randn_like):
        t = factory(base, device="cpu", requires_grad=True, memory_format=fg.preserve_format)
        assert t.dtype is fg.float64 and t.requires_grad and t.layout is fg.strided
    assert fg.full_like(base, 3, layout=fg.strided).tolist() == [[3.0] * 3] * 2
    assert fg.randint(0, 5, (3,), requires_grad=False, device="cpu").dtype is fg.int64
    assert sorted(fg.randperm(5, device="cpu", dtype=fg.int32).tolist()) == list(range(5))
    with pytest.raises(TypeError, match="unexpected keyword argument 'devce'"):
        fg.zeros_like(base, devce="cpu")
    t = base.t()
    assert t.contiguous(memory_format=fg.channels_last).is_contiguous()
    assert t.to(memory_format=fg.contiguous_format).shape == t.shape
    made = base.new_zeros(4, device="cpu")
    assert made.dtype is fg.float64 and base.new_full((2,), 7).tolist() == [7.0, 7.0]


def test_default_device_and_interop() -> None:
    assert fg.get_default_device().type == "cpu"
    fg.set_default_device("cpu")
    try:
        assert fg.ones(2).device.type == "cpu"
    finally:
        fg.set_default_device(None)
    arr = np.arange(4.0)
    shared = fg.asarray(arr)
    arr[0] = 9.0
    assert shared[0].item() == 9.0  # no copy
    assert fg.asarray(arr, copy=True)._data is not arr
    assert fg.asarray([1, 2]).dtype is fg.int64
    assert fg.frombuffer(bytearray(b"\x01\x00\x02\x00"), dtype=fg.int16).tolist() == [1, 2]
    assert fg.get_device(fg.ones(1)) == -1
    if HAVE_TORCH:
        torch = _torch()
        assert fg.from_dlpack(torch.arange(3)).tolist() == [0, 1, 2]
        assert torch.from_dlpack(fg.to_dlpack(fg.arange(3))).tolist() == [0, 1, 2]


def test_module_paths_and_whole_model_pickles(tmp_path: Path) -> None:
    from fusegrad.nn.modules.batchnorm import _BatchNorm
    from fusegrad.nn.modules.conv import Conv2d

    assert Conv2d is nn.Conv2d and issubclass(nn.BatchNorm1d, _BatchNorm)
    assert nn.Linear.__module__ == "fusegrad.nn.modules.linear"
    assert b"fusegrad.nn.modules.linear" in pickle.dumps(nn.Linear(2, 2))
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten())
    fg.save(model, tmp_path / "model.pt")
    loaded = fg.load(tmp_path / "model.pt", weights_only=False)
    x = fg.randn(1, 1, 5, 5)
    model.eval()
    loaded.eval()
    assert fg.equal(model(x), loaded(x)) and repr(loaded) == repr(model)


def test_safe_globals(tmp_path: Path) -> None:
    path = tmp_path / "config.pt"
    fg.save({"config": nn.ReLU(), "w": fg.ones(2)}, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        fg.load(path)
    with serialization.safe_globals([nn.ReLU]):
        assert isinstance(fg.load(path)["config"], nn.ReLU)
    with pytest.raises(pickle.UnpicklingError):
        fg.load(path)  # (only inside the block)
    serialization.add_safe_globals([nn.ReLU])
    try:
        assert nn.ReLU in serialization.get_safe_globals()
        assert fg.load(path)["w"].tolist() == [1.0, 1.0]
    finally:
        serialization.clear_safe_globals()


def test_onnx_is_importable_and_says_it_does_not_export() -> None:
    import fusegrad.onnx

    assert fusegrad.onnx.is_in_onnx_export() is False
    with pytest.raises(NotImplementedError, match="does not export ONNX"):
        fusegrad.onnx.export(nn.Linear(2, 2), (fg.ones(1, 2),), "model.onnx")


@needs_torch
def test_nn_grad_attention_and_factory_kwargs() -> None:
    torch = _torch()
    x, w = RNG.standard_normal((2, 3, 6, 6)), RNG.standard_normal((4, 3, 3, 3))
    g = RNG.standard_normal((2, 4, 3, 3))
    for fn in ("conv2d_input", "conv2d_weight"):
        first = x.shape if fn.endswith("input") else fg.tensor(x)
        second = fg.tensor(w) if fn.endswith("input") else w.shape
        got = getattr(nn.grad, fn)(first, second, fg.tensor(g), stride=2, padding=1)
        tfirst = x.shape if fn.endswith("input") else torch.tensor(x)
        tsecond = torch.tensor(w) if fn.endswith("input") else w.shape
        want = getattr(torch.nn.grad, fn)(tfirst, tsecond, torch.tensor(g), stride=2, padding=1)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10)
    q = fg.randn(2, 4, 8)
    plain = F.scaled_dot_product_attention(q, q, q)
    backend = nn.attention.SDPBackend
    with nn.attention.sdpa_kernel(backend.MATH):
        assert fg.allclose(F.scaled_dot_product_attention(q, q, q), plain, atol=1e-6)
    with nn.attention.sdpa_kernel([backend.CUDNN_ATTENTION]):
        with pytest.raises(RuntimeError, match="No available kernel"):
            F.scaled_dot_product_attention(q, q, q)
    assert F.scaled_dot_product_attention(q, q, q).shape == plain.shape  # (restored)
    assert nn.factory_kwargs({"device": "cpu", "factory_kwargs": {"dtype": fg.float64}}) == {
        "device": "cpu",
        "dtype": fg.float64,
    }
    with pytest.raises(TypeError):
        nn.factory_kwargs({"bias": True})


@needs_torch
def test_swa_utils_match_torch() -> None:
    torch = _torch()
    for options in (
        {"swa_lr": 0.05, "anneal_epochs": 5},
        {"swa_lr": 0.02, "anneal_epochs": 0},
        {"swa_lr": 0.05, "anneal_epochs": 3, "anneal_strategy": "linear"},
    ):
        ours = fg.optim.SGD([fg.nn.Parameter(fg.zeros(2))], lr=0.5)
        theirs = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)
        s1 = fg.optim.swa_utils.SWALR(ours, **options)
        s2 = torch.optim.swa_utils.SWALR(theirs, **options)
        for _ in range(8):
            ours.step()
            theirs.step()
            s1.step()
            s2.step()
            assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"])
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).double()
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
    with torch.no_grad():
        for p, q in zip(model.parameters(), tmodel.parameters()):
            q.copy_(torch.tensor(p.detach().numpy()))
    ema = fg.optim.swa_utils.get_ema_avg_fn(0.9)
    ours = fg.optim.swa_utils.AveragedModel(model, avg_fn=ema)
    theirs = torch.optim.swa_utils.AveragedModel(
        tmodel, avg_fn=torch.optim.swa_utils.get_ema_avg_fn(0.9)
    )
    for _ in range(4):
        with fg.no_grad():
            for p in model.parameters():
                p.add_(fg.tensor(RNG.standard_normal(tuple(p.shape))))
        with torch.no_grad():
            for p, q in zip(model.parameters(), tmodel.parameters()):
                q.copy_(torch.tensor(p.detach().numpy()))
        ours.update_parameters(model)
        theirs.update_parameters(tmodel)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12)
    data = [RNG.standard_normal((4, 3)) for _ in range(3)]
    fg.optim.swa_utils.update_bn([fg.tensor(d) for d in data], ours)
    torch.optim.swa_utils.update_bn([torch.tensor(d) for d in data], theirs)
    np.testing.assert_allclose(
        ours.module[1].running_var.numpy(), theirs.module[1].running_var.numpy(), rtol=1e-10
    )


def test_sparse_coo_graph_convolution() -> None:
    """A graph-convolution layer ``relu(A @ X @ W)`` with a sparse adjacency: gradients reach
    the dense features, the weight and the sparse values."""
    edges = np.array([[0, 1, 1, 2, 0, 2], [1, 0, 2, 1, 0, 2]])
    weights = RNG.random(6)
    features = RNG.standard_normal((3, 4))
    w = RNG.standard_normal((4, 2))
    adj = fg.sparse_coo_tensor(fg.tensor(edges), fg.tensor(weights), (3, 3), requires_grad=True)
    x, wt = fg.tensor(features, requires_grad=True), fg.tensor(w, requires_grad=True)
    out = fg.sparse.mm(adj, x @ wt).relu()
    assert adj.is_sparse and adj.layout is fg.sparse_coo and not x.is_sparse
    out.pow(2).sum().backward()
    dense = adj.detach().to_dense().numpy()
    np.testing.assert_allclose(out.detach().numpy(), np.maximum(dense @ features @ w, 0))
    fg.autograd.gradcheck(
        lambda v, f: fg.spmm(fg.sparse_coo_tensor(fg.tensor(edges), v, (3, 3)), f),
        (fg.tensor(weights, requires_grad=True), fg.tensor(features, requires_grad=True)),
    )
    d = fg.tensor(features * (features > 0), requires_grad=True)
    s = d.to_sparse()
    assert s._nnz() == int((features > 0).sum()) and s.is_coalesced()
    s.to_dense().sum().backward()
    assert fg.equal(d.grad, fg.tensor((features > 0).astype(float)))
    if HAVE_TORCH:
        torch = _torch()
        tadj = torch.sparse_coo_tensor(
            torch.tensor(edges), torch.tensor(weights), (3, 3), requires_grad=True
        )
        tx, tw = torch.tensor(features, requires_grad=True), torch.tensor(w, requires_grad=True)
        tout = torch.sparse.mm(tadj, tx @ tw).relu()
        tout.pow(2).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-10)
        np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-10)
        np.testing.assert_allclose(
            adj.grad.to_dense().numpy(), tadj.grad.to_dense().numpy(), rtol=1e-10
        )
        np.testing.assert_array_equal(
            adj.coalesce().indices().numpy(), tadj.coalesce().indices().numpy()
        )


def test_chain_dataset_and_more_inplace_methods() -> None:
    from fusegrad.utils.data import ChainDataset, IterableDataset

    class Count(IterableDataset):
        def __init__(self, n: int) -> None:
            self.n = n

        def __iter__(self) -> Any:
            return iter(range(self.n))

        def __len__(self) -> int:
            return self.n

    assert list(Count(2) + Count(3)) == [0, 1, 0, 1, 2]
    assert len(ChainDataset([Count(2), Count(1)])) == 3
    x = fg.zeros(2, 2)
    x.addmm_(fg.ones(2, 3), fg.ones(3, 2))
    assert x.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    b = fg.zeros(2, 2)
    b.addbmm_(fg.ones(4, 2, 3), fg.ones(4, 3, 2))
    assert b.tolist() == [[12.0, 12.0], [12.0, 12.0]]
    c = fg.zeros(4, 2, 2)
    c.baddbmm_(fg.ones(4, 2, 3), fg.ones(4, 3, 2), alpha=0.5)
    assert c.sum().item() == 4 * 4 * 1.5
