"""Nested containers of tensors ("pytrees") as flat lists and back, for ``fusegrad.func``.

Tuples, lists, dicts and namedtuples are containers; anything else (tensors, numbers, None) is
a leaf.  ``tree_flatten`` gives the leaves in order and a spec that ``tree_unflatten`` rebuilds
the same structure from (with new leaves).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def tree_flatten(tree: Any) -> tuple[list, Any]:
    """``(leaves, spec)`` of ``tree``."""
    leaves: list = []

    def walk(node: Any) -> Any:
        if isinstance(node, (tuple, list)):
            kind = type(node) if (_is_namedtuple(node) or type(node) in (tuple, list)) else tuple
            return (kind, [walk(c) for c in node])
        if isinstance(node, dict):
            return (dict, [(k, walk(v)) for k, v in node.items()])
        leaves.append(node)
        return None

    return leaves, walk(tree)


def tree_unflatten(leaves: list, spec: Any) -> Any:
    """The structure ``spec`` (from ``tree_flatten``) with ``leaves`` in place of its leaves."""
    it = iter(leaves)

    def build(node: Any) -> Any:
        if node is None:
            return next(it)
        kind, children = node
        if kind is dict:
            return {k: build(c) for k, c in children}
        values = [build(c) for c in children]
        if kind is list:
            return values
        if kind is tuple:
            return tuple(values)
        return kind(*values)  # a namedtuple

    return build(spec)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([fn(x) for x in leaves], spec)
