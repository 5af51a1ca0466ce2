"""DistributedDataParallel on two real processes: run by tests/distributed/test_mpi_suites.py as
``mpiexec -n 2 python -m pytest tests/distributed/mpi_ddp.py``.

The reference is one process training a copy of the model on the whole batch (every rank
computes it locally); DDP trains on this rank's half.  float64, so results agree to rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.distributed as dist
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.nn.parallel import DistributedDataParallel as DDP
from fusegrad.utils.data import DistributedSampler

TIGHT = {"rtol": 1e-12, "atol": 1e-14}


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


class Net(nn.Module):
    """Linear-tanh-linear (float64), with a buffer and optionally an unused layer."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 16, dtype=fg.float64)
        self.fc2 = nn.Linear(16, 3, dtype=fg.float64)
        self.register_buffer("scale", fg.tensor([1.0 + rank()], dtype=fg.float64))
        if unused:
            self.extra = nn.Linear(3, 3, dtype=fg.float64)

    def forward(self, x: fg.Tensor, use_extra: bool = False) -> fg.Tensor:
        y = self.fc2(fg.tanh(self.fc1(x))) * self.scale
        return self.extra(y) if use_extra else y


def batch(n: int = 16, seed: int = 0) -> tuple[fg.Tensor, fg.Tensor]:
    """The whole batch, the same on every rank."""
    rng = np.random.default_rng(seed)
    return fg.tensor(rng.standard_normal((n, 5))), fg.tensor(rng.standard_normal((n, 3)))


def half(t: fg.Tensor) -> fg.Tensor:
    n = t.shape[0] // 2
    return t[rank() * n : (rank() + 1) * n]


def make(seed_by_rank: bool = True, **kwargs: object) -> tuple[DDP, nn.Module]:
    """A DDP model (initialized differently on each rank before the broadcast) and a
    single-process reference copy of rank 0's initial model."""
    fg.manual_seed(100 + (rank() if seed_by_rank else 0))
    net = Net(unused=bool(kwargs.pop("unused", False)))
    ddp = DDP(net, **kwargs)  # type: ignore[arg-type]
    return ddp, copy.deepcopy(net)


def same_on_every_rank(t: fg.Tensor) -> bool:
    parts = [fg.zeros_like(t) for _ in range(2)]
    dist.all_gather(parts, t.detach().contiguous())
    return bool(np.array_equal(parts[0].numpy(), parts[1].numpy()))


def test_construction_broadcasts_rank_0s_parameters_and_buffers() -> None:
    fg.manual_seed(100 + rank())
    net = Net()
    mine = {n: p.detach().clone() for n, p in net.state_dict().items()}
    ddp = DDP(net)
    assert ddp.module is net
    for name, value in net.state_dict().items():
        assert same_on_every_rank(value), name
    # rank 0 kept its own; rank 1's were replaced (they differed: per-rank seeds and buffer)
    now = net.state_dict()
    changed = any(not np.array_equal(v.numpy(), now[n].numpy()) for n, v in mine.items())
    assert changed == (rank() == 1)
    assert net.scale.tolist() == [1.0]


@pytest.mark.parametrize(
    "options",
    [{}, {"bucket_cap_mb": 0.0001}, {"bucket_cap_mb": 0.0001, "gradient_as_bucket_view": True}],
    ids=["one-bucket", "bucket-per-param", "bucket-view"],
)
def test_gradients_equal_one_process_on_the_whole_batch(options: dict) -> None:
    ddp, ref = make(**options)
    x, y = batch()
    F.mse_loss(ddp(half(x)), half(y)).backward()
    F.mse_loss(ref(x), y).backward()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT, err_msg=name)
    if options.get("gradient_as_bucket_view"):
        b = ddp._buckets[0]
        assert np.shares_memory(b.params[0][2].grad._data, b.buffer)


def test_buckets_in_reverse_parameter_order_and_launched_during_backward() -> None:
    ddp, _ = make(bucket_cap_mb=0.0001)  # one parameter per bucket
    names = [n for n, _ in ddp.module.named_parameters()]
    assert ddp.bucket_names == [[n] for n in reversed(names)]
    launched_before_last_grad: list[bool] = []
    # fc1.weight's gradient comes last; its own DDP hook ran just before this one
    ddp.module.fc1.weight.register_post_accumulate_grad_hook(
        lambda p: launched_before_last_grad.append(
            all(b.work is not None for b in ddp._buckets[:-1])
        )
    )
    x, y = batch()
    F.mse_loss(ddp(half(x)), half(y)).backward()
    assert launched_before_last_grad == [True]  # communication started inside backward
    assert all(b.work is None for b in ddp._buckets)  # and was waited for before it returned


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_ten_steps_equal_one_process(optimizer: str) -> None:
    ddp, ref = make(bucket_cap_mb=0.0005)
    opts = {"SGD": {"lr": 0.1, "momentum": 0.9}, "AdamW": {"lr": 0.01, "weight_decay": 0.1}}
    make_opt = getattr(fg.optim, optimizer)
    opt, ref_opt = (
        make_opt(ddp.parameters(), **opts[optimizer]),
        make_opt(ref.parameters(), **opts[optimizer]),
    )
    for step in range(10):
        x, y = batch(seed=step)
        opt.zero_grad()
        F.mse_loss(ddp(half(x)), half(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **TIGHT, err_msg=name)
        assert same_on_every_rank(p), name


def test_no_sync_accumulates_locally_then_reduces_the_sum() -> None:
    ddp, ref = make()
    x, y = batch(n=32)
    first, second = (x[:16], y[:16]), (x[16:], y[16:])
    local = copy.deepcopy(ref)
    with ddp.no_sync():
        F.mse_loss(ddp(half(first[0])), half(first[1])).backward()
    # no communication yet: this rank's own gradient
    F.mse_loss(local(half(first[0])), half(first[1])).backward()
    for p, q in zip(ddp.module.parameters(), local.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT)
    F.mse_loss(ddp(half(second[0])), half(second[1])).backward()
    # the average over ranks of (first + second) = one process, both whole batches
    (F.mse_loss(ref(first[0]), first[1]) + F.mse_loss(ref(second[0]), second[1])).backward()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT)
        assert same_on_every_rank(p.grad)


def test_unused_parameter_error_at_the_next_forward() -> None:
    ddp, _ = make(unused=True)
    x, y = batch()
    F.mse_loss(ddp(half(x)), half(y)).backward()  # extra.* got no gradient
    with pytest.raises(RuntimeError) as info:
        ddp(half(x))
    message = str(info.value)
    assert "Expected to have finished reduction in the prior iteration" in message
    assert "find_unused_parameters=True" in message
    assert "extra.weight" in message and "extra.bias" in message and "fc1" not in message
    F.mse_loss(ddp(half(x)), half(y)).backward()  # the error was reported once


def test_find_unused_parameters() -> None:
    ddp, ref = make(unused=True, find_unused_parameters=True, bucket_cap_mb=0.0001)
    x, y = batch()
    # rank 0 uses the extra layer, rank 1 does not: a locally unused, globally used parameter
    F.mse_loss(ddp(half(x), use_extra=rank() == 0), half(y)).backward()
    n = x.shape[0] // 2
    (
        F.mse_loss(ref(x[:n], use_extra=True), y[:n]) / 2 + F.mse_loss(ref(x[n:]), y[n:]) / 2
    ).backward()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT, err_msg=name)
    # unused everywhere: .grad stays None
    ddp.zero_grad()
    F.mse_loss(ddp(half(x)), half(y)).backward()
    assert ddp.module.extra.weight.grad is None
    assert ddp.module.fc1.weight.grad is not None


def test_state_dict_keys_and_loading_without_prefix() -> None:
    ddp, _ = make()
    keys = list(ddp.state_dict())
    assert keys == [f"module.{k}" for k in ddp.module.state_dict()]
    plain = {k: v * 0 + 2 for k, v in ddp.module.state_dict().items()}
    ddp.load_state_dict(plain)
    assert ddp.module.fc1.bias.tolist() == [2.0] * 16
    ddp.load_state_dict(ddp.state_dict())


def test_forward_broadcasts_buffers() -> None:
    ddp, _ = make()
    with fg.no_grad():
        ddp.module.scale.fill_(5.0 + rank())
    ddp(batch()[0])
    assert ddp.module.scale.tolist() == [5.0]


def test_distributed_sampler_splits_the_dataset() -> None:
    sampler = DistributedSampler(range(11), shuffle=True, seed=3)
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (2, rank(), 6)
    parts: list = [None, None]
    dist.all_gather_object(parts, list(sampler))
    assert len(parts[0]) == len(parts[1]) == 6  # 11 padded to 12 by repeating the first
    assert set(parts[0]) | set(parts[1]) == set(range(11))


def test_a_backward_that_raises_midway_leaves_the_next_iteration_correct() -> None:
    ddp, ref = make(bucket_cap_mb=0.0001)
    x, y = batch()
    hidden = fg.tanh(ddp.module.fc1(half(x)))

    def boom(g: fg.Tensor) -> None:
        raise ValueError("boom")

    hidden.register_hook(boom)  # after fc2's gradients (their buckets may have started)
    loss = F.mse_loss(ddp.module.fc2(hidden) * ddp.module.scale, half(y))
    ddp._sync_this_backward = True
    with pytest.raises(ValueError, match="boom"):
        loss.backward()
    assert any(b.ready for b in ddp._buckets)  # some gradients had arrived
    ddp.zero_grad()
    F.mse_loss(ddp(half(x)), half(y)).backward()
    F.mse_loss(ref(x), y).backward()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT, err_msg=name)


def test_compiled_autograd_runs_the_hooks_and_waits_at_the_end() -> None:
    """Under compiled autograd the compiled backward runs DDP's post-accumulate-grad hooks at
    their eager positions and its end-of-backward callback when the program is done: the
    gradients are one process's on the whole batch, every bucket waited for, and the backward
    compiled (no fallback), on the first call and from the cached program."""
    ddp, ref = make(bucket_cap_mb=0.0001)  # one parameter per bucket
    x, y = batch()
    before = fg.compiler.counters.compiled_runs
    for _ in range(3):
        ddp.zero_grad()
        ref.zero_grad()
        with fg.compiler.compiled_autograd(fullgraph=True):
            F.mse_loss(ddp(half(x)), half(y)).backward()
        F.mse_loss(ref(x), y).backward()
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT, err_msg=name)
        assert all(b.work is None and not b.ready for b in ddp._buckets)
    assert fg.compiler.counters.compiled_runs - before == 3


def test_compiled_autograd_averages_the_buckets_in_its_program() -> None:
    """Compiled autograd alone (no whole step), DDP's hooks the only user code, no .grad to add
    to: the program does DDP's work -- an allreduce start per bucket right after the kernels of
    its last gradient, in the wrapper's order, and the waits at the end -- and calls no hook.
    Equal to one process on the whole batch; with no_sync, or a .grad to add to, the hooks run
    as opaque steps and the result is the same."""
    ddp, ref = make(bucket_cap_mb=0.0005, broadcast_buffers=False)
    x, y = batch()
    before = fg.compiler.counters.compiled_runs
    for _ in range(3):
        ddp.zero_grad()
        ref.zero_grad()
        with fg.compiler.compiled_autograd(fullgraph=True):
            F.mse_loss(ddp(half(x)), half(y)).backward()
        F.mse_loss(ref(x), y).backward()
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT, err_msg=name)
            assert same_on_every_rank(p.grad), name
        assert ddp._callback_task == -1 and all(not b.ready for b in ddp._buckets)
    assert fg.compiler.counters.compiled_runs - before == 3
    ddp.zero_grad()
    report = fg.compiler.explain(lambda: F.mse_loss(ddp(half(x)), half(y)).backward())
    text = str(report)
    assert len(ddp._buckets) > 1
    for k in range(len(ddp._buckets)):
        assert f"allreduce_start (DDP bucket {k})" in text
        assert f"allreduce_wait (DDP bucket {k})" in text
    assert "= hook" not in text  # (no opaque hook step)
    # gradient accumulation: no_sync, then a synchronising backward adding to .grad
    ddp.zero_grad()
    ref.zero_grad()
    with fg.compiler.compiled_autograd():
        with ddp.no_sync():
            F.mse_loss(ddp(half(x)), half(y)).backward()
        F.mse_loss(ddp(half(x)), half(y)).backward()
    (2.0 * F.mse_loss(ref(x), y)).backward()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), **TIGHT)


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_a_compiled_whole_step_averages_the_buckets_in_its_program(optimizer: str) -> None:
    """fusegrad.compile of a DDP training step: the program holds an allreduce start per bucket
    (placed right after the kernels computing the bucket's gradients) and its wait (before the
    optimizer reads the average); DDP's own hooks are not called by the replay.  Equal to one
    process on the whole batch, the same on both ranks."""
    ddp, ref = make(bucket_cap_mb=0.0005, broadcast_buffers=False)
    opts = {"SGD": {"lr": 0.1, "momentum": 0.9}, "AdamW": {"lr": 0.01, "weight_decay": 0.1}}
    make_opt = getattr(fg.optim, optimizer)
    opt = make_opt(ddp.parameters(), **opts[optimizer])
    ref_opt = make_opt(ref.parameters(), **opts[optimizer])

    def step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = fg.compile(step)
    before = (fg.compiler.counters.step_runs, dict(fg.compiler.counters.step_breaks))
    for k in range(6):
        x, y = batch(seed=k)
        compiled(half(x), half(y))
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    assert fg.compiler.counters.step_runs - before[0] >= 3
    assert fg.compiler.counters.step_breaks == before[1]
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), **TIGHT, err_msg=name)
        assert same_on_every_rank(p), name
    x, y = batch(seed=6)
    text = str(fg.compiler.explain(compiled, half(x), half(y)))
    assert text.count("allreduce_start") >= len(ddp._buckets) > 1
    assert text.count("allreduce_wait") >= len(ddp._buckets)


def test_sync_batch_norm_normalises_with_the_whole_batch() -> None:
    """SyncBatchNorm on this rank's half of a batch: the output, the input's gradient, the
    parameters' gradients (summed over the ranks) and the running statistics equal one
    BatchNorm2d on the whole batch."""
    rng = np.random.default_rng(7)
    whole = rng.standard_normal((6, 3, 4, 2))
    weights = rng.standard_normal((6, 3, 4, 2))  # the loss's weights, one per output element
    mine = slice(3 * rank(), 3 * rank() + 3)

    fg.manual_seed(0)
    plain = nn.BatchNorm2d(3, dtype=fg.float64)
    with fg.no_grad():
        plain.weight.copy_(fg.tensor([0.5, 1.5, -2.0], dtype=fg.float64))
        plain.bias.copy_(fg.tensor([0.1, 0.0, 0.3], dtype=fg.float64))
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    assert type(sync) is nn.SyncBatchNorm

    x_all = fg.tensor(whole, requires_grad=True)
    want = plain(x_all)
    (want * fg.tensor(weights)).sum().backward()

    x = fg.tensor(whole[mine], requires_grad=True)
    got = sync(x)
    (got * fg.tensor(weights[mine])).sum().backward()

    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy()[mine], **TIGHT)
    np.testing.assert_allclose(x.grad.numpy(), x_all.grad.numpy()[mine], **TIGHT)
    for p, q in zip(sync.parameters(), plain.parameters()):
        total = p.grad.clone()
        dist.all_reduce(total)  # (what DDP's averaging sums before it divides)
        np.testing.assert_allclose(total.numpy(), q.grad.numpy(), **TIGHT)
    np.testing.assert_allclose(sync.running_mean.numpy(), plain.running_mean.numpy(), **TIGHT)
    np.testing.assert_allclose(sync.running_var.numpy(), plain.running_var.numpy(), **TIGHT)
