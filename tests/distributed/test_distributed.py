"""fusegrad.distributed in one process, without starting MPI: errors before
init_process_group, argument checks, the launcher's errors, DistributedSampler with explicit
ranks.  The collectives and DDP run on two processes in test_mpi_suites.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fusegrad as fg
import fusegrad.distributed as dist
import fusegrad.nn as nn
from fusegrad.distributed import run
from fusegrad.nn.parallel import DistributedDataParallel
from fusegrad.utils.data import DistributedSampler


def test_import_does_not_start_mpi() -> None:
    code = (
        "import sys, fusegrad.distributed, fusegrad.nn.parallel, fusegrad.utils.data; "
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
