"""nn.utils.rnn's packed sequences (PackedSequence, pack_padded_sequence, pad_packed_sequence,
pack_sequence, unpack_sequence, unpad_sequence) and nn.RNN/LSTM/GRU on packed input, against
torch in float64: the packed data, batch sizes and permutations, the padded results and
lengths, outputs and final states, and gradients of the padded input, the initial states and
every parameter; errors as torch's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import nn
from fusegrad.nn.utils import rnn as R

TOL = {"rtol": 1e-10, "atol": 1e-12}
torch: Any = None


@pytest.fixture(autouse=True)
def _bind_torch() -> None:
    global torch
    torch = pytest.importorskip("torch")


def _same(a: Any, b: Any) -> None:
    if b is None:
        assert a is None
        return
    np.testing.assert_allclose(np.asarray(a.detach().numpy()), b.detach().numpy(), **TOL)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_and_pad_match_torch(batch_first: bool, enforce_sorted: bool) -> None:
    lengths = [5, 3, 3, 1] if enforce_sorted else [3, 5, 1, 3]
    x = np.random.default_rng(0).standard_normal((4, 5, 2) if batch_first else (5, 4, 2))
    fx, tx = fg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    got = R.pack_padded_sequence(fx, lengths, batch_first, enforce_sorted)
    want = torch.nn.utils.rnn.pack_padded_sequence(tx, lengths, batch_first, enforce_sorted)
    assert isinstance(got, tuple) and got._fields == want._fields
    for a, b in zip(got, want):
        _same(a, b)
    padded, lens = R.pad_packed_sequence(got, batch_first, padding_value=-2.0, total_length=6)
    t_padded, t_lens = torch.nn.utils.rnn.pad_packed_sequence(
        want, batch_first, padding_value=-2.0, total_length=6
    )
    _same(padded, t_padded)
    assert lens.tolist() == t_lens.tolist() and lens.dtype == fg.int64
    g = np.random.default_rng(1).standard_normal(tuple(t_padded.shape))
    padded.backward(fg.tensor(g))
    t_padded.backward(torch.tensor(g))
    _same(fx.grad, tx.grad)


def test_pack_sequence_unpack_and_unpad() -> None:
    rng = np.random.default_rng(2)
    seqs = [rng.standard_normal((n, 3)) for n in (2, 4, 1)]
    got = R.pack_sequence([fg.tensor(s) for s in seqs], enforce_sorted=False)
    want = torch.nn.utils.rnn.pack_sequence([torch.tensor(s) for s in seqs], enforce_sorted=False)
    for a, b in zip(got, want):
        _same(a, b)
    for a, s in zip(R.unpack_sequence(got), seqs):
        np.testing.assert_array_equal(a.numpy(), s)
    padded = R.pad_sequence([fg.tensor(s) for s in seqs])
    for a, s in zip(R.unpad_sequence(padded, fg.tensor([2, 4, 1])), seqs):
        np.testing.assert_array_equal(a.numpy(), s)
    assert got.double().data.dtype == fg.float64 and not got.is_cuda
    assert got.to(fg.float32).data.dtype == fg.float32


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda R, x: R.pack_padded_sequence(x, [2, 4, 3]), "sorted in decreasing order"),
        (lambda R, x: R.pack_padded_sequence(x, [4, 0, 3], enforce_sorted=False), "> 0|<= 0"),
        (lambda R, x: R.pack_padded_sequence(x, [4, 2, 3], batch_first=True), "batch_size"),
        (
            lambda R, x: R.pad_packed_sequence(
                R.pack_padded_sequence(x, [4, 3, 2]), total_length=2
            ),
            "total_length",
        ),
    ],
)
def test_errors_as_torch(call: Any, words: str) -> None:
    with pytest.raises((RuntimeError, ValueError), match=words):
        call(R, fg.zeros(4, 3, 1))
    with pytest.raises((RuntimeError, ValueError), match=words):
        call(torch.nn.utils.rnn, torch.zeros(4, 3, 1))


CASES = [
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"proj_size": 2, "batch_first": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("RNN", {"nonlinearity": "relu", "bidirectional": True}),
]


@pytest.mark.parametrize("cls,kwargs", CASES)
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_layers_on_packed_input_match_torch(
    cls: str, kwargs: dict, with_state: bool
) -> None:
    torch.manual_seed(0)
    want = getattr(torch.nn, cls)(3, 4, **kwargs).double()
    module = getattr(nn, cls)(3, 4, **kwargs).double()
    module.load_state_dict({k: fg.tensor(v.numpy()) for k, v in want.state_dict().items()})
    first = kwargs.get("batch_first", False)
    rng = np.random.default_rng(3)
    lengths = [3, 5, 1, 4]
    x = rng.standard_normal((4, 5, 3) if first else (5, 4, 3))
    fx, tx = fg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    f_in = R.pack_padded_sequence(fx, lengths, first, enforce_sorted=False)
    t_in = torch.nn.utils.rnn.pack_padded_sequence(tx, lengths, first, enforce_sorted=False)
    f_state, t_state = [], []
    if with_state:
        layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
        sizes = [kwargs.get("proj_size") or 4] + ([4] if cls == "LSTM" else [])
        for size in sizes:
            s = rng.standard_normal((layers, 4, size))
            f_state.append(fg.tensor(s, requires_grad=True))
            t_state.append(torch.tensor(s, requires_grad=True))
    f_hx = (tuple(f_state) if cls == "LSTM" else f_state[0]) if with_state else None
    t_hx = (tuple(t_state) if cls == "LSTM" else t_state[0]) if with_state else None
    f_out, f_h = module(f_in, f_hx)
    t_out, t_h = want(t_in, t_hx)
    assert isinstance(f_out, R.PackedSequence)
    for a, b in zip(f_out, t_out):
        _same(a, b)
    f_states = list(f_h) if cls == "LSTM" else [f_h]
    t_states = list(t_h) if cls == "LSTM" else [t_h]
    for a, b in zip(f_states, t_states):
        _same(a, b)
    f_pad, _ = R.pad_packed_sequence(f_out, first)
    t_pad, _ = torch.nn.utils.rnn.pad_packed_sequence(t_out, first)
    g = rng.standard_normal(tuple(t_pad.shape))
    gh = [rng.standard_normal(tuple(s.shape)) for s in t_states]
    f_loss = (f_pad * fg.tensor(g)).sum() + sum(
        (s * fg.tensor(w)).sum() for s, w in zip(f_states, gh)
    )
    t_loss = (t_pad * torch.tensor(g)).sum() + sum(
        (s * torch.tensor(w)).sum() for s, w in zip(t_states, gh)
    )
    f_loss.backward()
    t_loss.backward()
    _same(fx.grad, tx.grad)
    for a, b in zip(f_state, t_state):
        _same(a.grad, b.grad)
    params = dict(module.named_parameters())
    for name, p in want.named_parameters():
        _same(params[name].grad, p.grad)
