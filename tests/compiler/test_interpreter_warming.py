"""The interpreter compiled ahead of a program (``workers.warm_interpreter``): the first call of
a compiled step starts a worker that compiles the interpreter's core machine into the disk
cache, so that the program's worker, which starts after the recording, loads it instead of
compiling it again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fusegrad.compiler import workers
from fusegrad.compiler.settings import config

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("fresh_compiler")


_CHILD = """
import numpy as np
import fusegrad as fg
from fusegrad import compiler

compiler.config.background_compile = False
rng = np.random.default_rng(0)
w = fg.tensor(rng.standard_normal((6, 4)).astype(np.float32), requires_grad=True)
with compiler.compiled_autograd():
    for _ in range(2):
        x = fg.tensor(rng.standard_normal((3, 6)).astype(np.float32))
        (x @ w).tanh().square().sum().backward()
assert compiler.counters.compiled_runs >= 1, compiler.counters
print("COUNTS", compiler.counters.compiles, compiler.counters.disk_hits)
"""


def _interpreter_compiles(cache: Path) -> tuple[int, int]:
    """(compiles, disk hits) of a fresh process that runs a small interpreted backward with
    ``cache`` as its disk caches."""
    import os
    import subprocess

    env = dict(os.environ)
    env.update(FUSEGRAD_CACHE_DIR=str(cache), NUMBA_CACHE_DIR=str(cache / "numba"))
    env["PYTHONPATH"] = str(REPO_ROOT)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("COUNTS"))
    compiles, hits = line.split()[1:]
    return int(compiles), int(hits)


def test_the_first_call_warms_the_interpreter_in_a_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``workers.warm_interpreter``: a worker compiles the interpreter's core machine into the
    disk cache, the specialisation a program's interpreted kernels call (a process that runs
    one then loads it: no compile, where a cold cache compiles it), and leaves a marker; with
    the marker, nothing starts again."""
    from fusegrad.compiler.codegen import interpreter

    warm, cold = tmp_path / "warm", tmp_path / "cold"
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(warm))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(warm / "numba"))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    monkeypatch.setattr(interpreter, "loaded", lambda core=False: False)  # (this process has it)
    monkeypatch.setattr(workers, "_warming", {})
    workers.warm_interpreter("float32")
    proc = workers._warming["float32"]
    workers.wait_for_warming()
    assert proc.returncode == 0
    assert list(warm.glob("fusegrad_interpreter_*"))
    monkeypatch.setattr(workers, "_warming", {})
    workers.warm_interpreter("float32")
    assert not workers._warming  # (the marker: warmed before)
    compiles, hits = _interpreter_compiles(warm)
    assert compiles == 0 and hits >= 1, (compiles, hits)
    assert _interpreter_compiles(cold)[0] >= 1


def test_compiling_a_step_or_module_asks_for_the_interpreter_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fusegrad.compile`` asks ``warm_interpreter`` for the default dtype's interpreter when it
    wraps a step or a module (a script builds its model and data before the first call: the
    interpreter's compile overlaps them), and a step's first call asks again (a no-op unless the
    default dtype changed); later calls do not ask, and ``mode="debug"`` (no kernels) never
    asks."""
    import fusegrad as fg

    asked: list[str] = []
    monkeypatch.setattr(workers, "warm_interpreter", asked.append)
    params: list[fg.Tensor] = []

    def step(x: fg.Tensor) -> fg.Tensor:
        (w,) = params
        w.grad = None
        loss = (x @ w).tanh().sum()
        loss.backward()
        with fg.no_grad():
            w -= 0.1 * w.grad
        return loss

    compiled = fg.compile(step)
    assert asked == ["float32"]
    fg.set_default_dtype(fg.float64)
    try:
        params.append(fg.randn(4, 3, requires_grad=True))
        for _ in range(3):
            compiled(fg.randn(2, 4))
    finally:
        fg.set_default_dtype(fg.float32)
    assert asked == ["float32", "float64"]
    params[0] = fg.randn(4, 3, requires_grad=True)
    asked.clear()
    fg.compile(fg.nn.Linear(3, 2))
    assert asked == ["float32"]
    asked.clear()
    debug = fg.compile(step, mode="debug")
    fg.compile(fg.nn.Linear(3, 2), mode="debug")
    for _ in range(3):
        debug(fg.randn(2, 4))
    assert asked == []
