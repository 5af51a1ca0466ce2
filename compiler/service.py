"""The compilation service: the one owner of a program's life, from a front end's key to code
that runs.

The three front ends -- compiled autograd (``region``), whole steps (``step``: ``compile(fn)``)
and compiled modules (``module``: ``compile(model)``) -- each turn a call into a key and a graph
(a captured backward, a recorded step, a module's forward and backward).  What happens to that
graph from then on is decided here, once for all three:

* **the caches** (``Service.graphs``: walk key -> captured graphs; ``Service.tapes``: the
  walk-free path; ``Service.batched``: Jacobian programs) and their bounds (``config``); the
  refusals they remember (``GraphEntry.refused``, a recording's break reason in ``Recordings``);
* **building** a ``Program`` from a graph and the configuration (``Service.build``: the only
  place a program is constructed);
* **compiling** it -- in the foreground, or on a thread of its own while the calls run
  uncompiled (``Service.obtain`` with a ``Background``: the one state machine of a program's
  life, ``Slot``: building -> ready, or failed and built again by the next call);
* **promoting** it (the first call after the background compile finished runs the compiled
  program) and **evicting** it (bounded tables: ``Programs``, ``Recordings``);
* **the compile notice** (``CompileNotice``: one line on stderr when a compile is slow);
* **the recording policy** of whole steps and modules (``Recordings``: at most
  ``config.step_recordings`` guard keys per function or module, then one logged reason).

Everything it does is reported through ``events``.  See docs/ARCHITECTURE.md, "The
compilation service".
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from fusegrad.dtypes import get_default_dtype

from . import events, logs, workers
from . import trace as _trace
from .cache import LRU, KeyHistory, Programs, Slot
from .codegen import diskcache, numba_cpu
from .events import emit
from .ir import Graph
from .passes.fuse import Extern, Kernel
from .program import Program
from .settings import config


class CompileNotice:
    """One line on stderr when capturing, building and first running (numba's JIT) something
    takes longer than ``config.compile_notice_s``: printed by a timer while it still runs, or at
    the end if the timer had no chance to.  Cache hits never start one (``start`` is called on
    the slow paths only)."""

    __slots__ = ("lock", "said", "start_time", "timer", "what")

    def __init__(self) -> None:
        self.timer: threading.Timer | None = None  # (the rest is made by ``start``)

    def start(self, what: str) -> None:
        """The slow path began; ``what`` names what compiles."""
        limit = config.compile_notice_s
        if self.timer is not None or limit is None:
            return
        self.what = what
        self.said = False
        self.lock = threading.Lock()
        self.start_time = time.perf_counter()
        self.timer = threading.Timer(limit, self.say)
        self.timer.daemon = True
        self.timer.start()

    def say(self) -> None:
        with self.lock:
            if self.said:
                return
            self.said = True
        print(
            f"fusegrad.compiler: compiling {self.what} (capture, fusion and numba's JIT: once; "
            "later calls reuse it, later processes load it from the disk cache)",
            file=sys.stderr,
            flush=True,
        )

    def stop(self) -> None:
        timer = self.timer
        if timer is None:
            return
        timer.cancel()
        limit = config.compile_notice_s
        if limit is not None and time.perf_counter() - self.start_time >= limit:
            self.say()

    def __enter__(self) -> CompileNotice:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---- background compiles -----------------------------------------------------------------------


# How long a call waits for a background job that only loads its program's code from the disk
# cache (``BackgroundBuild.loading``) before it runs uncompiled instead.  Measured on the GPT step
# (warm, 1 thread, a busy machine): loading took 76 ms of the thread's time but 0.19 s of wall
# time beside the calls that ran uncompiled meanwhile, switching the interpreter lock with it.
# The call that starts the job waits too (``Service._from_job``).
LOAD_WAIT = 1.0

# ``publish(program, origin)``: the calls run ``program`` while the job goes on; ``origin`` is
# the job's first program (it names a trial's choice on disk)
Publish = Callable[..., None]


class BackgroundBuild:
    """A program built and run once on scratch data (``work``: build, then ``Program.prepare``:
    numba compiles or loads its kernels), on a daemon thread of its own, while the calls that
    need it run uncompiled.  The thread may read arrays the uncompiled calls update meanwhile
    (parameters): the values it computes are thrown away, only the compiled code is kept."""

    def __init__(
        self, work: Callable[[Publish, BackgroundBuild], Program], uncompiled: Any, what: str
    ) -> None:
        self.program: Program | None = None
        self.uncompiled = uncompiled
        # a first program the calls may run while the job goes on (``work`` publishes it:
        # a compiled program of steps, while its native segments compile)
        self.first: Program | None = None
        # the job's first program, which names a trial's choice on disk (``remember_choice``)
        self.origin: Program | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.done = threading.Event()
        # ``work`` says so when what it makes first is only loaded from the disk cache (a
        # worker compiled it before): a call then waits for it (``LOAD_WAIT``) rather than run
        # uncompiled beside it; ``ready`` is set once a program is published or the job is done
        self.loading = False
        self.ready = threading.Event()
        # set once ``loading`` is known (the first program's compile starts, the job waits for
        # the interpreter's worker, publishes or ends): a call waits for that first
        self.decided = threading.Event()
        # waiting for a worker process (no numba on this thread meanwhile: a process that
        # exits need not wait for it, ``_finish_compiles_at_exit``)
        self.waiting = False
        with _jobs_lock:
            _jobs.add(self)
            numba_cpu.background_compiles += 1  # (serial kernels meanwhile: ``use_parallel``)
        thread = threading.Thread(
            target=self._work, args=(work, what), name="fusegrad-compile", daemon=True
        )
        thread.start()

    def _work(self, work: Callable[[Publish, BackgroundBuild], Program], what: str) -> None:
        notice = CompileNotice()
        notice.start(what)
        start = time.perf_counter()

        def publish(program: Program, origin: Program) -> None:
            self.first = program
            self.origin = origin
            self.ready.set()
            self.decided.set()
            notice.stop()

        try:
            self.program = work(publish, self)
        except BaseException as e:  # (reported by the call that picks the program up)
            self.error = e
        finally:
            self.seconds = time.perf_counter() - start
            notice.stop()
            with _jobs_lock:
                numba_cpu.background_compiles -= 1
            self.done.set()
            self.ready.set()
            self.decided.set()
            with _jobs_lock:
                _jobs.discard(self)


def _compile(
    program: Program,
    prepare_args: tuple,
    launch: workers.Launch | None,
    job: BackgroundBuild | None = None,
) -> None:
    """Run ``program`` once on the warm-up's scratch arrays, so that numba compiles (or loads)
    what it calls; with ``launch``, a worker process compiles it first and this thread loads
    the worker's code from the disk cache.  For ``job``'s first program, ``job.loading`` says
    whether this only loads it: a worker compiled it before, or it is a quick tier (no generated
    code) whose interpreter is on disk (its load ran beside uncompiled calls before)."""
    if job is not None and job.first is None:
        if launch is not None:
            job.loading = workers.compiled_before(program)
        else:
            job.loading = program.settings["quick"] and workers.interpreter_ready(
                get_default_dtype().name
            )
        job.decided.set()
    try:
        if launch is not None:
            if job is not None:
                job.waiting = True
            try:
                why = workers.compile_elsewhere(program, prepare_args, launch)
            finally:
                if job is not None:
                    job.waiting = False
            if why is not None:
                logs.log("perf", f"compiled on a thread, not in a worker process: {why}")
    finally:
        if launch is not None:
            launch.done()
    if launch is not None and _exiting.is_set():
        # (the process ends: the worker filled the cache for the next one)
        raise RuntimeError("the process is exiting: the program was not loaded")
    program.prepare(*prepare_args)


def _upgrades(program: Program) -> bool:
    """Whether a background compile goes on to the native segments of ``program``, a recorded
    step's or module's program of steps (``config.native_programs`` None: True builds them at
    once, False never)."""
    return (
        config.native_programs is not False
        and program.settings["hot"]
        and not program.settings["quick"]
        and not program.native
        and program.device == "cpu"
        and program.mode != "debug"
        and program.native_eligible
    )


def _quick_first(program: Program) -> Program | None:
    """The first tier of ``program``'s background compile, or None: where ``program`` (a
    recorded step's or module's program of steps, on the CPU) has kernels to generate that the
    interpreter could run (row kernels, kernels over its bound) and no worker compiled it before
    (``workers.compiled_before``: a warm start loads it at once), the same graph with every
    interpretable kernel interpreted and the rest by eager kernels (``Program.quick``), which
    generates no code.  Measured on the GPT step, cold: the program of steps generates 20 row
    kernels, about 15 s of numba's compile in a worker; the quick tier runs from the first call
    after the interpreter's compile (a worker started when the step was wrapped)."""
    if (
        config.quick_programs is not None
        or not program.settings["hot"]
        or program.settings["quick"]
        or program.native
        or program.device != "cpu"
        or program.mode != "default"
        or program.interpreter_max_elements <= 0
        or workers.compiled_before(program)
    ):
        return None
    quick = Program(program.graph, **{**program.settings, "quick": True})
    if _generated_kernels(quick) >= _generated_kernels(program):
        return None
    return quick


def _generated_kernels(program: Program) -> int:
    """How many kernels of ``program``'s variant for its capture's sizes are generated code."""
    schedule = program.default.schedule
    return sum(
        1
        for k, s in enumerate(schedule.steps)
        if isinstance(s, Kernel) and k not in schedule.interpreted
    )


def _specialises(program: Program) -> bool:
    """Whether a background compile goes on to native segments at the call's sizes
    (``Program.per_size``) for ``program``, a captured backward's program of steps on the CPU:
    where it has at least ``NATIVE_MIN_STEPS`` steps (fewer leave little for a segment to save,
    and native code generates every kernel, which the interpreter can beat on small ones)."""
    return (
        config.native_programs is not False
        and not program.settings["hot"]
        and not program.per_size
        and program.device == "cpu"
        and program.mode != "debug"
        and len(program.default.schedule.steps) >= NATIVE_MIN_STEPS
    )


# a captured backward of fewer steps gets no native candidate (``_specialises``): a segment
# saves each step's dispatch from Python (a few microseconds), and the GPT step's backward has 67
NATIVE_MIN_STEPS = 16
# the two candidates of each kind of trial (``Trial.what``; the first names its choice on disk)
NATIVE = ("native segments", "the program of steps")
NATIVE_AT_SIZES = ("native segments at the call's sizes", "the program of steps")

# a program that interprets a kernel over more than this many elements
# (``config.interpreter_max_elements`` allows up to 65,536) gets a second candidate from its
# background compile: the same graph with generated code for those kernels.  Measured on the
# GPT step's backward (kernels of 16,384 to 49,152 elements): 4.5 ms interpreted, 2.8 ms
# generated; a 200-op chain on 1,000 elements stays interpreted (10x faster there).  Whole
# steps too (one thread, ms per step, interpreted -> generated): DCGAN 41.8 -> 35.8, the
# Transformer 21.7 -> 18.1, GPT 6.6 -> 6.0
GENERATED_ABOVE = 4096


def _generates_more(program: Program, sizes: tuple | None) -> bool:
    """Whether a background compile goes on to ``program``'s graph with generated code for
    its kernels over ``GENERATED_ABOVE`` elements: a CPU program (a recorded step's or
    module's goes to native segments instead where those are enabled, ``_upgrades``) whose
    variant for ``sizes`` interprets such a kernel."""
    if (
        program.device != "cpu"
        or program.mode == "debug"
        or program.quick
        or program.interpreter_max_elements <= GENERATED_ABOVE
    ):
        return False
    inst = program.instance(program.graph.hints if sizes is None else sizes)
    return any(inst.numels[k] > GENERATED_ABOVE for k in inst.variant.schedule.interpreted)


def _choice_file(first: Program, what: str) -> str | None:
    """The file in the disk cache that remembers a ``Trial`` between ``first`` (a program of
    steps) and its ``what`` candidate ("native segments", "generated code for the larger
    kernels"), named by the first program, the code generators' sources (``_codegen_stamp``),
    numba's version and Python's; None when trials are not remembered
    (``config.remember_trials``), there is no disk cache, or the program cannot be named across
    processes."""
    if not config.remember_trials:
        return None
    directory = diskcache.cache_dir()
    if directory is None:
        return None
    try:
        key = workers.identity(first)
    except Exception:  # noqa: BLE001 - a graph that does not pickle: nothing is remembered
        return None
    key += f"|{what}|{numba.__version__}|{sys.version}|{_codegen_stamp()}".encode()
    return os.path.join(directory, f"fusegrad_trial_{hashlib.sha1(key).hexdigest()[:20]}")


_stamp: list[str] = []


def _codegen_stamp() -> str:
    """A hash of the code generators' sources (``compiler/codegen``): a choice measured with
    other generated code (another fusegrad) is not remembered as this one's."""
    if not _stamp:
        digest = hashlib.sha1()
        folder = os.path.dirname(os.path.abspath(diskcache.__file__))
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + f.read())
        _stamp.append(digest.hexdigest()[:16])
    return _stamp[0]


def remember_choice(first: Program, what: str, kept: int) -> None:
    """Write down which candidate a finished ``Trial`` kept (0: ``first``, 1: the ``what``
    candidate), for the next background compile of the same program, in this process or a
    later one (``remembered_choice``).  A cache that cannot be written remembers nothing."""
    path = _choice_file(first, what)
    if path is None:
        return
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(kept))
    except OSError:
        pass


def remembered_choice(first: Program, what: str) -> int | None:
    """The candidate an earlier ``Trial`` between ``first`` and its ``what`` candidate kept
    (0 or 1), or None when none is remembered: then both are compiled and a trial chooses.  A
    remembered choice saves a warm start the loser's compile (its kernels loaded from the disk
    cache: about 0.1 s of the GPT step's 0.34) and the trial's dozen calls, half of them on the
    slower program; the choice is the one measured on this machine, as long as the cache keeps
    it (clearing the cache, or ``FUSEGRAD_REMEMBER_TRIALS=0``, measures again)."""
    path = _choice_file(first, what)
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as f:
            kept = int(f.read().strip())
    except (OSError, ValueError):
        return None
    if kept not in (0, 1):
        return None
    logs.log("perf", f"{what} {'kept' if kept else 'dropped'} as an earlier trial chose")
    return kept


class Trial:
    """Two compiled programs of one graph -- a program of steps and its native segments, or a
    captured backward's program and the same with generated code for its larger kernels
    (``GENERATED_ABOVE``) -- the next calls run them in turn, ``RUNS`` measured runs each
    (after one unmeasured run, a first run's loading), and the faster by median wall time stays
    in the slot (``perf`` log).  Generated code is not always faster than what it replaces (the
    interpreter's small kernels), so the choice is measured, not assumed.

    Between interpreted and generated larger kernels (``kernels_only``) the time compared leaves
    out the extern steps (``Program.time_externs``), which the two candidates run alike: in a
    step made mostly of convolutions their products are nearly all of the wall time, and the
    noise of a busy machine on them decided the choice (measured on the DCGAN step's modules:
    generated LeakyReLU kernels of 32,768-65,536 elements 30-60 us against 110-220 us
    interpreted, yet three of six trials kept the interpreter on whole-program medians)."""

    RUNS = 5

    def __init__(
        self,
        slot: Slot,
        steps: Program,
        native: Program,
        what: tuple[str, str] = NATIVE,
        kernels_only: bool = False,
        origin: Program | None = None,
    ) -> None:
        self.slot = slot
        # the program whose identity names the choice on disk: the background compile's first
        # (``remembered_choice`` looks it up before anything else is built)
        self.origin = steps if origin is None else origin
        self.what = what  # (the second candidate and the first, in words: the ``perf`` log)
        self.candidates = (steps, native)
        self.times: tuple[list[float], list[float]] = ([], [])
        self.runs = [0, 0]
        self.last: int | None = None
        self.kernels_only = kernels_only
        # the extern steps whose time is left out of the comparison: all of them between
        # interpreted and generated kernels; between a program of steps and its native
        # segments, those the native program runs from Python too (a convolution's products:
        # the same work in both, and on a busy machine their noise would decide)
        timed: bool | frozenset = True if kernels_only else _python_externs(native) or False
        self.outside = bool(timed)
        for program in self.candidates:
            program.time_externs = timed
        _trials.add(self)

    def _end(self, best: Program) -> Program:
        """``best`` stays in the slot: the trial is over (and remembered on disk,
        ``remember_choice``, when both candidates were measured)."""
        self.slot.program, self.slot.trial = best, None
        _trials.discard(self)
        for program in self.candidates:
            program.time_externs = False
        if min(map(len, self.times)) >= self.RUNS:
            remember_choice(self.origin, self.what[0], self.candidates.index(best))
        return best

    def next(self) -> Program:
        """The program this call runs (the previous call's time is read from its program)."""
        last = self.last
        if last is not None:
            self.runs[last] += 1
            program = self.candidates[last]
            seconds = program.last_seconds
            if self.runs[last] > 1 and seconds is not None:
                if self.outside:
                    seconds -= program.extern_seconds
                self.times[last].append(seconds)
        if sum(self.runs) > 4 * self.RUNS:  # (a program that does not time its runs)
            return self._end(self.candidates[0])
        if min(map(len, self.times)) >= self.RUNS:
            steps, native = (float(np.median(t)) for t in self.times)
            best = self._end(self.candidates[1 if native < steps else 0])
            what, against = self.what
            logs.log(
                "perf",
                f"{what} {'kept' if native < steps else 'dropped'}: "
                f"{native * 1e3:.3f} ms against {steps * 1e3:.3f} ms for {against}"
                + (
                    " (outside the extern steps)"
                    if self.kernels_only
                    else " (outside the extern steps both run from Python)"
                    if self.outside
                    else ""
                ),
            )
            return best
        self.last = 1 if last == 0 else 0 if last == 1 else 1
        return self.candidates[self.last]


# the trials still running (a trial whose slot was evicted goes with it)
_trials: weakref.WeakSet[Trial] = weakref.WeakSet()


def trials_running() -> int:
    """How many ``Trial``s still run their candidates in turn (benchmarks call the programs
    until none does, so that only the kept programs are measured)."""
    return len(_trials)


def _python_externs(native: Program) -> frozenset:
    """The ids of the values of the extern steps a native program runs from Python (outside
    its segments), which its program of steps runs from Python as well: empty for anything
    else.  (Ids: a ``per_size`` program's native programs have graphs of their own, with the
    same value ids.)"""
    if getattr(native, "per_size", False):
        native = next(iter(native.specialised.values()), None)  # (the one it was prepared for)
    if not getattr(native, "native", False):
        return frozenset()
    variant = native.default
    steps = variant.schedule.steps
    return frozenset(
        steps[k].value.id for k in variant.python_steps if isinstance(steps[k], Extern)
    )


# the background compiles still running (``wait_for_compiles``)
_jobs: set[BackgroundBuild] = set()
_jobs_lock = threading.Lock()


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait until the programs being compiled in the background are ready (at most ``timeout``
    seconds); True when none is left.  The next call of each then runs its compiled program."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _jobs_lock:
            pending = next(iter(_jobs), None)
        if pending is None:
            return True
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        pending.done.wait(left)


# How long a process that exits waits for the background compiles still running on its threads
# (``_finish_compiles_at_exit``); set once it exits, so that a job whose worker process
# finishes afterwards loads nothing.
EXIT_WAIT_S = 60.0
_exiting = threading.Event()


@atexit.register
def _finish_compiles_at_exit() -> None:
    """A process that exits waits for its background compiles running numba on their threads
    (not for those waiting for a worker process), at most ``EXIT_WAIT_S``.  The
    compile threads are daemons: one still running when Python finalises is stopped where it
    next takes the GIL, and when that is inside a callback from LLVM's C++ (numba's object
    cache hooks, called while machine code is emitted or loaded) the stop unwinds through C++
    frames and aborts the process ("terminate called without an active exception": a rank of
    the distributed benchmark, once in CI, after it had printed its results).  Waiting also
    leaves the finished code in the disk cache for the next run."""
    _exiting.set()  # (a job whose worker returns after this loads nothing)
    deadline = time.monotonic() + EXIT_WAIT_S
    said = False
    while time.monotonic() < deadline:
        with _jobs_lock:
            # (a job waiting for its worker process runs no numba code; the worker goes on
            # and fills the cache for the next run, as a script that ends early wants)
            busy = [j for j in _jobs if not j.waiting]
        if not busy:
            return
        if not said:
            logs.log("perf", f"waiting for {len(busy)} background compile(s) before exit")
            said = True
        busy[0].done.wait(0.05)


@dataclass
class Background:
    """How ``Service.obtain`` may compile a program off the caller's thread.

    ``owner`` names the front end in log lines ("whole step", ...), ``what`` the program (the
    compile notice, the ``recompiles`` log).  ``warmup()`` is called on the caller's thread when
    a background compile starts: it takes what it needs of this call's arrays now (copies where
    the user may write into them) and returns the arguments of ``Program.prepare``, which runs
    the program once on them on the compile thread, so that numba compiles or loads what it
    calls; if it raises (a saved tensor was modified), no background compile starts and the
    call goes on in the foreground.  ``worker``: numba compiles in a worker process first
    (``workers``; large recorded programs, not a captured backward, whose compile is shorter
    than a process start).  ``uncompiled()``
    gives what calls run meanwhile (a ``mode="debug"`` program: every value by its eager kernel),
    or is None when the caller has its own uncompiled path (compiled autograd: the eager engine).
    ``cold(program)``: whether a program already built still needs numba for this call (a new
    size vector of a symbolic program); a program not built yet always does.  ``build_first``:
    the program is built on the caller's thread (a captured backward: cheap), only numba's
    compile runs in the background; otherwise both do (a whole step: the passes over a large
    graph take a while)."""

    owner: str
    what: str
    warmup: Callable[[], tuple]
    uncompiled: Callable[[], Any] | None = None
    cold: Callable[[Program], bool] | None = None
    build_first: bool = False
    worker: bool = False


# ---- recordings: whole steps and compiled modules ----------------------------------------------


class Recordings:
    """A compiled function's (or module's) recordings by guard key: the replayable entry, or
    the reason it cannot be replayed (a refusal remembered: that key runs with compiled backward
    only).  The one recording policy of both front ends: a key is recorded once; at most
    ``config.step_recordings`` recordings are made, after which the function is no longer
    recorded (``GIVEN_UP``, with one logged reason) and every new key runs with compiled
    backward only.  The oldest entries go first when the table is full."""

    __slots__ = ("entries", "generation", "given_up", "insertions", "name", "recordings")

    def __init__(self, name: Callable[[], str]) -> None:
        self.name = name  # (in words, for the reason: called only when one is given)
        self.entries: dict[tuple, Any] = {}
        self.recordings = 0
        self.given_up: str | None = None
        # counts the entries replaced or dropped: a fast guard (``guard.FastGuard``) made for
        # an entry stands only while this is what it was then
        self.generation = 0
        self.insertions = 0  # every entry remembered (a new key may take a call from another)

    def get(self, key: tuple) -> Any:
        return self.entries.get(key)

    def refusal(self) -> str | None:
        """Why a new key is not recorded (None: it is; counted as a recording)."""
        if self.recordings >= config.step_recordings:
            if self.given_up is None:
                self.given_up = (
                    f"{self.recordings} recordings (config.step_recordings) of {self.name()}: "
                    "the guard key changes on every call (sizes, Python values, modules); "
                    "whole-step compile is off for it, its backward is still compiled"
                )
                emit(events.GIVEN_UP, self.given_up)
            return self.given_up
        return None

    def count(self) -> int:
        """Count a recording that starts now; returns its number."""
        self.recordings += 1
        return self.recordings

    def remember(self, key: tuple, entry: Any) -> None:
        self.insertions += 1
        if key in self.entries:
            self.generation += 1
        while len(self.entries) >= max(config.step_recordings, 1):
            self.entries.pop(next(iter(self.entries)))
            self.generation += 1
        self.entries[key] = entry

    def last_key(self) -> tuple | None:
        return next(reversed(self.entries), None)

    def values(self) -> list:
        return list(self.entries.values())

    def items(self) -> list:
        return list(self.entries.items())

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries


# ---- the service -------------------------------------------------------------------------------


class Service:
    """The process's compilation service (``service``, one per process): see the module
    docstring."""

    def __init__(self) -> None:
        # walk key (``key.walk``) -> ``cache.GraphEntry``: the graphs captured for it
        self.graphs = LRU(lambda: config.cache_size)
        # tape key (``tape.tape_key``) -> ``cache.TapeEntry``: the walk-free path
        self.tapes = LRU(lambda: config.tape_cache_size)
        # jacobian(vectorize=True): (walk key, sizes, batch) -> (Program,)
        self.batched = LRU(lambda: config.cache_size)
        # the last walk key of each coarse shape: why a key missed, in words
        self.history = KeyHistory()

    def miss_reason(self, key: tuple) -> str:
        """Why walk key ``key`` found no graph, in words."""
        return self.history.miss_reason(key, first=not len(self.graphs))

    def lookup(self, w: Any, mode: str = "default") -> Program | None:
        """The cached program that runs walk ``w`` in ``mode`` now, or None (for tools)."""
        entry = self.graphs.get(w.key)
        captured = entry.find(w.sizes) if entry is not None else None
        if captured is None:
            return None
        return captured.programs.ready((w.grad_key, mode, config.program_key()))

    def cached_programs(self) -> list[Program]:
        """Every program in the graph cache (for tests and tools), oldest graph first."""
        out: list[Program] = []
        for entry in self.graphs.values():
            for captured in list(entry.symbolic) + entry.concrete.values():
                out.extend(captured.programs.programs())
        return out

    # ---- building -------------------------------------------------------------------------------
    def build(
        self,
        graph: Graph,
        *,
        mode: str = "default",
        device: str = "cpu",
        leaves_with_grad: frozenset = frozenset(),
        unpacked: frozenset[int] | None = None,
        recorded: bool = False,
    ) -> Program:
        """The program of ``graph`` (after the passes) under the configuration: the one place a
        ``Program`` is built.  ``recorded``: a whole step's or module's program, of the sizes it
        was recorded with, that runs many times (one size vector, or those of a recording over
        symbolic sizes; row kernels also replace runs of interpreted kernels, ``Program.hot``);
        otherwise a captured backward of symbolic sizes (``config.sizes_per_program`` size
        vectors kept prepared)."""
        return Program(
            graph,
            mode=mode,
            leaves_with_grad=leaves_with_grad,
            interpreter_max_elements=config.interpreter_max_elements,
            device=device,
            # (a recording merged over sizes, ``dynamic``, runs at many: its hints say so)
            sizes_per_program=1 if recorded and not graph.hints else config.sizes_per_program,
            unpacked=unpacked,
            hot=recorded,
            quick=recorded and config.quick_programs is True and device == "cpu",
            # native segments at once when asked for (True: a captured backward's at each size
            # vector it runs at, ``Program.per_size``); with None a background compile goes on
            # to them once the program of steps runs (``_upgrades``, ``_specialises``)
            native=config.native_programs is True,
        )

    def uncompiled(self, graph: Graph) -> Program:
        """What a recorded graph runs as while its program compiles: every value by its
        primitive's eager kernel (``mode="debug"``: the same inputs, effects and results as
        eager's), no code generated."""
        return Program(graph, mode="debug", sizes_per_program=1)

    # ---- a program's life -----------------------------------------------------------------------
    def obtain(
        self,
        table: Programs,
        key: Any,
        build: Callable[[], Program],
        background: Background | None = None,
        notice: CompileNotice | None = None,
    ) -> tuple[Any, bool]:
        """The program under ``key`` of ``table`` for this call, as ``(program, compiled)``.

        ``compiled`` False: the program is being compiled on another thread and this call runs
        uncompiled -- ``program`` is then ``background.uncompiled()``'s (None: the caller's own
        uncompiled path).  A background compile starts when ``background`` is given and allowed
        (``config.background_compile``, no trace report, no ``explain``) and the program is not
        built yet or is ``cold``; otherwise the program is built here (``notice`` started) and
        compiled by its first run.  The call after a background compile finished promotes its
        program; one whose compile failed builds it again here (and fails as a foreground build
        fails, or compiles what the thread did not)."""
        slot = table.slots.get(key)
        if slot is not None and slot.trial is not None and slot.job is None:
            return slot.trial.next(), True
        if slot is not None and slot.job is None and slot.program is not None:
            if background is None or background.cold is None or not background.cold(slot.program):
                return slot.program, True
        if slot is None:
            slot = table.slot(key)
        if slot.job is not None:
            return self._from_job(slot, build, background, notice)
        if background is not None and self._may_background():
            if background.build_first and slot.program is None:
                if notice is not None:
                    notice.start(background.what)
                slot.program = build()
            if self._start(slot, build, background):
                # (the call that started it waits too where the job only loads: it ran
                # uncompiled beside the load before, 40 ms of the GPT step's warm start)
                return self._from_job(slot, build, background, notice, starting=True)
        if slot.program is None:
            if notice is not None:
                notice.start(background.what if background is not None else "a program")
            slot.program = build()
        return slot.program, True

    def _from_job(
        self,
        slot: Slot,
        build: Callable[[], Program],
        background: Background | None,
        notice: CompileNotice | None,
        starting: bool = False,
    ) -> tuple[Any, bool]:
        """``obtain`` for a slot whose background job was started: its first program when
        published, the job's uncompiled path while it runs, or its program once done.  A job
        that only loads its code from the disk cache is waited for (``LOAD_WAIT``); the call
        that started (``starting``) a job that compiles runs uncompiled, whatever the job did
        meanwhile."""
        job = slot.job
        assert job is not None
        if starting or not job.done.is_set():
            if job.first is None:
                # (only loading the disk cache's code: on its own the thread is done in a
                # fraction of the time it takes beside calls run uncompiled; whether it
                # only loads is known once it has built its first program)
                deadline = time.monotonic() + LOAD_WAIT
                job.decided.wait(LOAD_WAIT)
                if job.loading:
                    job.ready.wait(max(0.0, deadline - time.monotonic()))
                elif starting:
                    emit(events.UNCOMPILED_RUN)
                    return job.uncompiled, False
            if job.first is not None:  # (compiled; its native segments are compiling)
                return job.first, True
            if not job.done.is_set():
                emit(events.UNCOMPILED_RUN)
                return job.uncompiled, False
        self._promote(slot, background)
        if slot.program is None:  # (its build failed: built here, failing as it would)
            if notice is not None:
                notice.start(background.what if background is not None else "a program")
            slot.program = build()
        return slot.program, True

    @staticmethod
    def _may_background() -> bool:
        return config.background_compile and not _trace.enabled and events.debug.report is None

    def _start(self, slot: Slot, build: Callable[[], Program], background: Background) -> bool:
        """Start compiling ``slot``'s program on a thread of its own; False when its warm-up
        cannot be made (the call then goes on in the foreground)."""
        try:
            prepare_args = background.warmup()
        except Exception:  # noqa: BLE001 - (the foreground run raises it, as eager does)
            return False
        built = slot.program
        in_worker = background.worker and config.compile_workers
        launch = workers.Launch() if in_worker else None

        def work(publish: Publish, job: BackgroundBuild) -> Program:
            try:
                return _work(publish, job)
            finally:
                if launch is not None:  # (a build that raised started no worker)
                    launch.done()

        def _work(publish: Publish, job: BackgroundBuild) -> Program:
            program = built if built is not None else build()
            if in_worker:
                # the interpreter, compiling in a worker since the step was wrapped
                # (``workers.warm_interpreter``): the program's worker loads it rather than
                # compiles it a second time
                job.waiting = True
                if workers.warming():  # (it compiles: the interpreter is not on disk yet)
                    job.decided.set()
                try:
                    workers.wait_for_warming()
                finally:
                    job.waiting = False
            larger = _generates_more(program, prepare_args[3])
            to_larger = {"interpreter_max_elements": GENERATED_ABOVE}
            what: str | None = None
            if _upgrades(program):
                # (the program of steps the native one is tried against: ``program``, or,
                # where it interprets larger kernels, the same with those as generated code --
                # a native program generates every kernel, so it is measured against the best
                # program of steps, not the quick first one)
                what, change = NATIVE[0], {"native": True}
            elif _specialises(program):
                # (a captured backward: native at the warm-up's sizes, other sizes running
                # the schedule of the program it is tried against)
                what, change = NATIVE_AT_SIZES[0], {"native": True, **(to_larger if larger else {})}
            elif larger:
                what, change, larger = "generated code for the larger kernels", to_larger, False
            # a trial between the candidates ended before (in any process): their code is in
            # the disk cache, so no quick tier (on a warm start it cost the GPT step its
            # interpreter's load and a program built for nothing, and its calls a wait)
            remembered = remembered_choice(program, what) if what is not None else None
            quick = _quick_first(program) if remembered is None else None
            quick_published = False
            if quick is not None:
                # the first tier, published while the program compiles: it generates no
                # code, so it runs once the interpreter is compiled (or loaded)
                try:
                    _compile(quick, prepare_args, None, job=job)
                except Exception as e:  # noqa: BLE001 - (the program of steps follows)
                    logs.log("perf", f"quick first tier not compiled ({type(e).__name__}: {e})")
                else:
                    publish(quick, origin=program)
                    quick_published = True

            def alone(p: Program) -> Program:
                """``p``, the job's last program, which no trial follows: published, so that
                the quick tier (the job's first program) is not tried against it."""
                if quick_published:
                    publish(p, origin=program)
                return p

            if what is None:
                _compile(program, prepare_args, launch, job=job)
                return alone(program)

            def candidate(settings: dict) -> Program:
                other = Program(program.graph, **{**program.settings, **settings})
                other.double = program.double  # (a captured backward's, for create_graph)
                return other

            def later(settings: dict, words: str) -> Program | None:
                """A later candidate, compiled (its worker yields to first programs), or None
                when it does not compile (the published program stays)."""
                try:
                    other = candidate(settings)
                    _compile(
                        other,
                        prepare_args,
                        workers.Launch(later=True) if in_worker else None,
                        job=job,
                    )
                except Exception as e:  # noqa: BLE001 - (the published program stays)
                    logs.log("perf", f"{words} not compiled ({type(e).__name__}: {e})")
                    return None
                return other

            if remembered == 1:  # an earlier trial kept the other: it is compiled, and runs, alone
                try:
                    other = candidate(change)
                    _compile(other, prepare_args, launch, job=job)
                    return alone(other)
                except Exception as e:  # noqa: BLE001 - (the first program after all)
                    logs.log("perf", f"{what} not compiled ({type(e).__name__}: {e})")
                    remembered, launch2 = 0, workers.Launch() if in_worker else None
            else:
                launch2 = launch
            current = None
            if larger and (quick_published or remembered == 0):
                # the quick tier runs meanwhile, or an earlier trial kept the program of steps:
                # the next program is the one with generated larger kernels (the candidate the
                # trial measures), not ``program`` first, which would only run in between (GPT
                # step, cold: the native candidate compiled 10 s sooner; warm, ``program``
                # was never compiled, and its worker took 10 s)
                try:
                    current = candidate(to_larger)
                    _compile(current, prepare_args, launch2, job=job)
                except Exception as e:  # noqa: BLE001 - (``program`` instead)
                    logs.log(
                        "perf",
                        f"generated code for the larger kernels not compiled "
                        f"({type(e).__name__}: {e})",
                    )
                    current, launch2 = None, workers.Launch() if in_worker else None
            if current is None:
                _compile(program, prepare_args, launch2, job=job)
                current = program
                if larger:  # the program of steps with generated larger kernels, published
                    publish(program, origin=program)
                    current = later(to_larger, "generated code for the larger kernels") or program
            if remembered == 0:  # (an earlier trial kept the program of steps: no native one)
                if current is not program:
                    # the program that trial measured (its larger kernels generated) replaces
                    # the first one as it did then: no trial again
                    publish(current, origin=program)
                return alone(current)
            # the program runs compiled from the next call on; the other candidate (its native
            # segments, or its larger kernels as generated code) compiles meanwhile (a second
            # worker for a worker's program), then a ``Trial`` keeps the faster of the two
            publish(current, origin=program)
            return later(change, what) or current

        uncompiled = background.uncompiled() if background.uncompiled is not None else None
        slot.job = BackgroundBuild(work, uncompiled, background.what)
        emit(events.BACKGROUND_STARTED, background.what)
        return True

    @staticmethod
    def _promote(slot: Slot, background: Background | None) -> None:
        job = slot.job
        assert job is not None
        slot.job = None
        owner = background.owner if background is not None else "a program"
        if job.error is not None:
            emit(events.BACKGROUND_FAILED, owner=owner, error=job.error)
        else:
            emit(events.BACKGROUND_DONE, owner=owner, seconds=job.seconds)
        if job.program is not None:
            slot.program = job.program
            if job.first is not None and job.first is not job.program:
                # the program of steps and its native segments: the faster one stays
                slot.program = job.first
                if job.program.native or job.program.per_size:
                    what = NATIVE if job.program.native else NATIVE_AT_SIZES
                    slot.trial = Trial(slot, job.first, job.program, what, origin=job.origin)
                else:
                    words = ("generated code for the larger kernels", "interpreting them")
                    slot.trial = Trial(slot, job.first, job.program, words, kernels_only=True)

    # ---- the whole cache ------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every cached graph and program, and zero the counters (``compiler.reset``)."""
        self.graphs.clear()
        self.tapes.clear()
        self.batched.clear()
        self.history.clear()
        events.counters.reset()


service = Service()
