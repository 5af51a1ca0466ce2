"""The recurrent layers' CUDA kernels (``cuda/recurrent.py``: ``rnn_sequence``,
``rnn_sequence_backward``) in numba's simulator: nn.LSTM (with a projection, two bidirectional
layers), nn.GRU and nn.RNN (tanh, relu), padded and packed sequences, given initial states,
float64 and float32, give the CPU kernels' outputs, final states and gradients (input, initial
states, every weight and bias); the kernels ran on the device, not the per-step ops; double
backward (the rule's composite) on the device; a compiled backward on the device calls them as
externs."""

from __future__ import annotations

import modes
import numpy as np
import pytest
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
from fusegrad import nn
from fusegrad.autograd import tracer
from fusegrad.nn.utils.rnn import pack_padded_sequence

modes.require_device()


# (layer, keyword arguments, packed)
_CASES = [
    ("LSTM", {}, False),
    ("LSTM", {"proj_size": 2}, True),
    ("LSTM", {"num_layers": 2, "bidirectional": True}, True),
    ("GRU", {}, True),
    ("GRU", {"bidirectional": True, "batch_first": True}, False),
    ("RNN", {}, False),
    ("RNN", {"nonlinearity": "relu"}, True),
]


def _run(case: tuple, dtype: str, device: str) -> tuple:
    name, kwargs, packed = case
    rng = np.random.default_rng(len(kwargs))
    fg.manual_seed(0)
    layer = getattr(nn, name)(4, 3, **kwargs).to(dtype=getattr(fg, dtype)).to(device)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    size = kwargs.get("proj_size", 3)
    x = fg.tensor(rng.standard_normal((4, 3, 4)).astype(dtype), device=device, requires_grad=True)
    batch = 4 if kwargs.get("batch_first") else 3
    h0 = fg.tensor(
        rng.standard_normal((layers, batch, size)).astype(dtype), device=device, requires_grad=True
    )
    states: list = [h0]
    if name == "LSTM":
        c0 = rng.standard_normal((layers, batch, 3)).astype(dtype)
        states.append(fg.tensor(c0, device=device, requires_grad=True))
    inp = (
        pack_padded_sequence(x, [4, 3, 1], batch_first=kwargs.get("batch_first", False))
        if packed
        else x
    )
    rec = _Recorder()
    with tracer.tracing(rec):
        out, state = layer(inp, tuple(states) if name == "LSTM" else h0)
        values = out.data if packed else out
        finals = state if isinstance(state, tuple) else (state,)
        weights = fg.tensor(rng.standard_normal(values.shape).astype(dtype), device=device)
        loss = (values * weights).sum() + sum((f * f).sum() for f in finals)
        loss.backward()
    leaves = [x, *states, *layer.parameters()]
    got = [values.detach(), *(f.detach() for f in finals)] + [t.grad for t in leaves]
    return [t.cpu().numpy() for t in got], rec.names


@pytest.mark.parametrize(
    ("case", "dtype"),
    [(c, "float64") for c in _CASES] + [(_CASES[i], "float32") for i in (1, 3)],
    ids=lambda v: f"{v[0]}{'-packed' if v[2] else ''}{v[1]}" if isinstance(v, tuple) else v,
)
def test_matches_the_cpu_kernels(case: tuple, dtype: str) -> None:
    want, _ = _run(case, dtype, "cpu")
    got, names = _run(case, dtype, "cuda")
    assert {"rnn_sequence", "rnn_sequence_backward"} <= names, names
    tol = {"rtol": 1e-11, "atol": 1e-12} if dtype == "float64" else {"rtol": 1e-4, "atol": 1e-5}
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, **tol)


def test_double_backward_on_the_device() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 2, 2))
    results = []
    for device in ("cpu", "cuda"):
        fg.manual_seed(1)
        layer = nn.GRU(2, 2).to(dtype=fg.float64).to(device)
        xt = fg.tensor(x, device=device, requires_grad=True)
        out, _ = layer(xt)
        (gx,) = fg.autograd.grad((out * out * out).sum(), xt, create_graph=True)
        (gg,) = fg.autograd.grad((gx * gx).sum(), xt)
        results.append(gg.cpu().numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-10, atol=1e-12)


def test_compiled_backward_runs_the_kernel_as_an_extern() -> None:
    """A compiled backward on the device (``compiled_autograd``) calls
    ``rnn_sequence_backward`` as an extern and gives eager CUDA's gradients."""
    from fusegrad import compiler

    x = np.random.default_rng(4).standard_normal((3, 2, 2))

    def run(compiled: bool) -> list:
        fg.manual_seed(2)
        layer = nn.LSTM(2, 3).to(dtype=fg.float64).to("cuda")
        xt = fg.tensor(x, device="cuda", requires_grad=True)
        out, (h, c) = layer(xt)
        loss = (out * out).sum() + (c * h).sum()
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        return [t.grad.cpu().numpy() for t in (xt, *layer.parameters())]

    want = run(False)
    compiler.reset()
    got = run(True)
    assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 1
    assert not compiler.counters.fallbacks
    (program,) = compiler.cached_programs()
    assert "rnn_sequence_backward" in {str(v.op) for v in program.externs}
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
