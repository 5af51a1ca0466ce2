"""Pictures of graphs: ``make_dot(t)`` draws the backward graph of a tensor, as torchviz does
for PyTorch, and ``DotGraph`` is the small DOT builder it (and the compiler's
``explain(...).to_dot()``, ``fusegrad.compiler.viz``) writes with.

The DOT text is built here, by plain string code, whatever is installed: a graph can always be
inspected (``.source``) and saved.  Turning it into a picture needs Graphviz's ``dot`` program
(``apt-get install graphviz``, ``brew install graphviz``, ``conda install graphviz``); the
``graphviz`` Python package (``pip install 'fusegrad[viz]'``) is used to run it when present,
and the ``dot`` program is called directly when it is not.  Without ``dot``, ``render`` writes
the ``.dot`` file instead and warns, saying how to get the picture later.

``make_dot`` always returns a ``DotGraph`` (the same type whatever is installed), which has what
torchviz's result is mostly used for: ``.source``, ``.format``, ``.render(path)``, ``.pipe()``
and display in Jupyter; ``.to_graphviz()`` gives a ``graphviz.Source`` for the rest.

What the picture shows (``make_dot``): one box per node of the backward graph, named by
``name()`` (``MulBackward0``, ``AccumulateGrad``, ``MyFunctionBackward``); the leaf tensor
behind each ``AccumulateGrad``, named after its parameter when ``params`` names it, with shape
and dtype; the roots (the tensors passed in); with ``show_saved``, every tensor a node saved for
backward with its name in the derivative rule, shape and dtype (dashed edges); and hooks, as
lines in their node's label and a red border: tensor hooks, node pre- and post-hooks,
``retain_grad`` and post-accumulate-grad hooks, saved-tensor hooks.  Edges point the way the
forward computation went (from an input's node to the node that used it); gradients flow
against them.  Nothing is run or unpacked: saved tensors are described from what they keep.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from .autograd.function import FunctionCtx
from .autograd.node import AccumulateGrad, Node, OpNode, SavedTensor
from .tensor import Tensor

__all__ = ["DotGraph", "RenderWarning", "make_dot"]

# Fill colours: what a picture of a backward graph uses, after torchviz's conventions.
ROOT_COLOR = "darkolivegreen1"
LEAF_COLOR = "lightblue"
SAVED_COLOR = "orange"
HOOK_COLOR = "red"


class RenderWarning(UserWarning):
    """``render`` could not make a picture (no ``dot`` program) and wrote the DOT text."""


def _quote(text: Any) -> str:
    """A DOT double-quoted string: backslashes and quotes escaped, newlines as ``\\n``."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + s.replace("\r", "").replace("\n", "\\n") + '"'


def _attrs(attrs: Mapping[str, Any]) -> str:
    items = [f"{key}={_quote(value)}" for key, value in attrs.items() if value is not None]
    return f" [{', '.join(items)}]" if items else ""


class DotGraph:
    """A DOT graph built statement by statement: ``node``, ``edge`` and ``subgraph`` (a cluster
    when its name starts with ``cluster``).  ``source`` is the text, one statement per line;
    ``render`` and ``pipe`` run Graphviz's ``dot`` on it (see the module docstring)."""

    def __init__(
        self,
        name: str = "G",
        *,
        kind: str = "digraph",
        graph_attrs: Mapping[str, Any] | None = None,
        node_attrs: Mapping[str, Any] | None = None,
        edge_attrs: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.format = "svg"  # what ``render`` writes when the path does not say
        self.graph_attrs = dict(graph_attrs or {})
        self.node_attrs = dict(node_attrs or {})
        self.edge_attrs = dict(edge_attrs or {})
        self.body: list[str | DotGraph] = []

    # ---- building ----------------------------------------------------------------------------
    def node(self, name: str, label: Any = None, **attrs: Any) -> str:
        """Add node ``name`` (its label defaults to the name); returns the name."""
        self.body.append(f"{_quote(name)}{_attrs({'label': label, **attrs})};")
        return name

    def edge(self, tail: str, head: str, **attrs: Any) -> None:
        self.body.append(f"{_quote(tail)} -> {_quote(head)}{_attrs(attrs)};")

    def subgraph(self, name: str, label: Any = None, **attrs: Any) -> DotGraph:
        """A nested graph, added here and returned to be filled; ``cluster...`` names draw a box
        around their nodes (a node belongs to the first cluster that names it)."""
        child = DotGraph(name, kind="subgraph", graph_attrs={"label": label, **attrs})
        self.body.append(child)
        return child

    # ---- text --------------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The DOT text."""
        lines: list[str] = []
        # an explicit stack of (graph to open, depth) and closing lines: subgraphs nest, and
        # graph walks here never recurse; items are pushed last-first to come off in order
        stack: list[tuple[DotGraph, int] | str] = [(self, 0)]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                lines.append(item)
                continue
            graph, depth = item
            pad = "    " * depth
            lines.append(f"{pad}{graph.kind} {_quote(graph.name)} {{")
            for what, attrs in (
                ("graph", graph.graph_attrs),
                ("node", graph.node_attrs),
                ("edge", graph.edge_attrs),
            ):
                if any(v is not None for v in attrs.values()):
                    lines.append(f"{pad}    {what}{_attrs(attrs)};")
            stack.append(pad + "}")
            for part in reversed(graph.body):
                stack.append(
                    (part, depth + 1) if isinstance(part, DotGraph) else f"{pad}    {part}"
                )
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.source

    # ---- pictures ----------------------------------------------------------------------------
    def pipe(self, format: str = "svg") -> bytes:
        """The picture in ``format`` (``svg``, ``png``, ``pdf``, ...), made by Graphviz's
        ``dot``; raises ``RuntimeError`` saying what to install when it is missing."""
        if shutil.which("dot") is None:
            raise RuntimeError(_missing_dot_message())
        try:
            import graphviz  # optional (the ``viz`` extra): used to run ``dot`` when present
        except ImportError:
            done = subprocess.run(
                ["dot", f"-T{format}"], input=self.source.encode(), capture_output=True, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"dot -T{format} failed ({done.returncode}): {done.stderr.decode().strip()}"
                ) from None
            return done.stdout
        return graphviz.Source(self.source).pipe(format=format)

    def render(self, path: str | os.PathLike, format: str | None = None) -> str:
        """Write the picture to ``path`` and return the path written.  The format is ``format``,
        else the path's suffix (``graph.png``), else ``self.format`` (svg), added to the path.
        Without Graphviz's ``dot``, writes the DOT text to ``<path without suffix>.dot``, warns
        (``RenderWarning``) and returns that path."""
        path = os.fspath(path)
        stem, suffix = os.path.splitext(path)
        fmt = format or suffix[1:] or self.format
        target = path if suffix[1:] == fmt else f"{path}.{fmt}"
        parent = os.path.dirname(os.path.abspath(target))
        os.makedirs(parent, exist_ok=True)
        if shutil.which("dot") is None:
            dot_path = (stem if suffix[1:] == fmt else path) + ".dot"
            with open(dot_path, "w", encoding="utf-8") as f:
                f.write(self.source)
            warnings.warn(
                f"{_missing_dot_message()}; wrote the DOT text to {dot_path} instead of "
                f"{target} (later: dot -T{fmt} {dot_path} -o {target})",
                RenderWarning,
                stacklevel=2,
            )
            return dot_path
        data = self.pipe(fmt)
        with open(target, "wb") as f:
            f.write(data)
        return target

    def to_graphviz(self) -> Any:
        """This graph as a ``graphviz.Source`` (needs the ``graphviz`` package)."""
        import graphviz  # optional (the ``viz`` extra), asked for by name here

        return graphviz.Source(self.source, format=self.format)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        """Jupyter: the SVG when ``dot`` is there, else the DOT text."""
        if shutil.which("dot") is not None:
            return {"image/svg+xml": self.pipe("svg").decode("utf-8")}
        return {"text/plain": self.source}


def _missing_dot_message() -> str:
    return (
        "fusegrad.viz: Graphviz's `dot` program is not on PATH (apt-get install graphviz, "
        "brew install graphviz or conda install graphviz; the Python side is "
        "pip install 'fusegrad[viz]')"
    )


# ---- the backward graph of tensors -----------------------------------------------------------


def _shape_text(shape: Any, dtype: Any) -> str:
    name = getattr(dtype, "name", None) or str(dtype)
    return f"{tuple(int(d) for d in shape)} {name}"


def _tensor_text(t: Tensor) -> str:
    return _shape_text(t._data.shape, t._dtype)


def _saved_text(s: SavedTensor) -> str:
    """Shape and dtype of what ``s`` keeps, without unpacking it (unpacking may run hooks)."""
    if s._unpack_hook is not None:
        return "packed by saved-tensor hooks"
    if s._counter is None:
        return "freed"
    t = s._tensor
    if t is not None:
        return _tensor_text(t)
    data = s._data
    if data is None:
        return "freed"
    return _shape_text(data.shape, data.dtype)


def _saved_of(node: Node) -> list[tuple[str, SavedTensor]] | None:
    """(name, saved tensor) for each tensor ``node`` saved; None when they were freed."""
    if isinstance(node, OpNode):
        saved = node._saved
        if saved is None:
            return None if node._rule.save_index else []
        names: list[str] = [""] * len(saved)
        for name, (where, variadic) in node._slots_of_saved().items():
            if name in ("self", "other", "result") and any(names[where]):
                continue  # (PyTorch's aliases of a name the rule already gave)
            for k in range(*where.indices(len(saved))):
                if not names[k]:
                    names[k] = f"{name}[{k - where.start}]" if variadic else name
        return list(zip(names, saved))
    if isinstance(node, FunctionCtx):
        if node._released:
            return None
        return [(f"saved_tensors[{k}]", s) for k, s in enumerate(node._saved or []) if s]
    return []


def _hook_marks(node: Node) -> list[str]:
    """One line per kind of hook registered on ``node`` (and, for a leaf, on its tensor)."""
    marks = []
    if node._pre_hooks:
        marks.append(f"pre-hook x{len(node._pre_hooks)}")
    if node._post_hooks:
        marks.append(f"post-hook x{len(node._post_hooks)}")
    for nr, hooks in sorted((node._tensor_pre_hooks or {}).items()):
        if hooks:
            marks.append(f"tensor hook x{len(hooks)} (output {nr})")
    for nr, ref in sorted((node._retain_grad_hooks or {}).items()):
        t = ref()
        if t is not None and t.grad_fn is node:
            marks.append(f"retain_grad (output {nr})")
    if isinstance(node, AccumulateGrad):
        leaf = node.variable
        if leaf._hooks:
            marks.append(f"tensor hook x{len(leaf._hooks)}")
        if leaf._post_acc_hooks:
            marks.append(f"post-accumulate-grad hook x{len(leaf._post_acc_hooks)}")
    return marks


def _attr_text(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def make_dot(
    var: Tensor | Sequence[Tensor],
    params: Mapping[str, Tensor] | None = None,
    show_attrs: bool = False,
    show_saved: bool = False,
) -> DotGraph:
    """The backward graph of ``var`` (a tensor or a sequence of tensors) as a ``DotGraph``.

    ``params`` names leaves (``dict(model.named_parameters())``); unnamed leaves are labelled
    by shape and dtype.  ``show_attrs`` adds each primitive's attributes (``dim``, ``shape``,
    ...); ``show_saved`` adds the tensors each node saved for backward (name in the derivative
    rule, shape, dtype).  The arguments are torchviz's, in its order.  See the module docstring
    for what is drawn.
    """
    roots = [var] if isinstance(var, Tensor) else list(var)
    for k, t in enumerate(roots):
        if not isinstance(t, Tensor):
            raise TypeError(
                f"make_dot: expected a Tensor or a sequence of Tensors, item {k} is "
                f"a {type(t).__name__}"
            )
    names = {id(p): name for name, p in (params or {}).items()}
    dot = DotGraph(
        "backward",
        graph_attrs={"rankdir": "TB", "fontsize": "12", "ranksep": "0.1"},
        node_attrs={
            "shape": "box",
            "style": "filled",
            "fillcolor": "white",
            "align": "left",
            "fontsize": "10",
            "height": "0.2",
            "fontname": "monospace",
        },
    )
    ids: dict[int, str] = {}  # id(node or tensor) -> DOT name

    def name_of(obj: Any) -> tuple[str, bool]:
        key = id(obj)
        found = ids.get(key)
        if found is not None:
            return found, False
        ids[key] = f"n{len(ids)}"
        return ids[key], True

    queue: deque[Node] = deque()
    for k, t in enumerate(roots):
        root, _ = name_of(t)
        label = f"{names.get(id(t), 'output' if len(roots) == 1 else f'output {k}')}\n"
        dot.node(root, label + _tensor_text(t), fillcolor=ROOT_COLOR)
        node = t.grad_fn
        if node is None and t._requires_grad:
            node = t._edge()[0]  # a leaf: its AccumulateGrad
        if node is None:
            continue
        target, new = name_of(node)
        dot.edge(target, root)
        if new:
            queue.append(node)
    saved_count = 0
    while queue:  # breadth first from the roots: every node once
        node = queue.popleft()
        here = ids[id(node)]
        lines = [node.name()]
        if show_attrs and isinstance(node, OpNode):
            lines += [f"{key}={_attr_text(value)}" for key, value in node.attrs.items()]
        saved = _saved_of(node) if show_saved else []
        if saved is None:
            lines.append("(saved tensors freed)")
        marks = _hook_marks(node)
        lines += [f"[{m}]" for m in marks]
        hooked = {"color": HOOK_COLOR, "penwidth": "2"} if marks else {}
        dot.node(here, "\n".join(lines), **hooked)
        if isinstance(node, AccumulateGrad):
            leaf = node.variable
            leaf_name, new_leaf = name_of(leaf)
            if new_leaf:
                title = names.get(id(leaf), "leaf")
                dot.node(leaf_name, f"{title}\n{_tensor_text(leaf)}", fillcolor=LEAF_COLOR)
            dot.edge(leaf_name, here)
        for label, s in saved or []:
            saved_name = f"s{saved_count}"
            saved_count += 1
            dot.node(saved_name, f"{label}\n{_saved_text(s)}", fillcolor=SAVED_COLOR)
            dot.edge(saved_name, here, style="dashed", dir="none")
        for child, output_nr in node.next_functions:
            if child is None:
                continue
            tail, new = name_of(child)
            many = child.num_outputs > 1 if not isinstance(child, AccumulateGrad) else False
            dot.edge(tail, here, label=str(output_nr) if many else None)
            if new:
                queue.append(child)
    return dot
