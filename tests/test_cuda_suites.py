"""The CUDA test suites, each in a pytest process of its own (docs/ARCHITECTURE.md, contract 9):

* tests/cuda under numba's CUDA simulator: ``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is
  first imported, which this process has long done;
* tests/cuda without the simulator (``FUSEGRAD_CUDA_PTX=1``): every generated kernel and every
  kernel of the eager CUDA backend compiled to PTX, numba-cuda's real type inference (no GPU
  needed).

Both start together, as soon as pytest has collected these tests (``tests/conftest.py``), and
run beside the rest of the suite; each test waits for its own, and a failure shows the suite's
output.  The simulator suite takes minutes, so while a test waits it prints what it is
waiting for and, every ``PROGRESS_EVERY_S`` seconds, how far the suite has got (straight to the
terminal, past pytest's capture).  Marked ``cuda``: ``python -m pytest -m "not cuda"`` leaves
them out.  Skipped when numba-cuda is not installed (the ``cuda`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_S = 1800  # (from the suite's start, early in the session)
PROGRESS_EVERY_S = 30

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        importlib.util.find_spec("numba_cuda") is None,
        reason="numba-cuda is not installed (pip install -e '.[cuda]'): CUDA suites not run",
    ),
]


class _Suite:
    """One pytest process running tests/cuda; a thread reads its output as it comes, so a
    waiting test can say how far it has got: pytest -q ends each full line of results with
    "[ NN%]", and the results on the line being written count too (a slow module can take
    minutes to fill one)."""

    def __init__(self, title: str, extra_env: dict[str, str], drop: tuple[str, ...]) -> None:
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(extra_env)
        env["PYTHONUNBUFFERED"] = "1"  # progress as it happens, not when a pipe buffer fills
        self.title = title
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "tests/cuda", "-q", "-rs", "-p", "no:cacheprovider"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while chunk := os.read(fd, 65536):  # whatever has come, without waiting for a newline
            self.chunks.append(chunk)

    def output(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def progress(self) -> str:
        """How far the suite has got, in words."""
        text = self.output()
        percents = re.findall(r"\[\s*(\d+)%\]", text)
        line = text.rsplit("\n", 1)[-1]  # the line of results being written
        more = sum(line.count(c) for c in ".sFExX") if "%]" not in line else 0
        if percents:
            done = f"{percents[-1]}% of its tests done" + (f" and {more} more" if more else "")
        else:
            done = f"{more} tests done" if more else "collecting its tests"
        return f"{done}, after {time.monotonic() - self.started:.0f} s"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join(timeout=10)


_started: dict[str, _Suite] = {}


def start_early() -> None:
    """Start both suites now.  tests/conftest.py calls this as soon as collection has chosen
    these tests: the suites then take their minutes on the second core while the rest of the
    suite runs on the first, instead of after it."""
    if _started or importlib.util.find_spec("numba_cuda") is None:
        return
    _started["simulator"] = _Suite(
        "tests/cuda in numba's CUDA simulator",
        {"NUMBA_ENABLE_CUDASIM": "1"},
        ("FUSEGRAD_CUDA_PTX",),
    )
    _started["ptx"] = _Suite(
        "tests/cuda compiling every kernel to PTX",
        {"FUSEGRAD_CUDA_PTX": "1"},
        ("NUMBA_ENABLE_CUDASIM",),
    )


def stop_all() -> None:
    """Stop what still runs (the session ends, e.g. after ``-x``)."""
    for suite in _started.values():
        suite.stop()


@pytest.fixture(scope="module")
def suites() -> Iterator[dict[str, _Suite]]:
    start_early()  # (if conftest has not)
    yield _started
    stop_all()


def _say(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[tests/test_cuda_suites.py] {text}", flush=True)


def _check(suite: _Suite, capsys: pytest.CaptureFixture[str], *expected_files: str) -> None:
    if suite.process.poll() is None:
        _say(
            capsys,
            f"waiting for {suite.title} (a pytest process of its own, minutes on 2 cores; "
            f"progress every {PROGRESS_EVERY_S} s)",
        )
    while suite.process.poll() is None:
        try:
            suite.process.wait(timeout=PROGRESS_EVERY_S)
        except subprocess.TimeoutExpired:
            if time.monotonic() - suite.started > TIMEOUT_S:
                suite.stop()
                pytest.fail(f"the suite ran over {TIMEOUT_S} s:\n{suite.output()[-20000:]}")
            _say(capsys, f"{suite.title}: {suite.progress()}")
    suite.reader.join(timeout=60)
    output = suite.output()
    returncode = suite.process.returncode
    assert returncode == 0, f"exit code {returncode}:\n{output[-20000:]}"
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary, output[-20000:]
    # the suite's own tests ran (were not all skipped by a mode check)
    for name in expected_files:
        assert f"SKIPPED [1] tests/cuda/{name}" not in output, output[-20000:]


def test_cuda_kernels_in_the_simulator(
    suites: dict[str, _Suite], capsys: pytest.CaptureFixture[str]
) -> None:
    _check(
        suites["simulator"],
        capsys,
        "test_cuda_kernels.py",
        "test_device_tensors.py",
        "test_eager_op_table.py",
        "test_training.py",
        "test_compiled_cuda.py",
        "test_nan_semantics_cuda.py",
    )


def test_cuda_kernels_compile_to_ptx(
    suites: dict[str, _Suite], capsys: pytest.CaptureFixture[str]
) -> None:
    _check(suites["ptx"], capsys, "test_cuda_ptx.py", "test_backend_ptx.py")
