"""Collectives on two real processes: run by tests/distributed/test_mpi_suites.py as
``mpiexec -n 2 python -m pytest tests/distributed/mpi_collectives.py`` (the file name keeps it
out of the normal, single-process collection).

Every rank computes every rank's input (seeded by rank), so each checks its result against
numpy.  Both ranks run the same tests in the same order; a check that fails on one rank only
ends its pytest (-x), and mpiexec stops the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.distributed as dist

DTYPES = ["float32", "float64"]


@pytest.fixture(scope="module", autouse=True)
def world(request: pytest.FixtureRequest) -> Iterator[None]:
    dist.init_process_group("mpi", timeout=timedelta(seconds=60))
    assert dist.get_world_size() == 2, "run me with mpiexec -n 2"
    yield
    if request.session.testsfailed:
        return  # the other rank may be elsewhere: conftest.py aborts the job instead
    dist.barrier()
    dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank()


def data(r: int, shape: tuple, dtype: str, seed: int = 0) -> np.ndarray:
    """Rank ``r``'s input: the same on every process that asks for it."""
    rng = np.random.default_rng(1000 * seed + r)
    if dtype.startswith("int"):
        return rng.integers(-5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def as_tensor(a: np.ndarray, contiguous: bool) -> fg.Tensor:
    """``a`` as a tensor; a transposed (non-contiguous) view of the same values otherwise."""
    if contiguous:
        return fg.tensor(a)
    t = fg.tensor(np.ascontiguousarray(a.T)).t()
    assert not t.is_contiguous()
    return t


def tol(dtype: str) -> dict:
    return {"rtol": 1e-6, "atol": 1e-6} if dtype == "float32" else {"rtol": 1e-13, "atol": 0}


NUMPY_REDUCE = {
    dist.ReduceOp.SUM: lambda xs: xs[0] + xs[1],
    dist.ReduceOp.AVG: lambda xs: (xs[0] + xs[1]) / 2,
    dist.ReduceOp.PRODUCT: lambda xs: xs[0] * xs[1],
    dist.ReduceOp.MIN: lambda xs: np.minimum(xs[0], xs[1]),
    dist.ReduceOp.MAX: lambda xs: np.maximum(xs[0], xs[1]),
}


def test_rank_size_backend() -> None:
    assert dist.is_initialized() and dist.is_available()
    assert dist.get_rank() in (0, 1)
    assert dist.get_backend() == "mpi"
    ranks = [None, None]
    dist.all_gather_object(ranks, dist.get_rank())
    assert ranks == [0, 1]


def test_init_twice_raises() -> None:
    with pytest.raises(RuntimeError, match="twice"):
        dist.init_process_group("mpi")


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(dist.ReduceOp), ids=lambda o: o.name)
def test_all_reduce(op: dist.ReduceOp, dtype: str, contiguous: bool) -> None:
    xs = [data(r, (3, 4), dtype) for r in range(2)]
    t = as_tensor(xs[rank()], contiguous)
    version = t._version
    assert dist.all_reduce(t, op=op) is None
    assert t._version > version  # an in-place change
    np.testing.assert_allclose(t.numpy(), NUMPY_REDUCE[op](xs), **tol(dtype))


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT])
def test_all_reduce_integers_and_bool(op: dist.ReduceOp) -> None:
    xs = [data(r, (5,), "int64") for r in range(2)]
    t = fg.tensor(xs[rank()])
    dist.all_reduce(t, op=op)
    np.testing.assert_array_equal(t.numpy(), NUMPY_REDUCE[op](xs))
    flags = fg.tensor([rank() == 0, True, False])
    dist.all_reduce(flags, op=op)  # SUM is "or", MIN and PRODUCT "and"
    expect = [True, True, False] if op is dist.ReduceOp.SUM else [False, True, False]
    assert flags.tolist() == expect


def test_all_reduce_avg_of_integers_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="all_reduce: ReduceOp.AVG needs a floating point tensor"):
        dist.all_reduce(fg.tensor([1, 2]), op=dist.ReduceOp.AVG)


def test_all_reduce_writes_the_tensors_own_array_without_a_copy() -> None:
    base = fg.zeros(3, 4, dtype=fg.float64)
    row = base[1]  # a contiguous view: MPI writes straight into base's memory
    arr = row._data
    row.add_(float(rank() + 1))
    dist.all_reduce(row)
    assert row._data is arr
    np.testing.assert_array_equal(base.numpy()[1], np.full(4, 3.0))
    np.testing.assert_array_equal(base.numpy()[[0, 2]], 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_async_all_reduce(dtype: str) -> None:
    xs = [data(r, (1000,), dtype, seed=3) for r in range(2)]
    t = fg.tensor(xs[rank()])
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    assert isinstance(work, dist.Work)
    assert work.wait() is True
    assert work.is_completed()
    np.testing.assert_allclose(t.numpy(), (xs[0] + xs[1]) / 2, **tol(dtype))
    # several in flight at once, completed by polling is_completed()
    ts = [fg.tensor(data(rank(), (50,), dtype, seed=s)) for s in range(4)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    while not all(w.is_completed() for w in works):
        pass
    for s, x in enumerate(ts):
        expect = data(0, (50,), dtype, seed=s) + data(1, (50,), dtype, seed=s)
        np.testing.assert_allclose(x.numpy(), expect, **tol(dtype))


def test_wait_times_out_when_a_peer_is_late_then_completes() -> None:
    t = fg.tensor([float(rank() + 1)])
    if rank() == 0:
        work = dist.all_reduce(t, async_op=True)
        with pytest.raises(dist.DistTimeoutError, match="all_reduce: timed out after 0.2 s"):
            work.wait(timeout=0.2)
        dist.send(fg.tensor([1.0]), dst=1)  # now rank 1 may join
        work.wait()
    else:
        dist.recv(fg.zeros(1), src=0)
        dist.all_reduce(t)
    assert t.tolist() == [3.0]


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(dtype: str, contiguous: bool) -> None:
    xs = [data(r, (2, 3), dtype) for r in range(2)]
    t = as_tensor(xs[rank()], contiguous)
    dist.broadcast(t, src=1)
    np.testing.assert_array_equal(t.numpy(), xs[1])
    t = as_tensor(xs[rank()], contiguous)
    dist.broadcast(t, src=0, async_op=True).wait()
    np.testing.assert_array_equal(t.numpy(), xs[0])


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather(dtype: str, contiguous: bool) -> None:
    xs = [data(r, (2, 3), dtype) for r in range(2)]
    out = [as_tensor(np.zeros((2, 3), dtype), contiguous) for _ in range(2)]
    dist.all_gather(out, as_tensor(xs[rank()], contiguous))
    for r in range(2):
        np.testing.assert_array_equal(out[r].numpy(), xs[r])
    out = [fg.zeros(2, 3, dtype=getattr(fg, dtype)) for _ in range(2)]
    dist.all_gather(out, fg.tensor(xs[rank()]), async_op=True).wait()
    np.testing.assert_array_equal(np.stack([o.numpy() for o in out]), np.stack(xs))


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_into_tensor(dtype: str, stacked: bool) -> None:
    xs = [data(r, (2, 3), dtype) for r in range(2)]
    out = fg.zeros(*((2, 2, 3) if stacked else (4, 3)), dtype=getattr(fg, dtype))
    arr = out._data
    dist.all_gather_into_tensor(out, as_tensor(xs[rank()], contiguous=False))
    assert out._data is arr
    expect = np.stack(xs) if stacked else np.concatenate(xs)
    np.testing.assert_array_equal(out.numpy(), expect)


def test_all_gather_into_a_non_contiguous_output() -> None:
    out = fg.zeros(3, 2, dtype=fg.float64).t()  # (2, 3), transposed
    dist.all_gather_into_tensor(out, fg.tensor([float(rank())] * 3, dtype=fg.float64))
    np.testing.assert_array_equal(out.numpy(), [[0.0] * 3, [1.0] * 3])


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_tensor(dtype: str, op: dist.ReduceOp) -> None:
    xs = [data(r, (4, 3), dtype) for r in range(2)]
    out = fg.zeros(2, 3, dtype=getattr(fg, dtype))
    work = dist.reduce_scatter_tensor(out, as_tensor(xs[rank()], False), op=op, async_op=True)
    work.wait()
    expect = NUMPY_REDUCE[op](xs)[2 * rank() : 2 * rank() + 2]
    np.testing.assert_allclose(out.numpy(), expect, **tol(dtype))


def test_reduce_to_one_rank() -> None:
    t = fg.tensor([1.0, 2.0]) * (rank() + 1)
    dist.reduce(t, dst=1)
    assert t.tolist() == ([1.0, 2.0] if rank() == 0 else [3.0, 6.0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_and_scatter(dtype: str) -> None:
    xs = [data(r, (3,), dtype) for r in range(2)]
    if rank() == 1:
        got = [fg.zeros(3, dtype=getattr(fg, dtype)) for _ in range(2)]
        dist.gather(fg.tensor(xs[1]), got, dst=1)
        np.testing.assert_array_equal(np.stack([g.numpy() for g in got]), np.stack(xs))
    else:
        dist.gather(fg.tensor(xs[0]), dst=1)
    out = fg.zeros(3, dtype=getattr(fg, dtype))
    parts = [fg.tensor(x) for x in xs] if rank() == 0 else None
    dist.scatter(out, parts, src=0, async_op=True).wait()
    np.testing.assert_array_equal(out.numpy(), xs[rank()])


@pytest.mark.parametrize("contiguous", [True, False])
def test_send_recv_isend_irecv(contiguous: bool) -> None:
    x = data(0, (2, 3), "float64")
    if rank() == 0:
        dist.send(as_tensor(x, contiguous), dst=1)
        work = dist.isend(as_tensor(2 * x, contiguous), dst=1, tag=7)
        work.wait()
        assert work.is_completed()
    else:
        got = as_tensor(np.zeros((2, 3)), contiguous)
        assert dist.recv(got) == 0  # any source: the sender's rank comes back
        np.testing.assert_array_equal(got.numpy(), x)
        got2 = as_tensor(np.zeros((2, 3)), contiguous)
        work = dist.irecv(got2, src=0, tag=7)
        work.wait()
        assert work.source_rank() == 0
        np.testing.assert_array_equal(got2.numpy(), 2 * x)


def test_send_to_self_raises() -> None:
    with pytest.raises(ValueError, match="isend: Invalid destination rank"):
        dist.send(fg.zeros(1), dst=rank())


def test_barrier_and_new_group() -> None:
    dist.barrier()
    assert dist.barrier(async_op=True).wait()
    solo = dist.new_group([1])
    both = dist.new_group()
    if rank() == 1:
        assert dist.get_rank(solo) == 0 and dist.get_world_size(solo) == 1
        t = fg.tensor([5.0])
        dist.all_reduce(t, group=solo)
        assert t.tolist() == [5.0]
    else:
        assert solo is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(solo) == -1
        assert dist.all_reduce(fg.tensor([1.0]), group=solo) is None
    t = fg.tensor([float(rank())])
    dist.broadcast(t, src=1, group=both)
    assert t.tolist() == [1.0]
    assert dist.get_process_group_ranks(both) == [0, 1]


def test_object_collectives() -> None:
    objs = [{"rank": rank()}, None]
    dist.broadcast_object_list(objs, src=1)
    assert objs == [{"rank": 1}, None]


# -- errors: both ranks raise before communicating ------------------------------------------------
def test_all_gather_into_tensor_wrong_size() -> None:
    expected = (
        r"all_gather_into_tensor: output tensor size must be equal to world_size times input "
        r"tensor size: output \(3,\) float32, input \(2,\) float32, world_size 2"
    )
    with pytest.raises(ValueError, match=expected):
        dist.all_gather_into_tensor(fg.zeros(3), fg.zeros(2))


def test_dtype_mismatch() -> None:
    with pytest.raises(
        TypeError, match=r"reduce_scatter_tensor: .*input \(2,\) float32, output \(1,\) float64"
    ):
        dist.reduce_scatter_tensor(fg.zeros(1, dtype=fg.float64), fg.zeros(2))


def test_all_gather_list_errors() -> None:
    with pytest.raises(ValueError, match="all_gather: tensor_list must be a list of 2 tensors"):
        dist.all_gather([fg.zeros(2)], fg.zeros(2))
    with pytest.raises(ValueError, match=r"all_gather: tensor_list\[1\] is \(3,\) float32"):
        dist.all_gather([fg.zeros(2), fg.zeros(3)], fg.zeros(2))


def test_gather_list_on_the_wrong_rank() -> None:
    if rank() == 1:
        with pytest.raises(ValueError, match="must NOT be specified on non-destination ranks"):
            dist.gather(fg.zeros(1), [fg.zeros(1), fg.zeros(1)], dst=0)
    else:
        with pytest.raises(ValueError, match="must be specified on destination rank"):
            dist.gather(fg.zeros(1), None, dst=0)


def test_rank_outside_the_group() -> None:
    with pytest.raises(ValueError, match=r"broadcast: global rank 5 is not part of the group"):
        dist.broadcast(fg.zeros(1), src=5)


def test_not_a_tensor() -> None:
    with pytest.raises(TypeError, match="all_reduce: expected a fusegrad.Tensor for tensor"):
        dist.all_reduce(np.zeros(2))  # type: ignore[arg-type]
