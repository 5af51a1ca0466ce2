"""The ``python -m fusegrad`` demo: a short in-process training run and the command line."""

from __future__ import annotations

import pathlib
import re
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


def _result(step_ms: list[float], compiled: bool = False) -> demo.TrainResult:
    history = [demo.EpochStats(i + 1, 1.0 / (i + 1), 0.5, ms) for i, ms in enumerate(step_ms)]
    return demo.TrainResult(0.9, history, source="synthetic", compiled=compiled)


def test_speed_is_compiled_time_over_eager_time() -> None:
    # the benchmarks' convention: below 1x the compiled step is faster; epoch 1 (compiling)
    # is left out of the medians
    eager = _result([9.0, 4.0, 4.0, 4.2])
    compiled = _result([900.0, 2.0, 2.1, 2.0], compiled=True)
    line = demo.speed_line(eager, compiled)
    assert line.startswith("compiled step 0.50× eager time"), line
    assert "2.00 ms compiled vs 4.00 ms eager" in line
    assert demo.speed_line(compiled, eager).startswith("compiled step 2.00× eager time")


def test_compiled_run_says_compiling_before_its_first_step() -> None:
    lines: list[str] = []
    result = demo.train(epochs=2, hidden=32, seed=0, log=lines.append, compiled=True)
    compiling = [i for i, line in enumerate(lines) if line.startswith("compiling…")]
    first_epoch = next(i for i, line in enumerate(lines) if line.startswith("epoch"))
    assert len(compiling) == 1 and compiling[0] < first_epoch, lines
    # the first epoch records the step (and builds its program): its time is said
    assert result.history[0].compile_seconds > 0
    assert "recording and compiling" in lines[first_epoch]
    eager_lines: list[str] = []
    demo.train(epochs=1, hidden=32, seed=0, log=eager_lines.append)
    assert not any("compiling" in line for line in eager_lines)


def test_command_line_both_modes_prints_the_ratio_and_plots(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curves.png"
    assert demo.main(["--epochs", "2", "--hidden", "32", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^compiled step \d+\.\d\d× eager time", out, re.MULTILINE), out
    assert "compiling…" in out and f"training curves: {png}" in out
    assert "(match)" in out and "x;" not in out  # no eager/compiled "4.17x" any more
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_plot_draws_one_line_per_run_in_each_panel(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    original = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        drawn.append(self)
        original(self, *args, **kwargs)

    results = {"eager": _result([5.0, 4.0, 4.0]), "compiled": _result([50.0, 2.0, 2.0], True)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", keep)
        demo.plot_history(results, str(tmp_path / "c.png"))
    (fig,) = drawn
    loss_ax, acc_ax = fig.axes
    for ax in (loss_ax, acc_ax):
        assert [line.get_label().split()[0] for line in ax.get_lines()] == ["eager", "compiled"]
        assert list(ax.get_lines()[0].get_xdata()) == [1, 2, 3]
    assert list(loss_ax.get_lines()[1].get_ydata()) == [1.0, 0.5, 1 / 3]
    assert list(acc_ax.get_lines()[0].get_ydata()) == [50.0, 50.0, 50.0]
    assert (tmp_path / "c.png").stat().st_size > 0


def test_plot_without_matplotlib_says_so_before_training(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--plot", "curves.png"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib" in captured.err and "pip install matplotlib" in captured.err
    assert "epoch" not in captured.out  # nothing was trained
