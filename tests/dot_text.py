"""Read back the DOT text that ``fusegrad.viz.DotGraph`` writes (one statement per line), so
tests can check a picture's structure: which nodes, with which labels and attributes, which
edges, and which clusters hold which nodes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = r'"((?:[^"\\]|\\.)*)"'
_ATTR = re.compile(r"(\w+)=" + _NAME)
_NODE = re.compile(r"^" + _NAME + r"(?: \[(.*)\])?;$")
_EDGE = re.compile(r"^" + _NAME + " -> " + _NAME + r"(?: \[(.*)\])?;$")
_OPEN = re.compile(r"^(?:di)?(?:graph|subgraph) " + _NAME + " {$")


def _unescape(text: str) -> str:
    out, chars = [], iter(text)
    for c in chars:
        if c == "\\":
            nxt = next(chars)
            out.append("\n" if nxt == "n" else nxt)
        else:
            out.append(c)
    return "".join(out)


def _attrs(text: str | None) -> dict[str, str]:
    return {k: _unescape(v) for k, v in _ATTR.findall(text or "")}


@dataclass
class Dot:
    graph: dict[str, str] = field(default_factory=dict)  # the top graph's attributes
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> attributes
    edges: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> graph attrs
    parent: dict[str, str | None] = field(default_factory=dict)  # cluster -> enclosing one
    cluster_of: dict[str, str | None] = field(default_factory=dict)  # node -> innermost cluster

    def label(self, node: str) -> str:
        return self.nodes[node].get("label", node)

    def find(self, start: str) -> list[str]:
        """Nodes whose label starts with ``start``."""
        return [n for n in self.nodes if self.label(n).startswith(start)]

    def one(self, start: str) -> str:
        found = self.find(start)
        assert len(found) == 1, f"{len(found)} nodes labelled {start!r}: {found}"
        return found[0]

    def has_edge(self, tail: str, head: str) -> bool:
        return any(a == tail and b == head for a, b, _ in self.edges)

    def into(self, head: str) -> list[str]:
        return [a for a, b, _ in self.edges if b == head]

    def members(self, cluster: str) -> set[str]:
        return {n for n, c in self.cluster_of.items() if c == cluster}


def parse(source: str) -> Dot:
    dot = Dot()
    stack: list[str] = []
    for raw in source.splitlines():
        line = raw.strip()
        if not line:
            continue
        if m := _OPEN.match(line):
            name = _unescape(m.group(1))
            if stack:  # a subgraph
                dot.clusters[name] = {}
                dot.parent[name] = stack[-1] if len(stack) > 1 else None
            stack.append(name)
        elif line == "}":
            stack.pop()
        elif line.startswith(("graph [", "node [", "edge [")):
            if line.startswith("graph ["):
                where = dot.clusters[stack[-1]] if len(stack) > 1 else dot.graph
                where.update(_attrs(line))
        elif m := _EDGE.match(line):
            dot.edges.append((_unescape(m.group(1)), _unescape(m.group(2)), _attrs(m.group(3))))
        elif m := _NODE.match(line):
            name = _unescape(m.group(1))
            dot.nodes.setdefault(name, {}).update(_attrs(m.group(2)))
            dot.cluster_of.setdefault(name, stack[-1] if len(stack) > 1 else None)
        else:
            raise AssertionError(f"not a DOT statement this parser knows: {line!r}")
    assert not stack, "unbalanced braces"
    return dot
