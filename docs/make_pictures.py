"""Draws the pictures of the README and docs/ARCHITECTURE.md with fusegrad's own tools: the
backward graph of a small model's loss (``fg.viz.make_dot``), the program a compiled training
step runs (``fg.compiler.explain(...).render``), and the compiler's layers -- its modules and
their load-time imports, read from the code (``tests/import_graph.py``) and drawn with
``fg.viz.DotGraph``.

``python docs/make_pictures.py [--out DIR]`` writes ``backward_graph.svg``, ``fused_step.svg``
and ``compiler_layers.svg`` into ``DIR`` (default ``docs/images``, where the documents link
them); without Graphviz's ``dot`` program each is written as ``.dot`` text instead, with a
warning.  Prints the paths written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.viz import DotGraph

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "docs" / "images"

# the compiler's layers, top to bottom (docs/ARCHITECTURE.md, "Layers"): module name prefixes
LAYERS = (
    ("the public face", ("fusegrad.compiler", "fusegrad.compiler.explain")),
    (
        "front ends",
        ("fusegrad.compiler.region", "fusegrad.compiler.step", "fusegrad.compiler.module"),
    ),
    (
        "recording, keys, capture",
        (
            "fusegrad.compiler.recording",
            "fusegrad.compiler.admission",
            "fusegrad.compiler.key",
            "fusegrad.compiler.capture",
            "fusegrad.compiler.functions",
            "fusegrad.compiler.tape",
            "fusegrad.compiler.ddp",
            "fusegrad.compiler.double",
            "fusegrad.compiler.batching",
        ),
    ),
    ("the compilation service", ("fusegrad.compiler.service", "fusegrad.compiler.cache")),
    ("programs", ("fusegrad.compiler.program",)),
    (
        "IR and passes",
        ("fusegrad.compiler.ir", "fusegrad.compiler.symbolic", "fusegrad.compiler.passes"),
    ),
    ("code generation", ("fusegrad.compiler.codegen",)),
    (
        "events, settings, reports",
        (
            "fusegrad.compiler.events",
            "fusegrad.compiler.logs",
            "fusegrad.compiler.trace",
            "fusegrad.compiler.settings",
            "fusegrad.compiler.viz",
        ),
    ),
)


def backward_graph(path: Path) -> str:
    """A two-layer MLP's cross-entropy loss: nodes, parameters by name, saved tensors with
    their shapes and dtypes."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    loss = F.cross_entropy(model(fg.randn(16, 4)), fg.randint(0, 3, (16,)))
    dot = fg.viz.make_dot(loss, params=dict(model.named_parameters()), show_saved=True)
    return str(dot.render(str(path)))


def fused_step(path: Path) -> str:
    """A whole training step (forward, backward, SGD) as one fused program, beside the backward
    graph ``explain`` also compiles on its own."""
    fg.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = fg.optim.SGD(model.parameters(), lr=0.1)

    @fg.compile
    def train_step(x: fg.Tensor, y: fg.Tensor) -> fg.Tensor:
        opt.zero_grad()
        loss = ((model(x).tanh() - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    report = fg.compiler.explain(train_step, fg.randn(16, 4), fg.randn(16, 2))
    return str(report.render(str(path)))


def _layer_of(module: str) -> int:
    best, found = -1, len(LAYERS)
    for k, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), k
    return found


def _reduced(graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """The transitive reduction of an acyclic graph: an edge is left out when its head is
    reached through another edge anyway (what the picture needs to show the layering)."""
    reach: dict[str, set[str]] = {}
    order: list[str] = []
    state: dict[str, int] = {}
    for root in sorted(graph):  # (an iterative post-order: dependencies first)
        stack = [(root, iter(sorted(graph[root])))]
        if root in state:
            continue
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[node] = 2
                order.append(node)
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(graph.get(nxt, {})))))
    for node in order:
        reach[node] = set()
        for dep in graph[node]:
            reach[node] |= {dep} | reach.get(dep, set())
    return {
        node: {d for d in deps if not any(d in reach.get(o, set()) for o in deps if o != d)}
        for node, deps in graph.items()
    }


def compiler_layers(path: Path) -> str:
    """The compiler's modules in their layers, with their load-time imports (each edge points
    from a module to one it imports; edges implied by others are left out)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from import_graph import COMPILER  # (the tests' reading of the code: tests/import_graph.py)

    graph = COMPILER.load_graph()
    dot = DotGraph(
        "compiler",
        graph_attrs={"rankdir": "TB", "fontname": "Helvetica"},
        node_attrs={
            "shape": "box",
            "style": "rounded,filled",
            "fillcolor": "#eef3fb",
            "fontname": "Helvetica",
            "fontsize": "11",
        },
        edge_attrs={"color": "#7a869a", "arrowsize": "0.6"},
    )
    clusters = [
        dot.subgraph(f"cluster_{k}", label=title, style="rounded", color="#b0b8c8")
        for k, (title, _) in enumerate(LAYERS)
    ]
    other = dot.subgraph(f"cluster_{len(LAYERS)}", label="other", style="rounded")
    for module in sorted(graph):
        k = _layer_of(module)
        short = module[len("fusegrad.compiler.") :] or "fusegrad.compiler"
        (clusters[k] if k < len(LAYERS) else other).node(module, label=short)
    for module, deps in sorted(_reduced(graph).items()):
        for dep in sorted(deps):
            dot.edge(module, dep)
    return str(dot.render(str(path)))


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python docs/make_pictures.py", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory to write into")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = [
        backward_graph(args.out / "backward_graph.svg"),
        fused_step(args.out / "fused_step.svg"),
        compiler_layers(args.out / "compiler_layers.svg"),
    ]
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
