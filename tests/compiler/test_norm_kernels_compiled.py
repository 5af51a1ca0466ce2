"""The normalisation, embedding and interpolate kernels (``ops/norms.py``, ``ops/resample.py``,
``embedding``) with the compilers: eager calls run the fused kernels, compiled programs the
composites (``Tracer.prefers_composites``), and the two agree -- a whole training step
(``compile(step)``), a compiled module (``compile(model)``), and a backward compiled by
``compiled_autograd()`` of a forward that ran eagerly (the rules' kernels then run as externs
of the captured program).  Values and gradients, with the recordings and captures counted.
(Compiles run in the foreground: tests/conftest.py sets FUSEGRAD_BACKGROUND_COMPILE=0.)"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class _Net(nn.Module):
    """Every fused layer once: embedding, layer norm, batch norm (running statistics), group
    norm, instance norm, bilinear upsampling."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8, padding_idx=0)
        self.ln = nn.LayerNorm(8)
        self.bn = nn.BatchNorm2d(2, momentum=None)
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(4, affine=True, track_running_stats=True)
        self.conv = nn.Conv2d(2, 4, 1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, tokens: fg.Tensor) -> fg.Tensor:
        h = self.ln(self.embed(tokens))  # (N, 8, 8)
        h = h.reshape(tokens.shape[0], 2, 4, 8).transpose(2, 3)  # (N, 2, 8, 4)
        h = self.bn(h)
        h = self.gn(self.conv(h))
        h = self.inorm(h).tanh()
        h = self.up(h)[:, :, ::2, ::1]  # (N, 4, 8, 8)
        return self.head(h.reshape(tokens.shape[0], -1))


def _batches(count: int) -> list:
    rng = np.random.default_rng(3)
    return [(rng.integers(0, 10, (4, 8)), rng.integers(0, 3, 4)) for _ in range(count)]


def _make_step(model: nn.Module) -> Callable:
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(tokens: fg.Tensor, target: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens), target)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def test_training_step_compiles_and_matches_eager() -> None:
    fg.manual_seed(0)
    eager = _Net().double()
    comp = copy.deepcopy(eager)
    losses = []
    for step in (_make_step(eager), fg.compile(_make_step(comp))):
        losses.append([step(fg.tensor(t), fg.tensor(y)).item() for t, y in _batches(5)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(comp.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), 1e-8, 1e-10, name)
    for (name, b), c in zip(comp.named_buffers(), eager.buffers()):
        np.testing.assert_allclose(b.numpy(), c.numpy(), 1e-9, 1e-12, err_msg=name)
    counters = compiler.counters
    assert not counters.step_breaks, counters.step_breaks
    assert counters.step_runs >= 3, counters  # replays of one recording


def test_compiled_module_matches_eager() -> None:
    fg.manual_seed(1)
    eager = _Net().double()
    comp = fg.compile(copy.deepcopy(eager))
    for tokens, _ in _batches(3):
        outs = []
        for model in (eager, comp):
            model.zero_grad()
            out = model(fg.tensor(tokens))
            (out * out).sum().backward()
            outs.append([out.detach().numpy()] + [p.grad.numpy() for p in model.parameters()])
        for a, b in zip(*outs):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_backward_of_an_eager_forward_runs_the_kernels(dtype: str) -> None:
    """The forward runs eagerly (fused kernels); ``compiled_autograd()`` captures the rules,
    whose backward kernels are externs of the program: eager's gradients, one capture."""
    fg.manual_seed(2)
    model = _Net().to(getattr(fg, dtype))
    tokens = fg.tensor(_batches(1)[0][0])

    def grads(compiled: bool) -> list:
        model.zero_grad()
        out = model(tokens)
        loss = (out * out).sum()
        if compiled:
            with compiler.compiled_autograd():
                loss.backward()
        else:
            loss.backward()
        return [p.grad.numpy().copy() for p in model.parameters()]

    want = grads(False)  # (training mode: the batch's statistics, whatever the running ones)
    for _ in range(3):
        got = grads(True)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5 if dtype == "float32" else 1e-10, atol=1e-6)
    assert compiler.counters.captures == 1, compiler.counters
    assert compiler.counters.compiled_runs == 3, compiler.counters
    assert not compiler.counters.fallbacks, compiler.counters


def test_compiled_backward_serves_other_batch_sizes() -> None:
    """The kernels' sizes are not attributes: one capture of the backward (norm_backward,
    embedding_backward, resample_backward as externs) serves every batch size: the statistics
    are shaped (N, groups), of the input's sizes.  (Batch sizes chosen so that none equals
    another size of the graph -- 2 groups, 4 channels, 5, 10 -- which the key tells apart.)"""
    fg.manual_seed(3)
    embed, norm = nn.Embedding(11, 5), nn.GroupNorm(2, 4)
    up = nn.Upsample(scale_factor=2)
    rng = np.random.default_rng(4)
    for batch in (3, 7, 9):
        tokens = fg.tensor(rng.integers(0, 11, (batch, 4)))
        grads = []
        for compiled in (False, True):
            for p in (*embed.parameters(), *norm.parameters()):
                p.grad = None
            h = embed(tokens)  # (N, C=4, L=5)
            out = up(norm(h)).tanh().sum()
            if compiled:
                with compiler.compiled_autograd():
                    out.backward()
            else:
                out.backward()
            grads.append([p.grad.numpy().copy() for p in (*embed.parameters(), *norm.parameters())])
        for a, b in zip(*grads):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert compiler.counters.captures == 1, compiler.counters
    assert compiler.counters.compiled_runs == 3, compiler.counters


@pytest.mark.parametrize("layer", ["layer", "batch", "group"])
def test_only_the_bias_needs_a_gradient_under_compiled_autograd(layer: str) -> None:
    """The input is not saved when only the bias needs a gradient (the fuzzer's seed 168 crashed
    the composite backward a capture takes): the bias's gradient alone, eager's."""
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((4, 6, 3)).astype(np.float32))
    make = {
        "layer": lambda: nn.LayerNorm(3),
        "batch": lambda: nn.BatchNorm1d(6),
        "group": lambda: nn.GroupNorm(2, 6),
    }[layer]
    grads = []
    for compiled in (False, True):
        fg.manual_seed(0)
        m = make()
        m.weight.requires_grad_(False)
        if compiled:
            with compiler.compiled_autograd():
                (m(x) * 2.0).square().sum().backward()
        else:
            (m(x) * 2.0).square().sum().backward()
        grads.append(m.bias.grad.numpy().copy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-6)


# rows of (x, g) for a layer norm over one element: finite, signed zeros, infinities, NaN
_ONE_ELEMENT_X = [0.4034, -3.0, -0.0, 0.0, 1e30, np.inf, -np.inf, np.nan]
_ONE_ELEMENT_G = [-0.134, 2.5, -0.0, np.inf, np.nan]


@pytest.mark.parametrize("native", [False, True], ids=["steps", "native"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_layer_norm_over_one_element_has_eagers_exact_zero_gradient_compiled(
    dtype: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer norm over one element is constant: its input's gradient is exactly +0 (NaN
    where ``x`` or ``g`` is not finite), as eager's fused kernels and PyTorch give it.  The
    compiled composite took ``gs rstd - rstd mean(gs)``, contracted into an FMA in generated
    code: the product's rounding error (1e-14 float64, 1e-6 float32; native fuzz seeds 3000330,
    3005088, 3005370, 1009234, 1000892, where later ops amplified it).  Forward values too,
    bit for bit (signed zeros included)."""
    monkeypatch.setattr(compiler.config, "native_programs", native)
    pairs = [(x, g) for x in _ONE_ELEMENT_X for g in _ONE_ELEMENT_G]
    x_rows = np.array([[x] for x, _ in pairs], dtype=dtype)
    g_rows = np.array([[g] for _, g in pairs], dtype=dtype)

    def step(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor, g: fg.Tensor) -> fg.Tensor:
        y = nn.functional.layer_norm((x * 2.0) * 0.5, (1,), w, b)  # (history, exact)
        y.backward(g)
        return y.detach()

    results = []
    for fn in (step, fg.compile(step)):
        for _ in range(3):  # (compiled: recorded, then replayed)
            x = fg.tensor(x_rows, requires_grad=True)
            w = fg.tensor(np.array([0.7], dtype=dtype), requires_grad=True)
            b = fg.tensor(np.array([0.2], dtype=dtype), requires_grad=True)
            y = fn(x, w, b, fg.tensor(g_rows))
        results.append((y.numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()))
    finite = np.isfinite(x_rows) & np.isfinite(g_rows)
    eager_gx = results[0][1]
    assert not eager_gx[finite].any()
    assert np.isnan(eager_gx[~finite]).all()
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)
        zeros = want == 0
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    assert compiler.counters.step_runs == 2 and not compiler.counters.step_breaks
    assert (compiler.counters.native_runs > 0) == native, compiler.counters


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_layer_norm_over_one_element_has_eagers_exact_zero_gradient_under_compiled_autograd(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backward of an eager layer norm over one element, captured by compiled autograd
    (the rule's composite, ``ops.norms.norm_grads``) and run as generated code: eager's exact
    +0, NaN where ``x`` or ``g`` is not finite (fuzz seed 1005180: 1.8e-14 in float64)."""
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 0)  # (generated code)
    pairs = [(x, g) for x in _ONE_ELEMENT_X for g in _ONE_ELEMENT_G]
    x_rows = np.array([[x] for x, _ in pairs], dtype=dtype)
    g_rows = fg.tensor(np.array([[g] for _, g in pairs], dtype=dtype))
    results = []
    for compiled in (False, True, True):
        x = fg.tensor(x_rows, requires_grad=True)
        w = fg.tensor(np.array([0.7], dtype=dtype), requires_grad=True)
        y = nn.functional.layer_norm(x, (1,), w)
        if compiled:
            with compiler.compiled_autograd():
                y.backward(g_rows)
        else:
            y.backward(g_rows)
        results.append((x.grad.numpy(), w.grad.numpy()))
    for got, want in zip(results[2], results[0]):
        np.testing.assert_array_equal(got, want)
        zeros = want == 0
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 2
    assert not compiler.counters.fallbacks, compiler.counters


def _mean_dominated_rows(dtype: str) -> np.ndarray:
    """Rows of 4 whose mean is 200 times their spread (10 +- 0.05): the rounding of the mean to
    the dtype, |mean| u, is 200 u of the spread, which the normalisation's 1/std amplifies
    (native fuzz seed 1006197's rows were -1.1 +- 0.05)."""
    rng = np.random.default_rng(7)
    return (10.0 + 0.05 * rng.standard_normal((16, 4))).astype(dtype)


def _layer_norm_input_grad(x: np.ndarray, g: np.ndarray, how: str) -> np.ndarray:
    """``layer_norm(x, (4,))``'s input gradient for the root gradient ``g``: eagerly, as a
    whole step of native segments, or captured by compiled autograd (generated code)."""
    if how == "native":

        def step(x: fg.Tensor, g: fg.Tensor) -> None:
            nn.functional.layer_norm(x, (4,)).backward(g)

        compiled = fg.compile(step)
        for _ in range(2):  # (recorded, then replayed)
            xt = fg.tensor(x, requires_grad=True)
            compiled(xt, fg.tensor(g))
        return xt.grad.numpy()
    xt = fg.tensor(x, requires_grad=True)
    y = nn.functional.layer_norm(xt, (4,))
    with compiler.compiled_autograd() if how == "captured" else _no_region():
        y.backward(fg.tensor(g))
    return xt.grad.numpy()


def _extended_layer_norm_input_grad(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """rstd (g - mean(g) - xhat mean(g xhat)) over the rows, in numpy's long double (an
    80-bit float on x86: the mean's rounding is 2**-64 |mean|), returned as float64."""
    xe, ge = x.astype(np.longdouble), g.astype(np.longdouble)
    centred = xe - xe.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + np.longdouble(1e-5))
    xhat = centred * rstd
    projection = (ge * xhat).mean(axis=1, keepdims=True)
    return (rstd * (ge - ge.mean(axis=1, keepdims=True) - xhat * projection)).astype(np.float64)


class _no_region:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("how", ["native", "captured"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("gradient", ["constant", "random"])
def test_a_layer_norm_of_mean_dominated_rows_has_a_backward_stable_compiled_gradient(
    how: str, dtype: str, gradient: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled composites' input gradient of a layer norm is within a few roundoffs of
    the backward's terms (rstd |g|) of an extended-precision reference, whatever the ratio of
    the rows' mean to their spread: a perturbation of ``g`` by its rounding moves the exact
    gradient by that much, so no float computation of it can promise less.  They took mean(g
    centred) with ``centred = x - mean`` summing to n (mean - fl(mean)), not 0: an error
    |mean| / std times larger, 30 to 200 rstd |g| u here (and ``g rstd + (x beta + gamma)``:
    where ``g`` is constant, the exact gradient 0 came out as the rounding error of ``g
    rstd``); native fuzz seeds 1006197, 1000269, 1008724.  The reference is the formula in
    numpy's extended precision (64-bit significand) on the same rounded data; eager's kernels
    are no reference here: they keep the mean in the input's dtype and share the first
    error."""
    monkeypatch.setattr(compiler.config, "native_programs", how == "native")
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 0)  # (generated code)
    x = _mean_dominated_rows(dtype)
    if gradient == "constant":  # the gradient of a sum: exactly 0 in exact arithmetic
        g = np.full(x.shape, 0.5, dtype=dtype)
    else:
        g = np.random.default_rng(8).standard_normal(x.shape).astype(dtype)
    reference = _extended_layer_norm_input_grad(x, g)
    got = _layer_norm_input_grad(x, g, how)
    rstd = 1.0 / np.sqrt(x.astype(np.float64).var(axis=1, keepdims=True) + 1e-5)
    u = float(np.finfo(dtype).eps) / 2
    scale = u * rstd * np.abs(g.astype(np.float64)).max(axis=1, keepdims=True)
    if gradient == "random":
        # the input's rounding, u |x|, moves xhat by u |x| rstd: the exact gradient moves by
        # that times rstd |g| (a constant ``g`` has gradient 0 whatever ``x``: no such term)
        scale = scale * (1.0 + np.abs(x.astype(np.float64)).max(axis=1, keepdims=True) * rstd)
    error = np.abs(got.astype(np.float64) - reference)
    assert (error <= 4.0 * scale).all(), float((error / scale).max())
    if how == "native":
        assert compiler.counters.native_runs > 0, compiler.counters
        assert compiler.counters.step_runs == 1 and not compiler.counters.step_breaks
    else:
        assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 1
        assert not compiler.counters.fallbacks, compiler.counters


def _special_layer_norm_rows(dtype: str, weight: str) -> tuple:
    """(x, w, b, g) of a layer norm over 3: fuzz seed 301666's (x with an infinite and a NaN
    element, an infinite weight and bias element: ``weight`` "infinite"), and rows with an
    infinite or NaN input or gradient under finite weights (``weight`` "finite")."""
    x = np.array(
        [
            [[-0.7059, 0.9032, -0.0496], [0.1328, -1.2066, 2.0632], [0.1092, -0.6965, np.inf]],
            [[0.4778, np.nan, -0.4984], [0.2746, -1.6543, 0.3233], [-0.0685, -0.4256, -1.174]],
            [[0.1664, 0.1345, -0.1098], [-1.1387, 0.9702, 0.0248], [0.8803, -0.0491, -0.4539]],
        ]
    )
    g = np.array(
        [
            [[0.311, -2.715, 0.15], [-0.125, -0.617, 0.267], [-0.986, 0.583, -1.08]],
            [[0.558, 1.301, 0.465], [-0.967, 0.309, 0.253], [-0.892, 0.092, 1.166]],
            [[0.581, -2.504, 0.695], [0.839, -0.204, 0.594], [0.148, -0.288, -0.541]],
        ]
    )
    if weight == "infinite":
        w = np.array([-0.1472, np.inf, -0.0993])
        b = np.array([0.1333, -0.6738, np.inf])
    else:
        w = np.array([-0.1472, 0.7, -0.0993])
        b = np.array([0.1333, np.nan, -np.inf])
        g[0, 1, 0], g[1, 1, 2], g[2, 0, 1] = np.inf, -np.inf, np.nan
        x[2, 2] = [0.4, 0.1, 0.3]  # (x's and x - mean's signs differ; g there: inf below)
        g[2, 2, 1] = np.inf
    return (*(a.astype(dtype) for a in (x, w, b, g)),)


@pytest.mark.parametrize("how", ["captured", "debug", "steps", "native"])
@pytest.mark.parametrize("weight", ["infinite", "finite"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_layer_norm_with_infinities_has_eagers_infinities_and_nans_compiled(
    dtype: str, weight: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer norm's input gradient where its weight, bias, input or gradient hold infinities
    or NaNs, compiled as eager computes it: captured by compiled autograd (``norm_grads``, as
    generated code and in ``mode="debug"``) and as whole steps (``autograd.native``'s
    composite; native segments too).  The composites' drift correction took ``inf * 0`` (or
    ``inf - inf``) where eager's kernel gave an infinity (fuzz seed 301666: x.grad's row
    [nan, nan, inf] came out NaN throughout, in every configuration); where ``g w`` is not
    finite, eager and the composites now take PyTorch's coefficients
    (tests/ops/test_norm_kernels.py)."""
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 0)  # (generated code)
    monkeypatch.setattr(compiler.config, "native_programs", how == "native")
    x, w, b, g = _special_layer_norm_rows(dtype, weight)

    def step(xt: fg.Tensor, wt: fg.Tensor, bt: fg.Tensor, gt: fg.Tensor) -> None:
        nn.functional.layer_norm(xt, (3,), wt, bt).backward(gt, inputs=[xt])

    def grad(run: Callable | None, mode: str | None = None) -> np.ndarray:
        xt = fg.tensor(x, requires_grad=True)
        wt, bt = fg.tensor(w, requires_grad=True), fg.tensor(b, requires_grad=True)
        if mode is None:
            (run or step)(xt, wt, bt, fg.tensor(g))
        else:
            with compiler.compiled_autograd(mode=mode):
                step(xt, wt, bt, fg.tensor(g))
        return xt.grad.numpy()

    eager = grad(None)
    if weight == "infinite":  # (PyTorch's too)
        assert np.isnan(eager[2, 1, :2]).all() and np.isposinf(eager[2, 1, 2])
    else:
        assert np.isfinite(eager).any()
    assert not np.isfinite(eager).all()
    if how in ("captured", "debug"):
        mode = "default" if how == "captured" else "debug"
        results = [grad(None, mode) for _ in range(2)]
        assert compiler.counters.captures == 1 and not compiler.counters.fallbacks
    else:
        compiled = fg.compile(step)
        results = [grad(compiled) for _ in range(3)][1:]  # (recorded, then replayed)
        assert compiler.counters.step_runs == 2 and not compiler.counters.step_breaks
        assert (compiler.counters.native_runs > 0) == (how == "native"), compiler.counters
    for got in results:
        for test in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(test(got), test(eager), err_msg=test.__name__)
        finite = np.isfinite(eager)
        rtol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(got[finite], eager[finite], rtol=rtol, atol=rtol)


def _overflowing_layer_norm_rows(dtype: str) -> tuple:
    """(x, w, b, g) of a layer norm over 3: fuzz seed 304442's, whose first row's variance
    overflows float32 (to +inf: rstd 0) and whose ``g w (x - mean)`` overflows float32 there
    too (1e30 times 1e30); in float64 neither does."""
    x = np.array([[[1.4346, 1e30, -2.0528]], [[-0.1616, 1.9407, -1.0172]]])
    w = np.array([0.5779, 0.2285, 1e30])
    b = np.array([0.1663, 0.5088, -0.2394])
    g = np.array([[[0.624, 0.435, 1.854]], [[1.883, 0.539, -0.475]]])
    return (*(a.astype(dtype) for a in (x, w, b, g)),)


@pytest.mark.parametrize("how", ["captured", "debug", "steps", "native"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_layer_norm_whose_variance_overflows_has_eagers_gradients_compiled(
    dtype: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 layer norm whose variance overflows (rstd 0) in a row where ``g w (x -
    mean)`` overflows float32 too: eager's kernel sums those products in float64, so the row's
    input gradient is 0; the composites formed them in float32, and ``mean(g w (x - mean))
    rstd`` was ``inf * 0``, NaN throughout the row (fuzz seed 304442).  In float64 nothing
    overflows: the same gradients, to rounding.  The weight's and bias's too, compiled as in
    the infinities' test above."""
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 0)  # (generated code)
    monkeypatch.setattr(compiler.config, "native_programs", how == "native")
    x, w, b, g = _overflowing_layer_norm_rows(dtype)

    def step(xt: fg.Tensor, wt: fg.Tensor, bt: fg.Tensor, gt: fg.Tensor) -> None:
        (nn.functional.layer_norm(xt, (3,), wt, bt) * gt).sum().backward()

    def grads(run: Callable | None, mode: str | None = None) -> list[np.ndarray]:
        leaves = [fg.tensor(v, requires_grad=True) for v in (x, w, b)]
        if mode is None:
            (run or step)(*leaves, fg.tensor(g))
        else:
            with compiler.compiled_autograd(mode=mode):
                step(*leaves, fg.tensor(g))
        return [t.grad.numpy() for t in leaves]

    eager = grads(None)
    assert all(np.isfinite(e).all() for e in eager)
    if dtype == "float32":
        assert (eager[0][0] == 0).all()
    if how in ("captured", "debug"):
        mode = "default" if how == "captured" else "debug"
        results = [grads(None, mode) for _ in range(2)]
        assert compiler.counters.captures == 1 and not compiler.counters.fallbacks
    else:
        compiled = fg.compile(step)
        results = [grads(compiled) for _ in range(3)][1:]  # (recorded, then replayed)
        assert compiler.counters.step_runs == 2 and not compiler.counters.step_breaks
        assert (compiler.counters.native_runs > 0) == (how == "native"), compiler.counters
    rtol = 1e-5 if dtype == "float32" else 1e-10
    for got in results:
        for got_grad, want in zip(got, eager):
            # (the rows' terms are up to 1e30 times larger than some gradients: rounding is
            # relative to the largest, as the fuzz checker's floor)
            np.testing.assert_allclose(got_grad, want, rtol=rtol, atol=rtol * np.abs(want).max())
