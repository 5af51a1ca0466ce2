"""The ``python -m fusegrad`` demo: a short in-process training run and the command line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fusegrad import __main__ as demo


def test_short_training_run_learns():
    # digits where scikit-learn is installed, else (as in CI's test extra) the synthetic set
    lines: list[str] = []
    result = demo.train(epochs=3, batch_size=64, lr=3e-3, seed=0, hidden=64, log=lines.append)
    assert len(result.history) == 3
    assert result.history[-1].train_loss < result.history[0].train_loss
    # 10 classes: chance is 10%; three epochs already give far more
    assert result.test_accuracy > 0.8
    epoch_lines = [line for line in lines if line.startswith("epoch")]
    assert len(epoch_lines) == 3 and "loss" in epoch_lines[0] and "ms" in epoch_lines[0]
    assert lines[-1].startswith("test accuracy:")
    assert all(s.step_ms > 0 for s in result.history)


def test_synthetic_fallback_is_learnable():
    rng = np.random.default_rng(0)
    x, y = demo._synthetic(rng)
    split = int(0.8 * len(x))
    data = demo.Dataset(
        x[:split].astype(np.float32),
        y[:split],
        x[split:].astype(np.float32),
        y[split:],
        10,
        "synthetic",
    )
    result = demo.train(epochs=3, hidden=64, log=lambda s: None, data=data)
    assert result.test_accuracy > 0.5


def test_load_data_falls_back_without_sklearn(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn...` fail
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    messages: list[str] = []
    data = demo.load_data(seed=0, log=messages.append)
    assert data.source == "synthetic" and "scikit-learn is not installed" in messages[0]
    assert data.x_train.shape[1] == 64 and data.n_classes == 10
    # standardised with training statistics
    np.testing.assert_allclose(data.x_train.mean(0), 0, atol=1e-5)


def test_split_is_stratified_and_disjoint():
    pytest.importorskip("sklearn")
    data = demo.load_data(seed=1, log=lambda s: None)
    assert data.source == "digits"
    assert len(data.x_train) + len(data.x_test) == 1797
    counts = np.bincount(data.y_test, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38  # ~20% of each class's ~180 images


def test_command_line_help():
    out = subprocess.run(
        [sys.executable, "-m", "fusegrad", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0
    for flag in ("--epochs", "--batch-size", "--lr", "--seed", "--hidden"):
        assert flag in out.stdout


def test_command_line_rejects_bad_arguments():
    out = subprocess.run(
        [sys.executable, "-m", "fusegrad", "--epochs", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2 and "must be positive" in out.stderr


def test_compiled_training_matches_eager_gradients() -> None:
    from fusegrad.__main__ import compare_gradients, load_data

    data = load_data(0, log=lambda msg: None)
    assert compare_gradients(data, hidden=32, seed=0, batch_size=16) < 1e-4
