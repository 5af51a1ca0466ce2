"""The RPC agent under ``fusegrad.distributed.rpc``: MPI point-to-point messages, a progress
thread, a pool of worker threads, futures and the owner side of ``RRef``.

One agent per process (``rpc.init_rpc``), on its own duplicate of ``MPI.COMM_WORLD``.  Every
message is one pickled tuple sent with ``isend`` (mpi4py's object send) under one tag:

    (kind, request_id, context_id, body, tensors, extra)

``body`` is the payload pickled with tensors taken out (``persistent_id``): each tensor travels
as its numpy array in ``tensors``, with whether it requires grad, its class when it is a
subclass (``nn.Parameter``) and, inside a distributed autograd context, its send id
(``_dist_context``).  Functions are pickled by reference (module
and name), so the callee must be able to import them.  ``extra`` holds an RRef's id for the
kinds that need it before the body is read.

Requests (``call``, ``remote``, ``fetch``, and the distributed backward's ``backward`` and
``release``) are answered by ``ok`` (the result, pickled the same way) or ``err`` (the
exception's type, message and the remote traceback text, re-raised on the caller as the same
type where it can be rebuilt).  Only the progress thread receives: it polls ``improbe``
(sleeping up to 1 ms when idle so that it does not take a core from the computation), completes
the futures of responses and hands requests to the worker threads -- never runs user code
itself, so a request may make RPCs of its own (nested calls) without deadlock.  Any thread
sends (the agent needs ``MPI_THREAD_MULTIPLE``).  Every wait has a deadline: the call's timeout
(the agent's ``rpc_timeout``, 60 s by default as PyTorch's ``DEFAULT_RPC_TIMEOUT_SEC``), and a
late answer to a call that timed out is dropped.

Shutdown (graceful): wait for this worker's outstanding calls, a barrier (every worker has
stopped calling), let the worker threads finish, a second barrier (no more answers will be
sent), then exchange how many messages each worker sent to each other and receive until every
one has arrived, so no message is left in the communicator when it is freed.
"""

from __future__ import annotations

import importlib
import io
import itertools
import pickle
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autograd.grad_mode import is_grad_enabled
from ..storage import to_host
from ..tensor import Tensor
from . import _dist_context
from .process_group import DistError, DistTimeoutError, _mpi

DEFAULT_RPC_TIMEOUT_SEC = 60.0
"""PyTorch's default RPC timeout (``torch.distributed.rpc.constants.DEFAULT_RPC_TIMEOUT_SEC``)."""
DEFAULT_NUM_WORKER_THREADS = 16
TAG = 0x5250  # "RP": every RPC message (the agent's communicator carries nothing else)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker's name and id (its rank), as PyTorch's ``WorkerInfo``."""

    name: str
    id: int

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, name={self.name})"


# -- futures ----------------------------------------------------------------------------------
class Future:
    """The result of an ``rpc_async`` call (PyTorch's ``torch.futures.Future``, the parts that
    matter here): ``wait()`` blocks until it is done (raising its error), ``value()``,
    ``done()``, ``then(callback)`` (a future of ``callback(this_future)``) and
    ``add_done_callback``.  Callbacks run in the thread that completes the future -- for an RPC,
    the agent's progress thread: keep them short and make no blocking RPC in them.

    A future made by an RPC has a deadline (the call's timeout): ``wait()`` past it fails the
    future with ``DistTimeoutError``."""

    def __init__(self, description: str = "future", timeout_s: float | None = None) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []
        self._description = description
        self._timeout_s = timeout_s
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, value: Any) -> None:
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._complete(None, error)

    def _complete(self, value: Any, error: BaseException | None) -> bool:
        with self._lock:
            if self._event.is_set():
                return False  # (a late answer to a call that timed out)
            self._value, self._error = value, error
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
        return True

    def wait(self) -> Any:
        """The result, once done; raises the call's error, or ``DistTimeoutError`` when the
        deadline passes first."""
        remaining = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        if not self._event.wait(remaining):
            self._complete(
                None,
                DistTimeoutError(
                    f"{self._description}: RPC ran for more than its timeout "
                    f"({self._timeout_s:g} s) without an answer (the peer may have failed, be "
                    f"busy, or not be serving RPCs)"
                ),
            )
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        if not self.done():
            raise RuntimeError(f"{self._description}: value() called before the future is done")
        return self.wait()

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A future completed with ``callback(self)`` when this one is done (or with the error
        ``callback`` raises)."""
        chained = Future(f"{self._description}.then")

        def run(done: Future) -> None:
            try:
                result = callback(done)
            except Exception as e:  # noqa: BLE001  (the chained future carries it)
                chained.set_exception(e)
            else:
                chained.set_result(result)

        self.add_done_callback(run)
        return chained

    def __repr__(self) -> str:
        return f"Future({self._description}, done={self.done()})"


# -- what crosses: tensors out of the pickle ---------------------------------------------------
class _Pickler(pickle.Pickler):
    """Pickles a payload with each tensor replaced by an index into ``tensors``: (array,
    requires_grad, send id or None).  Inside a distributed autograd context a tensor that
    requires grad is recorded as a send."""

    def __init__(self, file: io.BytesIO, ctx: _dist_context.DistAutogradContext | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.ctx = ctx
        self.tensors: list[tuple[np.ndarray, bool, int | None, type | None]] = []
        self._index: dict[int, int] = {}
        self._keep: list[Tensor] = []  # (ids stay unique while the pickle is made)

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, Tensor):
            return None
        index = self._index.get(id(obj))
        if index is None:
            send_id = None
            if self.ctx is not None and obj.requires_grad and is_grad_enabled():
                send_id = self.ctx.record_send(obj)
            array = np.ascontiguousarray(to_host(obj._data))
            index = self._index[id(obj)] = len(self.tensors)
            # a subclass (nn.Parameter) comes back as itself
            kind = None if type(obj) is Tensor else type(obj)
            self.tensors.append((array, bool(obj.requires_grad), send_id, kind))
            self._keep.append(obj)
        return ("tensor", index)


class _Unpickler(pickle.Unpickler):
    def __init__(
        self,
        file: io.BytesIO,
        tensors: list,
        peer: int,
        ctx: _dist_context.DistAutogradContext | None,
    ) -> None:
        super().__init__(file)
        self.tensors = tensors
        self.peer = peer
        self.ctx = ctx
        self._made: dict[int, Tensor] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind, index = pid
        if kind != "tensor":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        made = self._made.get(index)
        if made is None:
            array, requires_grad, send_id, kind = self.tensors[index]
            made = (kind or Tensor)._make(array)
            if requires_grad:
                made.requires_grad_(True)
                if send_id is not None and self.ctx is not None:
                    self.ctx.record_recv(made, self.peer, send_id)
            self._made[index] = made
        return made


def pack(obj: Any, ctx: _dist_context.DistAutogradContext | None) -> tuple[bytes, list]:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, ctx)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.tensors


def unpack(
    body: bytes, tensors: list, peer: int, ctx: _dist_context.DistAutogradContext | None
) -> Any:
    return _Unpickler(io.BytesIO(body), tensors, peer, ctx).load()


# -- errors that cross ----------------------------------------------------------------------
def describe_error(error: BaseException, where: WorkerInfo) -> tuple[str, str, str, str]:
    """What an ``err`` answer carries: the type's module and name, the text PyTorch's remote
    errors have (``On WorkerInfo(...):``, the repr, the remote traceback) and the bare message."""
    kind = type(error)
    tb = "".join(traceback.format_exception(kind, error, error.__traceback__))
    text = f"On {where!r}:\n{error!r}\n{tb}"
    return kind.__module__, kind.__qualname__, text, str(error)


def rebuild_error(described: tuple[str, str, str, str]) -> BaseException:
    """The remote error as its own type where that type imports here and takes one message;
    otherwise a ``DistError`` with the same text."""
    module, qualname, text, _ = described
    try:
        kind: Any = importlib.import_module(module)
        for part in qualname.split("."):
            kind = getattr(kind, part)
        if isinstance(kind, type) and issubclass(kind, Exception):
            error = kind(text)
            if str(error) == text or isinstance(error, KeyError):
                return error
    except Exception:  # noqa: BLE001  (not rebuildable here: the generic error below)
        pass
    return DistError(f"{module}.{qualname}: {text}")


# -- the owner side of RRefs -----------------------------------------------------------------
class _Slot:
    """An owned RRef's value, set once (by ``remote``'s function or ``RRef(value)``)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: tuple[str, str, str, str] | None = None

    def set(self, value: Any) -> None:
        self.value = value
        self.event.set()

    def fail(self, described: tuple[str, str, str, str]) -> None:
        self.error = described
        self.event.set()

    def get(self, timeout_s: float | None, what: str) -> Any:
        if not self.event.wait(timeout_s):
            raise DistTimeoutError(
                f"{what}: the RRef's value was not created within {timeout_s:g} s"
            )
        if self.error is not None:
            raise rebuild_error(self.error)
        return self.value


# -- the agent --------------------------------------------------------------------------------
class _Running:
    agent: Agent | None = None


_running = _Running()


def running(op: str) -> Agent:
    """This process's agent; ``DistError`` naming ``op`` before ``init_rpc``."""
    agent = _running.agent
    if agent is None:
        raise DistError(
            f"{op}: RPC has not been initialized. Call fusegrad.distributed.rpc.init_rpc first."
        )
    return agent


def set_running(agent: Agent | None) -> None:
    _running.agent = agent


Handler = Callable[["Agent", int, Any, Any], Any]
HANDLERS: dict[str, Handler] = {}


def register_handler(kind: str, handler: Handler) -> None:
    """``handler(agent, source_rank, payload, extra)`` answers requests of ``kind`` (run on a
    worker thread, with the request's autograd context current)."""
    HANDLERS[kind] = handler


class Agent:
    def __init__(
        self,
        comm: Any,
        names: list[str],
        timeout_s: float,
        num_worker_threads: int,
    ) -> None:
        self.comm = comm
        self.rank = int(comm.Get_rank())
        self.world_size = int(comm.Get_size())
        self.workers = [WorkerInfo(n, i) for i, n in enumerate(names)]
        self.by_name = {w.name: w for w in self.workers}
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(num_worker_threads, thread_name_prefix="fusegrad-rpc")
        self._request_ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._outgoing: list[Any] = []  # MPI requests of messages not yet sent out
        self._sent = [0] * self.world_size
        self._received = [0] * self.world_size
        self._serving = 0  # requests being handled by worker threads
        self._lock = threading.Lock()
        self.owned: dict[tuple[int, int], _Slot] = {}
        self._rref_ids = itertools.count()
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._progress, name="fusegrad-rpc-progress", daemon=True
        )

    def start(self) -> None:
        """Start serving requests: after ``set_running(self)``, so that a function another
        worker calls here finds this worker's agent (``get_worker_info``: a peer whose
        ``init_rpc`` returned first could call in before it was set)."""
        self.thread.start()

    @property
    def info(self) -> WorkerInfo:
        return self.workers[self.rank]

    # -- sending --------------------------------------------------------------------------
    def _send(self, dst: int, message: tuple) -> None:
        request = self.comm.isend(message, dest=dst, tag=TAG)
        with self._lock:
            self._outgoing.append(request)
            self._sent[dst] += 1

    def request(
        self,
        dst: int,
        kind: str,
        payload: Any,
        timeout_s: float | None,
        description: str,
        extra: Any = None,
    ) -> Future:
        """Send a request; its future completes with the answer."""
        if self._stop.is_set():
            raise DistError(f"{description}: RPC has been shut down on this worker")
        ctx = _dist_context.current()
        request_id = next(self._request_ids)
        future = Future(description, timeout_s)
        try:
            body, tensors = pack(payload, ctx)
        except (pickle.PicklingError, AttributeError, TypeError) as e:  # refused here, unsent
            raise TypeError(
                f"{description}: cannot pickle the call ({e}); RPC sends functions and classes "
                f"by reference, so they must be defined at module level, importable by the "
                f"callee, and the arguments picklable"
            ) from e
        if ctx is not None:
            with ctx.lock:
                ctx.peers.add(dst)
        with self._lock:
            self._pending[request_id] = future
        self._send(
            dst, (kind, request_id, None if ctx is None else ctx.context_id, body, tensors, extra)
        )
        return future

    def new_rref_key(self) -> tuple[int, int]:
        return (self.rank, next(self._rref_ids))

    def slot(self, key: tuple[int, int]) -> _Slot:
        with self._lock:
            slot = self.owned.get(key)
            if slot is None:
                slot = self.owned[key] = _Slot()
            return slot

    # -- the progress thread ----------------------------------------------------------------
    def _progress(self) -> None:
        MPI = _mpi()
        status = MPI.Status()
        pause = 0.0
        while not self._stop.is_set():
            message = self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG, status=status)
            if message is None:
                self._reap_sends()
                if pause:
                    time.sleep(pause)
                pause = min(0.001, pause * 2 if pause else 2e-5)
                continue
            pause = 0.0
            source = status.Get_source()
            data = message.recv()
            with self._lock:
                self._received[source] += 1
            try:
                self._dispatch(source, data)
            except Exception:  # noqa: BLE001  (a bad message must not stop the agent)
                traceback.print_exc()

    def _reap_sends(self) -> None:
        with self._lock:
            if self._outgoing:
                self._outgoing = [r for r in self._outgoing if not r.Test()]

    def _dispatch(self, source: int, data: tuple) -> None:
        kind, request_id, context_id, body, tensors, extra = data
        if kind in ("ok", "err"):
            with self._lock:
                future = self._pending.pop(request_id, None)
            if future is None or future.done():
                return  # the caller gave up (timeout)
            if kind == "err":
                future.set_exception(rebuild_error(body))
                return
            ctx = None if context_id is None else _dist_context.lookup(context_id)
            try:
                value = unpack(body, tensors, source, ctx)
            except Exception as e:  # noqa: BLE001
                future.set_exception(e)
            else:
                future.set_result(value)
            return
        if kind == "remote" or kind == "fetch":
            self.slot(extra)  # before any worker thread runs: a fetch may wait for it
        with self._lock:
            self._serving += 1
        self.pool.submit(self._serve, source, data)

    def _serve(self, source: int, data: tuple) -> None:
        kind, request_id, context_id, body, tensors, extra = data
        ctx = None if context_id is None else _dist_context.join(context_id)
        previous = _dist_context.set_current(ctx)
        try:
            try:
                payload = unpack(body, tensors, source, ctx)
                handler = HANDLERS.get(kind)
                if handler is None:
                    raise DistError(f"RPC: unknown request kind {kind!r}")
                result = handler(self, source, payload, extra)
                reply_body, reply_tensors = pack(result, ctx)
                reply: tuple = ("ok", request_id, context_id, reply_body, reply_tensors, None)
            except BaseException as e:  # noqa: BLE001  (every error goes back to the caller)
                if kind == "remote":
                    self.slot(extra).fail(describe_error(e, self.info))
                reply = ("err", request_id, context_id, describe_error(e, self.info), [], None)
            finally:
                _dist_context.set_current(previous)
            self._send(source, reply)
        finally:
            with self._lock:
                self._serving -= 1

    # -- shutdown ---------------------------------------------------------------------------
    def _wait_until(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        pause = 1e-5
        while not done():
            if time.monotonic() > deadline:
                raise DistTimeoutError(f"rpc.shutdown: timed out waiting for {what}")
            time.sleep(pause)
            pause = min(0.001, pause * 2)

    def _barrier(self, deadline: float, what: str) -> None:
        request = self.comm.Ibarrier()
        self._wait_until(request.Test, deadline, what)

    def shutdown(self, graceful: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            if graceful:
                with self._lock:
                    pending = list(self._pending.values())
                self._wait_until(
                    lambda: all(f.done() for f in pending), deadline, "this worker's RPCs"
                )
                self._barrier(deadline, "the other workers to call shutdown")
                self._wait_until(lambda: self._serving == 0, deadline, "requests being served")
                self._barrier(deadline, "the other workers' requests being served")
                sent = np.array(self._sent, np.int64)
                expected = np.empty_like(sent)
                request = self.comm.Ialltoall(sent, expected)
                self._wait_until(request.Test, deadline, "the message counts")
                self._wait_until(
                    lambda: self._received == expected.tolist(), deadline, "messages in flight"
                )
                self._wait_until(
                    lambda: (self._reap_sends(), not self._outgoing)[1], deadline, "sends"
                )
        finally:
            self._stop.set()
            self.thread.join(timeout=5)
            self.pool.shutdown(wait=graceful, cancel_futures=not graceful)
        if graceful:
            self.comm.Free()
