"""tests/cuda runs in processes of its own (started by tests/test_cuda_suites.py):

* ``NUMBA_ENABLE_CUDASIM=1``: ``test_cuda_kernels.py`` runs generated kernels in numba's CUDA
  simulator (the variable must be set before numba is first imported, hence a process of its own);
* ``FUSEGRAD_CUDA_PTX=1`` without the simulator: ``test_cuda_ptx.py`` compiles every generated
  kernel to PTX (numba-cuda's real type inference, which the simulator skips; no GPU needed).

In any other process (the main suite) each module skips itself, with the reason, before importing
``numba.cuda``.  The op table of tests/ops feeds the corpus.
"""

from __future__ import annotations

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ops"))

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and "numba" in sys.modules:
    from numba import config

    # numba read its configuration before the variable was set: kernels would not be simulated
    assert config.ENABLE_CUDASIM, "numba was imported before NUMBA_ENABLE_CUDASIM=1 was set"
