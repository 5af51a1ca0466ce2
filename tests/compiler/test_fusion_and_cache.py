"""Golden tests on fusion decisions, the generated module, and the on-disk cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import compiler
from fusegrad.compiler.codegen import numba_cpu
from fusegrad.compiler.codegen.lowering import EXPRESSIONS, EXTERNS, FUSED_REDUCTIONS
from fusegrad.compiler.symbolic import substitute
from fusegrad.ops.registry import REGISTRY

VIEWS = {"reshape", "permute", "broadcast_to"}


@pytest.fixture(autouse=True)
def _fresh_compiler() -> Any:
    # these tests are about generated code: small kernels must not go to the interpreter
    compiler.reset()
    previous = compiler.config.interpreter_max_elements
    compiler.config.interpreter_max_elements = 0
    yield
    compiler.config.interpreter_max_elements = previous
    compiler.reset()


def _workload_a(n: int = 1000) -> list:
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True)
    w = fg.tensor(rng.standard_normal(n).astype(np.float32), requires_grad=True)
    b = fg.tensor(rng.standard_normal(1).astype(np.float32), requires_grad=True)
    return [x, w, b]


def _loss_a(x: fg.Tensor, w: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
    return ((x * w + b).tanh() * x.sigmoid() + (-x * x).exp() * 0.5).sum()


def test_every_primitive_has_exactly_one_lowering() -> None:
    kinds = [set(EXPRESSIONS), set(FUSED_REDUCTIONS), set(EXTERNS)]
    for name in REGISTRY:
        assert sum(name in k for k in kinds) == 1, name
    assert set().union(*kinds) == set(REGISTRY)


def test_workload_a_backward_is_one_kernel() -> None:
    leaves = _workload_a()
    report = compiler.explain(lambda: _loss_a(*leaves).backward())
    ((_, program),) = report.captures
    assert len(program.kernels) == 1
    assert {v.op for v in program.externs} <= VIEWS  # only free numpy views outside it
    kernel = program.kernels[0]
    assert [r.op for r in kernel.reductions] == ["sum_to"]  # b's gradient, fused
    assert len(kernel.outputs) == 3  # grad x, grad w, grad b


def test_mlp_backward_is_matmul_externs_plus_one_kernel_per_hidden_layer() -> None:
    fg.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )
    x, y = fg.randn(8, 32), fg.randint(0, 4, (8,))
    report = compiler.explain(lambda: F.cross_entropy(model(x), y).backward())
    ((_, program),) = report.captures
    ops = [v.op for v in program.externs]
    assert ops.count("matmul") == 5  # 2 per layer, none for the input's gradient
    assert not any(v.op == "matmul" for k in program.kernels for v in k.values)
    hidden = [k for k in program.kernels if substitute(k.shape, program.graph.hints) == (8, 16)]
    assert len(hidden) == 2  # ReLU backward + bias gradient, one loop per hidden layer
    for k in hidden:
        assert [v.op for v in k.values] == ["where"]
        assert [r.op for r in k.reductions] == ["sum_to"]


def test_repeated_layers_share_one_generated_function() -> None:
    """Kernels that differ only in their values' numbering (one per repeated layer) are one
    function in the module, compiled once; each layer still gets eager's gradients."""
    fg.manual_seed(0)
    layers = [nn.Linear(16, 16, dtype=fg.float64) for _ in range(3)]
    model = nn.Sequential(nn.Linear(32, 16, dtype=fg.float64), nn.ReLU())
    for layer in layers:
        model.append(layer)
        model.append(nn.ReLU())
    x = fg.randn(8, 32, dtype=fg.float64)

    def grads(compiled: bool) -> list:
        model.zero_grad()
        if compiled:
            with compiler.compiled_autograd(fullgraph=True):
                model(x).sum().backward()
        else:
            model(x).sum().backward()
        return [p.grad.numpy().copy() for p in model.parameters()]

    want = grads(False)
    got = grads(True)
    (program,) = compiler.cached_programs()
    hidden = [k for k in program.kernels if substitute(k.shape, program.graph.hints) == (8, 16)]
    assert len(hidden) == 4  # ReLU backward + bias gradient per layer
    source, plans = numba_cpu.emit_module(program.kernels, "repeated layers")
    names = {plan.name for plan, k in zip(plans, program.kernels) if k in hidden}
    assert len(names) < len(hidden)  # (the last layer reads the loss's broadcast gradient)
    assert source.count("\ndef kernel_") < sum(
        1 + (plan.parallel_name is not None) for plan in plans
    )
    ran = open(program.source_path).read()  # what the program runs (its own summary line)
    assert ran.split('"""', 2)[2] == source.split('"""', 2)[2]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_generated_module_is_readable_and_names_ir_values() -> None:
    leaves = _workload_a()
    with compiler.compiled_autograd():
        _loss_a(*leaves).backward()
    (program,) = compiler.cached_programs()
    source = open(program.source_path).read()
    assert "def kernel_0(" in source
    assert "# %" in source and "TanhBackward0" in source
    assert "@numba.njit(cache=True" in source
    assert "fastmath={" in source and "nnan" not in source and "ninf" not in source


def test_batch_size_change_reuses_graph_and_compiled_code() -> None:
    with compiler.compiled_autograd():
        _loss_a(*_workload_a(100)).backward()
        assert compiler.counters.compiles == 1 or compiler.counters.compiles == 0
        first = compiler.counters.compiles
        _loss_a(*_workload_a(333)).backward()
    assert compiler.counters.captures == 1  # sizes are symbols: no capture for a new size
    assert compiler.counters.compiles == first  # same source: no new compilation
    paths = {p.source_path for p in compiler.cached_programs()}
    assert len(paths) == 1


def test_broadcast_change_compiles_a_new_kernel() -> None:
    def loss(x: fg.Tensor, b: fg.Tensor) -> fg.Tensor:
        return (x * b).tanh().sum()

    with compiler.compiled_autograd():
        loss(fg.randn(4, 5, requires_grad=True), fg.randn(5, requires_grad=True)).backward()
        loss(fg.randn(4, 5, requires_grad=True), fg.randn(4, 1, requires_grad=True)).backward()
    paths = {p.source_path for p in compiler.cached_programs()}
    assert len(paths) == 2


def test_corrupt_cache_file_is_rewritten(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(tmp_path))
    from fusegrad.compiler.codegen import numba_cpu

    monkeypatch.setattr(numba_cpu, "_loaded", {})
    leaves = _workload_a(10)
    with compiler.compiled_autograd():
        _loss_a(*leaves).backward()
    (program,) = compiler.cached_programs()
    path = program.source_path
    assert path.startswith(str(tmp_path))
    with open(path, "w") as fh:
        fh.write("this is not python (")
    compiler.reset()
    numba_cpu._loaded.clear()
    ref = [t.grad.numpy().copy() for t in leaves]
    for t in leaves:
        t.grad = None
    with compiler.compiled_autograd():
        _loss_a(*leaves).backward()
    for t, r in zip(leaves, ref):
        np.testing.assert_allclose(t.grad.numpy(), r, rtol=1e-6)
    assert "def kernel_0(" in open(path).read()


_SECOND_PROCESS = textwrap.dedent(
    """
    import numpy as np
    import fusegrad as fg
    from fusegrad import compiler
    compiler.config.interpreter_max_elements = 0
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal(50).astype(np.float32), requires_grad=True)
    w = fg.tensor(rng.standard_normal(50).astype(np.float32), requires_grad=True)
    b = fg.tensor(rng.standard_normal(1).astype(np.float32), requires_grad=True)
    with compiler.compiled_autograd():
        ((x * w + b).tanh() * x.sigmoid() + (-x * x).exp() * 0.5).sum().backward()
    print(compiler.counters.compiles, compiler.counters.disk_hits)
    """
)


def test_second_process_hits_the_disk_cache(tmp_path: Any) -> None:
    env = dict(os.environ, FUSEGRAD_CACHE_DIR=str(tmp_path))
    first = subprocess.run(
        [sys.executable, "-c", _SECOND_PROCESS], env=env, capture_output=True, text=True, check=True
    )
    assert first.stdout.split() == ["1", "0"], first.stdout + first.stderr
    second = subprocess.run(
        [sys.executable, "-c", _SECOND_PROCESS], env=env, capture_output=True, text=True, check=True
    )
    assert second.stdout.split() == ["0", "1"], second.stdout + second.stderr


def test_grad_buffers_are_recycled_only_when_nobody_holds_them() -> None:
    leaves = _workload_a(64)

    def step() -> None:
        for t in leaves:
            t.grad = None
        with compiler.compiled_autograd():
            _loss_a(*leaves).backward()

    step()
    first = leaves[0].grad
    kept = first.numpy().copy()
    step()  # the user still holds ``first``: a new buffer, ``first`` untouched
    assert leaves[0].grad is not first
    np.testing.assert_array_equal(first.numpy(), kept)
    del first
    step()
    import weakref

    previous = weakref.ref(leaves[0].grad.numpy().base)  # the buffer behind the current .grad
    step()  # .grad was set to None and nothing else holds that buffer: it is reused
    assert previous() is not None and leaves[0].grad.numpy().base is previous()
    np.testing.assert_allclose(leaves[0].grad.numpy(), kept, rtol=1e-6)


def test_cheap_saved_values_are_recomputed_only_from_unchanged_leaves() -> None:
    def program(modify: bool) -> list:
        rng = np.random.default_rng(1)
        x = fg.tensor(rng.standard_normal(32), requires_grad=True)
        with compiler.compiled_autograd():
            n = -x  # neg's node records x's version
            if modify:
                with fg.no_grad():
                    x.mul_(2.0)  # x changes after neg saw it: n must not be recomputed from x
            loss = (n * x).exp().sum()  # mul saves n and x
            loss.backward()
        return [x.grad.numpy().copy()]

    for modify in (False, True):
        compiler.reset()
        compiled = program(modify)
        (prog,) = compiler.cached_programs()
        recomputed = [v for v in prog.graph.values if v.op == "neg" and v.inputs[0].op == "input"]
        assert bool(recomputed) == (not modify)
        rng = np.random.default_rng(1)
        x = fg.tensor(rng.standard_normal(32), requires_grad=True)
        n = -x
        if modify:
            with fg.no_grad():
                x.mul_(2.0)
        (n * x).exp().sum().backward()
        np.testing.assert_allclose(compiled[0], x.grad.numpy(), rtol=1e-12)
