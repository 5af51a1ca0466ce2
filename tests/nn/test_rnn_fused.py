"""nn.LSTM / nn.GRU / nn.RNN on their fused kernels (``rnn_sequence``, ``ops/recurrent.py``):
the same outputs and gradients as the per-step ops (``nn.rnn.fused_kernels(False)``) and as
PyTorch, over layers, directions, ``batch_first``, unbatched input, dropout, given initial
states, ``proj_size`` and both float dtypes; gradcheck of the op in float64; double backward;
which calls take which path."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import nn
from fusegrad.autograd import gradcheck, gradgradcheck, tracer
from fusegrad.nn.rnn import fused_kernels
from fusegrad.ops.recurrent import rnn_layer, rnn_sequence

MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class _Primitives(tracer.Tracer):
    """Records the names of the primitives that run (letting each run as usual)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def apply(self, prim, inputs, attrs):  # type: ignore[no-untyped-def]
        self.seen.add(prim.name)
        return NotImplemented


def _module(cls: str, dtype: str, **kw: Any) -> nn.Module:
    fg.manual_seed(0)
    if cls.startswith("RNN_"):
        kw["nonlinearity"] = cls[4:].lower()
        cls = "RNN"
    return getattr(nn, cls)(3, 5, **kw).to(getattr(fg, dtype))


def _run(model: nn.Module, x: np.ndarray, hx: Any, fused: bool, dtype: str) -> tuple:
    """(outputs, input gradient, parameter gradients) of one forward and backward."""
    model.zero_grad()
    xt = fg.tensor(x.astype(dtype), requires_grad=True)
    h = None
    if hx is not None:
        h = tuple(fg.tensor(a.astype(dtype), requires_grad=True) for a in hx)
    with fused_kernels(fused):
        fg.manual_seed(7)  # the same dropout draws on both paths
        out, state = model(xt, None if h is None else (h if len(h) == 2 else h[0]))
    states = state if isinstance(state, tuple) else (state,)
    weights = fg.tensor(np.linspace(-1, 1, out.numel()).reshape(tuple(out.shape)).astype(dtype))
    loss = (out * weights).sum() + sum((s * s).sum() for s in states)
    loss.backward()
    grads = [xt.grad.numpy()] + ([] if h is None else [a.grad.numpy() for a in h])
    params = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    return [out.detach().numpy()] + [s.detach().numpy() for s in states], grads, params


CONFIGS = [
    pytest.param({}, (6, 4, 3), "", id="one_layer"),
    pytest.param({"num_layers": 2}, (6, 4, 3), "", id="two_layers"),
    pytest.param({"bidirectional": True}, (6, 4, 3), "", id="bidirectional"),
    pytest.param({"num_layers": 2, "bidirectional": True}, (5, 2, 3), "h0", id="deep_bidir_h0"),
    pytest.param({"batch_first": True, "num_layers": 2}, (4, 6, 3), "", id="batch_first"),
    pytest.param({"num_layers": 2, "bidirectional": True}, (6, 3), "h0", id="unbatched"),
    pytest.param({"num_layers": 2, "dropout": 0.4}, (6, 4, 3), "", id="dropout"),
    pytest.param({"bias": False}, (6, 4, 3), "", id="no_bias"),
    pytest.param(
        {"proj_size": 2, "num_layers": 2, "bidirectional": True}, (5, 2, 3), "h0", id="proj"
    ),
]


def _states(cls: str, kw: dict, shape: tuple, rng: np.random.Generator) -> Any:
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    batch = () if len(shape) == 2 else (shape[0] if kw.get("batch_first") else shape[1],)
    h0 = rng.standard_normal((layers,) + batch + (kw.get("proj_size") or 5,))
    if cls != "LSTM":
        return (h0,)
    return (h0, rng.standard_normal((layers,) + batch + (5,)))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls", MODES)
@pytest.mark.parametrize("kw,shape,extra", CONFIGS)
def test_fused_matches_per_step_ops(
    cls: str, kw: dict, shape: tuple, extra: str, dtype: str
) -> None:
    if kw.get("proj_size") and cls != "LSTM":
        pytest.skip("proj_size is the LSTM's")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    hx = _states(cls, kw, shape, rng) if extra == "h0" else None
    model = _module(cls, dtype, **kw)
    fused = _run(model, x, hx, True, dtype)
    loop = _run(model, x, hx, False, dtype)
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (2e-5, 2e-5)
    for a, b in zip(fused[0] + fused[1], loop[0] + loop[1]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    for name, g in fused[2].items():
        np.testing.assert_allclose(g, loop[2][name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("cls", MODES)
@pytest.mark.parametrize("kw,shape,extra", CONFIGS)
def test_fused_matches_torch(cls: str, kw: dict, shape: tuple, extra: str) -> None:
    torch = pytest.importorskip("torch")
    if kw.get("dropout"):
        pytest.skip("dropout draws differ between the libraries")
    if kw.get("proj_size") and cls != "LSTM":
        pytest.skip("proj_size is the LSTM's")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape)
    hx = _states(cls, kw, shape, rng) if extra == "h0" else None
    model = _module(cls, "float64", **kw)
    outs, grads, params = _run(model, x, hx, True, "float64")
    tkw = dict(kw)
    name = cls
    if cls.startswith("RNN_"):
        tkw["nonlinearity"] = cls[4:].lower()
        name = "RNN"
    tmodel = getattr(torch.nn, name)(3, 5, **tkw).double()
    tmodel.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    tx = torch.tensor(x, requires_grad=True)
    th = None if hx is None else tuple(torch.tensor(a, requires_grad=True) for a in hx)
    tout, tstate = tmodel(tx, None if th is None else (th if len(th) == 2 else th[0]))
    tstates = tstate if isinstance(tstate, tuple) else (tstate,)
    weights = torch.tensor(np.linspace(-1, 1, tout.numel()).reshape(tuple(tout.shape)))
    loss = (tout * weights).sum() + sum((s * s).sum() for s in tstates)
    loss.backward()
    for a, b in zip(outs, [tout] + list(tstates)):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-9, atol=1e-12)
    tgrads = [tx.grad.numpy()] + ([] if th is None else [a.grad.numpy() for a in th])
    for a, b in zip(grads, tgrads):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    for k, p in tmodel.named_parameters():
        np.testing.assert_allclose(params[k], p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


def _layer_inputs(mode: str, bias: bool, rng: np.random.Generator) -> list:
    size = GATES[mode] * 3
    shapes = [(4, 2, 3), (size, 3), (size, 3), (2, 3), (2, 3), (size,), (size,)]
    arrays = [fg.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in shapes]
    if mode != "LSTM":
        arrays[4] = None
    if not bias:
        arrays[5] = arrays[6] = None
    return arrays


def _layer_fn(mode: str, reverse: bool, inputs: list) -> tuple[list, Any]:
    """The leaves that require grad, and a function of them running one layer."""
    leaves = [t for t in inputs if t is not None]

    def fn(*values: Any) -> tuple:
        it = iter(values)
        x, w_ih, w_hh, h0, c0, b_ih, b_hh = (None if t is None else next(it) for t in inputs)
        out, h_n, c_n = rnn_layer(mode, x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse)
        return (out, h_n) + (() if c_n is None else (c_n,))

    return leaves, fn


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_of_the_fused_layer(mode: str, reverse: bool) -> None:
    """Every input's gradient (x, the weights, the biases, h0, c0) against finite differences
    in float64; and second order (the rule's op-surface form under create_graph)."""
    rng = np.random.default_rng(11)
    leaves, fn = _layer_fn(mode, reverse, _layer_inputs(mode, True, rng))
    assert gradcheck(fn, leaves)
    if mode != "RNN_RELU":  # (relu's second derivative is zero almost everywhere)
        assert gradgradcheck(fn, leaves)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_of_the_fused_layer_with_a_projection(reverse: bool) -> None:
    """An LSTM layer with proj_size: h = (o tanh c) W_hr^T; every input's gradient, W_hr's
    included, and second order."""
    rng = np.random.default_rng(13)
    shapes = [(4, 2, 3), (12, 3), (12, 2), (2, 2), (2, 3), (12,), (12,), (2, 3)]
    ts = [fg.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in shapes]

    def fn(x, w_ih, w_hh, h0, c0, b_ih, b_hh, w_hr):  # type: ignore[no-untyped-def]
        out, h_n, c_n = rnn_layer("LSTM", x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse, w_hr)
        return out, h_n, c_n

    assert gradcheck(fn, ts)
    assert gradgradcheck(fn, ts)


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_of_every_packed_column(mode: str) -> None:
    """The primitive's packed output, the saved gates included, is differentiable as a whole
    (the double-backward form relies on it)."""
    rng = np.random.default_rng(12)
    size = GATES[mode] * 2
    shapes = [(3, 2, size), (size, 2), (2, 2), (2, 2), (size,)]
    ts = [fg.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in shapes]
    if mode != "LSTM":
        ts = ts[:3] + ts[4:]

    def fn(*a: Any) -> Any:
        c0 = a[3] if mode == "LSTM" else None
        return rnn_sequence(mode, a[0], a[1], a[2], c0, a[-1], True)

    assert gradcheck(fn, ts)


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_double_backward_through_a_module(cls: str) -> None:
    """A gradient penalty (create_graph) through a 2-layer bidirectional module equals the
    per-step ops' gradients."""
    model = _module(cls, "float64", num_layers=2, bidirectional=True)
    x = np.random.default_rng(2).standard_normal((4, 2, 3))
    results = []
    for fused in (True, False):
        model.zero_grad()
        xt = fg.tensor(x, requires_grad=True)
        with fused_kernels(fused):
            out = model(xt)[0]
        (gx,) = fg.autograd.grad((out**2).sum(), xt, create_graph=True)
        (gx**2).sum().backward()
        results.append([p.grad.numpy().copy() for p in model.parameters()])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_which_path_runs() -> None:
    """CPU float tensors run the kernel (proj_size and packed sequences too); the cells and
    CPU float16 run the per-step ops (no rnn_sequence)."""
    x = fg.randn(5, 2, 3)

    def primitives(call: Any) -> set[str]:
        rec = _Primitives()
        with tracer.tracing(rec):
            call()
        return rec.seen

    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    assert "rnn_sequence" in primitives(lambda: lstm(x))
    with fused_kernels(False):
        assert "rnn_sequence" not in primitives(lambda: lstm(x))
    assert "rnn_sequence" in primitives(lambda: lstm(x))  # (switched back on after the block)
    packed = nn.utils.rnn.pack_padded_sequence(x, [5, 3])
    assert "rnn_sequence" in primitives(lambda: lstm(packed))
    half = copy.deepcopy(lstm).half()
    assert "rnn_sequence" not in primitives(lambda: half(x.half()))
    assert "rnn_sequence" in primitives(lambda: nn.LSTM(3, 4, proj_size=2)(x))
    assert "rnn_sequence" not in primitives(lambda: nn.LSTMCell(3, 4)(x[0]))
    gru = copy.deepcopy(nn.GRU(3, 4)).double()
    assert "rnn_sequence" in primitives(lambda: gru(x.double()))


def test_kernel_names_op_shapes_and_dtypes_on_mixed_dtypes() -> None:
    from fusegrad.ops.registry import REGISTRY

    kernel = REGISTRY["rnn_sequence"].kernel
    x_gates = np.zeros((2, 1, 8), np.float32)
    w_hh = np.zeros((8, 2), np.float64)
    h0 = np.zeros((1, 2), np.float32)
    with pytest.raises(TypeError, match=r"rnn_sequence \(LSTM\).*w_hh \(8, 2\) float64"):
        kernel(
            x_gates,
            w_hh,
            h0,
            h0,
            mode="LSTM",
            reverse=False,
            bias=False,
            input_bias=False,
            proj=False,
            batch_sizes=None,
        )


def _packed_run(model: nn.Module, data: np.ndarray, lengths: list, hx: Any, fused: bool) -> list:
    """Outputs and gradients (input, initial states, parameters) of a packed forward and
    backward; the lengths unsorted, so that the states are permuted on the way in and out."""
    from fusegrad.nn.utils import rnn as R

    model.zero_grad()
    x = fg.tensor(data, requires_grad=True)
    h = None if hx is None else tuple(fg.tensor(a, requires_grad=True) for a in hx)
    with fused_kernels(fused):
        packed = R.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, state = model(packed, None if h is None else (h if len(h) == 2 else h[0]))
    padded, _ = R.pad_packed_sequence(out)
    states = state if isinstance(state, tuple) else (state,)
    weights = fg.tensor(np.linspace(-1, 1, padded.numel()).reshape(tuple(padded.shape)))
    ((padded * weights).sum() + sum((s * s * s).sum() for s in states)).backward()
    got = [padded.detach().numpy()] + [s.detach().numpy() for s in states] + [x.grad.numpy()]
    got += [] if h is None else [a.grad.numpy() for a in h]
    return got + [p.grad.numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("cls", MODES)
@pytest.mark.parametrize("with_state", [False, True])
def test_packed_sequences_run_fused_and_match_per_step_ops(cls: str, with_state: bool) -> None:
    kw: dict = {"num_layers": 2, "bidirectional": True}
    if cls == "LSTM" and with_state:
        kw["proj_size"] = 2
    model = _module(cls, "float64", **kw)
    rng = np.random.default_rng(8)
    data = rng.standard_normal((6, 4, 3))
    lengths = [3, 6, 1, 4]
    hx = _states(cls, kw, data.shape, rng) if with_state else None
    fused = _packed_run(model, data, lengths, hx, True)
    loop = _packed_run(model, data, lengths, hx, False)
    for a, b in zip(fused, loop):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_packed_sequence_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    from torch.nn.utils import rnn as TR

    model = _module("LSTM", "float64", num_layers=2, bidirectional=True)
    rng = np.random.default_rng(9)
    data = rng.standard_normal((5, 3, 3))
    lengths = [2, 5, 4]
    got = _packed_run(model, data, lengths, None, True)
    tmodel = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True).double()
    tmodel.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()})
    x = torch.tensor(data, requires_grad=True)
    out, (h, c) = tmodel(TR.pack_padded_sequence(x, lengths, enforce_sorted=False))
    padded, _ = TR.pad_packed_sequence(out)
    weights = torch.tensor(np.linspace(-1, 1, padded.numel()).reshape(tuple(padded.shape)))
    ((padded * weights).sum() + (h**3).sum() + (c**3).sum()).backward()
    want = [padded, h, c, x.grad] + [p.grad for p in tmodel.parameters()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_gradcheck_of_a_packed_layer(mode: str, reverse: bool) -> None:
    """Packed rows (batch sizes 3, 3, 2, 1): every input's gradient and second order."""
    rng = np.random.default_rng(14)
    sizes = (3, 3, 2, 1)
    gates = GATES[mode] * 2
    shapes = [(sum(sizes), 2), (gates, 2), (gates, 2), (3, 2), (3, 2), (gates,), (gates,)]
    ts = [fg.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in shapes]
    if mode != "LSTM":
        ts = ts[:4] + ts[5:]

    def fn(*a: Any) -> tuple:
        c0 = a[4] if mode == "LSTM" else None
        b_ih, b_hh = a[-2], a[-1]
        out, h_n, c_n = rnn_layer(
            mode, a[0], a[1], a[2], b_ih, b_hh, a[3], c0, reverse, None, sizes
        )
        return (out, h_n) + (() if c_n is None else (c_n,))

    assert gradcheck(fn, ts)
    assert gradgradcheck(fn, ts)


@pytest.mark.parametrize("with_b_hh", [True, False], ids=["b_hh", "no_b_hh"])
@pytest.mark.parametrize("mode", MODES)
def test_input_bias_added_in_the_kernel(mode: str, with_b_hh: bool) -> None:
    """``b_ih`` given to the primitive (as ``rnn_layer`` does) is the same as added to
    ``x_gates`` beforehand (values, and the gradients of every input with it), and its
    gradient passes gradcheck, also under create_graph (gradgradcheck)."""
    rng = np.random.default_rng(13)
    size = GATES[mode] * 2
    shapes = [(3, 2, size), (size, 2), (2, 2), (2, 2), (size,), (size,)]
    arrays = [rng.uniform(-1, 1, s) for s in shapes]
    weights = None  # (of the output in the loss: drawn once the output's size is known)

    def run(a: list, fused_bias: bool) -> Any:
        c0 = a[3] if mode == "LSTM" else None
        b_hh = a[4] if with_b_hh else None
        if fused_bias:
            return rnn_sequence(mode, a[0], a[1], a[2], c0, b_hh, False, b_ih=a[5])
        return rnn_sequence(mode, a[0] + a[5], a[1], a[2], c0, b_hh, False)

    results = []
    for fused_bias in (True, False):
        ts = [fg.tensor(v, requires_grad=True) for v in arrays]
        out = run(ts, fused_bias)
        weights = rng.uniform(-1, 1, out.shape) if weights is None else weights
        (out * fg.tensor(weights)).sum().backward()
        used = [0, 1, 2, 5] + ([3] if mode == "LSTM" else []) + ([4] if with_b_hh else [])
        results.append([out.detach().numpy()] + [ts[k].grad.numpy() for k in used])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    ts = [fg.tensor(v, requires_grad=True) for v in arrays]
    assert gradcheck(lambda *a: run(list(a), True), ts)
    assert gradgradcheck(lambda *a: run(list(a), True), ts)
