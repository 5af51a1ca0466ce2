"""The CUDA test suites, each in a pytest process of its own (DESIGN.md contract 9):

* tests/cuda under numba's CUDA simulator: ``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is
  first imported, which this process has long done;
* tests/cuda without the simulator (``FUSEGRAD_CUDA_PTX=1``): every generated kernel and every
  kernel of the eager CUDA backend compiled to PTX, numba-cuda's real type inference (no GPU
  needed).

Both start together (they run concurrently) and each test waits for its own; a failure shows the
suite's output.  Skipped only when numba-cuda is not installed (the ``cuda`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_S = 900

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip(
        "numba-cuda is not installed (pip install -e '.[cuda]'): CUDA suites not run",
        allow_module_level=True,
    )


def _start(extra_env: dict[str, str], drop: tuple[str, ...]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra_env)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "tests/cuda", "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def suites() -> Iterator[dict[str, subprocess.Popen]]:
    started = {
        "simulator": _start({"NUMBA_ENABLE_CUDASIM": "1"}, ("FUSEGRAD_CUDA_PTX",)),
        "ptx": _start({"FUSEGRAD_CUDA_PTX": "1"}, ("NUMBA_ENABLE_CUDASIM",)),
    }
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


def _check(process: subprocess.Popen, *expected_files: str) -> None:
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"the suite ran over {TIMEOUT_S} s:\n{output[-20000:]}")
    assert process.returncode == 0, f"exit code {process.returncode}:\n{output[-20000:]}"
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary, output[-20000:]
    # the suite's own tests ran (were not all skipped by a mode check)
    for name in expected_files:
        assert f"SKIPPED [1] tests/cuda/{name}" not in output, output[-20000:]


def test_cuda_kernels_in_the_simulator(suites: dict[str, subprocess.Popen]) -> None:
    _check(
        suites["simulator"],
        "test_cuda_kernels.py",
        "test_device_tensors.py",
        "test_eager_op_table.py",
        "test_training.py",
        "test_compiled_cuda.py",
        "test_nan_semantics_cuda.py",
    )


def test_cuda_kernels_compile_to_ptx(suites: dict[str, subprocess.Popen]) -> None:
    _check(suites["ptx"], "test_cuda_ptx.py", "test_backend_ptx.py")
