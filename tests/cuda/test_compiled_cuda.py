"""Compiled backward of CUDA tensors (numba's simulator): the program's fused kernels come from
the CUDA emitter, its externs run the eager CUDA kernels, and the results equal eager CUDA and
the CPU."""

from __future__ import annotations

from typing import Any

import modes
import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler, nn

modes.require_device()

RNG = np.random.default_rng(5)


def _golden(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
    return (fg.tanh(x * w + b) * fg.sigmoid(x) + fg.exp(-x * x) * 0.5).sum()


def _leaves(device: str, n: int = 40, dtype: str = "float32") -> list[fg.Tensor]:
    data = [RNG.standard_normal(n), RNG.standard_normal(n), RNG.standard_normal(1)]
    return [fg.tensor(a.astype(dtype), device=device, requires_grad=True) for a in data]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_golden_graph_compiled_on_cuda_matches_eager_and_cpu(dtype: str) -> None:
    compiler.reset()
    leaves = _leaves("cuda", dtype=dtype)
    with compiler.compiled_autograd():
        _golden(*leaves).backward()
    assert compiler.counters.captures == 1 and compiler.counters.compiled_runs == 1
    (program,) = compiler.cached_programs()
    assert program.device == "cuda" and len(program.kernels) == 1
    cpu = [fg.tensor(t.detach().cpu().numpy(), requires_grad=True) for t in leaves]
    _golden(*cpu).backward()
    tol = 1e-5 if dtype == "float32" else 1e-12
    for t, c in zip(leaves, cpu):
        assert t.grad is not None and t.grad.is_cuda
        np.testing.assert_allclose(t.grad.cpu().numpy(), c.grad.numpy(), rtol=tol, atol=tol)


def test_accumulation_epilogue_keeps_grad_identity_on_the_device() -> None:
    compiler.reset()
    leaves = _leaves("cuda")
    with compiler.compiled_autograd():
        _golden(*leaves).backward()
        first = [t.grad for t in leaves]
        _golden(*leaves).backward()
    assert all(t.grad is g for t, g in zip(leaves, first))
    eager = [fg.tensor(t.detach().cpu().numpy(), requires_grad=True) for t in leaves]
    for _ in range(2):
        _golden(*eager).backward()
    for t, e in zip(leaves, eager):
        np.testing.assert_allclose(t.grad.cpu().numpy(), e.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_mlp_step_compiled_on_cuda_matches_cpu_and_reuses_the_program() -> None:
    compiler.reset()
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    cpu_model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    cpu_model.load_state_dict(model.state_dict())
    model.to("cuda")
    for batch in (5, 5, 7):
        x = RNG.standard_normal((batch, 6)).astype(np.float32)
        y = RNG.integers(0, 3, batch)
        model.zero_grad()
        cpu_model.zero_grad()
        with compiler.compiled_autograd():
            loss = nn.functional.cross_entropy(
                model(fg.tensor(x, device="cuda")), fg.tensor(y, device="cuda")
            )
            loss.backward()
        nn.functional.cross_entropy(cpu_model(fg.tensor(x)), fg.tensor(y)).backward()
        for p, q in zip(model.parameters(), cpu_model.parameters()):
            np.testing.assert_allclose(p.grad.cpu().numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert compiler.counters.compiled_runs == 3
    assert compiler.counters.cache_hits >= 1  # the second step of batch 5 reused the program
    assert all(p.device == "cuda" for p in compiler.cached_programs())


def test_a_graph_spanning_devices_falls_back_with_its_reason() -> None:
    compiler.reset()
    x = fg.tensor(RNG.standard_normal(4).astype(np.float32), requires_grad=True)
    with compiler.compiled_autograd():
        (x.cuda().exp().cpu() * x).sum().backward()
    assert any("spans devices" in r for r in compiler.counters.fallbacks)
    want = np.exp(x.detach().numpy()) * (1 + x.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5)


def test_cpu_and_cuda_graphs_of_one_structure_get_separate_programs() -> None:
    compiler.reset()
    for device in ("cpu", "cuda", "cpu"):
        leaves = _leaves(device, n=16)
        with compiler.compiled_autograd():
            _golden(*leaves).backward()
        assert leaves[0].grad.is_cuda == (device == "cuda")
    assert sorted(p.device for p in compiler.cached_programs()) == ["cpu", "cuda"]


def _penalty_grads(device: str, compiled: str) -> list:
    """A gradient penalty: ``grad(create_graph=True)`` compiled when ``compiled`` is not
    "none"; the penalty's backward inside the region ("both": the VJP inlined into its
    program) or outside it ("first": the node's own VJP program); then a third order."""
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((6, 4)), device=device, requires_grad=True)
    w = fg.tensor(rng.standard_normal((4, 3)), device=device, requires_grad=True)

    def first() -> fg.Tensor:
        (gx,) = fg.autograd.grad((x @ w).tanh().sum(), x, create_graph=True)
        return ((gx * gx).sum(1) - 1.0).pow(2).mean()

    if compiled == "none":
        pen = first()
        pen.backward(create_graph=True)
    else:
        with compiler.compiled_autograd():
            pen = first()
            if compiled == "both":
                pen.backward(create_graph=True)
        if compiled == "first":
            pen.backward(create_graph=True)
    (third,) = fg.autograd.grad(w.grad.sum(), x)  # through the recorded second order
    return [w.grad.detach().cpu().numpy(), x.grad.detach().cpu().numpy(), third.cpu().numpy()]


@pytest.mark.parametrize("compiled", ["both", "first"])
def test_compiled_double_backward_on_cuda_matches_the_cpu(compiled: str) -> None:
    compiler.reset()
    ref = _penalty_grads("cpu", "none")
    got = _penalty_grads("cuda", compiled)
    assert not compiler.counters.fallbacks, compiler.counters.fallbacks
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _checkpointed_grads(device: str, reentrant: bool, compiled: bool) -> list[np.ndarray]:
    fg.manual_seed(4)
    lin1, lin2 = nn.Linear(6, 10).double().to(device), nn.Linear(10, 3).double().to(device)
    x = fg.tensor(np.linspace(-1, 1, 24).reshape(4, 6), device=device, requires_grad=True)

    def block(h: fg.Tensor) -> fg.Tensor:
        return lin2(fg.nn.functional.dropout(fg.tanh(lin1(h)), 0.3))

    fg.manual_seed(8)
    out = fg.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
    loss = (out * out).sum()
    if compiled:
        with compiler.compiled_autograd():
            loss.backward()
    else:
        loss.backward()
    return [t.grad.cpu().numpy() for t in (x, lin1.weight, lin2.bias)]


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputation_compiled_on_cuda(reentrant: bool) -> None:
    """The recomputed forward (its dropout mask drawn again) runs in the CUDA program."""
    compiler.reset()
    eager = _checkpointed_grads("cuda", reentrant, False)
    got = _checkpointed_grads("cuda", reentrant, True)
    assert compiler.counters.checkpoints_replayed == 1 and compiler.counters.compiled_runs == 1
    assert not compiler.counters.fallbacks and not compiler.counters.opaque_functions
    (program,) = compiler.cached_programs()
    assert program.device == "cuda"
    for a, b in zip(got, eager):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


class _Transfers:
    """Counts what crosses between host and device while ``watching``: device to host
    (``CudaArray.to_host``, the only way data leaves the device), host to device (numba's
    ``cuda.to_device`` and fusegrad's ``to_device``) and waits for the device
    (``cuda.synchronize``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from numba import cuda

        import fusegrad.cuda.array as cuda_array

        self.counts = {"to host": 0, "to device": 0, "synchronize": 0}
        self.watching = False
        for owner, name, kind in (
            (cuda_array.CudaArray, "to_host", "to host"),
            (cuda, "to_device", "to device"),
            (cuda_array, "to_device", "to device"),
            (cuda, "synchronize", "synchronize"),
        ):
            monkeypatch.setattr(owner, name, self._spy(kind, getattr(owner, name)))

    def _spy(self, kind: str, fn: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            if self.watching:
                self.counts[kind] += 1
            return fn(*args, **kwargs)

        return spy


@pytest.mark.parametrize("keep_grads", [False, True])
def test_a_program_is_one_launch_sequence_without_host_round_trips(
    monkeypatch: pytest.MonkeyPatch, keep_grads: bool
) -> None:
    """A CUDA program's run enqueues its launches and nothing else: no data leaves the device,
    none arrives, nothing waits for the device; every kernel's launches (grids, blocks, scratch
    sizes) are prepared once per size vector and reused by later calls.  With ``keep_grads``
    the ``.grad`` arrays exist, and the kernels add into them on the device."""
    from fusegrad.compiler.codegen import numba_cuda

    compiler.reset()
    fg.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.LayerNorm(5), nn.Linear(5, 3))
    cpu_model = nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.LayerNorm(5), nn.Linear(5, 3))
    cpu_model.load_state_dict(model.state_dict())
    model.to("cuda")
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    y = RNG.integers(0, 3, 3)
    xs, ys = fg.tensor(x, device="cuda"), fg.tensor(y, device="cuda")
    transfers = _Transfers(monkeypatch)
    prepared: list = []
    for call in range(4):
        model.zero_grad(set_to_none=not keep_grads)
        cpu_model.zero_grad(set_to_none=not keep_grads)
        with compiler.compiled_autograd():
            loss = nn.functional.cross_entropy(model(xs), ys)
            # (the first two calls build programs, uploading their constants: with
            # ``keep_grads`` the second finds .grad arrays, another program key)
            transfers.watching = call >= 2
            loss.backward()
            transfers.watching = False
        nn.functional.cross_entropy(cpu_model(fg.tensor(x)), fg.tensor(y)).backward()
        for p, q in zip(model.parameters(), cpu_model.parameters()):
            np.testing.assert_allclose(p.grad.cpu().numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-6)
        programs = [p for p in compiler.cached_programs() if p.device == "cuda"]
        prepared.append(
            {
                (id(p), k): call_
                for p in programs
                for inst in p._instances.values()
                for k, call_ in inst.calls.items()
            }
        )
    assert transfers.counts == {"to host": 0, "to device": 0, "synchronize": 0}
    assert compiler.counters.compiled_runs == 4
    assert prepared[-1] and all(type(c) is numba_cuda.Prepared for c in prepared[-1].values())
    # a program's launches were prepared by its first run and reused, not made again
    for key, call_ in prepared[-1].items():
        for earlier in prepared[:-1]:
            assert earlier.get(key, call_) is call_
    text = "\n".join(p.describe_schedule() for p in programs)
    assert "cuda: one launch sequence per call" in text
    assert "nothing copied between host and device, no wait for the device" in text
    assert "host round trip" not in text and "launch(es) of generated code" in text


def test_explain_lists_the_externs_that_read_device_data_on_the_host() -> None:
    """Advanced indexing's eager CUDA kernel reads its index tensor on the host: a program with
    one says so, step by step, instead of claiming no round trip."""
    compiler.reset()
    x = fg.tensor(RNG.standard_normal((5, 3)), device="cuda", requires_grad=True)
    index = fg.tensor(np.array([4, 0, 4, 2]), device="cuda")
    with compiler.compiled_autograd():
        (x[index].tanh() * 2.0).sum().backward()
    want = np.zeros((5, 3))
    np.add.at(want, [4, 0, 4, 2], 2.0 / np.cosh(x.detach().cpu().numpy()[[4, 0, 4, 2]]) ** 2)
    np.testing.assert_allclose(x.grad.cpu().numpy(), want, rtol=1e-12)
    (program,) = [p for p in compiler.cached_programs() if p.device == "cuda"]
    text = program.describe_schedule()
    assert "1 host round trip(s)" in text, text
    assert "= index_add_at: advanced indexing reads its index tensors on the host" in text, text


@pytest.mark.parametrize("rows", [3, 0])
def test_launch_fills_zeros_on_the_device(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """An accumulated output without an array to add into, and the sums over an empty space,
    start from zeros made on the device: no host array of zeros is copied over."""
    from fusegrad.compiler.codegen import numba_cuda
    from fusegrad.compiler.ir import Graph
    from fusegrad.compiler.passes.fuse import Kernel

    graph = Graph()
    x = graph.input("saved", 0, (rows, 4), fg.float32)
    y = graph.add("exp", (x,), {}, (rows, 4), fg.float32)
    s = graph.add("sum_to", (y,), {"shape": (1, 4)}, (1, 4), fg.float32)
    kernel = Kernel(
        shape=(rows, 4), values=[y], reductions=[s], inputs=[x], outputs=[y, s], accumulate={y}
    )
    (compiled,), _ = numba_cuda.compile_kernels([kernel], "test")
    data = RNG.standard_normal((rows, 4)).astype(np.float32)
    device_data = numba_cuda.cuda.to_device(data)
    transfers = _Transfers(monkeypatch)
    transfers.watching = True
    prepared = numba_cuda.prepare(compiled)
    out = numba_cuda.launch(prepared, [device_data])
    transfers.watching = False
    assert transfers.counts["to device"] == 0
    np.testing.assert_allclose(out[y].copy_to_host(), np.exp(data), rtol=1e-6)
    want = np.exp(data).sum(0, keepdims=True)
    np.testing.assert_allclose(out[s].copy_to_host(), want, rtol=1e-5)
    assert prepared.n == rows * 4 and prepared.launches >= 1
