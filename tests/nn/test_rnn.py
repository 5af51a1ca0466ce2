"""nn.RNNCell/LSTMCell/GRUCell and nn.RNN/LSTM/GRU against torch.nn in float64: a torch
state_dict loads unchanged (names, shapes, order), outputs, final states and the gradients of
the input, the initial states and every parameter agree; reprs, initialisation bounds, errors,
dropout between layers, and a few training steps that follow torch's."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import nn

TOL = {"rtol": 1e-10, "atol": 1e-12}


def _torch() -> Any:
    return pytest.importorskip("torch")


def _copy_from_torch(module: Any, torch_module: Any) -> None:
    module.load_state_dict(
        {k: fg.tensor(v.detach().numpy()) for k, v in torch_module.state_dict().items()}
    )


def _pair(torch: Any, data: np.ndarray) -> tuple[Any, Any]:
    return fg.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)


def _flatten(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return [out]


def _compare(module: Any, want: Any, inputs: list, torch_inputs: list, rng: Any) -> None:
    """Run both modules, backpropagate the same random cotangents, compare everything."""
    got_out = _flatten(module(*inputs))
    want_out = _flatten(want(*torch_inputs))
    assert len(got_out) == len(want_out)
    total_got, total_want = 0, 0
    for a, b in zip(got_out, want_out):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **TOL)
        g = rng.standard_normal(tuple(b.shape))
        total_got = total_got + (a * fg.tensor(g)).sum()
        total_want = total_want + (b * torch.tensor(g)).sum()
    total_got.backward()
    total_want.backward()
    for a, b in zip(_flatten(inputs), _flatten(torch_inputs)):
        if b is not None and b.requires_grad:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **TOL)
    got_params = dict(module.named_parameters())
    for name, p in want.named_parameters():
        np.testing.assert_allclose(
            got_params[name].grad.numpy(), p.grad.numpy(), **TOL, err_msg=name
        )


torch = None


@pytest.fixture(autouse=True)
def _bind_torch() -> None:
    global torch
    torch = _torch()


CELL_CASES = [
    ("RNNCell", {}),
    ("RNNCell", {"nonlinearity": "relu", "bias": False}),
    ("LSTMCell", {}),
    ("LSTMCell", {"bias": False}),
    ("GRUCell", {}),
    ("GRUCell", {"bias": False}),
]


@pytest.mark.parametrize("cls,kwargs", CELL_CASES)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_cells_match_torch(cls: str, kwargs: dict, batched: bool, with_state: bool) -> None:
    torch.manual_seed(0)
    want = getattr(torch.nn, cls)(5, 4, **kwargs).double()
    module = getattr(nn, cls)(5, 4, **kwargs).double()
    _copy_from_torch(module, want)
    assert repr(module) == repr(want)
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in want.named_parameters()]
    rng = np.random.default_rng(1)
    batch = (3,) if batched else ()
    x, xt = _pair(torch, rng.standard_normal(batch + (5,)))
    inputs, torch_inputs = [x], [xt]
    if with_state:
        states = [_pair(torch, rng.standard_normal(batch + (4,))) for _ in range(2)]
        if cls == "LSTMCell":
            inputs.append((states[0][0], states[1][0]))
            torch_inputs.append((states[0][1], states[1][1]))
        else:
            inputs.append(states[0][0])
            torch_inputs.append(states[0][1])
    _compare(module, want, inputs, torch_inputs, rng)


RNN_CASES = [
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2, "bias": False}),
    ("RNN", {"bidirectional": True, "batch_first": True}),
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"proj_size": 2, "batch_first": True}),
    ("LSTM", {"proj_size": 3, "num_layers": 2, "bidirectional": True, "bias": False}),
    ("GRU", {}),
    ("GRU", {"num_layers": 3, "batch_first": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True}),
]


@pytest.mark.parametrize("cls,kwargs", RNN_CASES)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_rnns_match_torch(cls: str, kwargs: dict, batched: bool, with_state: bool) -> None:
    torch.manual_seed(0)
    want = getattr(torch.nn, cls)(5, 4, **kwargs).double()
    module = getattr(nn, cls)(5, 4, **kwargs).double()
    _copy_from_torch(module, want)
    assert repr(module) == repr(want)
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in want.named_parameters()]
    rng = np.random.default_rng(2)
    length, batch = 6, 3
    if not batched:
        shape: tuple = (length, 5)
    elif kwargs.get("batch_first"):
        shape = (batch, length, 5)
    else:
        shape = (length, batch, 5)
    x, xt = _pair(torch, rng.standard_normal(shape))
    inputs, torch_inputs = [x], [xt]
    if with_state:
        layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
        mid = (batch,) if batched else ()
        h, ht = _pair(torch, rng.standard_normal((layers,) + mid + (kwargs.get("proj_size") or 4,)))
        if cls == "LSTM":
            c, ct = _pair(torch, rng.standard_normal((layers,) + mid + (4,)))
            inputs.append((h, c))
            torch_inputs.append((ht, ct))
        else:
            inputs.append(h)
            torch_inputs.append(ht)
    _compare(module, want, inputs, torch_inputs, rng)


def test_torch_state_dict_round_trip_and_init_bounds() -> None:
    fg.manual_seed(0)  # (the spread check below is statistical: ten values per small weight)
    module = nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2)
    bound = 1 / np.sqrt(5)
    for name, p in module.named_parameters():
        data = p.detach().numpy()
        assert np.abs(data).max() <= bound, name
        assert data.std() > bound / 4, name  # actually drawn, not constant
    want = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2)
    assert {k: tuple(v.shape) for k, v in module.state_dict().items()} == {
        k: tuple(v.shape) for k, v in want.state_dict().items()
    }
    want.load_state_dict({k: torch.tensor(v.numpy()) for k, v in module.state_dict().items()})
    assert len(module.all_weights) == 4 and len(module.all_weights[0]) == 5
    module.flatten_parameters()  # accepted, does nothing
    cell = nn.GRUCell(3, 7)
    assert cell.weight_ih.shape == (21, 3) and cell.weight_hh.shape == (21, 7)
    assert np.abs(cell.weight_hh.detach().numpy()).max() <= 1 / np.sqrt(7)


def test_dropout_between_layers_only_in_training() -> None:
    fg.manual_seed(0)
    module = nn.GRU(3, 4, num_layers=2, dropout=0.5).double()
    x = fg.randn(5, 2, 3, dtype=fg.float64)
    module.eval()
    a, b = module(x)[0].detach(), module(x)[0].detach()
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    module.train()
    c, _ = module(x)
    assert not np.allclose(c.detach().numpy(), a.numpy())
    # dropout touches only the second layer's input: a one-layer copy sees no change
    single = nn.GRU(3, 4, num_layers=1, dropout=0.0).double()
    single.load_state_dict({k: v for k, v in module.state_dict().items() if k.endswith("l0")})
    _, h_single = single(x)
    _, h_train = module(x)
    np.testing.assert_allclose(h_train[0].detach().numpy(), h_single[0].detach().numpy(), **TOL)


def test_single_layer_dropout_warns_as_torch() -> None:
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(3, 4, dropout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.LSTM(3, 4, num_layers=2, dropout=0.2)


ERROR_CASES = [
    (lambda m: m.RNN(3, 4, nonlinearity="sigmoid"), ValueError, "Unknown nonlinearity"),
    (lambda m: m.LSTM(3, 4, proj_size=4), ValueError, "proj_size has to be smaller"),
    (lambda m: m.LSTM(3, 4, proj_size=-1), ValueError, "positive integer or zero"),
    (lambda m: m.GRU(3, 4, dropout=1.5), ValueError, "dropout should be a number"),
    (lambda m: m.GRU(3, 0), ValueError, "hidden_size must be greater than zero"),
    (lambda m: m.GRU(3, 4, num_layers=0), ValueError, "num_layers must be greater than zero"),
    (lambda m: m.GRU(3, 4)(m.zeros(2, 2, 3, 1)), ValueError, "Expected input to be 2D or 3D"),
    (lambda m: m.GRU(3, 4)(m.zeros(2, 2, 5)), RuntimeError, "must be equal to input_size"),
    (
        lambda m: m.GRU(3, 4, 2)(m.zeros(5, 2, 3), m.zeros(1, 2, 4)),
        RuntimeError,
        r"Expected hidden size \(2, 2, 4\), got \[1, 2, 4\]",
    ),
    (
        lambda m: m.LSTM(3, 4)(m.zeros(5, 2, 3), (m.zeros(1, 2, 4), m.zeros(1, 3, 4))),
        RuntimeError,
        r"Expected hidden\[1\] size",
    ),
    (
        lambda m: m.RNN(3, 4)(m.zeros(5, 3), m.zeros(1, 2, 4)),
        RuntimeError,
        "For unbatched 2-D input, hx should also be 2-D",
    ),
    (lambda m: m.RNN(3, 4)(m.zeros(0, 2, 3)), RuntimeError, "sequence length"),
    (lambda m: m.RNNCell(3, 4)(m.zeros(2, 2, 3)), ValueError, "Expected input to be 1D or 2D"),
    (lambda m: m.GRUCell(3, 4)(m.zeros(2, 5)), RuntimeError, "inconsistent input_size"),
    (
        lambda m: m.RNNCell(3, 4)(m.zeros(2, 3), m.zeros(3, 4)),
        RuntimeError,
        "Input batch size 2 doesn't match hidden0 batch size 3",
    ),
    (
        lambda m: m.RNNCell(3, 4)(m.zeros(2, 3), m.zeros(2, 2)),
        RuntimeError,
        "hidden0 has inconsistent hidden_size: got 2, expected 4",
    ),
    (lambda m: m.LSTMCell(3, 4)(m.zeros(2, 3), (m.zeros(2, 4),)), RuntimeError, "two hidden"),
    (lambda m: m.RNNCell(3, 4, nonlinearity="x")(m.zeros(2, 3)), RuntimeError, "Unknown nonlin"),
]


@pytest.mark.parametrize("call,error,words", ERROR_CASES)
def test_errors_as_torch(call: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        call(_Lib(fg, nn))
    with pytest.raises(error, match=words):
        call(_Lib(torch, torch.nn))


class _Lib:
    """``m.zeros`` from the library, ``m.LSTM`` from its nn (one lambda drives both)."""

    def __init__(self, lib: Any, nn_module: Any) -> None:
        self.lib, self.nn = lib, nn_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.nn, name) if name[0].isupper() else getattr(self.lib, name)


def test_empty_batch_gives_empty_outputs() -> None:
    out, (h, c) = nn.LSTM(3, 4, num_layers=2)(fg.zeros(5, 0, 3))
    assert tuple(out.shape) == (5, 0, 4) and tuple(h.shape) == (2, 0, 4) == tuple(c.shape)


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_training_follows_torch(cls: str) -> None:
    """Five SGD steps of a 2-layer bidirectional recurrent regressor, from torch's weights."""
    torch.manual_seed(0)
    want_rnn = getattr(torch.nn, cls)(3, 6, num_layers=2, bidirectional=True).double()
    want_head = torch.nn.Linear(12, 1).double()
    rnn = getattr(nn, cls)(3, 6, num_layers=2, bidirectional=True).double()
    head = nn.Linear(12, 1).double()
    _copy_from_torch(rnn, want_rnn)
    _copy_from_torch(head, want_head)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((7, 4, 3)), rng.standard_normal((4, 1))
    params = list(rnn.parameters()) + list(head.parameters())
    want_params = list(want_rnn.parameters()) + list(want_head.parameters())
    opt = fg.optim.SGD(params, lr=0.1)
    want_opt = torch.optim.SGD(want_params, lr=0.1)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        want_opt.zero_grad()
        loss = ((head(rnn(fg.tensor(x))[0][-1]) - fg.tensor(y)) ** 2).mean()
        want_loss = ((want_head(want_rnn(torch.tensor(x))[0][-1]) - torch.tensor(y)) ** 2).mean()
        loss.backward()
        want_loss.backward()
        opt.step()
        want_opt.step()
        losses.append(loss.item())
        np.testing.assert_allclose(loss.item(), want_loss.item(), **TOL)
    assert losses[-1] < losses[0]
    for p, q in zip(params, want_params):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-11)
