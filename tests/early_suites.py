"""Test suites that run as pytest processes of their own, started as soon as the session knows
it will run them, so that they take their minutes beside the rest of the suite instead of after
it (``tests/conftest.py`` starts them; the tests that wait for them live in the files named in
``SUITES``):

* tests/cuda under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` must be set before numba
  is first imported, which the main process has long done);
* tests/cuda without the simulator, compiling every kernel to PTX (``FUSEGRAD_CUDA_PTX=1``);
* tests/autograd inside ``compiled_autograd()`` (``FUSEGRAD_TEST_COMPILED=1``).

The suites work the same with and without pytest-xdist (``python -m pytest -n 2``): the process
that starts them (the xdist controller, or the one pytest process) gives each a directory
(``FUSEGRAD_EARLY_DIR``, inherited by the workers), where a suite writes its output as it runs
(``<name>.log``) and, when it ends, its exit code (``<name>.rc``); a waiting test, in whichever
worker, reads both.  A test run on its own (no ``FUSEGRAD_EARLY_DIR``) starts its suite itself.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = "FUSEGRAD_EARLY_DIR"


@dataclass(frozen=True)
class Suite:
    name: str
    title: str  # in words, for the waiting test's messages
    paths: tuple[str, ...]  # what pytest runs
    env: tuple[tuple[str, str], ...]  # set for it
    drop: tuple[str, ...]  # removed from its environment
    test_file: str  # the file whose test waits for it (relative to the repository)


SUITES = {
    s.name: s
    for s in (
        Suite(
            "cuda-simulator",
            "tests/cuda in numba's CUDA simulator",
            ("tests/cuda",),
            (("NUMBA_ENABLE_CUDASIM", "1"),),
            ("FUSEGRAD_CUDA_PTX",),
            "tests/test_cuda_suites.py",
        ),
        Suite(
            "cuda-ptx",
            "tests/cuda compiling every kernel to PTX",
            ("tests/cuda",),
            (("FUSEGRAD_CUDA_PTX", "1"),),
            ("NUMBA_ENABLE_CUDASIM",),
            "tests/test_cuda_suites.py",
        ),
        Suite(
            "autograd-compiled",
            "tests/autograd inside compiled_autograd()",
            ("tests/autograd",),
            (("FUSEGRAD_TEST_COMPILED", "1"),),
            (),
            "tests/compiler/test_autograd_suite_compiled.py",
        ),
    )
}

# a runner that writes the suite's exit code once it has ended (atomically: a reader never sees
# half a file)
_RUNNER = (
    "import os, subprocess, sys\n"
    "log, rc = sys.argv[1], sys.argv[2]\n"
    "with open(log, 'wb') as out:\n"
    "    code = subprocess.call(sys.argv[3:], stdout=out, stderr=subprocess.STDOUT)\n"
    "with open(rc + '.tmp', 'w') as f:\n"
    "    f.write(str(code))\n"
    "os.replace(rc + '.tmp', rc)\n"
)

_running: dict[str, subprocess.Popen] = {}


def directory() -> pathlib.Path:
    """This session's directory for the suites (made on first use, in the environment so that
    workers and subprocesses find it)."""
    found = os.environ.get(ENV)
    if not found:
        found = tempfile.mkdtemp(prefix="fusegrad-early-")
        os.environ[ENV] = found
    return pathlib.Path(found)


def wanted(test_files: set[str]) -> list[Suite]:
    """The suites whose waiting test is among ``test_files`` (paths relative to the repo)."""
    return [s for s in SUITES.values() if s.test_file in test_files]


def start(suite: Suite) -> None:
    """Start ``suite`` now, unless this session already did (its log exists)."""
    where = directory()
    log = where / f"{suite.name}.log"
    if suite.name in _running or log.exists():
        return
    log.touch()
    env = {k: v for k, v in os.environ.items() if k not in suite.drop}
    env.update(suite.env)
    env["PYTHONUNBUFFERED"] = "1"  # progress as it happens, not when a pipe buffer fills
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [sys.executable, "-m", "pytest", *suite.paths, "-q", "-rs", "-p", "no:cacheprovider"]
    _running[suite.name] = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(log), str(where / f"{suite.name}.rc"), *command],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # (its own process group: ``stop_all`` ends it and its pytest)
    )


def stop_all() -> None:
    """End the suites this process started that still run (the session ends early)."""
    for proc in _running.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
    _running.clear()


@dataclass
class Result:
    returncode: int
    output: str


def output_of(suite: Suite) -> str:
    log = directory() / f"{suite.name}.log"
    return log.read_text(errors="replace") if log.exists() else ""


def progress(suite: Suite, started: float) -> str:
    """How far the suite has got, in words: pytest -q ends each full line of results with
    "[ NN%]", and the results on the line being written count too."""
    text = output_of(suite)
    percents = re.findall(r"\[\s*(\d+)%\]", text)
    line = text.rsplit("\n", 1)[-1]
    more = sum(line.count(c) for c in ".sFExX") if "%]" not in line else 0
    if percents:
        done = f"{percents[-1]}% of its tests done" + (f" and {more} more" if more else "")
    else:
        done = f"{more} tests done" if more else "collecting its tests"
    return f"{done}, after {time.monotonic() - started:.0f} s of waiting"


def wait(suite: Suite, timeout_s: float, every_s: float, say: object) -> Result:
    """Wait for ``suite`` (starting it if no one has), saying how far it has got every
    ``every_s`` seconds through ``say(text)``; its exit code and output."""
    if not (directory() / f"{suite.name}.log").exists():
        start(suite)
    rc = directory() / f"{suite.name}.rc"
    started = time.monotonic()
    if not rc.exists():
        say(f"waiting for {suite.title} (a pytest process of its own; progress every {every_s} s)")
    last = started
    while not rc.exists():
        now = time.monotonic()
        if now - started > timeout_s:
            stop_all()
            raise TimeoutError(
                f"{suite.title} ran over {timeout_s} s:\n{output_of(suite)[-20000:]}"
            )
        if now - last >= every_s:
            say(f"{suite.title}: {progress(suite, started)}")
            last = now
        time.sleep(0.5)
    return Result(int(rc.read_text()), output_of(suite))
