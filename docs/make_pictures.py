"""Draws the README's pictures with fusegrad's own commands: the backward graph of a small
model's loss (``fg.viz.make_dot``) and the program a compiled training step runs
(``fg.compiler.explain(...).render``).

``python docs/make_pictures.py [--out DIR]`` writes ``backward_graph.svg`` and
``fused_step.svg`` into ``DIR`` (default ``docs/images``, where the README links them); without
Graphviz's ``dot`` program each is written as ``.dot`` text instead, with a warning.  Prints
the paths written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F

DEFAULT_OUT = Path(__file__).resolve().parent / "images"


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


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python docs/make_pictures.py", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory to write into")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = [
        backward_graph(args.out / "backward_graph.svg"),
        fused_step(args.out / "fused_step.svg"),
    ]
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
