"""CUDA tensors through the collectives and DDP on two processes, in numba's CUDA simulator:
run by tests/distributed/test_mpi_suites.py as ``NUMBA_ENABLE_CUDASIM=1 mpiexec -n 2 python -m
pytest tests/distributed/mpi_cuda.py`` when numba-cuda is installed.  CUDA tensors travel
through host buffers; results land back in the device arrays."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.distributed as dist
import fusegrad.nn as nn
from fusegrad.nn.parallel import DistributedDataParallel as DDP


@pytest.fixture(scope="module", autouse=True)
def world(request: pytest.FixtureRequest) -> Iterator[None]:
    dist.init_process_group("nccl", timeout=timedelta(seconds=60))  # an alias of MPI
    assert dist.get_world_size() == 2, "run me with mpiexec -n 2"
    yield
    if request.session.testsfailed:
        return  # conftest.py aborts the job
    dist.barrier()
    dist.destroy_process_group()


def test_collectives_on_cuda_tensors() -> None:
    r = dist.get_rank()
    t = (fg.tensor([1.0, 2.0]) * (r + 1)).cuda()
    array = t._data
    dist.all_reduce(t)
    assert t.is_cuda and t._data is array and t.cpu().tolist() == [3.0, 6.0]
    out = fg.zeros(2, 2, dtype=fg.float64).cuda()
    dist.all_gather_into_tensor(out, fg.tensor([r, r + 0.5], dtype=fg.float64).cuda())
    assert out.cpu().tolist() == [[0.0, 0.5], [1.0, 1.5]]
    b = fg.tensor([float(r)]).cuda()
    dist.broadcast(b, src=1, async_op=True).wait()
    assert b.cpu().tolist() == [1.0]
    if r == 0:
        dist.send(fg.tensor([4.0, 5.0]).cuda(), dst=1)
    else:
        got = fg.zeros(2).cuda()
        assert dist.recv(got, src=0) == 0
        assert got.cpu().tolist() == [4.0, 5.0]
    assert dist.cuda_aware_mpi() in (True, False)  # the mpich wheel says False


def test_ddp_on_cuda_averages_like_on_the_cpu() -> None:
    r = dist.get_rank()
    fg.manual_seed(r)
    cpu = DDP(nn.Linear(3, 2, dtype=fg.float64))  # rank 0's weights on both
    on_device = nn.Linear(3, 2, dtype=fg.float64)
    on_device.load_state_dict(cpu.module.state_dict())
    gpu = DDP(on_device.cuda())
    x = fg.tensor(np.random.default_rng(r).standard_normal((4, 3)))
    (cpu(x) ** 2).sum().backward()
    (gpu(x.cuda()) ** 2).sum().backward()
    for p, q in zip(cpu.module.parameters(), gpu.module.parameters()):
        assert q.grad.is_cuda
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), rtol=1e-12)
