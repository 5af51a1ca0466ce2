"""``python -m fusegrad.distributed.run -n 2 script.py [args]``: torchrun's job on MPI.

Starts ``-n`` processes of ``script.py`` (or ``-m module``) with ``mpiexec``: the one installed
next to this Python (the ``mpich`` wheel of the ``distributed`` extra puts it in the virtual
environment's ``bin``), else the first on PATH, else ``--mpiexec PATH``.  Each process first
sets torchrun's environment variables from MPI's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``) so scripts that read them work, then runs the script as ``__main__``.
A process that fails (an uncaught exception or a nonzero ``sys.exit``) aborts the whole job
(``MPI_Abort``) so the others do not wait in a collective it will never join.  Plain
``mpiexec -n 2 python script.py`` works too, without those variables and without the abort
(``mpiexec -n 2 python -m mpi4py script.py`` has it).  The exit status is mpiexec's.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import runpy
import shutil
import subprocess
import sys
import time
import traceback

# MPI launchers' variables for the global and the node-local rank (MPICH's hydra, Open MPI)
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def find_mpiexec() -> str | None:
    """mpiexec next to this Python, else on PATH; None when there is none."""
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fusegrad.distributed.run",
        description="Run a training script in several processes over MPI (torchrun's job).",
    )
    p.add_argument(
        "-n",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="n",
        type=int,
        default=1,
        help="number of processes (default 1)",
    )
    p.add_argument("--mpiexec", default=None, help="the mpiexec to use (default: found)")
    p.add_argument(
        "--mpi-args", default="", help="extra mpiexec arguments, one string (split on spaces)"
    )
    p.add_argument("-m", "--module", action="store_true", help="run script as a module name")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("script", help="the script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def _first(names: tuple[str, ...], default: str) -> str:
    for name in names:
        if name in os.environ:
            return os.environ[name]
    return default


def _run_worker(script: str, args: list[str], module: bool) -> None:
    """One process: torchrun's variables from MPI's, then the script as __main__."""
    rank = _first(_RANK_VARS, "0")
    os.environ.setdefault("RANK", rank)
    os.environ.setdefault("WORLD_SIZE", _first(_SIZE_VARS, "1"))
    os.environ.setdefault("LOCAL_RANK", _first(_LOCAL_RANK_VARS, rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", _first(_LOCAL_SIZE_VARS, os.environ["WORLD_SIZE"]))
    sys.argv = [script, *args]
    try:
        if module:
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(pathlib.Path(script).resolve().parent))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            _abort(e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        # (mpiexec forwards each rank's output through its own proxies: the abort below kills
        # them, so the traceback gets a moment to pass through first; once seen cut short)
        time.sleep(0.2)
        _abort(1)
        raise


def _abort(code: int) -> None:
    """A failed process ends the whole job (``MPI_Abort``), as ``python -m mpi4py`` does: the
    others may be blocked in a collective it will never join."""
    if "mpi4py.MPI" not in sys.modules:
        return
    from mpi4py import MPI  # already imported (and MPI started) by the script

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        print(
            f"fusegrad.distributed.run: rank {MPI.COMM_WORLD.Get_rank()} failed; aborting the "
            f"other processes",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(code)


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if opts.worker:
        _run_worker(opts.script, opts.args, opts.module)
        return 0
    if opts.n < 1:
        print(f"fusegrad.distributed.run: -n must be at least 1, got {opts.n}", file=sys.stderr)
        return 2
    mpiexec = opts.mpiexec or find_mpiexec()
    if mpiexec is None:
        print(
            f"fusegrad.distributed.run: mpiexec not found next to {sys.executable} or on PATH; "
            f"install MPI with pip install 'fusegrad[distributed]' (mpi4py and the mpich "
            f"wheel), or pass --mpiexec PATH",
            file=sys.stderr,
        )
        return 2
    cmd = [mpiexec, "-n", str(opts.n), *opts.mpi_args.split()]
    cmd += [sys.executable, "-m", "fusegrad.distributed.run", "--worker"]
    cmd += ["-m"] if opts.module else []
    cmd += [opts.script, *opts.args]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
