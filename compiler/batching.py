"""Batched VJPs: ``autograd.functional.jacobian(..., vectorize=True)`` through one program.

A Jacobian in reverse mode is one vector-Jacobian product per output element, each a backward
pass with a one-hot cotangent.  The backward graph is the same for all of them and linear in the
cotangent, so they can run as *one* program whose root gradient has a leading batch dimension
holding all the cotangents at once.

``batched_vjp`` captures the backward of one output (``capture``, concrete sizes, no hooks),
then rewrites the captured graph value by value (``batch_graph``): a value that depends on the
root gets the batch dimension in front, a value that does not stays as it is (the saved tensors,
and whatever the rules compute from them alone), and each primitive gets the attributes that do
on the batched value what it did on one row -- elementwise operands aligned with size-1
dimensions after the batch one, reduction and permutation dimensions shifted by one, shapes
prefixed with the batch size, the batch dimension of ``matmul`` operands kept apart from their
own batch dimensions.  The IR verifier checks every rewritten value against its primitive's
shape rule.  A primitive without such a rule (indexing with tensors, scatters, ...) makes the
graph *unbatchable*: the caller then computes the rows one by one, with the reason logged.
Programs are cached per graph key and batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fusegrad.ops.registry import REGISTRY
from fusegrad.tensor import Tensor

from . import admission, events, logs, passes
from .capture import Fallback, capture
from .events import emit
from .ir import Graph, Value, VerifyError, verify
from .key import walk
from .service import service

_ELEMENTWISE_ATTRS = frozenset({"dtype"})  # attributes an elementwise rule may keep as they are


class Unbatchable(Exception):
    """Why a captured backward graph cannot be batched (the message)."""


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


class _Batcher:
    """Rewrites one graph (see the module docstring); ``mapped[v] = (value, batched)``."""

    def __init__(self, src: Graph, batch: int) -> None:
        self.src = src
        self.b = batch
        self.out = Graph(hints=())
        self.mapped: dict[Value, tuple[Value, bool]] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def add(self, op: str, inputs: tuple, attrs: dict, shape: tuple, v: Value) -> Value:
        return self.out.add(op, inputs, attrs, tuple(shape), v.dtype, v.origin)

    def aligned(self, x: Value, rank: int) -> Value:
        """Batched ``x`` (``B, *s``) as ``B, 1, ..., 1, *s`` of rank ``rank + 1``."""
        s = tuple(x.shape[1:])
        if len(s) == rank:
            return x
        shape = (self.b, *([1] * (rank - len(s))), *s)
        return self.out.add("reshape", (x,), {"shape": shape}, shape, x.dtype, x.origin)

    def spread(self, x: Value, shape: tuple) -> Value:
        """Unbatched ``x`` broadcast to ``B, *shape``."""
        full = (self.b, *shape)
        return self.out.add("broadcast_to", (x,), {"shape": full}, full, x.dtype, x.origin)

    # -- the rules -------------------------------------------------------------------------------
    def run(self) -> Graph:
        for v in self.src.values:
            if v.op == "input":
                kind = v.attr("kind")
                if kind == "root":
                    shape = (self.b, *v.shape)
                    self.mapped[v] = (self.out.input("root", v.attr("index"), shape, v.dtype), True)
                elif kind == "saved":
                    self.mapped[v] = (
                        self.out.input("saved", v.attr("index"), tuple(v.shape), v.dtype),
                        False,
                    )
                else:
                    raise Unbatchable(f"an input of kind {kind!r}")
            elif v.op == "scalar":
                self.mapped[v] = (self.out.scalar(v.attr("value"), v.dtype), False)
            elif v.op == "constant":
                self.mapped[v] = (self.out.constant(self.src.constants[v.attr("index")]), False)
            else:
                self.mapped[v] = self.rewrite(v)
        for kind, slot, v in self.src.effects:
            if kind != "capture":
                raise Unbatchable(f"a {kind} effect")
            value, batched = self.mapped[v]
            if not batched:
                value = self.spread(value, tuple(v.shape))
            self.out.effects.append((kind, slot, value))
        return self.out

    def rewrite(self, v: Value) -> tuple[Value, bool]:
        ins = [self.mapped[i] for i in v.inputs]
        if not any(batched for _, batched in ins):
            # nothing here depends on the cotangents: the value as it was
            return self.add(v.op, tuple(x for x, _ in ins), dict(v.attrs), v.shape, v), False
        prim = REGISTRY.get(v.op)
        if prim is None:
            raise Unbatchable(f"{v.op} (an opaque step)")
        rule = getattr(self, "_" + v.op, None)
        if rule is None and prim.kind == "elementwise":
            rule = self._elementwise
        if rule is None:
            raise Unbatchable(f"{v.op} has no batching rule")
        return rule(v, ins), True

    def _elementwise(self, v: Value, ins: list) -> Value:
        rank = len(v.shape)
        args = tuple(self.aligned(x, rank) if batched else x for x, batched in ins)
        return self.add(v.op, args, dict(v.attrs), (self.b, *v.shape), v)

    def _reshape(self, v: Value, ins: list) -> Value:
        shape = (self.b, *v.attr("shape"))
        return self.add("reshape", (ins[0][0],), {"shape": shape}, shape, v)

    def _broadcast_to(self, v: Value, ins: list) -> Value:
        target = tuple(v.attr("shape"))
        x = self.aligned(ins[0][0], len(target))
        shape = (self.b, *target)
        return self.add("broadcast_to", (x,), {"shape": shape}, shape, v)

    def _permute(self, v: Value, ins: list) -> Value:
        rank = len(v.shape)
        dims = (0, *(_norm(d, rank) + 1 for d in v.attr("dims")))
        return self.add("permute", (ins[0][0],), {"dims": dims}, (self.b, *v.shape), v)

    def _sum_to(self, v: Value, ins: list) -> Value:
        x = ins[0][0]
        target = tuple(v.attr("shape"))
        lead = len(x.shape) - 1 - len(target)
        padded = (self.b, *([1] * lead), *target)
        summed = self.add("sum_to", (x,), {"shape": padded}, padded, v)
        if not lead:
            return summed
        shape = (self.b, *target)
        return self.add("reshape", (summed,), {"shape": shape}, shape, v)

    def _sum(self, v: Value, ins: list) -> Value:
        x = ins[0][0]
        rank = len(x.shape) - 1
        dim = v.attr("dim")
        if dim is None:
            dims: Any = tuple(range(1, rank + 1))
        elif isinstance(dim, (tuple, list)):
            dims = tuple(_norm(d, rank) + 1 for d in dim)
        else:
            dims = _norm(int(dim), rank) + 1
        attrs = {**dict(v.attrs), "dim": dims}
        return self.add("sum", (x,), attrs, (self.b, *v.shape), v)

    def _matmul(self, v: Value, ins: list) -> Value:
        # the operands' own batch dimensions broadcast right-aligned: the batch dimension of
        # the cotangents must not meet one of them, so both get the same rank after it (an
        # operand that does not depend on the cotangents gets size-1 dims in front)
        rank = max(len(x.shape) - batched for x, batched in ins)
        args = []
        for x, batched in ins:
            if batched:
                args.append(self.aligned(x, rank))
            else:
                shape = (1,) * (rank + 1 - len(x.shape)) + tuple(x.shape)
                args.append(self.out.add("reshape", (x,), {"shape": shape}, shape, x.dtype))
        return self.add("matmul", tuple(args), dict(v.attrs), (self.b, *v.shape), v)

    def _getitem(self, v: Value, ins: list) -> Value:
        key = v.attr("key")
        if len(ins) > 1 or any(entry[0] == "t" for entry in key):
            raise Unbatchable("getitem with index tensors has no batching rule")
        key = (("s", 0, self.b, 1), *key)
        return self.add("getitem", (ins[0][0],), {"key": key}, (self.b, *v.shape), v)

    def _cat(self, v: Value, ins: list) -> Value:
        rank = len(v.shape)
        args = tuple(x if batched else self.spread(x, tuple(x.shape)) for x, batched in ins)
        dim = _norm(v.attr("dim"), rank) + 1
        return self.add("cat", args, {"dim": dim}, (self.b, *v.shape), v)

    def _pad(self, v: Value, ins: list) -> Value:
        widths = ((0, 0), *v.attr("widths"))
        attrs = {"widths": widths, "value": v.attr("value")}
        return self.add("pad", (ins[0][0],), attrs, (self.b, *v.shape), v)

    def _reduce(self, v: Value, ins: list) -> Value:
        """``amax``/``amin``/``prod`` (each row reduced on its own)."""
        return self._sum(v, ins)

    _amax = _amin = _prod = _reduce

    def _cumsum(self, v: Value, ins: list) -> Value:
        dim = _norm(v.attr("dim"), len(v.shape)) + 1
        return self.add("cumsum", (ins[0][0],), {"dim": dim}, (self.b, *v.shape), v)

    def _flip(self, v: Value, ins: list) -> Value:
        rank = len(v.shape)
        dims = tuple(_norm(d, rank) + 1 for d in v.attr("dims"))
        return self.add("flip", (ins[0][0],), {"dims": dims}, (self.b, *v.shape), v)

    def _diagonal(self, v: Value, ins: list) -> Value:
        rank = len(ins[0][0].shape) - 1
        attrs = {
            "offset": v.attr("offset"),
            "dim1": _norm(v.attr("dim1"), rank) + 1,
            "dim2": _norm(v.attr("dim2"), rank) + 1,
        }
        return self.add("diagonal", (ins[0][0],), attrs, (self.b, *v.shape), v)

    def _index_add_at(self, v: Value, ins: list) -> Value:
        key = v.attr("key")
        if len(ins) > 1 or any(entry[0] == "t" for entry in key):
            raise Unbatchable("index_add_at with index tensors has no batching rule")
        shape = (self.b, *v.attr("shape"))
        attrs = {"key": (("s", 0, self.b, 1), *key), "shape": shape}
        return self.add("index_add_at", (ins[0][0],), attrs, shape, v)

    def _indexed(self, v: Value, ins: list) -> Value:
        """``gather`` (x, index) and ``scatter_add`` (x, index, src) along ``dim``: every
        operand that does not depend on the cotangents (the index never does) is spread over
        the batch."""
        args = [x if batched else self.spread(x, tuple(x.shape)) for x, batched in ins]
        dim = _norm(v.attr("dim"), len(v.shape)) + 1
        return self.add(v.op, tuple(args), {"dim": dim}, (self.b, *v.shape), v)

    _gather = _scatter_add = _indexed


def batch_graph(graph: Graph, batch: int) -> Graph:
    """``graph`` (a captured backward, concrete sizes) with ``batch`` cotangents at once (see
    the module docstring); raises ``Unbatchable``."""
    out = _Batcher(graph, batch).run()
    try:
        verify(out)
    except (VerifyError, TypeError, ValueError) as e:  # (a rule got a shape wrong: never run it)
        raise Unbatchable(f"the batched graph does not verify ({e})") from None
    return out


def batched_vjp(output: Tensor, inputs: Sequence[Tensor], cotangents: np.ndarray) -> list | None:
    """The VJPs of ``output`` with respect to ``inputs`` for every cotangent in
    ``cotangents`` (shape ``(B, *output.shape)``) by one program: per input an array of shape
    ``(B, *input.shape)``, or None for an input the output does not depend on.  None when the
    backward cannot be batched (the reason is in the ``perf`` log): compute the rows one by
    one then.  The graph is kept (as with ``retain_graph=True``)."""
    batch = int(cotangents.shape[0])
    root = Tensor._make(np.zeros(cotangents.shape[1:], cotangents.dtype))
    try:
        w = walk([output], [root], list(inputs), False, False)
        plan = admission.admit(w, admission.BATCHED, inputs=list(inputs), accumulate=False)
        if isinstance(plan, str):
            raise Unbatchable(plan)
        key = (w.key, w.sizes, batch)  # (captured with concrete sizes: they are part of it)
        entry = service.batched.get(key)
        if entry is None:
            captured = capture(
                w, [output], [root], list(inputs), False, symbolic=False, allow_opaque=False
            )
            graph = passes.run(batch_graph(captured.graph, batch))
            entry = (service.build(graph, unpacked=captured.unpacked),)
            service.batched.put(key, entry)
    except (Unbatchable, Fallback) as e:
        logs.log("perf", f"jacobian(vectorize=True): rows one by one ({e})")
        return None
    (program,) = entry
    results = program.run(w, w.sizes, [Tensor._make(cotangents)], True, list(inputs))
    emit(events.BATCHED_VJP)
    return [None if r is None else r._data for r in results]  # type: ignore[union-attr]
