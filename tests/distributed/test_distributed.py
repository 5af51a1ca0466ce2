"""fusegrad.distributed in one process, without starting MPI: errors before
init_process_group, argument checks, the launcher's errors, DistributedSampler with explicit
ranks.  The collectives and DDP run on two processes in test_mpi_suites.py."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import fusegrad as fg
import fusegrad.distributed as dist
import fusegrad.distributed.autograd as dist_autograd
import fusegrad.distributed.rpc as rpc
import fusegrad.nn as nn
from fusegrad.distributed import run
from fusegrad.nn.parallel import DistributedDataParallel
from fusegrad.utils.data import DistributedSampler


def test_import_does_not_start_mpi() -> None:
    code = (
        "import sys, fusegrad.distributed, fusegrad.nn.parallel, fusegrad.utils.data, "
        "fusegrad.distributed.rpc, fusegrad.distributed.autograd, fusegrad.distributed.optim; "
        "print('mpi4py' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "call",
    [
        lambda: dist.get_rank(),
        lambda: dist.get_world_size(),
        lambda: dist.barrier(),
        lambda: dist.all_reduce(fg.zeros(2)),
        lambda: dist.new_group([0]),
    ],
    ids=["get_rank", "get_world_size", "barrier", "all_reduce", "new_group"],
)
def test_not_initialized(call: object) -> None:
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        call()  # type: ignore[operator]


def test_not_initialized_names_the_op_and_is_a_dist_error() -> None:
    with pytest.raises(dist.DistError, match="^all_gather_into_tensor: Default process group"):
        dist.all_gather_into_tensor(fg.zeros(2), fg.zeros(1))


def test_ddp_needs_a_process_group() -> None:
    with pytest.raises(ValueError, match="DistributedDataParallel: Default process group"):
        DistributedDataParallel(nn.Linear(2, 2))


def test_invalid_backend() -> None:
    with pytest.raises(ValueError, match="invalid backend 'tcp'"):
        dist.init_process_group("tcp")
    assert not dist.is_initialized()


def test_reduce_op_names() -> None:
    assert {op.name for op in dist.ReduceOp} == {"SUM", "AVG", "PRODUCT", "MIN", "MAX"}


def test_launcher_without_mpiexec(monkeypatch: pytest.MonkeyPatch, capsys: object) -> None:
    monkeypatch.setattr(run, "find_mpiexec", lambda: None)
    assert run.main(["-n", "2", "train.py"]) == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "mpiexec not found" in err and "fusegrad[distributed]" in err


def test_launcher_rejects_zero_processes(capsys: object) -> None:
    assert run.main(["-n", "0", "train.py"]) == 2


def test_distributed_sampler_without_shuffle_pads_like_pytorch() -> None:
    parts = [list(DistributedSampler(range(10), 3, r, shuffle=False)) for r in range(3)]
    assert parts == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    parts = [
        list(DistributedSampler(range(10), 3, r, shuffle=False, drop_last=True)) for r in range(3)
    ]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert len(DistributedSampler(range(10), 3, 0, drop_last=True)) == 3


def test_distributed_sampler_shuffles_per_epoch_and_splits_disjointly() -> None:
    samplers = [DistributedSampler(range(12), 2, r, seed=7) for r in range(2)]
    first = [list(s) for s in samplers]
    assert sorted(first[0] + first[1]) == list(range(12))
    assert [list(s) for s in samplers] == first  # same epoch, same order
    for s in samplers:
        s.set_epoch(1)
    second = [list(s) for s in samplers]
    assert second != first and sorted(second[0] + second[1]) == list(range(12))


def test_distributed_sampler_invalid_rank() -> None:
    with pytest.raises(
        ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"
    ):
        DistributedSampler(range(4), num_replicas=2, rank=2)


def test_rpc_before_init_rpc() -> None:
    with pytest.raises(dist.DistError, match="rpc_sync: RPC has not been initialized"):
        rpc.rpc_sync("worker0", print)
    with pytest.raises(dist.DistError, match="dist_autograd.context: RPC has not been"):
        with dist_autograd.context():
            pass
    with pytest.raises(dist.DistError, match="RRef: RPC has not been initialized"):
        rpc.RRef(fg.ones(1))


def test_future_then_and_errors() -> None:
    f = rpc.Future()
    chained = f.then(lambda done: done.value() + 1)
    assert not f.done()
    with pytest.raises(RuntimeError, match="value\\(\\) called before the future is done"):
        f.value()
    f.set_result(1)
    assert f.wait() == 1 and chained.wait() == 2
    failed = rpc.Future()
    failed.set_exception(ValueError("no"))
    with pytest.raises(ValueError, match="no"):
        failed.then(lambda done: done.value()).wait()
    late = rpc.Future("slow call", timeout_s=0.05)
    with pytest.raises(dist.DistTimeoutError, match="slow call: RPC ran for more than"):
        late.wait()
    late.set_result(3)  # an answer after the timeout is dropped
    with pytest.raises(TimeoutError):
        late.wait()


ONE_WORKER = """
import mpi4py
if "single" in __import__("sys").argv:
    mpi4py.rc.thread_level = "single"
import fusegrad as fg
import fusegrad.distributed.autograd as dist_autograd
import fusegrad.distributed.rpc as rpc
try:
    rpc.init_rpc("solo")
except Exception as e:
    print(type(e).__name__, e)
    raise SystemExit(0)
w = fg.ones(3, requires_grad=True)
with dist_autograd.context() as context_id:  # calls to itself record send and recv too
    y = rpc.rpc_sync("solo", fg.mul, args=(w, 3.0))
    dist_autograd.backward(context_id, [(y * y).sum()])
    print(dist_autograd.get_gradients(context_id)[w].tolist(), w.grad)
rpc.shutdown()
"""


def test_one_worker_calls_itself_in_a_subprocess(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "solo.py"
    script.write_text(ONE_WORKER)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "[18.0, 18.0, 18.0] None"


def test_init_rpc_needs_mpi_thread_multiple(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "single.py"
    script.write_text(ONE_WORKER)
    done = subprocess.run(
        [sys.executable, str(script), "single"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "DistError init_rpc: the RPC agent needs MPI initialized with MPI_THREAD_MULTIPLE"
    ), done.stdout
    assert "MPI_THREAD_SINGLE" in done.stdout
