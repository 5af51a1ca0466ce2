"""The normalisation layers' CUDA kernels (``cuda/norms.py``: ``norm_stats``, ``norm``,
``norm_backward``) in numba's simulator: batch, instance, group and layer norm, with and without
the affine parameters, in training and in evaluation (running statistics), float32 and float64,
give the CPU kernels' values, gradients and running statistics; the kernels ran on the device,
not the composites; the gradients for each subset of inputs; double backward (the rule's
composite) on the device; hypothesis over layouts and shapes."""

from __future__ import annotations

import modes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from primitive_names import PrimitiveNames as _Recorder

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.autograd import tracer

modes.require_device()


def _batch(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)


def _batch_eval(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
    return F.batch_norm(x, rm, rv, w, b, training=False)


def _instance(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
    return F.instance_norm(x, rm, rv, w, b, momentum=0.2)


def _group(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
    return F.group_norm(x, 2, w, b)


def _layer(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
    return F.layer_norm(x, tuple(x.shape[-2:]), w, b)


def _layer1(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-3)


# (layer, input shape, parameter shape, running statistics)
_CASES = [
    (_batch, (3, 4, 5), (4,), True),
    (_batch, (2, 3), (3,), False),
    (_batch_eval, (2, 3, 2, 2), (3,), True),
    (_instance, (2, 3, 4, 2), (3,), True),
    (_group, (2, 4, 3), (4,), False),
    (_group, (1, 6, 2, 1, 2), (6,), False),
    (_layer, (2, 4, 3, 2), (3, 2), False),
    (_layer1, (5, 7), (7,), False),
]
_NORMS = {"norm_stats", "norm", "norm_backward"}


def _run(case: tuple, dtype: str, device: str, affine: bool, wants: tuple) -> tuple:
    fn, xs, ps, running = case
    rng = np.random.default_rng(len(xs) + len(ps))
    x = rng.standard_normal(xs).astype(dtype) * 2 + 1
    w, b = rng.standard_normal(ps).astype(dtype), rng.standard_normal(ps).astype(dtype)
    leaves = [
        fg.tensor(a, device=device, requires_grad=want) if a is not None else None
        for a, want in zip((x, w if affine else None, b if affine else None), wants)
    ]
    stats = None, None
    if running:
        channels = xs[1]
        stats = (
            fg.tensor(rng.standard_normal(channels).astype(dtype), device=device),
            fg.tensor(rng.uniform(0.5, 2, channels).astype(dtype), device=device),
        )
    rec = _Recorder()
    with tracer.tracing(rec):
        out = fn(*leaves, *stats)
        weights = fg.tensor(
            np.random.default_rng(1).standard_normal(xs).astype(dtype), device=device
        )
        if any(t is not None and t.requires_grad for t in leaves):
            (out * weights).sum().backward()
    grads = [None if t is None or t.grad is None else t.grad.cpu().numpy() for t in leaves]
    running_now = [s.cpu().numpy() for s in stats if s is not None]
    return [out.detach().cpu().numpy(), *grads, *running_now], rec.names


def _close(got: list, want: list, dtype: str) -> None:
    tol = {"rtol": 1e-11, "atol": 1e-12} if dtype == "float64" else {"rtol": 1e-5, "atol": 1e-5}
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, **tol)


def _name(case: tuple) -> str:
    return f"{case[0].__name__}{case[1]}"


@pytest.mark.parametrize(
    ("case", "dtype"),
    [(c, "float64") for c in _CASES] + [(_CASES[i], "float32") for i in (0, 3, 6)],
    ids=lambda v: _name(v) if isinstance(v, tuple) else v,
)
def test_matches_the_cpu_kernels(case: tuple, dtype: str) -> None:
    # (evaluation with a graph runs the composite on both devices: its node would keep the input)
    evaluation = case[0] is _batch_eval
    wants = (not evaluation,) * 3
    want, _ = _run(case, dtype, "cpu", True, wants)
    got, names = _run(case, dtype, "cuda", True, wants)
    # the kernels ran on the device
    assert ({"norm"} if evaluation else {"norm", "norm_backward"}) <= names, names
    _close(got, want, dtype)


@pytest.mark.parametrize(
    "wants", [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]
)
@pytest.mark.parametrize("case", [_CASES[0], _CASES[6]], ids=_name)
def test_each_subset_of_gradients(case: tuple, wants: tuple) -> None:
    want, _ = _run(case, "float64", "cpu", True, wants)
    got, names = _run(case, "float64", "cuda", True, wants)
    assert "norm_backward" in names
    _close(got, want, "float64")


@pytest.mark.parametrize("case", [_CASES[0], _CASES[4], _CASES[7]], ids=_name)
def test_without_affine_parameters(case: tuple) -> None:
    want, _ = _run(case, "float32", "cpu", False, (True, False, False))
    got, names = _run(case, "float32", "cuda", False, (True, False, False))
    assert _NORMS <= names
    _close(got, want, "float32")


def test_double_backward_on_the_device() -> None:
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 4, 3)), rng.standard_normal(4)
    results = []
    for device in ("cpu", "cuda"):
        xt = fg.tensor(x, device=device, requires_grad=True)
        wt = fg.tensor(w, device=device, requires_grad=True)
        out = F.group_norm(xt, 2, wt) + F.layer_norm(xt, (3,), None, None)
        gx, gw = fg.autograd.grad((out * out * out).sum(), (xt, wt), create_graph=True)
        (gg,) = fg.autograd.grad((gx * gx).sum() + (gw * gw).sum(), xt)
        results.append(gg.cpu().numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-10, atol=1e-12)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["layer", "batch", "instance", "group"]),
    batch=st.integers(1, 3),
    channels=st.sampled_from([1, 2, 4]),
    spatial=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_shapes_property(kind: str, batch: int, channels: int, spatial: list, seed: int) -> None:
    shape = (batch, channels, *spatial)
    per_stat = int(np.prod(spatial)) * (batch if kind == "batch" else 1)
    if kind in ("batch", "instance") and per_stat <= 1:
        return  # (PyTorch refuses one value per statistic in training)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    params = shape[1:] if kind == "layer" else (channels,)
    w, b = rng.standard_normal(params), rng.standard_normal(params)
    results = []
    for device in ("cpu", "cuda"):
        ts = [fg.tensor(v, device=device, requires_grad=True) for v in (x, w, b)]
        if kind == "layer":
            out = F.layer_norm(ts[0], params, ts[1], ts[2])
        elif kind == "batch":
            out = F.batch_norm(ts[0], None, None, ts[1], ts[2], training=True)
        elif kind == "instance":
            out = F.instance_norm(ts[0], weight=ts[1], bias=ts[2])
        else:
            out = F.group_norm(ts[0], 2 if channels % 2 == 0 else 1, ts[1], ts[2])
        (out * out * out).sum().backward()
        results.append([out.detach().cpu().numpy()] + [t.grad.cpu().numpy() for t in ts])
    for a, b_ in zip(*results):
        np.testing.assert_allclose(a, b_, rtol=1e-10, atol=1e-11)


def test_gradcheck_on_the_device() -> None:
    """``gradcheck`` on CUDA tensors (the inputs perturbed through a host copy, the output
    gradients made on the device): layer norm in float64, small (the simulator is slow)."""
    from fusegrad.autograd.gradcheck import gradcheck

    rng = np.random.default_rng(3)
    x = fg.tensor(rng.standard_normal((2, 3)), device="cuda", requires_grad=True)
    w = fg.tensor(rng.standard_normal(3), device="cuda", requires_grad=True)
    assert gradcheck(lambda x, w: F.layer_norm(x, (3,), w), (x, w))
    assert x.device.type == "cuda" and x.grad is None  # (restored in place, nothing written)
