"""float16 (always) and bfloat16 (with the optional ml_dtypes package): PyTorch's promotion,
conversions, values and gradients of a small model against torch, save/load, printing, and
compiled programs that run such graphs eagerly with a stated reason."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import dtypes

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")
HALVES = ["float16"] + (["bfloat16"] if dtypes.bfloat16 is not None else [])

_CASES = [
    ("h+f32", lambda m, h: m.ones(3, dtype=h) + m.ones(3)),
    ("h*float", lambda m, h: m.ones(3, dtype=h) * 2.5),
    ("h*int", lambda m, h: m.ones(3, dtype=h) * 2),
    ("i64+0d_h", lambda m, h: m.ones(3, dtype=m.int64) + m.ones((), dtype=h)),
    ("h+0d_f32", lambda m, h: m.ones(3, dtype=h) + m.ones(())),
    ("0d_h+0d_f64", lambda m, h: m.ones((), dtype=h) + m.ones((), dtype=m.float64)),
    ("h+f16", lambda m, h: m.ones(3, dtype=h) + m.ones(3, dtype=m.float16)),
    ("h@h", lambda m, h: m.ones(2, 3, dtype=h) @ m.ones(3, 2, dtype=h)),
    ("mean_h", lambda m, h: m.ones(3, dtype=h).mean()),
    ("softmax_h", lambda m, h: m.ones(3, dtype=h).softmax(0)),
]


@needs_torch
@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize(("name", "make"), _CASES, ids=[c[0] for c in _CASES])
def test_promotion_matches_torch(half: str, name: str, make) -> None:  # type: ignore[no-untyped-def]
    got = make(fg, getattr(fg, half))
    want = make(torch, getattr(torch, half))
    assert got.dtype.name == str(want.dtype).split(".")[-1], name


@pytest.mark.parametrize("half", HALVES)
def test_conversions_and_names(half: str) -> None:
    d = getattr(fg, half)
    x = fg.tensor([1.5, -2.25])
    assert x.to(d).dtype is d and x.to(half).dtype is d
    assert getattr(x, "half" if half == "float16" else "bfloat16")().dtype is d
    assert x.to(d).is_floating_point() and x.to(d).float().dtype is fg.float32
    assert fg.zeros(2, dtype=d).dtype is d and fg.randn(2, dtype=d).dtype is d
    assert x.to(d).type() == (
        "fusegrad.HalfTensor" if half == "float16" else "fusegrad.BFloat16Tensor"
    )
    m = nn.Linear(2, 2)
    getattr(m, "half" if half == "float16" else "bfloat16")()
    assert m.weight.dtype is d and m.weight.requires_grad
    assert fg.half is fg.float16 and fg.dtypes.as_dtype("half") is fg.float16


@needs_torch
@pytest.mark.parametrize("half", HALVES)
def test_printing_matches_torch(half: str) -> None:
    data = [[1.23456, -2.5e-3], [300.0, 0.0]]
    got = repr(fg.tensor(data).to(getattr(fg, half)))
    want = repr(torch.tensor(data).to(getattr(torch, half)))
    assert got == want.replace("torch.", "fusegrad.")


@needs_torch
@pytest.mark.parametrize("half", HALVES)
def test_small_model_values_and_gradients_match_torch(half: str) -> None:
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((4, 6)) * 0.5, rng.standard_normal((6, 3)) * 0.5
    x, y = rng.standard_normal((5, 4)), np.array([0, 2, 1, 1, 0])

    def run(lib):  # type: ignore[no-untyped-def]
        dt = getattr(lib, half)
        a = lib.tensor(w1).to(dt).requires_grad_()
        b = lib.tensor(w2).to(dt).requires_grad_()
        h = (lib.tensor(x).to(dt) @ a).tanh()
        logits = h @ b
        fn = F if lib is fg else torch.nn.functional
        loss = fn.cross_entropy(logits.float(), lib.tensor(y)) + (h * h).mean().float()
        loss.backward()
        return loss, a.grad, b.grad

    got, want = run(fg), run(torch)
    tol = 2e-2 if half == "bfloat16" else 3e-3
    for g, w in zip(got, want):
        assert g.dtype.name == str(w.dtype).split(".")[-1]
        np.testing.assert_allclose(
            g.detach().float().numpy(), w.detach().float().numpy(), rtol=tol, atol=tol
        )


@pytest.mark.parametrize("half", HALVES)
def test_save_and_load_round_trip(tmp_path: os.PathLike, half: str) -> None:
    x = fg.randn(3, 2).to(getattr(fg, half))
    path = os.path.join(tmp_path, "half.pt")
    fg.save({"x": x, "dtype": x.dtype}, path)
    back = fg.load(path)
    assert back["x"].dtype is x.dtype and back["dtype"] is x.dtype
    assert back["x"].numpy().tobytes() == x.numpy().tobytes()


@pytest.mark.parametrize("half", HALVES)
def test_compiled_programs_run_half_graphs_eagerly(half: str) -> None:
    from fusegrad import compiler

    compiler.reset()
    fg.manual_seed(0)
    model = nn.Linear(3, 2).to(getattr(fg, half))
    opt = fg.optim.SGD(model.parameters(), lr=0.1)
    twin = nn.Linear(3, 2).to(getattr(fg, half))
    twin.load_state_dict(model.state_dict())
    twin_opt = fg.optim.SGD(twin.parameters(), lr=0.1)

    def step(m: nn.Module, o: fg.optim.Optimizer, x: fg.Tensor) -> fg.Tensor:
        o.zero_grad()
        loss = (m(x) ** 2).mean()
        loss.backward()
        o.step()
        return loss.detach()

    compiled = fg.compile(lambda x: step(model, opt, x))
    for _ in range(3):
        x = fg.randn(4, 3).to(getattr(fg, half))
        assert fg.equal(compiled(x), step(twin, twin_opt, x))
    assert fg.equal(model.weight, twin.weight)
    assert compiler.counters.step_runs == 0
    assert any("half dtypes" in r for r in compiler.counters.step_breaks)
    x = fg.randn(3).to(getattr(fg, half)).requires_grad_()
    with compiler.compiled_autograd():
        (x.exp() * x).sum().backward()
    assert x.grad.dtype is x.dtype
    assert any("half dtypes" in r for r in compiler.counters.fallbacks)


def test_from_numpy_takes_float16_and_says_so() -> None:
    t = fg.from_numpy(np.array([0.5, 1.5], np.float16))
    assert t.dtype is fg.float16
    with pytest.raises(TypeError, match="float16"):
        fg.from_numpy(np.ones(2, np.uint16))


# ---- bfloat16 without importing ml_dtypes up front --------------------------------------------
#
# ml_dtypes' extension takes about half a second to import, so fusegrad imports it only when a
# bfloat16 value is first made or met (``dtypes._LazyNumpyDtype``). Each check runs in a fresh
# process: in this one, other tests have imported it already.

needs_bfloat16 = pytest.mark.skipif(dtypes.bfloat16 is None, reason="ml_dtypes not installed")


def _run_fresh(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@needs_bfloat16
def test_importing_fusegrad_leaves_ml_dtypes_unimported_until_bfloat16_is_used() -> None:
    _run_fresh(
        """
        import sys
        import fusegrad as fg
        import fusegrad.compiler
        import fusegrad.compiler.workers
        from fusegrad import dtypes

        assert "ml_dtypes" not in sys.modules
        assert fg.bfloat16 is dtypes.bfloat16 and dtypes.bfloat16 in dtypes.ALL
        assert dtypes.as_dtype("bfloat16") is fg.bfloat16
        x = fg.tensor([1.0, 2.5, 3.14159, 1 / 3, -7.0])
        assert fg.from_numpy(x.numpy()).dtype is fg.float32  # (float32 arrays: no import)
        assert "ml_dtypes" not in sys.modules
        b = x.to(fg.bfloat16)
        assert "ml_dtypes" in sys.modules
        assert b.dtype is fg.bfloat16 and (b * 2).dtype is fg.bfloat16
        # rounded to bfloat16's 8 significant bits, to nearest
        assert b.float().tolist() == [1.0, 2.5, 3.140625, 0.333984375, -7.0], b.float().tolist()
        assert fg.zeros(2, dtype=fg.bfloat16).dtype is fg.bfloat16
        assert fg.tensor([0.5], dtype="bfloat16").dtype is fg.bfloat16
        assert x.bfloat16().dtype is fg.bfloat16
        assert dtypes.bfloat16.np.name == "bfloat16"
        """
    )


@needs_bfloat16
def test_numpy_bfloat16_arrays_give_bfloat16_tensors() -> None:
    # fusegrad first, ml_dtypes imported by the user afterwards: fusegrad's bfloat16 has not
    # met ml_dtypes yet when it is handed the array
    _run_fresh(
        """
        import fusegrad as fg
        import ml_dtypes
        import numpy as np

        a = np.array([1.5, -2.0, 0.1], ml_dtypes.bfloat16)
        for make in (fg.from_numpy, fg.tensor, fg.as_tensor, fg.asarray):
            t = make(a)
            assert t.dtype is fg.bfloat16, (make, t.dtype)
            assert t.numpy().tobytes() == a.tobytes(), make
        assert fg.dtypes.from_numpy_dtype(a.dtype) is fg.bfloat16
        assert fg.dtypes.as_dtype(ml_dtypes.bfloat16) is fg.bfloat16
        assert (fg.from_numpy(a) + 1).dtype is fg.bfloat16
        assert fg.tensor(a, dtype=fg.float32).tolist() == a.astype(np.float32).tolist()
        """
    )


@needs_bfloat16
def test_bfloat16_tensors_saved_here_load_in_a_fresh_process(tmp_path: os.PathLike) -> None:
    x = fg.tensor([1.0, -0.5, 3.14159, 1e-3]).to(fg.bfloat16)
    path = os.path.join(tmp_path, "bf16.pt")
    fg.save({"x": x, "dtype": fg.bfloat16}, path)
    _run_fresh(
        f"""
        import io, sys
        import fusegrad as fg

        fg.save({{"y": fg.ones(2)}}, io.BytesIO())  # (no bfloat16 value: no import)
        assert "ml_dtypes" not in sys.modules
        back = fg.load({path!r})
        assert back["x"].dtype is fg.bfloat16 and back["dtype"] is fg.bfloat16
        assert back["x"].numpy().tobytes() == {x.numpy().tobytes()!r}
        assert back["x"].float().tolist() == {x.float().tolist()!r}
        """
    )


def test_without_ml_dtypes_bfloat16_is_absent_and_says_why() -> None:
    # (a None entry in sys.modules makes ``import ml_dtypes`` fail, and find_spec say None)
    _run_fresh(
        """
        import sys

        sys.modules["ml_dtypes"] = None
        import numpy as np

        import fusegrad as fg
        from fusegrad import dtypes

        assert dtypes.bfloat16 is None and len(dtypes.ALL) == 11
        attempts = (
            lambda: fg.bfloat16,
            lambda: dtypes.as_dtype("bfloat16"),
            lambda: fg.ones(2).bfloat16(),
            lambda: fg.tensor([1.0], dtype="bfloat16"),
        )
        for attempt in attempts:
            try:
                attempt()
            except (AttributeError, TypeError) as e:
                assert "needs the optional ml_dtypes package" in str(e), e
            else:
                raise AssertionError("bfloat16 without ml_dtypes")
        assert fg.from_numpy(np.ones(2, np.float32)).dtype is fg.float32
        """
    )
