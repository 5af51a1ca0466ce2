"""The autograd suite run inside ``compiled_autograd()`` (``FUSEGRAD_TEST_COMPILED=1``, see
tests/autograd/conftest.py): every test passes there too, except the known differences marked
``compiled_differs`` (strict expected failures), at least 95% of the backward calls compile,
and the coverage report is printed.  One subprocess, about a minute and a half."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_autograd_suite_passes_inside_compiled_autograd() -> None:
    env = dict(os.environ, FUSEGRAD_TEST_COMPILED="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/autograd"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    calls = re.search(
        r"backward calls: (\d+); compiled (\d+) \(([\d.]+)%\), fell back (\d+)", output
    )
    assert calls is not None, output[-3000:]
    total, compiled, _, fell_back = (float(g) for g in calls.groups())
    assert total == compiled + fell_back and compiled > 0
    # issue 12's target: at least 95% of the suite's backward calls run a compiled program
    # (custom Function backwards that cannot be traced run inside it as opaque steps)
    assert compiled >= 0.95 * total, output[output.index("compiled-autograd coverage") :]
    assert "as opaque steps:" in output
    print(output[output.index("compiled-autograd coverage") :])  # (shown with -s)
