"""Compiles in worker processes (docs/ARCHITECTURE.md, "The compilation service").

A background compile of a whole step's or a compiled module's program (``service.obtain``)
runs numba in a process of its own, not on a thread of the user's: numba's compiler is Python
code that holds the GIL, so a compile thread slows every call that runs meanwhile, and it dies
with the process.  The worker gets the program's graph, its build settings
(``Program.settings``) and the scratch arrays of the warm-up run, builds the same program and
runs it once (``Program.prepare``): numba compiles every kernel and segment it calls and writes
them to the disk cache (``codegen.diskcache``).  The compile thread only waits for the worker
(no GIL held), then builds the program in the user's process and runs the same warm-up, which
loads everything from the disk cache.

A worker that succeeded leaves a marker file beside the cache (``_done_marker``: named by the
program, numba's version and Python's); a later background compile of the same program, in
this process or another, skips the worker and loads the code on its thread at once.  Measured
on the demo (``python -m fusegrad``, warm cache): a worker's start took about 18 epochs of
its 40, during which the calls ran uncompiled at 4-5 ms against eager's 1.1; loading on the
thread took 3 epochs.

The worker runs in a session of its own: a script that exits before the compile is done
leaves the worker running, and the next run of the script finds the cache filled.  (A script
that exits while the compile thread still builds the program waits for the worker to start:
``Launch``, at most ``LAUNCH_WAIT_S`` seconds.)  A worker
that fails (a graph that does not pickle, an error in the worker) is no error: its reason goes
to the ``perf`` log, and the thread compiles as before.

The interpreter's own compile (``codegen.interpreter``: several seconds, once per machine)
gets a worker of its own when ``fusegrad.compile`` wraps a step or a module (``warm_interpreter``;
a step's first call asks again), ahead of any program: it overlaps the script's set-up, the first
call and the recording instead of following them, and the
program's worker then loads the interpreter instead of compiling it (measured on the cold GPT
step: the program's worker took 11.6-12.5 s instead of 16-17).

``config.compile_workers`` (``FUSEGRAD_COMPILE_WORKERS=0`` sets False) turns workers off.

At most ``slots()`` workers compile at once on the machine, whichever processes started them
(one less than the cores, at least one; ``FUSEGRAD_COMPILE_SLOTS`` sets the number): a
worker starts at once and waits for a slot (a lock file in the cache directory, held for its
life) before it builds anything, so a script that compiles many programs leaves a queue of
waiting workers rather than one numba compile per program fighting for the cores.  The workers
of later candidates (a program's native segments, its larger kernels as generated code: the
program already runs compiled) take no slot while a first program's worker waits for one, so
the programs that calls still run uncompiled are compiled first (``take_slot``).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numba
import numpy as np

from . import logs

try:
    import fcntl
except ImportError:  # (not POSIX: no worker processes)
    fcntl = None  # type: ignore[assignment]
from .codegen import diskcache, interpreter, numba_cpu
from .program import Program
from .settings import config

# the worker's exit status when the payload could not be read (the parent's reason)
_BAD_PAYLOAD = 3

# how long the interpreter's exit waits for background compiles to start their workers
LAUNCH_WAIT_S = 60.0

_launches = 0  # background compiles whose worker has not started yet (``Launch``)
_launches_changed = threading.Condition()


class Launch:
    """A background compile that is to start a worker (made on the caller's thread); ``done``
    once the worker has started or will not.  The interpreter's exit waits for every one."""

    def __init__(self, later: bool = False) -> None:
        global _launches
        with _launches_changed:
            _launches += 1
        self.pending = True
        # a later candidate's compile (a program's native segments, its larger kernels as
        # generated code): its worker leaves the slots to workers of first programs
        self.later = later

    def done(self) -> None:
        global _launches
        with _launches_changed:
            if self.pending:
                self.pending = False
                _launches -= 1
                _launches_changed.notify_all()


@atexit.register
def _wait_for_launches() -> None:
    with _launches_changed:
        _launches_changed.wait_for(lambda: _launches == 0, timeout=LAUNCH_WAIT_S)


def compile_elsewhere(program: Program, prepare_args: tuple, launch: Launch) -> str | None:
    """Build ``program`` again in a worker process and run ``Program.prepare(*prepare_args)``
    there, filling the disk cache; wait for it (``launch.done()`` once it has started).  None
    when it succeeded, else why not."""
    try:
        payload = pickle.dumps(
            (program.graph, program.settings, prepare_args), protocol=pickle.HIGHEST_PROTOCOL
        )
    except Exception as e:  # noqa: BLE001 - e.g. a hook or custom Function in the graph
        return f"the program does not pickle ({type(e).__name__}: {e})"
    directory = diskcache.cache_dir()
    if directory is None:
        return "no disk cache (the worker's code could not reach this process)"
    if fcntl is None:
        return "no file locks on this system"
    done = _done_marker(directory, program)
    if os.path.exists(done):
        # a worker compiled this program before (this process or an earlier one): its code is
        # on disk, and loading it here takes a fraction of a worker's start
        logs.log("perf", "the disk cache holds the program's code: loaded without a worker")
        return None
    # one worker per program at a time, whichever process started it: its lock file is held
    # for the worker's life (the worker inherits the descriptor)
    lock_path = os.path.join(
        directory, f"fusegrad_worker_{hashlib.sha1(identity(program)).hexdigest()[:20]}.lock"
    )
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another process's worker compiles this program: wait for it
        launch.done()
        start = time.perf_counter()
        fcntl.flock(lock, fcntl.LOCK_EX)  # (blocks without the GIL)
        os.close(lock)
        logs.log(
            "perf",
            f"another process's worker compiled the program ({time.perf_counter() - start:.1f} s "
            "waited)",
        )
        return None
    try:
        return _spawn(payload, directory, lock, launch)
    finally:
        os.close(lock)


def compiled_before(program: Program) -> bool:
    """Whether a worker compiled ``program`` into the disk cache before (its marker file)."""
    directory = diskcache.cache_dir()
    return directory is not None and os.path.exists(_done_marker(directory, program))


def _done_marker(directory: str, program: Program) -> str:
    """The file that says a worker compiled ``program`` into the disk cache of ``directory``
    (named by the program and the numba and Python that compiled it)."""
    key = identity(program) + f"|{numba.__version__}|{sys.version}".encode()
    return os.path.join(directory, f"fusegrad_compiled_{hashlib.sha1(key).hexdigest()[:20]}.done")


def identity(program: Program) -> bytes:
    """What names a program across processes: its generated source (hashed into the module's
    file name), else its pickled graph and settings."""
    source = program.source_path
    if source:
        return os.path.basename(source).encode()
    # (pickled after one round trip: the first one changes the bytes -- a graph a worker
    # unpickled pickles 8 bytes longer than the one it came from -- later ones do not, so this
    # process and a worker, which holds the round-tripped graph, name the program alike; the
    # bytes themselves made every such program's marker and trial choice miss in the next
    # process: a worker on every run of benchmark D's step)
    state = pickle.dumps((program.graph, program.settings), protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(pickle.loads(state), protocol=pickle.HIGHEST_PROTOCOL)


def _worker_env(directory: str) -> dict[str, str]:
    """The environment of a worker: this process's, with its import path (the worker imports
    fusegrad and the generated modules as this process does), its disk cache, and the size of
    its numba thread pool (``numba_cpu.POOL_THREADS``), which a program's native segments
    depend on.  A script that set ``NUMBA_NUM_THREADS`` after importing fusegrad gave its
    workers another size than its own, so a worker built another program than the one the
    process then loaded: a worker on every warm start, and a compile in the process itself."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
    env["FUSEGRAD_CACHE_DIR"] = directory
    env["NUMBA_NUM_THREADS"] = str(numba_cpu.POOL_THREADS)
    return env


def _spawn(payload: bytes, directory: str, lock: int, launch: Launch) -> str | None:
    """Start the worker on ``payload`` (it holds ``lock`` while it runs) and wait for it."""
    fd, path = tempfile.mkstemp(prefix="fusegrad_worker_", suffix=".pkl", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    env = _worker_env(directory)
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fusegrad.compiler.workers", path]
            + (["--later"] if launch.later else []),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # (outlives this process: the cache gets filled)
            pass_fds=(lock,),
        )
    except OSError as e:
        os.unlink(path)
        return f"no worker process ({e})"
    # (logged before ``done``: the interpreter's exit waits only for ``done``, and a line
    # logged after it could be lost; a loaded CI run lost it once)
    logs.log("perf", f"compiling in worker process {proc.pid}")
    launch.done()
    _, err = proc.communicate()
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        return f"the worker failed (exit {proc.returncode}): {lines[-1] if lines else ''}"
    logs.log("perf", f"a worker compiled the program in {time.perf_counter() - start:.1f} s")
    return None


# the workers compiling the interpreter ahead of a program (``warm_interpreter``), by dtype
_warming: dict[str, subprocess.Popen] = {}
_warming_lock = threading.Lock()


def _interpreter_marker(directory: str, dtype: str) -> str:
    """The file that says a worker compiled the interpreter's core machine for ``dtype`` into
    the disk cache of ``directory`` (named by its module, numba's version and Python's)."""
    key = f"{interpreter.module_name(core=True)}|{dtype}|{numba.__version__}|{sys.version}"
    key = key.encode()
    return os.path.join(directory, f"fusegrad_interpreter_{hashlib.sha1(key).hexdigest()[:20]}")


def warm_interpreter(dtype: str) -> None:
    """Start a worker that compiles the interpreter's core machine for ``dtype`` into the disk
    cache, and return at once: called when ``fusegrad.compile`` wraps a step or a module and
    by a step's first call (it runs eagerly, then the next records, then a background compile
    starts), so that the interpreter's own compile (about 4 s, once per machine) overlaps the
    script's set-up and that first call instead of following them, and the program's worker
    finds it on disk.  Nothing is started when
    workers are off, there is no disk cache, the interpreter is loaded in this process, a
    worker warmed it before (its marker file) or is warming it now."""
    if (
        fcntl is None
        or not config.compile_workers
        or not config.background_compile
        or config.interpreter_max_elements <= 0
        or dtype not in interpreter.FLOAT_DTYPES
        or interpreter.loaded(core=True)
    ):
        return
    with _warming_lock:
        if dtype in _warming:
            return
        directory = diskcache.cache_dir()
        if directory is None or os.path.exists(_interpreter_marker(directory, dtype)):
            return
        env = _worker_env(directory)
        try:
            _warming[dtype] = subprocess.Popen(
                [sys.executable, "-m", "fusegrad.compiler.workers", "--interpreter", dtype],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            logs.log("perf", f"the interpreter is not warmed in a worker ({e})")
            return
    logs.log("perf", f"warming the interpreter ({dtype}) in worker process {_warming[dtype].pid}")


def interpreter_ready(dtype: str) -> bool:
    """Whether the interpreter's core machine for ``dtype`` loads without a compile: this
    process has it, or a worker left its marker beside the disk cache."""
    if interpreter.loaded(core=True):
        return True
    directory = diskcache.cache_dir()
    return directory is not None and os.path.exists(_interpreter_marker(directory, dtype))


def warming() -> bool:
    """Whether a worker ``warm_interpreter`` started is still compiling."""
    with _warming_lock:
        return any(proc.poll() is None for proc in _warming.values())


def wait_for_warming() -> None:
    """Wait for the workers ``warm_interpreter`` started (without the GIL)."""
    with _warming_lock:
        procs = list(_warming.values())
    for proc in procs:
        proc.wait()


def _warm_main(dtype: str) -> int:
    """The worker of ``warm_interpreter``: compile (or load) the core machine's ``run_ops`` for
    ``dtype`` under a compile slot, then leave the marker."""
    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass
    directory = diskcache.cache_dir()
    if directory is None or fcntl is None:
        return 1
    slot = take_slot(directory, slots())
    try:
        run_ops = getattr(interpreter.machine(core=True), f"run_ops_{dtype}")
        regs = np.zeros((1, 1), dtype=dtype)
        # (the argument types of ``InterpretedKernel``'s calls: the same specialisation)
        run_ops(
            1,
            np.zeros((0, 5), np.int64),
            regs,
            np.zeros(1, dtype),
            np.zeros(0, np.int64),
            np.zeros(0, np.float64),
        )
        with open(_interpreter_marker(directory, dtype), "w"):
            pass
    finally:
        os.close(slot)
    return 0


def slots() -> int:
    """How many workers may compile at once on this machine."""
    wanted = os.environ.get("FUSEGRAD_COMPILE_SLOTS", "")
    if wanted.isdigit() and int(wanted) > 0:
        return int(wanted)
    return max(1, (os.cpu_count() or 2) - 1)


def try_slot(directory: str, count: int) -> int | None:
    """A free slot's lock file, locked (its descriptor), or None when all ``count`` are
    taken."""
    for k in range(count):
        fd = os.open(
            os.path.join(directory, f"fusegrad_worker_slot_{k}.lock"), os.O_RDWR | os.O_CREAT, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return fd
    return None


def take_slot(directory: str, count: int, poll_s: float = 0.2, later: bool = False) -> int:
    """A slot, waiting for one to free up.  A worker of a first program says it waits (a file
    named by its process id, ``fusegrad_worker_first_<pid>.wait``, while it waits); a ``later``
    worker takes no slot while one of those waits, so that the programs calls are waiting for
    compile before the second candidates of programs that already run compiled."""
    marker = None
    if not later:
        marker = os.path.join(directory, f"fusegrad_worker_first_{os.getpid()}.wait")
        try:
            with open(marker, "w"):
                pass
        except OSError:
            marker = None
    try:
        while True:
            if not (later and first_waiting(directory)):
                fd = try_slot(directory, count)
                if fd is not None:
                    return fd
            time.sleep(poll_s)
    finally:
        if marker is not None:
            try:
                os.unlink(marker)
            except OSError:
                pass


def first_waiting(directory: str) -> bool:
    """Whether a worker of a first program waits for a slot (a marker of a process that is gone
    is removed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    for name in names:
        if not (name.startswith("fusegrad_worker_first_") and name.endswith(".wait")):
            continue
        pid = name[len("fusegrad_worker_first_") : -len(".wait")]
        if pid.isdigit() and _alive(int(pid)):
            return True
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (someone else's process: it exists)
        return True
    return True


def _main(path: str, later: bool = False) -> int:
    """The worker: wait for a slot (``slots``; a ``later`` candidate's worker after the first
    programs' workers, ``take_slot``), then build the program in ``path``'s payload and run its
    warm-up, at a lower scheduling priority than the process that runs the calls meanwhile (on
    a small machine the worker would otherwise take a core from them)."""
    try:
        os.nice(10)
    except (AttributeError, OSError):  # (not POSIX, or not allowed: the same priority)
        pass
    slot = None
    if fcntl is not None:
        slot = take_slot(os.path.dirname(os.path.abspath(path)), slots(), later=later)
    try:
        with open(path, "rb") as f:
            graph, settings, prepare_args = pickle.load(f)
    except Exception as e:  # noqa: BLE001
        print(f"fusegrad worker: cannot read {path}: {e}", file=sys.stderr)
        return _BAD_PAYLOAD
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    program: Any = Program(graph, **settings)
    program.prepare(*prepare_args)
    try:  # (written by the worker: the process that started it may have exited already)
        with open(_done_marker(os.path.dirname(os.path.abspath(path)), program), "w"):
            pass
    except OSError:  # (no marker: the next background compile starts a worker again)
        pass
    if slot is not None:
        os.close(slot)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--interpreter":
        status = _warm_main(sys.argv[2])
    else:
        status = _main(sys.argv[1], later="--later" in sys.argv[2:])
    # the process that started this one waits for its exit: leave at once, without Python's
    # shutdown (tearing down numba's and LLVM's objects took 0.4 s after the interpreter's
    # marker, on the path of a cold start's first compiled call); its files are written and
    # closed, and an exception above still ends it the usual way, with its traceback
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
