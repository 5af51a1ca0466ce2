"""Background compiles in worker processes (``compiler.workers``, ``config.compile_workers``):
numba compiles a whole step's program in a process of its own and fills the disk cache; the
user's process then loads the compiled code.  The worker outlives a script that exits first."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn
from fusegrad.compiler import workers
from fusegrad.compiler.program import Program
from fusegrad.compiler.settings import config

pytestmark = pytest.mark.usefixtures("fresh_compiler")

REPO_ROOT = Path(__file__).resolve().parents[2]


def _train(
    compiled: bool, steps: int, wait: bool = True, uncompiled: list | None = None
) -> tuple[list[float], list[np.ndarray]]:
    """``steps`` SGD steps of a small MLP (``compiled``: through ``fg.compile``, waiting for
    the background compile after the third call when ``wait``); ``uncompiled`` gets, per call,
    whether it ran uncompiled."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    opt = fg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    fn = fg.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    losses = []
    for i in range(steps):
        x = fg.tensor(rng.standard_normal((8, 6)))
        y = fg.tensor(rng.integers(0, 3, 8))
        before = compiler.counters.uncompiled_runs
        losses.append(fn(x, y).item())
        if uncompiled is not None:
            uncompiled.append(compiler.counters.uncompiled_runs > before)
        if compiled and wait and i == 2:
            assert compiler.wait_for_compiles(300)
    return losses, [p.detach().numpy() for p in model.parameters()]


def test_a_worker_process_compiles_the_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any
) -> None:
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    monkeypatch.setattr(config, "native_programs", False)  # (one stage: the program of steps)
    monkeypatch.setattr(config, "interpreter_max_elements", 0)  # (numba compiles every kernel)
    want = _train(False, 6)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            got = _train(True, 6)
    finally:
        compiler.set_logs(None)
    assert "a worker compiled the program" in caplog.text, caplog.text
    assert compiler.counters.uncompiled_runs >= 1, compiler.counters
    assert compiler.counters.step_runs >= 3, compiler.counters  # compiled after the wait
    # the worker compiled; this process only loaded its code from the disk cache (or had it
    # already: an earlier test of this process may have compiled the same kernels)
    assert compiler.counters.compiles == 0, compiler.counters
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    assert not list(tmp_path.glob("fusegrad_worker_*.pkl"))  # (the payload was removed)


def test_a_program_a_worker_compiled_before_loads_without_a_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any
) -> None:
    """The worker leaves a marker beside the disk cache; the next background compile of the
    same program (here after ``compiler.reset``, as in a new process) loads the code on its
    thread instead of starting a worker, with the same results."""
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    monkeypatch.setattr(config, "native_programs", False)
    want = _train(False, 6)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            _train(True, 6)
            assert "a worker compiled the program" in caplog.text, caplog.text
            assert list(tmp_path.glob("fusegrad_compiled_*.done"))
            caplog.clear()
            compiler.reset()
            spawned: list = []
            monkeypatch.setattr(workers, "_spawn", lambda *a: spawned.append(a))
            got = _train(True, 6)
    finally:
        compiler.set_logs(None)
    assert not spawned
    assert "loaded without a worker" in caplog.text, caplog.text
    assert compiler.counters.step_runs >= 3, compiler.counters
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_a_call_waits_for_a_program_the_cache_only_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where a worker compiled the program before, the background job only loads its code:
    the call that started it waits for that (``service.LOAD_WAIT``) and runs compiled, rather
    than run uncompiled beside the load (and slow it: both need the GIL)."""
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    monkeypatch.setattr(config, "native_programs", False)
    want = _train(False, 8)
    _train(True, 3)  # (a worker compiles it: its marker is written)
    assert list(tmp_path.glob("fusegrad_compiled_*.done"))
    compiler.reset()
    prepare = Program.prepare

    def slow(self: Program, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # (a large program's load)
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(Program, "prepare", slow)
    before = workers.compiled_before

    def late(program: Program) -> bool:
        time.sleep(0.2)  # (a busy machine: the job decides after the next call has begun)
        return before(program)

    monkeypatch.setattr(workers, "compiled_before", late)
    uncompiled: list = []
    got = _train(True, 8, wait=False, uncompiled=uncompiled)
    # the third call starts the job, waits for it and runs compiled
    assert uncompiled == [False] * 8, uncompiled
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)

    # a program nobody compiled before: the calls do not wait for its compile
    compiler.reset()
    monkeypatch.setattr(workers, "compiled_before", lambda program: False)
    monkeypatch.setattr(workers, "compile_elsewhere", lambda *args: None)  # (compiles here)
    monkeypatch.setattr(config, "quick_programs", False)  # (a quick tier may only load)
    uncompiled.clear()
    _train(True, 8, wait=False, uncompiled=uncompiled)
    assert uncompiled[:5] == [False, False, True, True, True], uncompiled


def test_a_graph_that_does_not_pickle_compiles_on_the_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any
) -> None:
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    monkeypatch.setattr(config, "native_programs", False)  # (one stage: the program of steps)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("cannot pickle this")

    monkeypatch.setattr(workers.pickle, "dumps", refuse)
    want = _train(False, 5)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            got = _train(True, 5)
    finally:
        compiler.set_logs(None)
    assert "not in a worker process: the program does not pickle" in caplog.text, caplog.text
    assert compiler.counters.step_runs >= 2, compiler.counters
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


_SCRIPT = """
import fusegrad as fg, numpy as np
from fusegrad import compiler, nn
compiler.set_logs("perf")
fg.manual_seed(0)
compiler.config.interpreter_max_elements = 0  # (every kernel generated: numba compiles)
model = nn.Sequential(nn.Linear(5, 9), nn.GELU(), nn.Linear(9, 2)).double()
opt = fg.optim.Adam(model.parameters(), lr=0.01)

@fg.compile
def step(x):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    return loss

x = fg.tensor(np.linspace(-1, 1, 15).reshape(3, 5))
for _ in range(3):
    step(x)
print("counters", compiler.counters.compiles, compiler.counters.disk_hits, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="waits on /proc")
def test_a_script_that_exits_first_leaves_the_cache_filled(tmp_path: Path) -> None:
    env = dict(os.environ, FUSEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    env["FUSEGRAD_BACKGROUND_COMPILE"] = "1"
    env["FUSEGRAD_NATIVE"] = "0"  # (one stage: the program of steps)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    first = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    # it exited while its step compiled (every call ran uncompiled); the worker goes on
    assert "counters 0 " in first.stdout, first.stdout
    pids = [int(p) for p in _worker_pids(first.stderr)]
    assert pids, first.stderr
    deadline = time.monotonic() + 300
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    env["FUSEGRAD_BACKGROUND_COMPILE"] = "0"
    second = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr
    # the next run compiles nothing: every kernel comes from the cache the worker filled
    compiles, hits = (int(n) for n in second.stdout.split()[1:3])
    assert compiles == 0 and hits > 0, second.stdout


def _worker_pids(stderr: str) -> list[str]:
    """The process ids of the workers the ``perf`` log announced."""
    return [line.rsplit(" ", 1)[1] for line in stderr.splitlines() if "worker process " in line]


def test_one_worker_per_program_across_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any
) -> None:
    """While another process's worker holds a program's lock, a compile of the same program
    waits for it instead of starting a second worker, then loads (here: compiles) the code."""
    fcntl = pytest.importorskip("fcntl")
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    monkeypatch.setattr(config, "native_programs", False)
    monkeypatch.setattr(workers, "identity", lambda program: b"the same program")
    name = hashlib.sha1(b"the same program").hexdigest()[:20]
    held = os.open(tmp_path / f"fusegrad_worker_{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # (as the other process's worker would)
    spawned: list = []
    monkeypatch.setattr(workers, "_spawn", lambda *a: spawned.append(a))
    want = _train(False, 6)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            threading.Timer(1.0, lambda: os.close(held)).start()  # the other worker is done
            got = _train(True, 6)
    finally:
        compiler.set_logs(None)
    assert not spawned
    assert "another process's worker compiled the program" in caplog.text, caplog.text
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_workers_wait_for_a_compile_slot_across_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """At most ``slots()`` workers compile at once on the machine: a slot held by one process
    is not free for another until it is released."""
    pytest.importorskip("fcntl")
    monkeypatch.setenv("FUSEGRAD_COMPILE_SLOTS", "2")
    assert workers.slots() == 2
    monkeypatch.setenv("FUSEGRAD_COMPILE_SLOTS", "")
    assert workers.slots() == max(1, (os.cpu_count() or 2) - 1)
    first = workers.try_slot(str(tmp_path), 2)
    second = workers.try_slot(str(tmp_path), 2)
    assert first is not None and second is not None
    probe = (
        "import sys; from fusegrad.compiler import workers; "
        "print(workers.try_slot(sys.argv[1], 2) is not None)"
    )

    def other_process_gets_one() -> bool:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return out.stdout.strip() == "True"

    assert not other_process_gets_one()
    os.close(first)
    assert other_process_gets_one()
    os.close(second)


def test_a_later_candidates_worker_leaves_the_slot_to_a_waiting_first_program(
    tmp_path: Path,
) -> None:
    """``take_slot(later=True)`` (a program's native segments or larger generated kernels:
    the program already runs compiled) takes no slot while a first program's worker waits for
    one (its marker names a live process), and takes it once that worker stops waiting.  A
    marker of a process that is gone is removed, not waited for.  A first program's worker
    marks itself while it waits and removes its marker with the slot."""
    pytest.importorskip("fcntl")
    directory = str(tmp_path)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    stale = tmp_path / f"fusegrad_worker_first_{int(gone.stdout)}.wait"
    stale.touch()
    assert not workers.first_waiting(directory)
    assert not stale.exists()
    waiting = tmp_path / f"fusegrad_worker_first_{os.getpid()}.wait"  # (this process: alive)
    waiting.touch()
    assert workers.first_waiting(directory)
    taken: list[int] = []
    later = threading.Thread(
        target=lambda: taken.append(workers.take_slot(directory, 1, poll_s=0.02, later=True))
    )
    later.start()
    time.sleep(0.5)
    assert not taken  # the slot is free, but a first program waits
    waiting.unlink()
    later.join(30)
    assert taken and taken[0] >= 0
    os.close(taken[0])
    # a first program's worker: its marker exists while it waits, and not after
    held = workers.try_slot(directory, 1)
    assert held is not None
    first: list[int] = []
    thread = threading.Thread(
        target=lambda: first.append(workers.take_slot(directory, 1, poll_s=0.02))
    )
    thread.start()
    time.sleep(0.3)
    assert workers.first_waiting(directory) and not first
    os.close(held)
    thread.join(30)
    assert first and not workers.first_waiting(directory)
    os.close(first[0])


def test_a_program_without_generated_code_is_named_alike_by_a_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``workers.identity`` of a program with no generated module (every kernel interpreted)
    is its pickled graph: the same after the round trip a worker's copy went through, so the
    worker's marker (and a trial's remembered choice) names it in the next process too -- the
    raw bytes differed, and such a step started a worker in every process."""
    import pickle

    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(config, "background_compile", True)
    monkeypatch.setattr(config, "compile_workers", True)
    seen: list = []
    elsewhere = workers.compile_elsewhere

    def recorded(program: Program, *args: Any) -> Any:
        seen.append(program)
        return elsewhere(program, *args)

    monkeypatch.setattr(workers, "compile_elsewhere", recorded)
    x, w = fg.randn(64, requires_grad=True), fg.randn(64)
    opt = fg.optim.SGD([x], lr=0.1)

    @fg.compile
    def step() -> fg.Tensor:
        opt.zero_grad()
        h = x
        for _ in range(5):
            h = (h * w + 0.1).tanh()
        loss = h.sum()
        loss.backward()
        opt.step()
        return loss

    for _ in range(4):
        step()
    assert compiler.wait_for_compiles(300)
    plain = [p for p in seen if not p.source_path]
    assert plain, [p.source_path for p in seen]
    for program in plain:
        graph, settings = pickle.loads(pickle.dumps((program.graph, program.settings)))
        assert workers.identity(Program(graph, **settings)) == workers.identity(program)
        assert workers.compiled_before(program)


def test_a_worker_gets_this_processs_numba_pool_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """numba's pool size is fixed at its import, and a program's native segments depend on it:
    a script that sets ``NUMBA_NUM_THREADS`` after importing fusegrad must not give its workers
    another size than its own (they would build another program than the one it loads)."""
    import numba

    from fusegrad.compiler.codegen import numba_cpu

    own = numba.config.NUMBA_NUM_THREADS
    assert numba_cpu.POOL_THREADS == own
    monkeypatch.setenv("NUMBA_NUM_THREADS", str(own + 3))
    env = workers._worker_env(str(tmp_path))
    assert env["FUSEGRAD_CACHE_DIR"] == str(tmp_path)
    assert env["NUMBA_NUM_THREADS"] == str(own)
    seen = subprocess.run(
        [sys.executable, "-c", "import numba; print(numba.config.NUMBA_NUM_THREADS)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(seen.stdout) == own
