"""BatchNorm1d/2d and GroupNorm modules, and F.batch_norm/group_norm/instance_norm's statistics:
running statistics updated in place (momentum, cumulative average, num_batches_tracked), eval
mode, track_running_stats, affine; PyTorch's errors; checked against torch when importable;
and a whole-step compile of a training loop with BatchNorm that replays the buffer updates."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler, nn


def _batch(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return rng.standard_normal(shape) * 2.0 + 0.5


def _run(lib: Any, make: Any, shape: tuple, steps: int = 3) -> tuple[list, dict]:
    """Train-mode forward/backward for ``steps`` batches, then one eval forward: the outputs,
    input gradients and final state_dict."""
    m = make(lib).double()
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(steps):
        x = lib.tensor(_batch(rng, shape), requires_grad=True)
        y = m(x)
        weights = lib.tensor(np.linspace(-1, 1, y.numel()).reshape(tuple(y.shape)))
        (y * weights).sum().backward()
        seen += [y.detach().numpy().copy(), x.grad.numpy().copy()]
    m.eval()
    seen.append(m(lib.tensor(_batch(rng, shape))).detach().numpy().copy())
    state = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    return seen, state


BN_CASES = [
    ("BatchNorm1d", (4, 3)),
    ("BatchNorm1d", (4, 3, 5)),
    ("BatchNorm2d", (3, 3, 4, 2)),
]


@pytest.mark.parametrize("name,shape", BN_CASES)
@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize("track", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_modules_match_torch(
    name: str, shape: tuple, momentum: Any, track: bool, affine: bool
) -> None:
    torch = pytest.importorskip("torch")

    def make(lib: Any) -> Any:
        return getattr(lib.nn, name)(3, momentum=momentum, track_running_stats=track, affine=affine)

    want, want_state = _run(torch, make, shape)
    got, got_state = _run(fg, make, shape)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert list(got_state) == list(want_state)
    for key in want_state:
        assert got_state[key].dtype == want_state[key].dtype, key
        np.testing.assert_allclose(got_state[key], want_state[key], rtol=1e-12, err_msg=key)


IN_CASES = [
    ("InstanceNorm1d", (4, 3, 5)),
    ("InstanceNorm1d", (3, 6)),  # unbatched
    ("InstanceNorm2d", (2, 3, 4, 5)),
    ("InstanceNorm2d", (3, 4, 4)),  # unbatched
]


@pytest.mark.parametrize("name,shape", IN_CASES)
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"affine": True},
        {"track_running_stats": True},
        {"affine": True, "track_running_stats": True, "momentum": None},
        {"affine": True, "bias": False, "track_running_stats": True, "momentum": 0.3},
    ],
)
def test_instance_norm_modules_match_torch(name: str, shape: tuple, kwargs: dict) -> None:
    torch = pytest.importorskip("torch")

    def make(lib: Any) -> Any:
        return getattr(lib.nn, name)(3, **kwargs)

    assert repr(make(fg)) == repr(make(torch))
    want, want_state = _run(torch, make, shape)
    got, got_state = _run(fg, make, shape)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert list(got_state) == list(want_state)
    for key in want_state:
        np.testing.assert_allclose(got_state[key], want_state[key], rtol=1e-12, err_msg=key)


def test_instance_norm_num_features_check() -> None:
    with pytest.warns(UserWarning, match="does not match num_features"):
        nn.InstanceNorm1d(4)(fg.randn(2, 3, 5))
    with pytest.raises(ValueError, match="to match num_features"):
        nn.InstanceNorm1d(4, affine=True)(fg.randn(2, 3, 5))
    with pytest.raises(ValueError, match="expected 3D or 4D input"):
        nn.InstanceNorm2d(3)(fg.randn(3, 5))


def test_running_statistics_by_hand() -> None:
    bn = nn.BatchNorm1d(2, momentum=None, dtype=fg.float64)
    rng = np.random.default_rng(1)
    batches = [_batch(rng, (5, 2)) for _ in range(3)]
    for b in batches:
        bn(fg.tensor(b))
    # momentum=None: the plain average of the batches' statistics
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([b.mean(0) for b in batches], 0))
    np.testing.assert_allclose(
        bn.running_var.numpy(), np.mean([b.var(0, ddof=1) for b in batches], 0)
    )
    assert bn.num_batches_tracked.item() == 3 and bn.num_batches_tracked.dtype == fg.int64
    # in place: the same buffer objects, versions bumped, no history
    mean_buffer = bn.running_mean
    bn(fg.tensor(batches[0]))
    assert bn.running_mean is mean_buffer and mean_buffer.grad_fn is None
    bn.eval()
    x = _batch(rng, (4, 2))
    want = (x - bn.running_mean.numpy()) / np.sqrt(bn.running_var.numpy() + 1e-5)
    np.testing.assert_allclose(bn(fg.tensor(x)).detach().numpy(), want, rtol=1e-12)
    assert bn.num_batches_tracked.item() == 4  # eval mode does not count
    bn.reset_running_stats()
    assert bn.running_var.tolist() == [1.0, 1.0] and bn.num_batches_tracked.item() == 0


def test_eval_without_running_stats_uses_the_batch() -> None:
    bn = nn.BatchNorm2d(2, track_running_stats=False, dtype=fg.float64).eval()
    x = _batch(np.random.default_rng(2), (3, 2, 2, 2))
    got = bn(fg.tensor(x)).detach().numpy()
    mu, var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(got, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-12)
    assert bn.running_mean is None and "running_mean" not in bn.state_dict()


def test_functional_statistics_update_in_place() -> None:
    x = _batch(np.random.default_rng(3), (6, 2, 3))
    rm, rv = fg.zeros(2, dtype=fg.float64), fg.ones(2, dtype=fg.float64)
    F.batch_norm(fg.tensor(x), rm, rv, training=True, momentum=0.25)
    np.testing.assert_allclose(rm.numpy(), 0.25 * x.mean((0, 2)), rtol=1e-12)
    np.testing.assert_allclose(rv.numpy(), 0.75 + 0.25 * x.var((0, 2), ddof=1), rtol=1e-12)
    assert rm._version == 2  # mul_ then add_
    rm2, rv2 = fg.zeros(2, dtype=fg.float64), fg.ones(2, dtype=fg.float64)
    F.instance_norm(fg.tensor(x), rm2, rv2, momentum=0.5)
    np.testing.assert_allclose(rm2.numpy(), 0.5 * x.mean(2).mean(0), rtol=1e-12)
    np.testing.assert_allclose(rv2.numpy(), 0.5 + 0.5 * x.var(2, ddof=1).mean(0), rtol=1e-12)


def test_group_norm_module() -> None:
    gn = nn.GroupNorm(2, 4, dtype=fg.float64)
    assert repr(gn) == "GroupNorm(2, 4, eps=1e-05, affine=True, bias=True)"
    assert [n for n, _ in gn.named_parameters()] == ["weight", "bias"]
    x = _batch(np.random.default_rng(4), (3, 4, 5))
    g = x.reshape(3, 2, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(
        x.shape
    )
    np.testing.assert_allclose(gn(fg.tensor(x)).detach().numpy(), want, rtol=1e-12)
    assert nn.GroupNorm(2, 4, affine=False).weight is None
    assert nn.GroupNorm(2, 4, bias=False).bias is None


def test_reprs_and_state_dict_keys() -> None:
    bn = nn.BatchNorm2d(3)
    assert repr(bn) == (
        "BatchNorm2d(3, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)"
    )
    assert list(bn.state_dict()) == [
        "weight",
        "bias",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]
    assert [n for n, _ in nn.BatchNorm1d(3, affine=False).named_parameters()] == []


@pytest.mark.parametrize(
    "call,kind,words",
    [
        (
            lambda: F.batch_norm(fg.randn(1, 4), None, None, training=True),
            ValueError,
            "more than 1",
        ),
        (lambda: F.batch_norm(fg.randn(3, 4), None, None), RuntimeError, "evaluation mode"),
        (
            lambda: F.batch_norm(fg.randn(3, 4), fg.zeros(3), fg.ones(3)),
            RuntimeError,
            "running_mean should contain 4 elements not 3",
        ),
        (
            lambda: F.batch_norm(fg.randn(3, 4), None, None, fg.ones(3), training=True),
            RuntimeError,
            "weight should contain 4 elements not 3",
        ),
        (lambda: nn.BatchNorm1d(4)(fg.randn(2, 4, 3, 3)), ValueError, "expected 2D or 3D input"),
        (lambda: nn.BatchNorm2d(4)(fg.randn(2, 4, 3)), ValueError, "expected 4D input (got 3D"),
        (lambda: F.group_norm(fg.randn(2, 6, 3), 4), RuntimeError, "divisible by num_groups"),
        (
            lambda: F.group_norm(fg.randn(2, 6), 3, fg.ones(5)),
            RuntimeError,
            "weight to be a vector",
        ),
        (lambda: F.group_norm(fg.randn(6), 3), RuntimeError, "at least 2 dimensions"),
        (lambda: nn.GroupNorm(4, 6), ValueError, "must be divisible by num_groups"),
        (lambda: F.instance_norm(fg.randn(2, 6, 1)), ValueError, "more than 1 spatial element"),
        (
            lambda: F.instance_norm(fg.randn(2, 6, 3), use_input_stats=False),
            RuntimeError,
            "running_mean and running_var to be defined",
        ),
    ],
)
def test_errors(call: Any, kind: type, words: str) -> None:
    with pytest.raises(kind, match=words.replace("(", r"\(")):
        call()


# ---- whole-step compile ------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self, momentum: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False, dtype=fg.float64)
        self.bn = nn.BatchNorm2d(4, momentum=momentum, dtype=fg.float64)
        self.gn = nn.GroupNorm(2, 4, dtype=fg.float64)
        self.bn1 = nn.BatchNorm1d(4, dtype=fg.float64)
        self.fc = nn.Linear(4, 3, dtype=fg.float64)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        h = self.gn(F.relu(self.bn(self.conv(x))))
        return self.fc(self.bn1(h.mean((2, 3))))


def _step(model: nn.Module, opt: Any) -> Any:
    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


@pytest.mark.parametrize("momentum", [0.1, None])
def test_whole_step_training_with_batch_norm_matches_eager(momentum: Any) -> None:
    compiler.reset()
    runs = []
    for compiled in (False, True):
        fg.manual_seed(0)
        model = _Net(momentum)
        opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        step = _step(model, opt)
        fn = fg.compile(step) if compiled else step
        rng = np.random.default_rng(5)
        losses = []
        for _ in range(5):
            x = fg.tensor(_batch(rng, (6, 2, 4, 4)))
            y = fg.tensor(rng.integers(0, 3, 6))
            losses.append(fn(x, y).item())
        model.eval()
        x = fg.tensor(_batch(rng, (2, 2, 4, 4)))
        runs.append((losses, model.state_dict(), model(x).detach().numpy()))
    (want, want_state, want_eval), (got, got_state, got_eval) = runs
    np.testing.assert_allclose(got, want, rtol=1e-10)
    for key, value in want_state.items():
        np.testing.assert_allclose(
            got_state[key].numpy(), value.numpy(), rtol=1e-10, atol=1e-12, err_msg=key
        )
    assert got_state["bn.num_batches_tracked"].item() == 5
    np.testing.assert_allclose(got_eval, want_eval, rtol=1e-10)
    # recorded once (after the warm-up call that creates the optimizer's state), then replayed
    # with the in-place buffer updates: no break
    assert not compiler.counters.step_breaks, compiler.counters.step_breaks
    assert compiler.counters.step_captures == 1 and compiler.counters.step_runs == 3
    compiler.reset()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_element_equal_to_its_mean_normalises_to_exactly_zero(dtype: str) -> None:
    """Layer, group, instance and batch norm of constant rows or channels give exactly 0 (plus
    the bias), as PyTorch's layer and group norm do: the normalisation is not contracted into
    an FMA, which left the rounding error of ``mean * rstd`` (seed 1001831 of the native fuzz
    campaign: a layer norm over one element gave 3e-16, and its ``** -1.5`` a finite gradient
    where the compiled composite's exact 0 gave NaN)."""
    x = np.full((4, 3, 5), 0.3, dtype=dtype)
    x[:, 1] = 1 / 3
    x[:, 2] = -2.7
    t = fg.tensor(x)
    bias = fg.tensor(np.array([0.5, -1.0, 2.0], dtype=dtype))
    outputs = {
        "layer": F.layer_norm(t, (5,)),
        "layer over one element": F.layer_norm(t[..., :1], (1,)),
        "group": F.group_norm(t, 3),
        "instance": F.instance_norm(t),
        "batch": F.batch_norm(t, None, None, training=True),
    }
    for name, out in outputs.items():
        assert not out.numpy().any(), name
    shifted = F.group_norm(t, 3, bias=bias).numpy()
    np.testing.assert_array_equal(shifted, np.broadcast_to(bias.numpy()[:, None], x.shape))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_norm_over_one_element_has_exactly_zero_input_gradient(dtype: str) -> None:
    """The output of a layer norm over one element (and of a group norm with one element per
    group) is constant, so its input's gradient is exactly 0, as PyTorch's: the backward takes
    each difference before its product (contracted into FMAs, the other order left 3e-14 in
    float64: seed 1002490 of the native fuzz campaign, where the compiled composite gave 0)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 1)).astype(dtype) * 3
    g = rng.standard_normal((4, 1)).astype(dtype)
    w = fg.tensor(np.array([1.7], dtype=dtype), requires_grad=True)
    t = fg.tensor(x, requires_grad=True)
    F.layer_norm(t, (1,), weight=w).backward(fg.tensor(g))
    assert not t.grad.numpy().any()
    t = fg.tensor(x.reshape(2, 2, 1), requires_grad=True)
    F.group_norm(t, 2, weight=fg.tensor(np.array([0.5, -2.0], dtype=dtype))).backward(
        fg.tensor(g.reshape(2, 2, 1))
    )
    assert not t.grad.numpy().any()
