"""RPC, distributed autograd and DistributedOptimizer on two real processes: run by
tests/distributed/test_mpi_suites.py as ``mpiexec -n 2 python -m pytest ...mpi_rpc.py``.

Every test runs on both ranks at once, each driving its own calls to the other (so each rank
is also serving the other's requests meanwhile).  The model split over the two processes is
compared with one process computing the whole model (float64, 1e-12).  Functions called
remotely live at module level: RPC sends them by reference.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.distributed as dist
import fusegrad.distributed.autograd as dist_autograd
import fusegrad.distributed.rpc as rpc
import fusegrad.nn as nn
from fusegrad.distributed import _rpc_agent
from fusegrad.distributed.optim import DistributedOptimizer

TIGHT = {"rtol": 1e-12, "atol": 1e-14}


@pytest.fixture(scope="module", autouse=True)
def workers(request: pytest.FixtureRequest) -> Iterator[None]:
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    options = rpc.RpcBackendOptions(rpc_timeout=30)
    start = _rpc_agent.Agent.start

    def recorded(agent: _rpc_agent.Agent) -> None:
        STARTED.append(_rpc_agent._running.agent is agent)
        start(agent)

    _rpc_agent.Agent.start = recorded  # type: ignore[method-assign]
    try:
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    finally:
        _rpc_agent.Agent.start = start  # type: ignore[method-assign]
    yield
    if request.session.testsfailed:
        return  # the other rank may be elsewhere: conftest.py aborts the job instead
    rpc.shutdown()


def me() -> int:
    return rpc.get_worker_info().id


def other() -> str:
    return f"worker{1 - me()}"


# -- run remotely ----------------------------------------------------------------------------
def add(a: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
    return a + b


def whoami() -> str:
    return rpc.get_worker_info().name


def fetch(rref: rpc.RRef) -> fg.Tensor:
    return rref.to_here() * 2  # a nested call back to the owner, from a worker thread


def raise_value_error(text: str) -> None:
    raise ValueError(f"bad value on {rpc.get_worker_info().name}: {text}")


class TwoArgError(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


def raise_two_arg_error() -> None:
    raise TwoArgError("first", "second")


def seeded(layer: nn.Linear, seed: int) -> nn.Linear:
    """Parameters drawn from numpy's generator of ``seed``: fusegrad's global generator is
    shared by the threads of a process, and the worker threads serving the other rank's calls
    run alongside this rank's own test code."""
    rng = np.random.default_rng(seed)
    with fg.no_grad():
        for p in layer.parameters():
            p.copy_(fg.tensor(rng.standard_normal(tuple(p.shape)) * 0.5))
    return layer


def make_layer(n_in: int, n_out: int, seed: int) -> nn.Linear:
    return seeded(nn.Linear(n_in, n_out, dtype=fg.float64), seed)


def layer_forward(layer: rpc.RRef, x: fg.Tensor) -> fg.Tensor:
    return fg.tanh(layer.local_value()(x))


def layer_params(layer: rpc.RRef) -> list[rpc.RRef]:
    return [rpc.RRef(p) for p in layer.local_value().parameters()]


def layer_grads(layer: rpc.RRef, context_id: int) -> list[fg.Tensor | None]:
    grads = dist_autograd.get_gradients(context_id)
    return [grads.get(p) for p in layer.local_value().parameters()]


def layer_dot_grads_are_none(layer: rpc.RRef) -> bool:
    return all(p.grad is None for p in layer.local_value().parameters())


class FailingBackward(fg.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: fg.Tensor) -> fg.Tensor:
        return x * 1.0

    @staticmethod
    def backward(ctx: object, g: fg.Tensor) -> fg.Tensor:
        raise ValueError(f"failing backward on {rpc.get_worker_info().name}")


def fails_in_backward(x: fg.Tensor) -> fg.Tensor:
    return FailingBackward.apply(x) * 3.0


# -- rpc ---------------------------------------------------------------------------------------
# whether the agent was this worker's running agent when it started serving (``workers``)
STARTED: list[bool] = []


def test_a_worker_serves_calls_only_once_its_agent_is_running() -> None:
    """A peer whose ``init_rpc`` returned first may call in at once: the call must find this
    worker's agent (``get_worker_info`` in the called function raised "RPC has not been
    initialized" once in CI when the agent served before it was set)."""
    assert STARTED == [True]
    assert rpc.rpc_sync(other(), whoami) == other()


def test_rpc_sync_async_then_and_calls_to_self() -> None:
    a, b = fg.tensor([1.0, 2.0]), fg.tensor([10.0, 20.0])
    assert rpc.rpc_sync(other(), add, args=(a, b)).tolist() == [11.0, 22.0]
    assert rpc.rpc_sync(other(), whoami) == other()
    future = rpc.rpc_async(other(), add, args=(a,), kwargs={"b": b})
    doubled = future.then(lambda f: f.value() * 2)
    assert future.wait().tolist() == [11.0, 22.0] and future.done()
    assert doubled.wait().tolist() == [22.0, 44.0]
    assert rpc.rpc_sync(rpc.get_worker_info(), whoami) == f"worker{me()}"  # to itself
    assert rpc.wait_all([rpc.rpc_async(1 - me(), whoami) for _ in range(5)]) == [other()] * 5
    assert rpc.get_worker_info(other()) == rpc.WorkerInfo(other(), 1 - me())


def test_remote_and_rrefs() -> None:
    rref = rpc.remote(other(), make_layer, args=(3, 2, 7))
    assert rref.owner() == rpc.get_worker_info(other()) and rref.owner_name() == other()
    assert not rref.is_owner()
    with pytest.raises(RuntimeError, match="RRef.local_value\\(\\): this RRef is owned by"):
        rref.local_value()
    copy_here = rref.to_here()
    assert isinstance(copy_here, nn.Linear) and isinstance(copy_here.weight, nn.Parameter)
    expected = make_layer(3, 2, 7)
    np.testing.assert_array_equal(
        copy_here.weight.detach().numpy(), expected.weight.detach().numpy()
    )
    x = fg.randn(4, 3, dtype=fg.float64)
    np.testing.assert_array_equal(
        rref.rpc_sync().forward(x).detach().numpy(), expected(x).detach().numpy()
    )
    assert rref.rpc_async().extra_repr().wait() == expected.extra_repr()
    # an RRef this worker owns, used by the other one: it calls back here for the value
    mine = rpc.RRef(fg.tensor([1.0, 2.0, 3.0]))
    assert mine.is_owner() and mine.local_value().tolist() == [1.0, 2.0, 3.0]
    assert rpc.rpc_sync(other(), fetch, args=(mine,)).tolist() == [2.0, 4.0, 6.0]


def test_remote_exceptions_carry_the_remote_traceback() -> None:
    with pytest.raises(ValueError) as info:
        rpc.rpc_sync(other(), raise_value_error, args=("x",))
    text = str(info.value)
    assert text.startswith(f"On WorkerInfo(id={1 - me()}, name={other()}):")
    assert f"ValueError('bad value on {other()}: x')" in text
    assert "Traceback (most recent call last)" in text and "in raise_value_error" in text
    with pytest.raises(ValueError, match="bad value on"):
        rpc.rpc_async(other(), raise_value_error, args=("y",)).wait()
    failed = rpc.remote(other(), raise_value_error, args=("z",))
    with pytest.raises(ValueError, match="bad value on .*: z"):
        failed.to_here()
    # a type that cannot be rebuilt from one message: DistError with the same text
    with pytest.raises(dist.DistError, match="(?s)TwoArgError: On WorkerInfo.*first"):
        rpc.rpc_sync(other(), raise_two_arg_error)
    # functions go by reference: one the callee could not import is refused here, unsent
    with pytest.raises(TypeError, match="cannot pickle the call.*by reference"):
        rpc.rpc_sync(other(), lambda: 1)
    with pytest.raises(ValueError, match="unknown worker name 'nobody'"):
        rpc.rpc_sync("nobody", whoami)


def test_timeout_fails_the_call_instead_of_waiting() -> None:
    start = time.monotonic()
    with pytest.raises(dist.DistTimeoutError, match="timeout \\(0.2 s\\)"):
        rpc.rpc_sync(other(), time.sleep, args=(1.0,), timeout=0.2)
    future = rpc.rpc_async(other(), time.sleep, args=(1.0,), timeout=0.2)
    with pytest.raises(TimeoutError):
        future.wait()
    assert time.monotonic() - start < 0.9  # neither waited for the sleep
    assert rpc.rpc_sync(other(), whoami) == other()  # late answers are dropped


# -- distributed autograd ----------------------------------------------------------------------
def _local_layers(seed: int) -> tuple[nn.Linear, nn.Linear]:
    return (
        seeded(nn.Linear(5, 8, dtype=fg.float64), seed),
        seeded(nn.Linear(8, 2, dtype=fg.float64), seed + 100),
    )


def _forward(fc1: nn.Module, middle: object, fc3: nn.Module, x: fg.Tensor, how: str) -> fg.Tensor:
    """fc1 here, the middle layer (twice) on the other worker, fc3 here."""
    h = fg.tanh(fc1(x))
    for _ in range(2):
        if how == "local":
            h = fg.tanh(middle(h))  # type: ignore[operator]
        elif how == "rpc_sync":
            h = rpc.rpc_sync(other(), layer_forward, args=(middle, h))
        else:  # remote + to_here
            h = rpc.remote(other(), layer_forward, args=(middle, h)).to_here()
    return (fc3(h) ** 2).mean()


@pytest.mark.parametrize("how", ["rpc_sync", "remote"])
def test_model_split_over_two_processes_gives_one_process_gradients(how: str) -> None:
    fc1, fc3 = _local_layers(10 + me())
    middle = rpc.remote(other(), make_layer, args=(8, 8, 20 + me()))
    ref1, ref3, ref_middle = copy.deepcopy(fc1), copy.deepcopy(fc3), make_layer(8, 8, 20 + me())
    x = fg.tensor(np.random.default_rng(me()).standard_normal((6, 5)))
    _forward(ref1, ref_middle, ref3, x, "local").backward()
    with dist_autograd.context() as context_id:
        loss = _forward(fc1, middle, fc3, x, how)
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)
        remote_grads = rpc.rpc_sync(other(), layer_grads, args=(middle, context_id))
    assert set(grads) == set(fc1.parameters()) | set(fc3.parameters())
    for p, q in zip(
        [*fc1.parameters(), *fc3.parameters()], [*ref1.parameters(), *ref3.parameters()]
    ):
        np.testing.assert_allclose(grads[p].numpy(), q.grad.numpy(), **TIGHT)
        assert p.grad is None  # into the context, not .grad
    for g, q in zip(remote_grads, ref_middle.parameters()):
        np.testing.assert_allclose(g.numpy(), q.grad.numpy(), **TIGHT)
    assert rpc.rpc_sync(other(), layer_dot_grads_are_none, args=(middle,))
    with pytest.raises(
        RuntimeError, match=f"Could not find autograd context with id: {context_id}"
    ):
        dist_autograd.get_gradients(context_id)  # released when the context ended


def test_distributed_optimizer_step_matches_a_local_step() -> None:
    fc1, fc3 = _local_layers(30 + me())
    middle = rpc.remote(other(), make_layer, args=(8, 8, 40 + me()))
    ref1, ref3, ref_middle = copy.deepcopy(fc1), copy.deepcopy(fc3), make_layer(8, 8, 40 + me())
    local = [*fc1.parameters(), *fc3.parameters()]
    params = [rpc.RRef(p) for p in local] + rpc.rpc_sync(other(), layer_params, args=(middle,))
    opt = DistributedOptimizer(fg.optim.SGD, params, lr=0.1, momentum=0.9)
    refs = [*ref1.parameters(), *ref3.parameters(), *ref_middle.parameters()]
    ref_opt = fg.optim.SGD(refs, lr=0.1, momentum=0.9)
    rng = np.random.default_rng(50 + me())
    for _ in range(2):
        x = fg.tensor(rng.standard_normal((6, 5)))
        with dist_autograd.context() as context_id:
            dist_autograd.backward(context_id, [_forward(fc1, middle, fc3, x, "rpc_sync")])
            opt.step(context_id)
        ref_opt.zero_grad()
        _forward(ref1, ref_middle, ref3, x, "local").backward()
        ref_opt.step()
    for p, q in zip(local, [*ref1.parameters(), *ref3.parameters()]):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **TIGHT)
    for p, q in zip(middle.to_here().parameters(), ref_middle.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **TIGHT)


def test_a_peer_failing_mid_backward_raises_here() -> None:
    w = fg.ones(3, dtype=fg.float64, requires_grad=True)
    start = time.monotonic()
    with dist_autograd.context() as context_id:
        y = rpc.rpc_sync(other(), fails_in_backward, args=(w * 2,))
        with pytest.raises(ValueError) as info:
            dist_autograd.backward(context_id, [y.sum()])
    text = str(info.value)
    assert f"On WorkerInfo(id={1 - me()}, name={other()})" in text
    assert f"failing backward on {other()}" in text and "Traceback" in text
    assert time.monotonic() - start < 10  # an answer, not the 30 s timeout


def test_backward_argument_errors() -> None:
    with dist_autograd.context() as context_id:
        w = fg.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="roots must be scalar tensors.*\\(3,\\)"):
            dist_autograd.backward(context_id, [w * 2])
        with pytest.raises(RuntimeError, match="does not require grad"):
            dist_autograd.backward(context_id, [fg.tensor(1.0)])
        with pytest.raises(RuntimeError, match="Could not find autograd context with id: -1"):
            dist_autograd.backward(-1, [w.sum()])
