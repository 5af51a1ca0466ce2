"""THE batching table: one rule per primitive saying how ``fusegrad.func.vmap`` computes it for a
whole batch at once, beside the derivative table (``derivatives.py``) and the forward-mode
table (``jvps.py``), and found by name the same way (``RULES`` below).

Under ``vmap`` each batched value is held as a *physical* tensor whose dim 0 is the batch (see
``fusegrad/func/vmap.py``).  A rule gets the primitive's operands as ``(physical, batched)``
pairs -- an unbatched operand is the tensor as it is -- with the primitive's attributes for one
sample and the batch size, and returns the physical result (batch dim 0): usually the same
primitive with attributes shifted past the batch dim (``dim + 1``, a shape with the batch size
in front) and operands aligned so that their batch dims meet and nothing else does.  Rules call
primitives through ``registry.apply`` with the tracer that ``vmap`` replaced, so they compose
with an enclosing ``vmap`` (nested levels), with autograd (the physical computation is what
gets recorded) and with ``fusegrad.compile``'s tracing.

A primitive without a rule here is computed sample by sample (``loop``): slower, never wrong.
``compiler/batching.py`` applies the same rewrites to captured backward graphs (for
``autograd.functional.jacobian(vectorize=True)``); this table is the eager version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import ops as F
from ..ops.registry import REGISTRY, apply
from ..ops.views import _as_view

Operand = tuple[Any, bool]  # (physical tensor, batched)
Rule = Callable[[Any, list, dict, int], Any]  # (prim, operands, attrs, batch) -> physical out

RULES: dict[str, Rule] = {}


def batching(*names: str) -> Callable[[Rule], Rule]:
    """Register ``rule`` as the batching rule of the primitives ``names``."""

    def register(rule: Rule) -> Rule:
        for name in names:
            if name not in REGISTRY:
                raise ValueError(f"batching rule for unknown primitive {name!r}")
            if name in RULES:
                raise ValueError(f"batching rule for {name!r} registered twice")
            RULES[name] = rule
        return rule

    return register


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _rank(x: Operand) -> int:
    """The rank of one sample of an operand."""
    t, batched = x
    return t.ndim - 1 if batched else t.ndim


def aligned(x: Any, rank: int) -> Any:
    """Physical ``x`` (``B, *s``) as ``B, 1, ..., 1, *s`` of rank ``rank + 1``, so that it
    broadcasts against operands of ``rank`` dims per sample without its batch dim meeting
    theirs."""
    extra = rank - (x.ndim - 1)
    if extra <= 0:
        return x
    return F.reshape(x, (x.shape[0], *([1] * extra), *x.shape[1:]))


def spread(x: Any, batch: int) -> Any:
    """Unbatched ``x`` broadcast to a physical ``B, *x.shape`` (a view)."""
    return F.broadcast_to(F.unsqueeze(x, 0), (batch, *x.shape))


def moved(x: Operand, batch: int) -> Any:
    """An operand as a physical tensor, spreading an unbatched one."""
    t, batched = x
    return t if batched else spread(t, batch)


def loop(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    """The fallback: ``prim`` on each sample, results stacked (differentiable like any op)."""
    results = []
    for b in range(batch):
        args = tuple(t[b] if batched else t for t, batched in ins)
        results.append(apply(prim, args, attrs))
    return F.stack(results)


# ---- elementwise ---------------------------------------------------------------------------


def _elementwise(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    rank = max(_rank(x) for x in ins)
    args = tuple(aligned(t, rank) if batched else t for t, batched in ins)
    return apply(prim, args, attrs)


for _name, _prim in REGISTRY.items():
    if _prim.kind == "elementwise":
        RULES[_name] = _elementwise


# ---- reductions ----------------------------------------------------------------------------


@batching("sum", "amax", "amin", "prod", "all", "any")
def _reduce(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    (x, _), rank = ins[0], _rank(ins[0])
    dim = attrs["dim"]
    if dim is None:
        dims: Any = tuple(range(1, rank + 1))
    elif isinstance(dim, (tuple, list)):
        dims = tuple(_norm(d, rank) + 1 for d in dim)
    else:
        dims = _norm(int(dim), rank) + 1
    return apply(prim, (x,), {**attrs, "dim": dims})


@batching("argmax", "argmin")
def _arg_reduce(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    (x, _), rank = ins[0], _rank(ins[0])
    if attrs["dim"] is None:
        flat = F.reshape(x, (batch, -1))
        out = apply(prim, (flat,), {"dim": 1, "keepdim": False})
        if attrs["keepdim"]:
            out = F.reshape(out, (batch, *([1] * rank)))
        return out
    return apply(prim, (x,), {**attrs, "dim": _norm(attrs["dim"], rank) + 1})


@batching("sum_to")
def _sum_to(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    x = ins[0][0]
    target = tuple(attrs["shape"])
    lead = x.ndim - 1 - len(target)
    padded = (batch, *([1] * lead), *target)
    summed = apply(prim, (x,), {"shape": padded})
    return F.reshape(summed, (batch, *target)) if lead else summed


@batching("cumsum", "cummax_index", "mode_index", "argsort")
def _along_dim(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    (x, _), rank = ins[0], _rank(ins[0])
    if "dim" not in attrs:
        return loop(prim, ins, attrs, batch)
    return apply(prim, (x,), {**attrs, "dim": _norm(attrs["dim"], max(rank, 1)) + 1})


@batching("softmax", "softmax_backward", "log_softmax", "log_softmax_backward")
def _softmax(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    """The fused softmax and log_softmax and their gradients (``g``, ``out``) along the
    shifted dim, an unbatched operand spread over the batch (each operand is one sample's
    shape)."""
    rank = max(_rank(x) for x in ins)
    args = tuple(moved(x, batch) for x in ins)
    return apply(prim, args, {**attrs, "dim": _norm(attrs["dim"], rank) + 1})


# ---- movement ------------------------------------------------------------------------------


def _view(prim: Any, x: Any, attrs: dict) -> Any:
    """View primitive ``prim`` on physical ``x``, its result marked as a view of ``x`` (as the
    op surface marks one sample's): an in-place op on a sample's view then writes into the
    base's history on the physical graph (``ops.inplace``'s CopySlices), and forward AD finds
    the view's tangent in the base's."""
    return _as_view(apply(prim, (x,), attrs), x, prim.name, attrs)


@batching("reshape")
def _reshape(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    return _view(prim, ins[0][0], {"shape": (batch, *attrs["shape"])})


@batching("broadcast_to")
def _broadcast_to(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    target = tuple(attrs["shape"])
    x = aligned(ins[0][0], len(target))
    return _view(prim, x, {"shape": (batch, *target)})


@batching("permute")
def _permute(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    rank = _rank(ins[0])
    dims = (0, *(_norm(d, rank) + 1 for d in attrs["dims"]))
    return _view(prim, ins[0][0], {"dims": dims})


@batching("flip")
def _flip(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    rank = _rank(ins[0])
    dims = tuple(_norm(d, rank) + 1 for d in attrs["dims"])
    return apply(prim, (ins[0][0],), {"dims": dims})


@batching("cat")
def _cat(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    rank = max(_rank(x) for x in ins)
    args = tuple(moved(x, batch) for x in ins)
    return apply(prim, args, {"dim": _norm(attrs["dim"], rank) + 1})


@batching("pad")
def _pad(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    widths = ((0, 0), *attrs["widths"])
    return apply(prim, (ins[0][0],), {**attrs, "widths": widths})


@batching("diagonal")
def _diagonal(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    rank = _rank(ins[0])
    shifted = {
        "offset": attrs["offset"],
        "dim1": _norm(attrs["dim1"], rank) + 1,
        "dim2": _norm(attrs["dim2"], rank) + 1,
    }
    return _view(prim, ins[0][0], shifted)


@batching("gather", "scatter", "scatter_add")
def _indexed(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    """``gather(x, index)``, ``scatter(x, index, src)``: every operand spread over the batch
    (the index too, when only the data is batched), the dim shifted past the batch."""
    rank = _rank(ins[0])
    args = tuple(moved(x, batch) for x in ins)
    return apply(prim, args, {"dim": _norm(attrs["dim"], rank) + 1})


def _advanced_block(key: tuple, rank: int) -> tuple[list[int], int]:
    """The key positions of the advanced entries (index tensors, and ints when there is an
    index tensor, as numpy counts them) and, when they are adjacent, the output position
    where numpy puts their block (-1 when they are not adjacent: in front)."""
    positions = [k for k, e in enumerate(key) if e[0] in ("t", "i")]
    consuming = sum(1 for e in key if e[0] in ("s", "i", "t"))
    if positions != list(range(positions[0], positions[0] + len(positions))):
        return positions, -1
    before = 0
    for e in key[: positions[0]]:
        if e[0] in ("s", "n"):
            before += 1
        elif e[0] == "e":
            before += rank - consuming
    return positions, before


def _block_back(out: Any, place: int, block_rank: int) -> Any:
    """Physical ``out`` = (B, *block, *rest) with the block moved to ``1 + place``."""
    if place < 0:
        return out
    dims = list(range(out.ndim))
    block = dims[1 : 1 + block_rank]
    rest = dims[1 + block_rank :]
    order = [0, *rest[:place], *block, *rest[place:]]
    return F.permute(out, tuple(order))


@batching("getitem")
def _getitem(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    """Basic indexing: a full slice in front of the key.  With index tensors: a batch index
    ``arange(B)``, shaped to broadcast with them, in front of the key, so that each sample
    picks from its own slice whether the data or the indices are batched; numpy then puts
    the advanced block (batch first) in front, and it is moved back to where one sample's
    block is when that is after some dims."""
    key = tuple(attrs["key"])
    if not any(e[0] == "t" for e in key):
        return _view(prim, ins[0][0], {"key": (("s", None, None, 1), *key)})
    block_rank = max(_rank(x) for x in ins[1:])
    where = F.reshape(F.arange(batch), (batch, *([1] * block_rank)))
    indices = [aligned(t, block_rank) if b else t for t, b in ins[1:]]
    physical_key = (("t", len(indices)), *key)
    out = apply(prim, (moved(ins[0], batch), *indices, where), {"key": physical_key})
    positions, at = _advanced_block(key, _rank(ins[0]))
    return _block_back(out, at if positions[0] != 0 else -1, block_rank)


@batching("to_device")
def _to_device(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    return apply(prim, (ins[0][0],), attrs)


# ---- products ------------------------------------------------------------------------------


@batching("matmul")
def _matmul(prim: Any, ins: list, attrs: dict, batch: int) -> Any:
    # the operands' own batch dims broadcast right-aligned: the vmap batch dim must not meet
    # one of them, so batched operands get the same rank after it and unbatched ones size-1
    # dims in front
    rank = max(_rank(x) for x in ins)
    args = []
    for t, batched in ins:
        if batched:
            args.append(aligned(t, rank))
        else:
            args.append(F.reshape(t, (*([1] * (rank + 1 - t.ndim)), *t.shape)))
    return apply(prim, tuple(args), attrs)
