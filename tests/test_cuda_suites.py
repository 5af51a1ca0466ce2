"""The CUDA test suites, each in a pytest process of its own (docs/ARCHITECTURE.md, contract 9):

* tests/cuda under numba's CUDA simulator: ``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is
  first imported, which this process has long done;
* tests/cuda without the simulator (``FUSEGRAD_CUDA_PTX=1``): every generated kernel and every
  kernel of the eager CUDA backend compiled to PTX, numba-cuda's real type inference (no GPU
  needed).

Both start together, as soon as the session knows it runs these tests (``tests/conftest.py``,
``tests/early_suites.py``), and run beside the rest of the suite; each test waits for its own,
saying how far it has got every ``PROGRESS_EVERY_S`` seconds (straight to the terminal, past
pytest's capture), and a failure shows the suite's output.  Marked ``cuda``: ``python -m pytest
-m "not cuda"`` leaves them out.  Skipped when numba-cuda is not installed (the ``cuda`` extra).
"""

from __future__ import annotations

import importlib.util

import early_suites
import pytest

TIMEOUT_S = 1800  # (of waiting)
PROGRESS_EVERY_S = 30

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        importlib.util.find_spec("numba_cuda") is None,
        reason="numba-cuda is not installed (pip install -e '.[cuda]'): CUDA suites not run",
    ),
]


def _check(name: str, capsys: pytest.CaptureFixture[str], *expected_files: str) -> None:
    def say(text: str) -> None:
        with capsys.disabled():
            print(f"\n[tests/test_cuda_suites.py] {text}", flush=True)

    try:
        done = early_suites.wait(early_suites.SUITES[name], TIMEOUT_S, PROGRESS_EVERY_S, say)
    except TimeoutError as e:
        pytest.fail(str(e))
    output = done.output
    assert done.returncode == 0, f"exit code {done.returncode}:\n{output[-20000:]}"
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary, output[-20000:]
    # the suite's own tests ran (were not all skipped by a mode check)
    for file in expected_files:
        assert f"SKIPPED [1] tests/cuda/{file}" not in output, output[-20000:]


def test_cuda_kernels_in_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    _check(
        "cuda-simulator",
        capsys,
        "test_cuda_kernels.py",
        "test_device_tensors.py",
        "test_eager_op_table.py",
        "test_training.py",
        "test_compiled_cuda.py",
        "test_nan_semantics_cuda.py",
        "test_pooling_cuda.py",
        "test_conv_cuda.py",
        "test_norms_cuda.py",
        "test_embedding_resample_cuda.py",
        "test_recurrent_cuda.py",
    )


def test_cuda_kernels_compile_to_ptx(capsys: pytest.CaptureFixture[str]) -> None:
    _check(
        "cuda-ptx",
        capsys,
        "test_cuda_ptx.py",
        "test_backend_ptx.py",
        "test_conv_pooling_ptx.py",
        "test_layer_kernels_ptx.py",
    )
