"""``fusegrad._malloc``: glibc's mmap and trim thresholds raised when fusegrad is imported, so
that a training step's arrays reuse freed heap memory instead of fresh pages.

Each case runs in a fresh process (the thresholds are process state): with the default
setting, a step's freed 3 MiB blocks are handed out again without touching new pages (counted as
minor page faults), where glibc's own thresholds give the freed heap top back and fault it in
again; ``FUSEGRAD_MALLOC=keep`` and the user's own ``MALLOC_*_`` variables leave malloc
alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's mallopt and getrusage page faults"
)

_PROBE = textwrap.dedent(
    """\
    import json, resource
    import numpy as np
    import fusegrad
    from fusegrad import _malloc
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def step():  # a step's arrays: four 3 MiB blocks, touched, then all freed
        blocks = [np.ones(3 << 18, np.float32) for _ in range(4)]
        del blocks
    for _ in range(3):  # warm: the heap has grown to hold them
        step()
    before = faults()
    for _ in range(20):
        step()
    print(json.dumps({"tuned": _malloc.tune(), "faults": faults() - before}))
    """
)


def _probe(**env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    full.pop("FUSEGRAD_MALLOC", None)
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=full, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_reused_without_new_pages() -> None:
    got = _probe()
    if not got["tuned"]:
        pytest.skip("this C library has no glibc mallopt")
    # 20 steps of 4 blocks of 768 pages each: about 60,000 faults if each came fresh
    assert got["faults"] < 1000, got


def test_keep_leaves_malloc_alone() -> None:
    got = _probe(FUSEGRAD_MALLOC="keep")
    assert got["tuned"] is False
    assert got["faults"] > 20 * 700, got  # the freed heap top trimmed and faulted again


def test_the_users_own_malloc_variables_win() -> None:
    got = _probe(MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    assert got["tuned"] is False
    assert got["faults"] > 20 * 700, got  # 3 MiB is above the user's 1 MiB threshold
