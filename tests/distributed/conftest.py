"""Under ``mpiexec`` (the MPI suites): a failed run aborts the whole MPI job, so the other rank,
perhaps blocked in a collective its peer will never join, does not wait for its timeout.  In
the normal single-process suite this does nothing."""

from __future__ import annotations

import sys
from typing import Any

_exit_status = {"value": 0}


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    _exit_status["value"] = int(exitstatus)


def pytest_unconfigure(config: Any) -> None:
    # after the terminal summary has been written: abort only then, so it is not lost
    status = _exit_status["value"]
    if status == 0 or "mpi4py.MPI" not in sys.modules:
        return
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(status)
