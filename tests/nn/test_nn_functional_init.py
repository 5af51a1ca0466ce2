"""``fusegrad.nn.functional`` surface and ``fusegrad.nn.init`` schemes."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusegrad
import fusegrad.nn.functional as F
from fusegrad import nn
from fusegrad.nn import init

REQUIRED = [
    "relu",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "softmax",
    "log_softmax",
    "leaky_relu",
    "elu",
    "softplus",
    "linear",
    "dropout",
    "layer_norm",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "unfold",
    "pad",
    "embedding",
    "one_hot",
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "normalize",
]


def test_functional_exposes_pytorch_names():
    missing = [name for name in REQUIRED if not callable(getattr(F, name, None))]
    assert missing == []
    assert set(REQUIRED) <= set(F.__all__)


def test_functional_activations_match_numpy():
    x = np.linspace(-4, 4, 17)
    t = fusegrad.tensor(x)
    np.testing.assert_allclose(F.relu(t).numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(F.leaky_relu(t, 0.1).numpy(), np.where(x > 0, x, 0.1 * x))
    np.testing.assert_allclose(F.elu(t, 2.0).numpy(), np.where(x > 0, x, 2 * np.expm1(x)))
    np.testing.assert_allclose(F.softplus(t).numpy(), np.log1p(np.exp(x)), rtol=1e-12)
    np.testing.assert_allclose(F.silu(t).numpy(), x / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(F.relu6(t * 2).numpy(), np.clip(2 * x, 0, 6))
    np.testing.assert_allclose(F.logsigmoid(t).numpy(), -np.log1p(np.exp(-x)), rtol=1e-12)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(
        F.gelu(t).numpy(), 0.5 * x * (1 + erf(x / math.sqrt(2))), rtol=1e-12, atol=1e-15
    )


def test_functional_inplace_activation():
    x = fusegrad.tensor([-1.0, 2.0])
    v = x._version
    assert F.relu(x, inplace=True) is x
    assert x.tolist() == [0.0, 2.0] and x._version == v + 1
    y = fusegrad.tensor([-2.0, 2.0], requires_grad=True)
    z = y * 1.0
    F.leaky_relu(z, 0.5, inplace=True).sum().backward()
    assert y.grad.tolist() == [0.5, 1.0]


def test_functional_softmax_and_normalize():
    x = fusegrad.randn(3, 4)
    np.testing.assert_allclose(F.softmax(x, dim=1).numpy().sum(1), np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(F.softmin(x, dim=0).numpy(), F.softmax(-x, dim=0).numpy())
    np.testing.assert_allclose(
        np.exp(F.log_softmax(x, dim=-1).numpy()), F.softmax(x, -1).numpy(), rtol=1e-5
    )
    with pytest.warns(UserWarning, match="Implicit dimension"):
        F.log_softmax(x)
    n = F.normalize(x, dim=1).numpy()
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), np.ones(3), rtol=1e-5)


def test_functional_dropout_training_flag():
    x = fusegrad.ones(100)
    assert F.dropout(x, 0.5, training=False) is x
    y = F.dropout(x, 0.5, training=True).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 0 < (y == 0).sum() < 100


def test_functional_against_torch_pad_unfold_one_hot():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5))
    np.testing.assert_allclose(
        F.pad(fusegrad.tensor(x), (1, 2, 0, 1), value=3.0).numpy(),
        torch.nn.functional.pad(torch.from_numpy(x), (1, 2, 0, 1), value=3.0).numpy(),
    )
    np.testing.assert_allclose(
        F.unfold(fusegrad.tensor(x), 2, padding=1, stride=2).numpy(),
        torch.nn.functional.unfold(torch.from_numpy(x), 2, padding=1, stride=2).numpy(),
    )
    idx = np.array([0, 3, 1])
    np.testing.assert_array_equal(
        F.one_hot(fusegrad.tensor(idx), 5).numpy(),
        torch.nn.functional.one_hot(torch.from_numpy(idx), 5).numpy(),
    )


# ---- init ------------------------------------------------------------------------------------


def test_calculate_gain():
    assert init.calculate_gain("linear") == 1.0
    assert init.calculate_gain("conv2d") == 1.0
    assert init.calculate_gain("sigmoid") == 1.0
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("leaky_relu") == pytest.approx(math.sqrt(2 / (1 + 0.01**2)))
    assert init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    assert init.calculate_gain("selu") == 0.75
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")


def test_fan_in_and_fan_out():
    assert init._calculate_fan_in_and_fan_out(fusegrad.empty(4, 3)) == (3, 4)
    assert init._calculate_fan_in_and_fan_out(fusegrad.empty(8, 2, 3, 5)) == (30, 120)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init._calculate_fan_in_and_fan_out(fusegrad.empty(5))


def _filled(fn, shape=(400, 300), **kwargs) -> np.ndarray:
    t = nn.Parameter(fusegrad.empty(*shape))
    v = t._version
    out = fn(t, **kwargs)
    assert out is t and t._version > v and t.requires_grad and t.grad_fn is None
    return t.detach().numpy()


def test_uniform_normal_constant():
    u = _filled(init.uniform_, a=-2.0, b=3.0)
    assert u.min() >= -2 and u.max() <= 3 and abs(u.mean() - 0.5) < 0.05
    n = _filled(init.normal_, mean=1.0, std=2.0)
    assert abs(n.mean() - 1) < 0.02 and abs(n.std() - 2) < 0.02
    assert np.all(_filled(init.constant_, val=0.25) == 0.25)
    assert np.all(_filled(init.ones_) == 1) and np.all(_filled(init.zeros_) == 0)
    tn = _filled(init.trunc_normal_, std=1.0, a=-1.0, b=1.5)
    assert tn.min() >= -1 and tn.max() <= 1.5
    np.testing.assert_array_equal(_filled(init.eye_, shape=(3, 4)), np.eye(3, 4))


@pytest.mark.parametrize(
    "fn,expected_std",
    [
        (init.xavier_uniform_, math.sqrt(2 / 700)),
        (init.xavier_normal_, math.sqrt(2 / 700)),
        (lambda t: init.kaiming_uniform_(t, nonlinearity="relu"), math.sqrt(2 / 300)),
        (lambda t: init.kaiming_normal_(t, nonlinearity="relu"), math.sqrt(2 / 300)),
        (
            lambda t: init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu"),
            math.sqrt(2 / 400),
        ),
        (lambda t: init.kaiming_uniform_(t, a=math.sqrt(5)), 1 / math.sqrt(3 * 300)),
    ],
)
def test_scaled_init_standard_deviations(fn, expected_std: float):
    values = _filled(fn)
    assert abs(values.std() - expected_std) < 0.03 * expected_std
    assert abs(values.mean()) < 0.05 * expected_std * 10


def test_uniform_schemes_respect_bounds():
    bound = math.sqrt(6 / 700)
    assert np.abs(_filled(init.xavier_uniform_)).max() <= bound
    bound = math.sqrt(2) * math.sqrt(3 / 300)
    assert np.abs(_filled(init.kaiming_uniform_, nonlinearity="relu")).max() <= bound
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(fusegrad.empty(3, 3), mode="fan_avg")


def test_orthogonal():
    q = _filled(init.orthogonal_, shape=(5, 8))
    np.testing.assert_allclose(q @ q.T, np.eye(5), atol=1e-5)
    q = _filled(init.orthogonal_, shape=(8, 5))
    np.testing.assert_allclose(q.T @ q, np.eye(5), atol=1e-5)


def test_init_is_reproducible_with_manual_seed_and_generator():
    fusegrad.manual_seed(3)
    a = _filled(init.normal_, shape=(10,))
    fusegrad.manual_seed(3)
    b = _filled(init.normal_, shape=(10,))
    np.testing.assert_array_equal(a, b)
    g1, g2 = fusegrad.Generator().manual_seed(5), fusegrad.Generator().manual_seed(5)
    c = init.xavier_uniform_(fusegrad.empty(4, 4), generator=g1).numpy()
    d = init.xavier_uniform_(fusegrad.empty(4, 4), generator=g2).numpy()
    np.testing.assert_array_equal(c, d)
    # a different seed gives different numbers
    fusegrad.manual_seed(4)
    assert not np.array_equal(_filled(init.normal_, shape=(10,)), a)
