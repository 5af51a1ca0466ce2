"""``fusegrad.distributed.rpc``: PyTorch's ``torch.distributed.rpc`` on MPI point-to-point.

    import fusegrad.distributed.rpc as rpc
    rpc.init_rpc(f"worker{rank}")            # every process; rank and world size from MPI
    y = rpc.rpc_sync("worker1", torch_fn, args=(x,))       # run there, wait for the result
    fut = rpc.rpc_async("worker1", fn, args=(x,)); fut.wait()
    rref = rpc.remote("worker1", nn.Linear, args=(4, 3))    # an object that lives there
    rref.to_here(); rref.owner(); rref.rpc_sync().forward(x)
    rpc.shutdown()                            # every process: waits for outstanding work

Functions and classes go by reference (module and name: the callee imports them); arguments
and results are pickled, tensors as their numpy arrays.  Inside a distributed autograd context
(``fusegrad.distributed.autograd.context()``), tensors that require grad are recorded as they
cross (see that module).  A call made to the caller's own worker works too.

Errors: an exception raised by the remote function is raised by ``rpc_sync`` / ``wait()`` /
``to_here()`` as the same type (``DistError`` where the type cannot be rebuilt), its message
``On WorkerInfo(id=.., name=..):`` followed by the remote repr and traceback, as PyTorch's.
Every call has a timeout (``timeout`` in seconds; -1 or None: the agent's ``rpc_timeout``, 60 s
by default; 0: none), after which it fails with ``DistTimeoutError``.

Differences from PyTorch: one backend (MPI: ``backend`` is accepted and ignored); RRefs are not
reference counted, so an owner keeps the values of ``remote`` calls until ``shutdown``; no
``@rpc.functions.async_execution``; ``init_rpc`` needs MPI initialised with
``MPI_THREAD_MULTIPLE`` (mpi4py's default).
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from typing import Any

from . import _dist_context
from . import autograd as _dist_autograd  # (registers the distributed backward's handlers)
from ._rpc_agent import (
    DEFAULT_NUM_WORKER_THREADS,
    DEFAULT_RPC_TIMEOUT_SEC,
    Agent,
    Future,
    WorkerInfo,
    register_handler,
    running,
    set_running,
)
from .process_group import DistError, _mpi

__all__ = [
    "DEFAULT_RPC_TIMEOUT_SEC",
    "Future",
    "RRef",
    "RpcBackendOptions",
    "TensorPipeRpcBackendOptions",
    "WorkerInfo",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
    "wait_all",
]

_ = _dist_autograd  # imported for its handlers


@dataclass
class RpcBackendOptions:
    """``rpc_timeout``: seconds a call waits for its answer (PyTorch's default, 60);
    ``num_worker_threads``: threads that serve incoming requests (nested and concurrent calls
    each hold one while they wait)."""

    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_SEC
    num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS
    init_method: str | None = None


TensorPipeRpcBackendOptions = RpcBackendOptions  # PyTorch's name, for scripts written for it


_init_lock = threading.Lock()


def is_available() -> bool:
    """True when mpi4py is installed (RPC runs on MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


_agent = running


def init_rpc(
    name: str,
    backend: Any = None,
    rank: int = -1,
    world_size: int | None = None,
    rpc_backend_options: RpcBackendOptions | None = None,
) -> None:
    """Start this process's RPC agent as worker ``name``; every process of the job calls it
    (names must be unique).  ``rank`` and ``world_size``, when given, must be MPI's."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"init_rpc: name must be a non-empty string, got {name!r}")
    options = rpc_backend_options or RpcBackendOptions()
    with _init_lock:
        try:
            running("init_rpc")
        except DistError:
            pass
        else:
            raise DistError("init_rpc: RPC is already initialized")
        MPI = _mpi()
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            levels = {
                MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
                MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
                MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
            }
            raise DistError(
                f"init_rpc: the RPC agent needs MPI initialized with MPI_THREAD_MULTIPLE (its "
                f"progress thread receives while other threads send), but MPI runs at "
                f"{levels.get(MPI.Query_thread(), MPI.Query_thread())}; leave "
                f"mpi4py.rc.thread_level at its default ('multiple') and use an MPI library "
                f"that provides it"
            )
        comm = MPI.COMM_WORLD.Dup()
        size, me = comm.Get_size(), comm.Get_rank()
        if world_size is not None and world_size != size:
            comm.Free()
            raise ValueError(f"init_rpc: world_size={world_size} but MPI started {size} processes")
        if rank not in (-1, None) and rank != me:
            comm.Free()
            raise ValueError(f"init_rpc: rank={rank} but MPI gave this process rank {me}")
        names = comm.allgather(name)
        if len(set(names)) != len(names):
            comm.Free()
            raise ValueError(f"init_rpc: worker names must be unique, got {names}")
        _dist_context.set_worker_id(me)
        agent = Agent(comm, names, float(options.rpc_timeout), int(options.num_worker_threads))
        set_running(agent)
        agent.start()


def shutdown(graceful: bool = True, timeout: float = 0) -> None:
    """Stop this worker's agent.  ``graceful`` (every worker calls it): wait until every worker
    is done calling and every request has been answered; ``timeout`` seconds for that (0: the
    agent's ``rpc_timeout``), then ``DistTimeoutError``."""
    agent = _agent("shutdown")
    try:
        agent.shutdown(graceful, float(timeout) if timeout else agent.timeout_s)
    finally:
        set_running(None)
        _dist_context.clear_all()


def get_worker_info(worker_name: str | None = None) -> WorkerInfo:
    """The ``WorkerInfo`` of ``worker_name`` (this worker's when None)."""
    agent = _agent("get_worker_info")
    if worker_name is None:
        return agent.info
    if worker_name not in agent.by_name:
        raise ValueError(f"get_worker_info: unknown worker name {worker_name!r}")
    return agent.by_name[worker_name]


def _rank_of(agent: Agent, to: Any, op: str) -> int:
    if isinstance(to, WorkerInfo):
        return to.id
    if isinstance(to, str):
        if to not in agent.by_name:
            raise ValueError(f"{op}: unknown worker name {to!r} (workers: {sorted(agent.by_name)})")
        return agent.by_name[to].id
    if isinstance(to, int) and 0 <= to < agent.world_size:
        return to
    raise ValueError(f"{op}: 'to' must be a worker name, WorkerInfo or rank, got {to!r}")


def _timeout_s(agent: Agent, timeout: float | None) -> float | None:
    if timeout is None or timeout < 0:
        return agent.timeout_s
    return None if timeout == 0 else float(timeout)


def _describe(op: str, func: Any, rank: int, agent: Agent) -> str:
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{op}({name}) on {agent.workers[rank]!r}"


def _call(
    op: str, to: Any, func: Any, args: tuple | None, kwargs: dict | None, timeout: float | None
) -> Future:
    agent = _agent(op)
    rank = _rank_of(agent, to, op)
    payload = (func, tuple(args or ()), dict(kwargs or {}))
    return agent.request(
        rank, "call", payload, _timeout_s(agent, timeout), _describe(op, func, rank, agent)
    )


def rpc_async(
    to: Any,
    func: Any,
    args: tuple | None = None,
    kwargs: dict | None = None,
    timeout: float | None = -1.0,
) -> Future:
    """Run ``func(*args, **kwargs)`` on worker ``to``; returns a ``Future`` of its result."""
    return _call("rpc_async", to, func, args, kwargs, timeout)


def rpc_sync(
    to: Any,
    func: Any,
    args: tuple | None = None,
    kwargs: dict | None = None,
    timeout: float | None = -1.0,
) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result."""
    return _call("rpc_sync", to, func, args, kwargs, timeout).wait()


def remote(
    to: Any,
    func: Any,
    args: tuple | None = None,
    kwargs: dict | None = None,
    timeout: float | None = -1.0,
) -> RRef:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and keep the result there; returns at
    once an ``RRef`` to it (an error surfaces at ``to_here()``)."""
    agent = _agent("remote")
    rank = _rank_of(agent, to, "remote")
    key = agent.new_rref_key()
    payload = (func, tuple(args or ()), dict(kwargs or {}))
    creation = agent.request(
        rank,
        "remote",
        payload,
        _timeout_s(agent, timeout),
        _describe("remote", func, rank, agent),
        extra=key,
    )
    return RRef._of(rank, key, creation)


def wait_all(futures: list[Future]) -> list[Any]:
    """The results of ``futures``, in order (the first error is raised)."""
    return [f.wait() for f in futures]


# -- RRef --------------------------------------------------------------------------------------
class RRef:
    """A reference to a value owned by one worker (PyTorch's ``RRef``).  ``RRef(value)`` makes
    this worker the owner of ``value``; ``remote()`` returns one owned by the callee.  An RRef
    may be passed in RPC arguments and results; it refers to the same value everywhere."""

    def __init__(self, value: Any, type_hint: Any = None) -> None:
        agent = _agent("RRef")
        self._owner = agent.rank
        self._key = agent.new_rref_key()
        self._creation: Future | None = None
        agent.slot(self._key).set(value)

    @classmethod
    def _of(cls, owner: int, key: tuple[int, int], creation: Future | None = None) -> RRef:
        rref = cls.__new__(cls)
        rref._owner, rref._key, rref._creation = owner, tuple(key), creation
        return rref

    def __reduce__(self) -> tuple:
        return (_rebuild_rref, (self._owner, self._key))

    def owner(self) -> WorkerInfo:
        return _agent("RRef.owner").workers[self._owner]

    def owner_name(self) -> str:
        return self.owner().name

    def is_owner(self) -> bool:
        return _agent("RRef.is_owner").rank == self._owner

    def confirmed_by_owner(self) -> bool:
        return self._creation is None or self._creation.done()

    def local_value(self) -> Any:
        """The value, on its owner (the value itself, not a copy)."""
        agent = _agent("RRef.local_value")
        if agent.rank != self._owner:
            raise RuntimeError(
                f"RRef.local_value(): this RRef is owned by {self.owner()!r}, not by this worker "
                f"({agent.info!r}); call local_value() on the owner, or to_here() here"
            )
        return agent.slot(self._key).get(agent.timeout_s, "RRef.local_value")

    def to_here(self, timeout: float | None = -1.0) -> Any:
        """A copy of the value here (the value itself on its owner)."""
        agent = _agent("RRef.to_here")
        if agent.rank == self._owner:
            return agent.slot(self._key).get(_timeout_s(agent, timeout), "RRef.to_here")
        future = agent.request(
            self._owner,
            "fetch",
            None,
            _timeout_s(agent, timeout),
            f"RRef.to_here() from {self.owner()!r}",
            extra=self._key,
        )
        return future.wait()

    def rpc_sync(self, timeout: float | None = -1.0) -> _Proxy:
        """``rref.rpc_sync().method(*args)``: call a method of the value on its owner."""
        return _Proxy(self, "sync", timeout)

    def rpc_async(self, timeout: float | None = -1.0) -> _Proxy:
        return _Proxy(self, "async", timeout)

    def remote(self, timeout: float | None = -1.0) -> _Proxy:
        return _Proxy(self, "remote", timeout)

    def __repr__(self) -> str:
        return f"RRef(owner={self._owner}, id={self._key})"


def _rebuild_rref(owner: int, key: tuple[int, int]) -> RRef:
    return RRef._of(owner, key)


def _call_method(rref: RRef, method: str, args: tuple, kwargs: dict) -> Any:
    return getattr(rref.local_value(), method)(*args, **kwargs)


class _Proxy:
    def __init__(self, rref: RRef, how: str, timeout: float | None) -> None:
        self._rref, self._how, self._timeout = rref, how, timeout

    def __getattr__(self, method: str) -> Any:
        rref, how, timeout = self._rref, self._how, self._timeout

        def call(*args: Any, **kwargs: Any) -> Any:
            call_args = (rref, method, args, kwargs)
            if how == "sync":
                return rpc_sync(rref.owner(), _call_method, call_args, timeout=timeout)
            if how == "async":
                return rpc_async(rref.owner(), _call_method, call_args, timeout=timeout)
            return remote(rref.owner(), _call_method, call_args, timeout=timeout)

        return call


# -- what the agent runs for these requests -----------------------------------------------------
def _serve_call(agent: Agent, source: int, payload: Any, extra: Any) -> Any:
    func, args, kwargs = payload
    return func(*args, **kwargs)


def _serve_remote(agent: Agent, source: int, payload: Any, extra: Any) -> None:
    func, args, kwargs = payload
    agent.slot(extra).set(func(*args, **kwargs))
    return None


def _serve_fetch(agent: Agent, source: int, payload: Any, extra: Any) -> Any:
    return agent.slot(extra).get(agent.timeout_s, "RRef.to_here")


register_handler("call", _serve_call)
register_handler("remote", _serve_remote)
register_handler("fetch", _serve_fetch)
