"""``fusegrad.viz.make_dot``: the DOT text of a backward graph, read back structurally (nodes,
labels, edges), and its rendering when Graphviz's ``dot`` is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings

import pytest
from dot_text import parse

import fusegrad as fg
from fusegrad import nn
from fusegrad.autograd import Function
from fusegrad.autograd.graph import saved_tensors_hooks
from fusegrad.viz import DotGraph, RenderWarning, make_dot

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot not installed")


def _mul_sum() -> tuple:
    x = fg.randn(3, 4, requires_grad=True)
    w = fg.randn(4, requires_grad=True)
    y = (x * w).sum()
    return x, w, y


def test_nodes_edges_leaves_and_saved_tensors() -> None:
    x, w, y = _mul_sum()
    dot = parse(make_dot(y, params={"x": x, "w": w}, show_saved=True).source)
    root = dot.one("output\n")
    assert dot.label(root) == "output\n() float32"
    total = dot.one("SumBackward0")
    mul = dot.one("MulBackward0")
    assert dot.has_edge(total, root)
    assert dot.has_edge(mul, total)
    # each leaf: its AccumulateGrad feeds MulBackward0; the leaf, named after its parameter,
    # feeds its AccumulateGrad
    accs = dot.find("AccumulateGrad")
    assert len(accs) == 2 and all(dot.has_edge(a, mul) for a in accs)
    leaf_x, leaf_w = dot.one("x\n"), dot.one("w\n")
    assert dot.label(leaf_x) == "x\n(3, 4) float32"
    assert dot.label(leaf_w) == "w\n(4,) float32"
    assert {dot.into(a)[0] for a in accs} == {leaf_x, leaf_w}
    # MulBackward0 saved both inputs (dashed edges), SumBackward0 nothing
    saved = [n for n in dot.into(mul) if dot.nodes[n].get("fillcolor") == "orange"]
    assert sorted(dot.label(n).split("\n")[1] for n in saved) == ["(3, 4) float32", "(4,) float32"]
    assert all(e[2].get("style") == "dashed" for e in dot.edges if e[0] in saved)
    assert not [n for n in dot.into(total) if dot.nodes[n].get("fillcolor") == "orange"]
    # every edge joins declared nodes
    assert all(a in dot.nodes and b in dot.nodes for a, b, _ in dot.edges)


def test_without_show_saved_or_params() -> None:
    x, w, y = _mul_sum()
    dot = parse(make_dot(y).source)
    assert not [n for n in dot.nodes if dot.nodes[n].get("fillcolor") == "orange"]
    assert len(dot.find("leaf\n")) == 2  # unnamed leaves say what they are


def test_module_parameters_are_named_and_shared_nodes_drawn_once() -> None:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    out = model(fg.randn(5, 4))
    loss = (out * out).sum() + out.sum()  # ``out``'s node is used twice
    dot = parse(make_dot(loss, params=dict(model.named_parameters()), show_saved=True).source)
    for name, shape in [("0.weight", "(8, 4)"), ("0.bias", "(8,)"), ("2.weight", "(2, 8)")]:
        assert dot.label(dot.one(name + "\n")) == f"{name}\n{shape} float32"
    tanh = dot.one("TanhBackward0")
    saved = [n for n in dot.into(tanh) if dot.nodes[n].get("fillcolor") == "orange"]
    assert [dot.label(n) for n in saved] == ["out\n(5, 8) float32"]
    assert len(dot.find("AccumulateGrad")) == 4
    # the second layer's output node (AddmmBackward0, as PyTorch names it) feeds both uses
    adds = dot.find("AddmmBackward0")
    users = [b for a, b, _ in dot.edges if a in adds and b in dot.find("MulBackward0")]
    assert users, "the layer's output should feed the product"


def test_several_roots() -> None:
    x = fg.randn(3, requires_grad=True)
    a, b = x.exp(), x.sin()
    dot = parse(make_dot([a, b], params={"x": x}).source)
    assert dot.find("output 0\n") and dot.find("output 1\n")
    acc = dot.one("AccumulateGrad")
    assert dot.has_edge(acc, dot.one("ExpBackward0")) and dot.has_edge(acc, dot.one("SinBackward0"))


def test_a_leaf_root_is_drawn_with_its_accumulator() -> None:
    x = fg.randn(2, requires_grad=True)
    dot = parse(make_dot(x, params={"x": x}).source)
    root = dot.one("x\n")  # named after its parameter
    assert dot.nodes[root]["fillcolor"] == "darkolivegreen1"
    assert dot.has_edge(dot.one("AccumulateGrad"), root)


def test_hooks_are_marked() -> None:
    x = fg.randn(3, requires_grad=True)
    w = fg.randn(3, requires_grad=True)
    h = x * w
    h.register_hook(lambda g: g)
    z = h.exp()
    z.retain_grad()
    out = z.sum()
    out.grad_fn.register_prehook(lambda grads: None)
    z.grad_fn.register_hook(lambda grads_in, grads_out: None)
    x.register_hook(lambda g: g)
    w.register_post_accumulate_grad_hook(lambda t: None)
    dot = parse(make_dot(out, params={"x": x, "w": w}).source)
    marks = {
        "MulBackward0": "[tensor hook x1 (output 0)]",
        "ExpBackward0": "[post-hook x1]\n[retain_grad (output 0)]",
        "SumBackward0": "[pre-hook x1]",
    }
    for name, lines in marks.items():
        node = dot.one(name)
        assert dot.label(node) == f"{name}\n{lines}"
        assert dot.nodes[node]["color"] == "red"
    acc_x = dot.into(dot.one("x\n"))  # (nothing flows into a leaf; its accumulator is after it)
    assert acc_x == []
    accs = {dot.label(a) for a in dot.find("AccumulateGrad")}
    assert accs == {
        "AccumulateGrad\n[tensor hook x1]",
        "AccumulateGrad\n[post-accumulate-grad hook x1]",
    }


def test_a_removed_hook_is_not_marked() -> None:
    x = fg.randn(3, requires_grad=True)
    y = x.exp()
    handle = y.register_hook(lambda g: g)
    handle.remove()
    dot = parse(make_dot(y.sum()).source)
    node = dot.one("ExpBackward0")
    assert dot.label(node) == "ExpBackward0" and "color" not in dot.nodes[node]


def test_saved_tensor_hooks_and_freed_tensors() -> None:
    x = fg.randn(3, requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        y = (x * x).sum()
    dot = parse(make_dot(y, show_saved=True).source)
    mul = dot.one("MulBackward0")
    saved = [n for n in dot.into(mul) if dot.nodes[n].get("fillcolor") == "orange"]
    assert [dot.label(n).split("\n")[1] for n in saved] == ["packed by saved-tensor hooks"] * 2
    z = (x.exp() * 2).sum()
    z.backward()
    dot = parse(make_dot(z, show_saved=True).source)
    assert dot.label(dot.one("ExpBackward0")) == "ExpBackward0\n(saved tensors freed)"


class _Cube(Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return 3 * g * x * x


def test_custom_function_nodes_and_their_saved_tensors() -> None:
    x = fg.randn(2, 3, requires_grad=True)
    y = _Cube.apply(x).sum()
    dot = parse(make_dot(y, params={"x": x}, show_saved=True).source)
    node = dot.one("_CubeBackward")
    saved = [n for n in dot.into(node) if dot.nodes[n].get("fillcolor") == "orange"]
    assert [dot.label(n) for n in saved] == ["saved_tensors[0]\n(2, 3) float32"]
    assert dot.has_edge(dot.one("AccumulateGrad"), node)


def test_attributes_are_shown_on_request() -> None:
    x = fg.randn(3, 4, requires_grad=True)
    y = x.sum(dim=1)
    # (PyTorch's name for a sum over dims: SumBackward1)
    assert dot_label(make_dot(y, show_attrs=True), "SumBackward1") == (
        "SumBackward1\ndim=(1,)\nkeepdim=False"
    )
    assert dot_label(make_dot(y), "SumBackward1") == "SumBackward1"


def dot_label(graph: DotGraph, name: str) -> str:
    dot = parse(graph.source)
    return dot.label(dot.one(name))


def test_a_deep_graph_is_walked_without_recursion() -> None:
    x = fg.randn(2, requires_grad=True)
    y = x
    for _ in range(3000):  # deeper than Python's recursion limit
        y = y * 1.0
    dot = parse(make_dot(y.sum()).source)
    assert len(dot.find("MulBackward0")) == 3000


def test_labels_are_escaped() -> None:
    x = fg.randn(2, requires_grad=True)
    name = 'a "quoted" \\ name'
    dot = parse(make_dot(x.exp(), params={name: x}).source)
    assert dot.label(dot.one("a ")) == f"{name}\n(2,) float32"


def test_bad_argument() -> None:
    with pytest.raises(TypeError, match="make_dot: expected a Tensor or a sequence of Tensors"):
        make_dot([fg.randn(2), 3])  # type: ignore[list-item]


def test_clusters_nest_in_the_builder() -> None:
    g = DotGraph("g")
    outer = g.subgraph("cluster_a", "A")
    inner = outer.subgraph("cluster_b", "B")
    inner.node("x", "X")
    outer.node("y")
    g.edge("x", "y", label="e")
    dot = parse(g.source)
    assert dot.cluster_of == {"x": "cluster_b", "y": "cluster_a"}
    assert dot.parent == {"cluster_a": None, "cluster_b": "cluster_a"}
    assert dot.clusters["cluster_b"]["label"] == "B"
    assert dot.edges == [("x", "y", {"label": "e"})]


def test_loading_viz_loads_neither_numba_nor_the_compiler_nor_graphviz() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, fusegrad as fg; fg.viz.make_dot(fg.randn(2, requires_grad=True).exp()); "
            "print(*(m in sys.modules for m in ('numba', 'fusegrad.compiler', 'graphviz')))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]


def test_render_without_dot_writes_the_dot_text(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fusegrad.viz as viz

    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    graph = make_dot(fg.randn(2, requires_grad=True).exp())
    with pytest.warns(RenderWarning, match="apt-get install graphviz") as caught:
        written = graph.render(tmp_path / "graph.svg")
    assert written == str(tmp_path / "graph.dot")
    assert (tmp_path / "graph.dot").read_text() == graph.source
    assert str(tmp_path / "graph.svg") in str(caught[0].message)
    assert not (tmp_path / "graph.svg").exists()
    assert graph._repr_mimebundle_() == {"text/plain": graph.source}
    with pytest.raises(RuntimeError, match="not on PATH"):
        graph.pipe()


@needs_dot
def test_render_svg_and_png(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x, w, y = _mul_sum()
    graph = make_dot(y, params={"x": x, "w": w}, show_saved=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        svg = graph.render(tmp_path / "g.svg")
        png = graph.render(tmp_path / "g", format="png")
    assert svg == str(tmp_path / "g.svg") and png == str(tmp_path / "g.png")
    text = (tmp_path / "g.svg").read_text()
    assert "<svg" in text and "MulBackward0" in text and "(3, 4) float32" in text
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "image/svg+xml" in graph._repr_mimebundle_()


@needs_dot
def test_pipe_without_the_graphviz_package(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "graphviz", None)  # ``import graphviz`` raises ImportError
    svg = make_dot(fg.randn(2, requires_grad=True).exp()).pipe("svg")
    assert b"ExpBackward0" in svg


@needs_dot
def test_to_graphviz() -> None:
    graphviz = pytest.importorskip("graphviz")
    source = make_dot(fg.randn(2, requires_grad=True).exp()).to_graphviz()
    assert isinstance(source, graphviz.Source) and "ExpBackward0" in source.source
