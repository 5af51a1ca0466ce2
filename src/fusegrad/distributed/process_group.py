"""Process groups over MPI: the default group, ``new_group``, ``ReduceOp`` and work handles.

``fusegrad.distributed`` has one transport, MPI through ``mpi4py`` (docs/ARCHITECTURE.md, contract
11); a
process group is an MPI communicator plus the global ranks it holds.  ``mpi4py`` is imported by
``init_process_group``, never when ``fusegrad.distributed`` is imported, so a script that only
checks ``is_available()`` starts no MPI.  A plain ``python script.py`` (no ``mpiexec``) is a
world of one process: MPI's singleton start.

Every collective is issued as MPI's non-blocking call (``Iallreduce``, ``Ibcast``, ...) and
returns a ``Work``; a blocking call is the same ``Work`` waited on at once.  Waiting polls the
request against the group's timeout (``init_process_group(timeout=...)``, 30 minutes by default
as in PyTorch) so a peer that never arrives ends in an error, not a hang.
"""

from __future__ import annotations

import enum
import importlib.util
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ..errors import FusegradError

DEFAULT_TIMEOUT = timedelta(minutes=30)
"""PyTorch's default process group timeout."""

SPIN_S = 0.05
"""How long ``Work.wait`` polls MPI without sleeping before it starts pausing between polls."""

BACKENDS = ("mpi", "gloo", "nccl")
"""Accepted backend names.  All run on MPI: ``gloo`` and ``nccl`` are aliases so scripts written
for PyTorch (``backend="nccl" if cuda else "gloo"``) run unchanged; ``get_backend()`` says
``"mpi"`` whatever was asked."""


class DistError(FusegradError, RuntimeError):
    """A failed or misused collective (PyTorch's ``torch.distributed.DistError``)."""


class DistNotInitializedError(DistError, ValueError):
    """A collective or query before ``init_process_group`` (PyTorch raises ValueError)."""


class DistTimeoutError(DistError, TimeoutError):
    """A wait that outlived the group's timeout (a peer that never joined the collective)."""


class ReduceOp(enum.Enum):
    """Reductions for ``all_reduce``, ``reduce`` and ``reduce_scatter_tensor``.  ``AVG`` is a sum
    divided by the group size (floating point tensors only)."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"


def _mpi() -> Any:
    """The ``mpi4py.MPI`` module (imports it, which initializes MPI, on first use)."""
    try:
        from mpi4py import MPI  # optional, and importing it starts MPI: on first use only
    except ImportError as e:
        raise DistError(
            "fusegrad.distributed needs mpi4py and an MPI library: "
            "pip install 'fusegrad[distributed]' (mpi4py and the mpich wheel)"
        ) from e
    return MPI


def is_available() -> bool:
    """True when mpi4py is installed (MPI itself is only started by init_process_group)."""
    return importlib.util.find_spec("mpi4py") is not None


class ProcessGroup:
    """A set of processes that run collectives together: an MPI communicator and the global
    ranks of its members, in group-rank order."""

    def __init__(self, comm: Any, ranks: Sequence[int], timeout: timedelta) -> None:
        self.comm = comm
        self.ranks = tuple(ranks)
        self.timeout = timeout
        self._group_rank = {g: i for i, g in enumerate(self.ranks)}

    def rank(self) -> int:
        return int(self.comm.Get_rank())

    def size(self) -> int:
        return len(self.ranks)

    def name(self) -> str:
        return "mpi"

    def group_rank(self, global_rank: int, op: str) -> int:
        """The rank in this group of a global rank (``src``/``dst`` arguments are global)."""
        if global_rank not in self._group_rank:
            raise ValueError(
                f"{op}: global rank {global_rank} is not part of the group (its global ranks: "
                f"{list(self.ranks)})"
            )
        return self._group_rank[global_rank]

    def __repr__(self) -> str:
        return f"ProcessGroup(backend=mpi, ranks={list(self.ranks)})"


class _NonGroupMember:
    """What ``new_group`` returns to processes outside the group (PyTorch's
    ``GroupMember.NON_GROUP_MEMBER``): collectives on it do nothing and return None."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class GroupMember:
    WORLD: ProcessGroup | None = None
    NON_GROUP_MEMBER = _NonGroupMember()


group = GroupMember  # torch.distributed.group.WORLD


class _State:
    """The default group and what init_process_group was given."""

    world: ProcessGroup | None = None
    backend_asked: str | None = None


_state = _State()


class Work:
    """The handle an ``async_op=True`` collective returns (PyTorch's ``Work``).

    ``wait()`` blocks until the operation has finished in this process -- the output tensors
    hold their result -- polling the MPI requests against ``timeout`` (the group's by default);
    ``is_completed()`` asks without blocking.  ``finish`` runs once, when the requests are
    done: copying a staged result back (non-contiguous or CUDA tensors), dividing for AVG."""

    def __init__(
        self,
        requests: list,
        op: str,
        timeout: timedelta,
        finish: Callable[[], Any] | None = None,
        statuses: list | None = None,
    ) -> None:
        self._requests = requests
        self._op = op
        self._timeout = timeout
        self._finish = finish
        self._statuses = statuses
        self._done = False
        self.result_value: Any = None  # what finish returned (recv: the source rank)

    def _complete(self) -> None:
        if not self._done:
            self._done = True
            if self._finish is not None:
                self.result_value = self._finish()

    def is_completed(self) -> bool:
        if self._done:
            return True
        MPI = _mpi()
        if self._statuses is not None:
            finished = MPI.Request.Testall(self._requests, self._statuses)
        else:
            finished = MPI.Request.Testall(self._requests)
        if finished:
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done; raise ``DistTimeoutError`` after ``timeout`` (a timedelta or
        seconds; the group's timeout by default).  Returns True, as PyTorch's does."""
        if self._done:
            return True
        limit = self._timeout if timeout is None else timeout
        seconds = limit.total_seconds() if isinstance(limit, timedelta) else float(limit)
        start = time.monotonic()
        deadline = start + seconds
        pause = 0.0
        # MPI progresses non-blocking collectives inside MPI calls: Testall drives it, and a
        # large allreduce takes many rounds, each needing both processes inside MPI.  So the
        # first SPIN_S seconds poll without sleeping, as MPI_Wait does (sleeping between polls
        # made a 2.8 MB allreduce twice as slow, a 20 kB one ten times); after that the pause
        # grows to 1 ms so that a long wait (a late peer) does not spin a core another rank
        # needs.
        while not self.is_completed():
            now = time.monotonic()
            if now > deadline:
                raise DistTimeoutError(
                    f"{self._op}: timed out after {seconds:g} s waiting for the other processes "
                    f"(one may have failed or not called {self._op} yet)"
                )
            if now - start < SPIN_S:
                continue
            if pause:
                time.sleep(pause)
            pause = min(0.001, pause * 2 if pause else 1e-5)
        return True

    def get_future(self) -> Any:
        raise NotImplementedError("Work.get_future: futures are not supported; use wait()")

    def __repr__(self) -> str:
        return f"Work({self._op}, completed={self._done})"


class _DoneWork(Work):
    """A finished ``Work`` (a collective that needed no communication)."""

    def __init__(self, op: str) -> None:
        super().__init__([], op, DEFAULT_TIMEOUT)
        self._done = True


# -- the default group ---------------------------------------------------------------------------
def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Join the default process group: every process started by ``mpiexec`` (or
    ``python -m fusegrad.distributed.run``); a plain ``python`` is a world of one.

    ``backend`` may be ``"mpi"``, None, or PyTorch's ``"gloo"``/``"nccl"`` (aliases: MPI is the
    one transport).  ``init_method`` and ``store`` are ignored (MPI's launcher does the
    rendezvous); ``world_size`` and ``rank``, when given, must agree with MPI's."""
    if _state.world is not None:
        raise DistError("trying to initialize the default process group twice!")
    if backend is not None:
        name = str(backend).lower()
        # "cpu:gloo,cuda:nccl" style strings: each part must be a known backend
        parts = [p.split(":")[-1] for p in name.split(",")]
        if not all(p in BACKENDS for p in parts):
            raise ValueError(
                f"init_process_group: invalid backend {backend!r}; fusegrad runs every backend on "
                f"MPI and accepts {', '.join(repr(b) for b in BACKENDS)} or None"
            )
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(
            f"init_process_group: expected timeout argument to be of type datetime.timedelta, "
            f"got {type(timeout).__name__}"
        )
    MPI = _mpi()
    comm = MPI.COMM_WORLD.Dup()  # our own communicator: user MPI traffic cannot interfere
    size, me = comm.Get_size(), comm.Get_rank()
    if world_size not in (-1, None) and world_size != size:
        comm.Free()
        raise ValueError(
            f"init_process_group: world_size={world_size} but MPI started {size} processes "
            f"(mpiexec -n {size})"
        )
    if rank not in (-1, None) and rank != me:
        comm.Free()
        raise ValueError(f"init_process_group: rank={rank} but MPI gave this process rank {me}")
    _state.world = ProcessGroup(comm, range(size), timeout or DEFAULT_TIMEOUT)
    _state.backend_asked = backend
    GroupMember.WORLD = _state.world


def is_initialized() -> bool:
    return _state.world is not None


def is_mpi_available() -> bool:
    return is_available()


def is_gloo_available() -> bool:
    return False


def is_nccl_available() -> bool:
    return False


def cuda_aware_mpi() -> bool:
    """Whether the MPI library says it can read CUDA device memory (MPIX_Query_cuda_support).
    fusegrad stages CUDA tensors through host buffers either way for now."""
    MPI = _mpi()
    query = getattr(MPI, "Query_cuda_support", None)
    try:
        return bool(query()) if query is not None else False
    except Exception:  # noqa: BLE001  (an MPI without the query: not CUDA-aware)
        return False


def _world(op: str) -> ProcessGroup:
    if _state.world is None:
        raise DistNotInitializedError(
            f"{op}: Default process group has not been initialized, please make sure to call "
            f"init_process_group."
        )
    return _state.world


def _resolve(group: Any, op: str) -> ProcessGroup | None:
    """The group a call runs on (None: this process is not a member; the call does nothing)."""
    world = _world(op)
    if group is None or group is GroupMember.WORLD:
        return world
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{op}: group must be a ProcessGroup or None, got {type(group).__name__}")
    return group


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (the default group by default); -1 for a non-member."""
    pg = _resolve(group, "get_rank")
    return -1 if pg is None else pg.rank()


def get_world_size(group: Any = None) -> int:
    """The number of processes in ``group``; -1 for a non-member."""
    pg = _resolve(group, "get_world_size")
    return -1 if pg is None else pg.size()


def get_backend(group: Any = None) -> str:
    _resolve(group, "get_backend")
    return "mpi"


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    return group.ranks[group_rank]


def get_process_group_ranks(group: ProcessGroup) -> list[int]:
    return list(group.ranks)


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
) -> Any:
    """A group of the given global ranks (all by default), in ascending rank order.  Every
    process of the default group must call it, members or not (MPI's ``Comm.Split``); a
    non-member gets ``GroupMember.NON_GROUP_MEMBER``."""
    world = _world("new_group")
    members = sorted(set(range(world.size()) if ranks is None else (int(r) for r in ranks)))
    for r in members:
        if not 0 <= r < world.size():
            raise ValueError(
                f"new_group: rank {r} is not a global rank of the default group (size "
                f"{world.size()})"
            )
    me = world.rank()
    MPI = _mpi()
    color = 0 if me in members else MPI.UNDEFINED
    comm = world.comm.Split(color, me)
    if me not in members:
        return GroupMember.NON_GROUP_MEMBER
    return ProcessGroup(comm, members, timeout or world.timeout)


def destroy_process_group(group: Any = None) -> None:
    """Free a group's communicator; without ``group``, the default group and the state
    ``init_process_group`` set up (it may be called again afterwards)."""
    if group is None or group is GroupMember.WORLD:
        world = _world("destroy_process_group")
        world.comm.Free()
        _state.world = None
        _state.backend_asked = None
        GroupMember.WORLD = None
        return
    if isinstance(group, ProcessGroup) and group.comm is not None:
        group.comm.Free()
        group.comm = None
