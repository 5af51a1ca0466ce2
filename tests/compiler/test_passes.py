"""IR passes on hand-built graphs: each keeps ``verify`` happy and does exactly its rewrite."""

from __future__ import annotations

import pytest

from fusegrad import float32, float64
from fusegrad.compiler.ir import Graph, VerifyError, format_graph, verify
from fusegrad.compiler.passes import run
from fusegrad.compiler.passes.dce import dce
from fusegrad.compiler.passes.fuse import Extern, Kernel, fuse
from fusegrad.compiler.passes.simplify import simplify


def _graph() -> tuple[Graph, dict]:
    g = Graph()
    x = g.input("saved", 0, (4, 3), float32)
    one = g.scalar(1.0, float32)
    m = g.add("mul", (x, one), {}, (4, 3), float32)
    n1 = g.add("neg", (m,), {}, (4, 3), float32)
    n2 = g.add("neg", (n1,), {}, (4, 3), float32)
    r = g.add("reshape", (n2,), {"shape": (4, 3)}, (4, 3), float32)
    dead = g.add("exp", (x,), {}, (4, 3), float32)
    s = g.add("sum_to", (r,), {"shape": (1, 3)}, (1, 3), float32)
    g.effects = [("grad", 0, r), ("grad", 1, s)]
    return g, {"x": x, "dead": dead}


def test_verify_accepts_a_good_graph_and_rejects_bad_ones() -> None:
    g, _ = _graph()
    verify(g)
    bad = Graph()
    x = bad.input("saved", 0, (2,), float32)
    bad.add("exp", (x,), {}, (3,), float32)  # wrong recorded shape
    with pytest.raises(VerifyError, match="rule gives"):
        verify(bad)
    bad2 = Graph()
    y = bad2.input("saved", 0, (2,), float32)
    bad2.add("exp", (y,), {}, (2,), float64)  # wrong recorded dtype
    with pytest.raises(VerifyError):
        verify(bad2)


def test_interning_shares_equal_values() -> None:
    g = Graph()
    x = g.input("saved", 0, (2,), float32)
    assert g.add("exp", (x,), {}, (2,), float32) is g.add("exp", (x,), {}, (2,), float32)
    assert g.input("saved", 1, (2,), float32) is not x


def test_simplify_removes_identities_and_dce_drops_dead_values() -> None:
    g, _ = _graph()
    out = dce(simplify(g))
    verify(out)
    ops = [v.op for v in out.values]
    assert "mul" not in ops and "neg" not in ops and "reshape" not in ops and "exp" not in ops
    assert ops == ["input", "scalar", "sum_to"] or ops == ["input", "sum_to"], format_graph(out)
    kinds = {slot: v.op for _, slot, v in out.effects}
    assert kinds == {0: "input", 1: "sum_to"}


def test_simplify_keeps_non_exact_rewrites() -> None:
    g = Graph()
    x = g.input("saved", 0, (3,), float32)
    zero = g.scalar(0.0, float32)
    m = g.add("mul", (x, zero), {}, (3,), float32)  # x * 0 is NaN for inf inputs
    a = g.add("add", (x, zero), {}, (3,), float32)  # -0.0 + 0.0 = +0.0
    g.effects = [("grad", 0, m), ("grad", 1, a)]
    out = run(g, check=True)
    assert [v.op for v in out.values if v.op in ("mul", "add")] == ["mul", "add"]


def test_fuse_makes_one_convex_kernel_with_a_reduction_epilogue() -> None:
    g = Graph()
    x = g.input("saved", 0, (8,), float32)
    b = g.input("saved", 1, (1,), float32)
    bb = g.add("broadcast_to", (b,), {"shape": (8,)}, (8,), float32)
    t = g.add("tanh", (x,), {}, (8,), float32)
    m = g.add("mul", (t, bb), {}, (8,), float32)
    s = g.add("sum_to", (m,), {"shape": (1,)}, (1,), float32)
    e = g.add("exp", (s,), {}, (1,), float32)  # needs the finished reduction: a new step
    mm = g.add("matmul", (g.input("saved", 2, (8, 8), float32),) * 2, {}, (8, 8), float32)
    g.effects = [("grad", 0, m), ("grad", 1, e), ("grad", 2, mm)]
    verify(g)
    steps = fuse(g)
    kernels = [st for st in steps if isinstance(st, Kernel)]
    externs = [st.value.op for st in steps if isinstance(st, Extern)]
    assert externs == ["matmul"]
    assert len(kernels) == 2
    first = kernels[0]
    assert [v.op for v in first.values] == ["broadcast_to", "tanh", "mul"]
    assert [r.op for r in first.reductions] == ["sum_to"]
    assert set(first.outputs) == {m, s}
    assert [v.op for v in kernels[1].values] == ["exp"] and kernels[1].inputs == [s]


def test_transposed_matmul_is_rewritten_when_nothing_else_uses_it() -> None:
    g = Graph()
    a = g.input("saved", 0, (8, 3), float32)
    w = g.input("saved", 1, (5, 3), float32)
    wt = g.add("permute", (w,), {"dims": (1, 0)}, (3, 5), float32)
    m = g.add("matmul", (a, wt), {}, (8, 5), float32)
    t = g.add("permute", (m,), {"dims": (1, 0)}, (5, 8), float32)
    g.effects = [("grad", 0, t)]
    out = run(g, check=True)
    ops = [v.op for v in out.values if v.op not in ("input",)]
    assert ops == ["permute", "matmul"]  # w.mT.mT cancelled; a.mT remains; result in layout
    ((_, _, final),) = out.effects
    assert final.op == "matmul" and final.inputs[0].op == "input"
    # a matmul used elsewhere too is left alone (recomputing it would cost a second product)
    g.effects = [("grad", 0, t), ("grad", 1, m)]
    kept = run(g, check=True)
    assert [v.op for v in kept.values].count("matmul") == 1
