"""Module mechanics: registration, traversal, state_dict, modes, conversion, repr, containers."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import fusegrad
from fusegrad import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.scale = nn.Parameter(fusegrad.ones(4))
        self.register_buffer("running", fusegrad.zeros(4))
        self.register_buffer("scratch", fusegrad.zeros(2), persistent=False)
        self.plain = 5

    def forward(self, x: fusegrad.Tensor) -> fusegrad.Tensor:
        return self.fc(x) * self.scale + self.running


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x: fusegrad.Tensor) -> fusegrad.Tensor:
        return self.head(self.block(x))


def test_parameter_is_tensor_and_requires_grad():
    p = nn.Parameter(fusegrad.zeros(2, 3))
    assert isinstance(p, fusegrad.Tensor) and isinstance(p, nn.Parameter)
    assert p.requires_grad and p.is_leaf
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert "requires_grad=True" in repr(p)
    frozen = nn.Parameter(fusegrad.zeros(2), requires_grad=False)
    assert not frozen.requires_grad
    # op results are plain tensors, not parameters
    assert type(p * 2) is fusegrad.Tensor


def test_parameter_shares_storage_with_wrapped_tensor():
    t = fusegrad.zeros(3)
    p = nn.Parameter(t)
    with fusegrad.no_grad():
        p.add_(1.0)
    np.testing.assert_array_equal(t.numpy(), [1.0, 1.0, 1.0])
    assert t._version == p._version == 1


def test_parameter_deepcopy_and_pickle_keep_type():
    p = nn.Parameter(fusegrad.randn(2, 2))
    for q in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert isinstance(q, nn.Parameter) and q.requires_grad
        np.testing.assert_array_equal(q.detach().numpy(), p.detach().numpy())
        assert q.detach().numpy() is not p.detach().numpy()


def test_registration_and_traversal():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == [
        "block.scale",
        "block.fc.weight",
        "block.fc.bias",
        "head.1.weight",
        "head.1.bias",
    ]
    assert [n for n, _ in net.named_buffers()] == ["block.running", "block.scratch"]
    assert [n for n, _ in net.named_children()] == ["block", "head"]
    assert [n for n, _ in net.named_modules()] == [
        "",
        "block",
        "block.fc",
        "head",
        "head.0",
        "head.1",
    ]
    assert len(list(net.modules())) == 6
    assert [n for n, _ in net.block.named_parameters(recurse=False)] == ["scale"]
    assert len(list(net.parameters(recurse=False))) == 0
    assert net.block.plain == 5 and "plain" not in net.block._parameters
    assert net.get_submodule("head.1") is net.head[1]
    assert net.get_parameter("block.fc.bias") is net.block.fc.bias


def test_shared_parameters_listed_once():
    lin = nn.Linear(2, 2)
    seq = nn.Sequential(lin, lin)
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.modules())) == 2
    # state_dict keeps every name, like PyTorch
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_setattr_rules():
    m = Block()
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'scale'"):
        m.scale = fusegrad.ones(4)
    m.scale = None
    assert "scale" in m._parameters and m.scale is None
    with pytest.raises(TypeError, match="as child module 'fc'"):
        m.fc = 3
    with pytest.raises(TypeError, match="as buffer 'running'"):
        m.running = 3.0
    m.running = fusegrad.ones(4)
    assert m._buffers["running"] is m.running
    # as in PyTorch, a parameter slot only takes a Parameter or None ...
    with pytest.raises(TypeError, match="as parameter 'scale'"):
        m.scale = nn.Identity()
    # ... while a buffer name re-bound to a Parameter moves between registries
    m.running = nn.Parameter(fusegrad.zeros(4))
    assert "running" not in m._buffers and "running" in m._parameters
    del m.scale
    assert not hasattr(m, "scale")
    with pytest.raises(AttributeError, match="'Block' object has no attribute 'nope'"):
        m.nope  # noqa: B018


def test_assign_before_init_raises():
    class Bad(nn.Module):
        def __init__(self) -> None:
            self.w = nn.Parameter(fusegrad.zeros(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()


def test_register_buffer_and_parameter_errors():
    m = nn.Module()
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", fusegrad.zeros(1))
    with pytest.raises(TypeError):
        m.register_parameter("w", fusegrad.zeros(1))
    m.x = 1
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("x", fusegrad.zeros(1))
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        m(1)


def test_state_dict_round_trip():
    fusegrad.manual_seed(0)
    a, b = Net(), Net()
    sd = a.state_dict()
    assert list(sd) == [
        "block.scale",
        "block.running",
        "block.fc.weight",
        "block.fc.bias",
        "head.1.weight",
        "head.1.bias",
    ]  # non-persistent buffer excluded
    assert all(not v.requires_grad for v in sd.values())
    # values alias the parameters (PyTorch's detach semantics)
    assert np.shares_memory(sd["block.fc.weight"].numpy(), a.block.fc.weight.detach().numpy())
    weight_before = b.block.fc.weight
    result = b.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert b.block.fc.weight is weight_before  # copied in place, identity kept
    x = fusegrad.randn(5, 3)
    np.testing.assert_allclose(a(x).detach().numpy(), b(x).detach().numpy())
    kept = a.state_dict(keep_vars=True)
    assert kept["block.fc.weight"] is a.block.fc.weight
    prefixed = a.state_dict(prefix="model.")
    assert "model.block.fc.weight" in prefixed


def test_load_state_dict_errors():
    net = Net()
    sd = net.state_dict()
    missing = OrderedDict((k, v) for k, v in sd.items() if k != "head.1.bias")
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "head.1.bias"'):
        net.load_state_dict(missing)
    extra = OrderedDict(sd)
    extra["bogus"] = fusegrad.zeros(1)
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "bogus"'):
        net.load_state_dict(extra)
    bad = OrderedDict(sd)
    bad["block.fc.weight"] = fusegrad.zeros(5, 5)
    with pytest.raises(RuntimeError, match="size mismatch for block.fc.weight"):
        net.load_state_dict(bad)
    with pytest.raises(nn.LoadStateDictError, match="Error\\(s\\) in loading state_dict for Net"):
        net.load_state_dict(missing)
    result = net.load_state_dict(extra, strict=False)
    assert result.unexpected_keys == ["bogus"] and result.missing_keys == []
    result = net.load_state_dict(missing, strict=False)
    assert result.missing_keys == ["head.1.bias"]
    # a shape mismatch is an error even when not strict, and nothing is half-loaded silently
    with pytest.raises(RuntimeError, match="size mismatch"):
        net.load_state_dict(bad, strict=False)


def test_load_state_dict_assign_and_numpy_values():
    lin = nn.Linear(2, 2)
    sd = {"weight": np.eye(2, dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)}
    lin.load_state_dict(sd)
    np.testing.assert_array_equal(lin.weight.detach().numpy(), np.eye(2))
    new_w = fusegrad.full((2, 2), 3.0)
    lin.load_state_dict({"weight": new_w, "bias": fusegrad.zeros(2)}, assign=True)
    assert isinstance(lin.weight, nn.Parameter) and lin.weight.requires_grad
    assert float(lin.weight.sum()) == 12.0


def test_train_eval_propagates():
    net = Net()
    assert net.training and net.head[0].training
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="boolean"):
        net.train("yes")


def test_dropout_respects_mode():
    fusegrad.manual_seed(0)
    drop = nn.Dropout(0.5)
    x = fusegrad.ones(2000)
    y = drop(x).numpy()
    kept = y != 0
    assert 0.4 < kept.mean() < 0.6
    np.testing.assert_allclose(y[kept], 2.0)  # survivors scaled by 1 / (1 - p)
    drop.eval()
    assert np.array_equal(drop(x).numpy(), x.numpy())  # identity in eval mode
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)
    assert np.all(nn.Dropout(1.0)(x).numpy() == 0)


def test_dropout_gradient_matches_mask():
    fusegrad.manual_seed(1)
    x = fusegrad.randn(50, requires_grad=True)
    y = nn.Dropout(0.3)(x)
    y.sum().backward()
    mask = y.detach().numpy() != 0
    np.testing.assert_allclose(x.grad.numpy(), mask / 0.7, rtol=1e-6)


def test_zero_grad_and_requires_grad_():
    lin = nn.Linear(3, 2)
    lin(fusegrad.randn(4, 3)).sum().backward()
    assert lin.weight.grad is not None
    grad = lin.weight.grad
    lin.zero_grad(set_to_none=False)
    assert lin.weight.grad is grad and float(grad.abs().sum()) == 0.0
    lin.zero_grad()
    assert lin.weight.grad is None and lin.bias.grad is None
    lin.requires_grad_(False)
    assert not any(p.requires_grad for p in lin.parameters())


def test_apply_visits_children_first():
    net = Net()
    order = []
    net.apply(lambda m: order.append(type(m).__name__))
    assert order == ["Linear", "Block", "ReLU", "Linear", "Sequential", "Net"]

    def init_zero(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.weight)

    net.apply(init_zero)
    assert float(net.head[1].weight.abs().sum()) == 0.0


def test_to_double_keeps_parameter_identity():
    net = Net()
    w = net.block.fc.weight
    net(fusegrad.randn(2, 3)).sum().backward()
    assert net.double() is net
    assert net.block.fc.weight is w and w.dtype == fusegrad.float64
    assert isinstance(w, nn.Parameter)
    assert w.grad.dtype == fusegrad.float64
    assert net.block.running.dtype == fusegrad.float64
    out = net(fusegrad.randn(2, 3, dtype=fusegrad.float64))
    assert out.dtype == fusegrad.float64
    net.float()
    assert w.dtype == fusegrad.float32
    net.to(fusegrad.float64)
    assert w.dtype == fusegrad.float64
    with pytest.raises(TypeError, match="floating point"):
        net.to(fusegrad.int64)


def test_repr_like_pytorch():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    assert repr(model) == (
        "Sequential(\n"
        "  (0): Linear(in_features=64, out_features=128, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Dropout(p=0.1, inplace=False)\n"
        "  (3): Linear(in_features=128, out_features=10, bias=True)\n"
        ")"
    )
    nested = nn.Sequential(nn.Sequential(nn.Tanh()))
    assert repr(nested) == "Sequential(\n  (0): Sequential(\n    (0): Tanh()\n  )\n)"
    assert repr(nn.Linear(2, 3, bias=False)) == "Linear(in_features=2, out_features=3, bias=False)"
    assert repr(nn.Conv2d(3, 8, 3, stride=2, padding=1)) == (
        "Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))"
    )
    assert (
        repr(nn.LayerNorm(10)) == "LayerNorm((10,), eps=1e-05, elementwise_affine=True, bias=True)"
    )
    assert repr(nn.Embedding(10, 3, padding_idx=0)) == "Embedding(10, 3, padding_idx=0)"
    assert repr(nn.GELU(approximate="tanh")) == "GELU(approximate='tanh')"
    assert repr(nn.MaxPool2d(2)) == (
        "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
    )
    assert repr(nn.CrossEntropyLoss()) == "CrossEntropyLoss()"


def test_sequential_container():
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    seq = nn.Sequential(a, b)
    seq.append(c)
    assert len(seq) == 3 and seq[0] is a and seq[-1] is c
    assert list(seq) == [a, b, c]
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and list(sub) == [b, c]
    named = nn.Sequential(OrderedDict([("fc", a), ("act", b)]))
    assert named.fc is a and list(named.state_dict()) == ["fc.weight", "fc.bias"]
    x = fusegrad.randn(4, 2)
    np.testing.assert_allclose(seq(x).detach().numpy(), c(b(a(x))).detach().numpy())
    del seq[1]
    assert list(seq._modules) == ["0", "1"] and seq[1] is c
    seq[0] = nn.Identity()
    assert isinstance(seq[0], nn.Identity)
    with pytest.raises(IndexError):
        seq[5]


def test_module_list_and_dict():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and len(list(layers.parameters())) == 6
    layers.append(nn.ReLU())
    layers.extend([nn.Tanh()])
    assert isinstance(layers[-1], nn.Tanh) and len(layers) == 5
    assert list(layers.state_dict())[:2] == ["0.weight", "0.bias"]
    with pytest.raises(NotImplementedError):
        layers(fusegrad.zeros(1))
    d = nn.ModuleDict({"enc": nn.Linear(2, 3), "dec": nn.Linear(3, 2)})
    assert list(d.keys()) == ["enc", "dec"] and "enc" in d and len(d) == 2
    assert [n for n, _ in d.named_parameters()] == [
        "enc.weight",
        "enc.bias",
        "dec.weight",
        "dec.bias",
    ]
    d["act"] = nn.ReLU()
    assert isinstance(d.pop("act"), nn.ReLU) and "act" not in d


def test_forward_hooks():
    lin = nn.Linear(2, 2)
    seen = []
    handle = lin.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    pre = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    out = lin(fusegrad.ones(1, 2))
    np.testing.assert_allclose(out.detach().numpy(), lin.bias.detach().numpy()[None], rtol=1e-6)
    assert seen == [(1, 2)]
    handle.remove()
    pre.remove()
    lin(fusegrad.ones(1, 2))
    assert len(seen) == 1


def test_deepcopy_module():
    net = Net()
    clone = copy.deepcopy(net)
    assert clone.block.fc.weight is not net.block.fc.weight
    assert isinstance(clone.block.fc.weight, nn.Parameter)
    x = fusegrad.randn(3, 3)
    np.testing.assert_allclose(net(x).detach().numpy(), clone(x).detach().numpy())


def test_nn_import_does_not_load_numba():
    import subprocess
    import sys

    code = (
        "import sys, fusegrad; fusegrad.nn.Linear(2, 2); fusegrad.optim.SGD; "
        "import fusegrad.nn.functional; print('numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
