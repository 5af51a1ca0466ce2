"""Real programs written from PyTorch's public API (this folder), run with ``torch`` being
fusegrad (as ``import fusegrad as torch`` makes it) eagerly and compiled
(``torch.compile(model)``), and against PyTorch itself when it is importable: losses,
gradients and parameters after 5 training steps, in float64, from the same initial
parameters (fusegrad's initialisation, loaded into both)."""

from __future__ import annotations

import functools
import inspect
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

import fusegrad

from . import cnn, gpt, lstm_lbfgs, makemore, polynomial_regression, transformer_classifier


def _makemore(kind: str) -> Any:
    """makemore's model ``kind`` as a program (its ``build`` and ``run`` bound to it)."""
    return SimpleNamespace(
        build=functools.partial(makemore.build, kind=kind),
        run=functools.partial(makemore.run, kind=kind),
    )


PROGRAMS: dict[str, Any] = {
    "gpt": gpt,
    "cnn": cnn,
    "lstm_lbfgs": lstm_lbfgs,
    "transformer_classifier": transformer_classifier,
    "makemore_mlp": _makemore("mlp"),
    "makemore_gru": _makemore("gru"),
    "polynomial_regression": polynomial_regression,
}
WITH_DROPOUT = ("gpt", "cnn", "transformer_classifier")


def _initial_state(program: ModuleType | SimpleNamespace) -> dict:
    fusegrad.manual_seed(0)
    kwargs = {"dropout": 0.0} if "dropout" in inspect.signature(program.build).parameters else {}
    model = program.build(fusegrad, **kwargs).double()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _close(got: dict, want: dict, rtol: float, atol: float) -> None:
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=rtol, atol=atol)
    for part in ("grads", "params", "buffers"):
        if part not in want:
            continue
        assert sorted(got[part]) == sorted(want[part]), part
        for name, value in want[part].items():
            np.testing.assert_allclose(
                got[part][name], value, rtol=rtol, atol=atol, err_msg=f"{part} {name}"
            )


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_eager_matches_pytorch(name: str) -> None:
    torch: Any = pytest.importorskip("torch")
    program = PROGRAMS[name]
    state = _initial_state(program)
    want = program.run(torch, state, compiled=False)
    got = program.run(fusegrad, state, compiled=False)
    _close(got, want, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiled_matches_eager(name: str) -> None:
    """``torch.compile(model)``: the forward replayed as a program and the backward called
    outside it a second program; with dropout where the model has it (same draws)."""
    program = PROGRAMS[name]
    state = _initial_state(program)
    kwargs = {"dropout": 0.1} if name in WITH_DROPOUT else {}
    want = program.run(fusegrad, state, compiled=False, **kwargs)
    got = program.run(fusegrad, state, compiled=True, **kwargs)
    _close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["mlp", "gru"])
def test_makemore_samples_characters_with_a_generator(kind: str) -> None:
    """Sampling draws from fusegrad's generators (not PyTorch's stream): the words are
    reproducible and made of the vocabulary."""
    state = _initial_state(_makemore(kind))
    first = makemore.run(fusegrad, state, compiled=False, kind=kind)["sample"]
    again = makemore.run(fusegrad, state, compiled=False, kind=kind)["sample"]
    assert first == again and len(first) == 3
    assert all(0 < ix < makemore.VOCAB for word in first for ix in word)


def test_polynomial_regression_learns() -> None:
    out = polynomial_regression.run(fusegrad, None, compiled=False, steps=60)
    assert out["losses"][-1] < 0.2 * out["losses"][0]


def test_gpt_generates_with_topk_and_multinomial() -> None:
    out = gpt.run(fusegrad, _initial_state(gpt), compiled=False, steps=2)
    assert out["sample_shape"] == (2, 7) and out["sample_in_range"]
