"""``explain(...).to_dot()`` / ``.render(path)``: the picture of compiled programs, read back
from its DOT text -- one cluster per kernel holding exactly the values fused into it, externs,
effects (and ``.grad`` epilogues), hooks as opaque steps, fallbacks, and a whole step's parts."""

from __future__ import annotations

import pathlib
import shutil
import sys

import pytest

import fusegrad as fg
from fusegrad import compiler, nn, optim
from fusegrad.compiler.passes.fuse import Extern, Kernel
from fusegrad.compiler.viz import PHASE_COLORS, phases

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dot_text import parse  # noqa: E402  (tests/dot_text.py)


def _train_step() -> tuple:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    # the per-parameter update, recorded into the program (its part of the picture)
    opt = optim.SGD(model.parameters(), lr=0.1, foreach=False)

    def step(x, y):  # type: ignore[no-untyped-def]
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return step, fg.randn(16, 4), fg.randn(16, 2)


def _check_program(dot, program, prefix: str) -> None:  # type: ignore[no-untyped-def]
    """Every kernel is a cluster of exactly its values, every extern a bold node, every value
    edge present, every effect drawn from its value."""
    schedule = program.default.schedule
    assert f"cluster_{prefix}" in dot.clusters
    for k, step in enumerate(schedule.steps):
        if isinstance(step, Kernel):
            cluster = f"cluster_{prefix}_k{k}"
            assert dot.parent[cluster] == f"cluster_{prefix}"
            values = {f"{prefix}_v{v.id}" for v in step.values + step.reductions}
            drawn = {n for n in dot.members(cluster) if n.startswith(f"{prefix}_v")}
            assert drawn == values
            how = "interpreted" if k in schedule.interpreted else "generated code"
            assert dot.clusters[cluster]["label"].startswith(f"kernel {k} over [")
            assert f"({how})" in dot.clusters[cluster]["label"]
            for r in step.reductions:
                assert "(fused reduction)" in dot.label(f"{prefix}_v{r.id}")
        else:
            assert isinstance(step, Extern)
            node = f"{prefix}_v{step.value.id}"
            assert dot.cluster_of[node] == f"cluster_{prefix}"
            assert dot.label(node).startswith(f"%{step.value.id} {step.value.op} (")
    names = set(dot.nodes)
    for v in program.graph.values:
        for i in v.inputs:
            if i.op != "scalar" and f"{prefix}_v{v.id}" in names:
                assert dot.has_edge(f"{prefix}_v{i.id}", f"{prefix}_v{v.id}")
    for e, (_, _, v) in enumerate(program.graph.effects):
        assert dot.has_edge(f"{prefix}_v{v.id}", f"{prefix}_e{e}")


def test_a_whole_step_program_and_its_parts(fresh_compiler) -> None:  # type: ignore[no-untyped-def]
    step, x, y = _train_step()
    report = compiler.explain(step, x, y)
    ((_, program),) = report.steps
    dot = parse(report.to_dot().source)
    _check_program(dot, program, "step0")
    part = phases(program.graph)
    by_op: dict[str, set[str]] = {}
    for v, p in part.items():
        by_op.setdefault(v.op, set()).add(p)
        fill = dot.nodes[f"step0_v{v.id}"]["fillcolor"]
        assert fill == PHASE_COLORS[p], (v, p)
    assert by_op["tanh"] == {"forward"}  # the forward's, fused with its backward
    assert part[program.graph.effects[0][2]] == "backward"  # a .grad
    writes = [v for kind, _, v in program.graph.effects if kind == "write"]
    assert len(writes) == 4 and all(part[v] == "optimizer" for v in writes)  # SGD's updates
    # parameters and arguments are inputs, named by kind; in-place writes are effects
    labels = [dot.label(n) for n in dot.nodes]
    assert sum(": parameter / buffer" in s for s in labels) == 4
    assert sum(": argument" in s for s in labels) == 2
    assert sum(s.startswith("in-place write to input") for s in labels) == 4
    assert "cluster_step0_legend" in dot.clusters
    # the backward compiled on its own (explain shows it too) is a second program
    ((_, backward),) = report.captures
    _check_program(dot, backward, "graph0")
    assert any("float32[s0, " in dot.label(n) for n in dot.members("cluster_graph0_k1"))


def test_grad_epilogues_sit_in_their_kernel(fresh_compiler, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(compiler.config, "interpreter_max_elements", 0)  # generated kernels
    x = fg.randn(8, 4, requires_grad=True)
    w = fg.randn(4, requires_grad=True)
    x.grad, w.grad = fg.zeros(8, 4), fg.zeros(4)  # .grad exists: "+=" fuses into the kernel

    def fn(x, w):  # type: ignore[no-untyped-def]
        (x * w).tanh().sum().backward()

    report = compiler.explain(fn, x, w)
    ((_, program),) = report.captures
    dot = parse(report.to_dot().source)
    _check_program(dot, program, "graph0")
    epilogue = program.default.schedule.epilogue
    assert epilogue, "the program should add into .grad inside a kernel"
    for e, (_, slot, v) in enumerate(program.graph.effects):
        node = f"graph0_e{e}"
        if v in epilogue:
            assert dot.label(node) == f".grad of leaf {slot}\n+= in the kernel (epilogue)"
            assert dot.cluster_of[node] == dot.cluster_of[f"graph0_v{v.id}"] != "cluster_graph0"
        else:
            assert dot.cluster_of[node] == "cluster_graph0"


def test_hooks_are_opaque_steps(fresh_compiler) -> None:  # type: ignore[no-untyped-def]
    x = fg.randn(8, 4, requires_grad=True)
    w = fg.randn(4, requires_grad=True)

    def fn(x, w):  # type: ignore[no-untyped-def]
        y = (x * w).tanh()
        y.register_hook(lambda g: g * 2)
        y.sum().backward()

    report = compiler.explain(fn, x, w)
    ((_, program),) = report.captures
    dot = parse(report.to_dot().source)
    _check_program(dot, program, "graph0")
    hook = dot.one("%2 hook (opaque step)")
    assert dot.nodes[hook]["shape"] == "octagon"
    assert "tensor hook 0 of node 1, slot 0" in dot.label(hook)
    stores = dot.find("%14 store_grad") + dot.find("%15 store_grad")
    assert [dot.label(n).split("\n")[2] for n in stores] == [
        "writes .grad of leaf 0",
        "writes .grad of leaf 1",
    ]
    # the recording stopped at the hook: a note says why
    (note,) = dot.find("whole step not replayable:")
    assert "register_hook()" in dot.label(note) and dot.nodes[note]["shape"] == "note"


def test_fallbacks_are_notes(fresh_compiler) -> None:  # type: ignore[no-untyped-def]
    x = fg.randn(3, requires_grad=True)

    def fn(x):  # type: ignore[no-untyped-def]
        x[x > 0].exp().sum().backward()  # (a boolean mask's shape depends on the data)

    report = compiler.explain(fn, x)
    dot = parse(report.to_dot().source)
    (note,) = dot.find("fallback (ran eagerly):")
    assert "boolean mask" in dot.label(note)
    assert not [c for c in dot.clusters if c.startswith("cluster_graph")]
    assert dot.graph["label"].endswith("0 captured backward graph(s), 1 fallback(s)")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot not installed")
def test_render(fresh_compiler, tmp_path) -> None:  # type: ignore[no-untyped-def]
    step, x, y = _train_step()
    report = compiler.explain(step, x, y)
    path = report.render(tmp_path / "step.svg")
    assert path == str(tmp_path / "step.svg")
    svg = (tmp_path / "step.svg").read_text()
    assert "<svg" in svg and "kernel" in svg and "cluster_step0_k" in svg
