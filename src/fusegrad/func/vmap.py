"""``vmap``: a function of one sample run on a whole batch at once, by a tracer.

Where this sits: ``fusegrad.func``'s batching transform, on the eager core's one extension
point (``autograd.tracer``).  ``vmap(f)(x)`` installs a ``BatchTracer`` on the thread and calls
``f`` with ``BatchedTensor``s: tensors that look like one sample (their shape, dtype and
``_data`` are one sample's, so every op surface function checks and promotes as usual) and hold
the whole batch as a *physical* tensor ``_phys`` whose dim 0 is the batch.  Every primitive
call then reaches the tracer (``ops.registry.apply``), which computes the batched result with
the primitive's rule from the batching table (``autograd/batching.py``) on the physical
tensors, under the tracer it replaced -- so ``vmap`` nests (the physical tensor of an inner
level is a ``BatchedTensor`` of the outer one) and composes with ``fusegrad.compile``.

Autograd is recorded on the physical tensors: a ``BatchedTensor``'s ``requires_grad`` and
``grad_fn`` are its physical tensor's, and a ``backward``/``grad`` call under ``vmap`` whose
outputs are batched is translated to the physical graph (``BatchTracer.backward``), where
every sample's gradient is its own row.  ``grad`` of a batched function with respect to an
unbatched input (``vmap(grad(loss), in_dims=(None, 0, 0))``) therefore lifts that input to a
batched one first (``lift``), so that each sample gets its own gradient.  A ``grad`` call whose
outputs are not batched but whose output gradients are (the vector-Jacobian products of
``jacrev``) runs the derivative rules themselves on batched values, through the tracer.  Where
the outputs are batched at an outer level and the output gradients at a level inside it
(``vmap(jacrev(f))``: jacrev's rows are a ``vmap`` inside the user's), the backward runs on the
outer level's physical graph with that level taken out of the chain (``_without_level``) and
the inner levels still batching: the output gradients hold the outer level's samples as an
ordinary dim (``_lower``), and so do the input gradients until they are put back (``_raise``).

Forward-mode AD runs above the levels: a primitive's JVP rule sees the samples, so a tangent
is a sample's (batched at the levels inside and at the sample's own).  A backward under ``vmap``
runs its rules on the physical graph, so the batch must hold the samples' tangents too: a
tangent given to a ``BatchedTensor`` is given, lowered (``_lower``: the level's batch as dim 0),
to its physical tensor (``BatchedTensor._tangent_follows``), and a batch with a tangent wrapped
as samples (a backward's result) gives them its tangent raised (``_raise``, in ``wrap``); an
unbatched operand whose tangent is batched at the level (``jacfwd``'s shared primal, met by an
input the inner transform lifted) enters the physical graph spread, with its tangent lowered
(``BatchTracer._unbatched``).  So
``vmap(hessian(f))``, ``vmap(jacfwd(grad(f)))`` and ``jvp`` of ``vmap`` agree with the loops.

In-place ops on a sample are computed out of place and written into the batch
(``BatchedTensor._inplace_hook``), where the engine's in-place machinery records them: a view
of a sample is a view of the batch (``batching._view``), so a write through it rewrites the
base's history as outside ``vmap``, and its tangent is the base's tangent's view.  The write
runs with the level out of the chain (``_physical``), as the batch's tangent may be batched
at levels inside it (``vmap(jacfwd(f))``), and the samples then get the batch's new tangent.

A custom ``autograd.Function`` called on batched tensors runs its forward at the level (its
ops are batched like any others) and gets one node on the physical tensors,
``_LevelFunction``, which runs its ``backward`` at the same level on the batched gradients
(PyTorch's ``generate_vmap_rule``); under nested levels, each enclosing level's node runs
the node of the level inside it on its own batch.  Conv and the norm layers, which run as such
Functions outside ``vmap``, record their primitives one by one under it
(``Tracer.primitive_nodes``), so a compiled recording around ``vmap``
(``fusegrad.compile(vmap(grad(f)))``) captures their rules like any primitive's.

What ``vmap`` cannot see through: Python reading a batched tensor's values (``.item()``,
``bool()``, ``.numpy()``: data-dependent control flow) raises; random draws raise unless
``randomness`` is ``"same"`` (one draw for all samples) or ``"different"`` (one per sample).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import ops as F
from ..autograd import api
from ..autograd import forward_ad as _forward_ad
from ..autograd import grad_mode as _grad_mode
from ..autograd import tracer as _tracer
from ..autograd.batching import RULES, loop, spread
from ..autograd.function import FunctionCtx
from ..autograd.graph_base import Node
from ..autograd.tracer import Tracer, tracing
from ..tensor import Tensor
from ._pytree import tree_flatten, tree_unflatten

_RANDOMNESS = ("error", "different", "same")


class BatchedTensor(Tensor):
    """One sample's view of a batch under ``vmap`` (see the module docstring): ``_phys`` is the
    whole batch (dim 0), ``_level`` the ``BatchTracer`` it belongs to.  No slots of its own,
    so a tensor made by a random draw can become one (``randomness="different"``)."""

    __slots__ = ()

    @property  # type: ignore[override]
    def grad_fn(self) -> Any:
        return self.__dict__["_phys"].grad_fn

    @grad_fn.setter
    def grad_fn(self, value: Any) -> None:
        # only a custom ``autograd.Function`` sets the history of its outputs (primitives record
        # theirs on the physical tensors): the batch gets a node that runs the Function's
        # backward at this level (``_LevelFunction``)
        if value is None:
            return
        level = self.__dict__["_level"]
        if isinstance(value, FunctionCtx):
            node = value.__dict__.get("_vmap_node")
            if node is None:
                node = value.__dict__["_vmap_node"] = _LevelFunction(value, value, level)
        elif isinstance(value, _LevelFunction):
            # the node of a level inside this one (the Function ran under nested ``vmap``s):
            # this level's node runs it on this level's batch, as it runs the Function's
            node = value.outer
            if node is None:
                node = value.outer = _LevelFunction(value, value.root, level)
        else:
            raise RuntimeError("vmap: the history of a batched tensor lives on its batch")
        self.__dict__["_phys"].grad_fn = node

    @property  # type: ignore[override]
    def _output_nr(self) -> int:
        return self.__dict__["_phys"]._output_nr

    @_output_nr.setter
    def _output_nr(self, value: int) -> None:
        phys = self.__dict__.get("_phys")
        if phys is not None:  # (``wrap`` sets it before the batch is there: the batch's own)
            phys._output_nr = value

    def _edge(self) -> tuple:
        """The batch's edge: gradients flow to the physical tensor's history."""
        return self.__dict__["_phys"]._edge()

    # ---- forward-mode AD: the batch holds the samples' tangents too -------------------------
    def _tangent_follows(self, tangent: Tensor | None, dual: Any) -> None:
        """Forward AD gave this sample a tangent (forward AD runs on samples, above ``vmap``):
        the batch gets the samples' tangents, the level's batch as dim 0 (``_lower``), so that
        a backward run on the physical graph (``BatchTracer.backward``) -- whose rules read
        the physical tensors -- carries tangents (``vmap(jacfwd(grad(f)))``, ``hessian``)."""
        level = self.__dict__["_level"]
        phys = self.__dict__["_phys"]
        base = phys._base
        if (
            tangent is not None
            and base is not None
            and getattr(phys, "_view_info", None) is not None
            and _forward_ad._tangent(base, dual) is not None
        ):
            # a view of a batch with a tangent (``batching._view``): its tangent is that view
            # of the base's (``forward_ad._tangent`` replays it), sharing its memory, so that
            # an in-place op on either is seen by the other
            phys.__dict__.pop(_forward_ad._TANGENT, None)
            return
        lowered = None if tangent is None else _lower(tangent, level)
        if tangent is not None and not _batched_through(tangent, level):
            # one tangent for every sample (``vmap(jacfwd(f))``: the columns' tangents are the
            # same for all samples), spread as a view: the batch's tangent is its own memory,
            # which an in-place op on the batch writes per sample (cloned through the levels
            # inside this one, at which ``lowered`` is batched as the tangent was)
            lowered = F.clone(lowered)
            _forward_ad._set_tangent(phys, lowered, dual)
            # and the samples' tangent is that memory too, so that a write through the batch
            # or a view of it (which reaches the physical tangent) is seen by the samples
            self.__dict__[_forward_ad._TANGENT] = (dual, _raise(lowered, level))
            return
        _forward_ad._set_tangent(phys, lowered, dual)

    def _recorded_by(self) -> Tensor:
        """The tensor whose node records this one's history (the bottom of its batches)."""
        t: Any = self
        while type(t) is BatchedTensor:
            t = t.__dict__["_phys"]
        return t

    @property
    def requires_grad(self) -> bool:  # type: ignore[override]
        return self.__dict__["_phys"].requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.__dict__["_phys"].requires_grad_(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:  # type: ignore[override]
        return self.__dict__["_phys"].is_leaf

    def detach(self) -> Tensor:
        level = self.__dict__["_level"]
        return level.wrap(self.__dict__["_phys"].detach())

    def _inplace_hook(self, op: str, fn: Callable, args: tuple, kwargs: dict) -> Tensor:
        """An in-place op: computed out of place, then written into the batch by ``copy_`` on
        the physical tensor (which records it there like any in-place op).  Where a graph is
        recorded, the op runs on a copy of the old value (as ``ops.inplace`` runs it on a
        snapshot): its node may save its input, which the write would otherwise change under
        it (``y.mul_(y)`` in ``vmap(grad(f))``: a version error)."""
        level = self.__dict__["_level"]
        operand: Tensor = self
        if _grad_mode.is_grad_enabled() and (
            self.requires_grad
            or any(isinstance(a, Tensor) and a.requires_grad for a in (*args, *kwargs.values()))
        ):
            operand = F.clone(self)
        result = fn(operand, *args, **kwargs)
        if result.dtype != self.dtype:
            result = result.to(self.dtype)
        phys = self.__dict__["_phys"]
        with _physical(level):
            if _batched_at(result, level):
                source = result.__dict__["_phys"]
            else:
                source = spread(result, level.size)
            phys.copy_(source)
        self._data = _sample(phys)
        self._version_counter.bump()
        # the write gave the batch its new tangent (``forward_ad.inplace_update``): the
        # samples' is its tangent's samples again, as ``wrap`` gives a new batch's
        _samples_follow(self, phys, level)
        return self

    def __repr__(self) -> str:
        level = self.__dict__["_level"]
        return f"BatchedTensor(lvl={level.depth}, bdim=0, value=\n{self.__dict__['_phys']!r})"


class _LevelFunction(Node):
    """The backward node, on the physical tensors, of a custom ``autograd.Function`` called on
    batched tensors (PyTorch's ``generate_vmap_rule``): its edges are the physical inputs'
    (``BatchedTensor._edge``), and it runs the Function's own node ``ctx`` -- its ``backward``,
    written for one sample -- on the batched gradients, at the ``vmap`` level the forward ran
    at, so that every op of the backward is batched by the same rules as the forward's."""

    __slots__ = ("batched", "ctx", "level", "outer", "root")

    def __init__(self, ctx: Node, root: FunctionCtx, level: BatchTracer) -> None:
        # ``ctx`` is the Function's node ``root`` or, under nested ``vmap``s, the node of the
        # level just inside this one; the edges are the bottom physical inputs' (``_edge``),
        # and the input shapes those of the inputs in this level's enclosing one: what is
        # left of each once every level from this one inwards is taken off
        batching = root.__dict__.get("_input_batching") or (None,) * len(root._input_meta)
        meta = []
        batched = []
        for (shape, dtype), chain in zip(root._input_meta, batching):
            inner = [s for lvl, s in chain or () if lvl.depth >= level.depth]
            meta.append((inner[-1] if inner else shape, dtype))
            batched.append(any(lvl is level for lvl, _ in chain or ()))
        super().__init__(root._edges, tuple(meta))
        self._seq = root._seq
        self.ctx = ctx
        self.root = root
        self.level = level
        self.batched = tuple(batched)  # per input: whether it is batched at ``level``
        self.outer: _LevelFunction | None = None  # the enclosing level's node, once made

    def name(self) -> str:
        return self.ctx.name()

    @property
    def num_outputs(self) -> int:
        return self.ctx.num_outputs

    _runs_without_grads = True

    def apply(self, grads: tuple, retain: bool) -> tuple:
        level = self.level
        if level.inside is not None:
            return self._apply_inside(grads, retain)
        logical = tuple(None if g is None else level.wrap(g) for g in grads)
        with tracing(level):
            results = self.ctx.apply(logical, retain)
        out = []
        with tracing(level.prev):
            for r, batched in zip(results, self.batched):
                if r is None:
                    out.append(None)
                elif _batched_at(r, level):
                    out.append(r.__dict__["_phys"])
                elif batched:
                    # one gradient for every sample of a batched input
                    out.append(spread(r, level.size))
                else:  # an unbatched input's gradient, already one for all samples
                    out.append(r)
        return tuple(out)

    def _apply_inside(self, grads: tuple, retain: bool) -> tuple:
        """``apply`` in a backward that runs with the level taken out of the chain and the
        levels inside it still batching (``_without_level``: ``jacrev`` of the Function under
        ``vmap``): the gradients are values of the chain without the level; the level is put
        back while the Function's backward runs on them, batched at it."""
        level = self.level
        inside = level.inside
        logical = tuple(None if g is None else _raise(g, level) for g in grads)
        inside.prev, level.inside = level, None
        try:
            results = self.ctx.apply(logical, retain)
        finally:
            inside.prev, level.inside = level.prev, inside
        out = []
        for r, batched in zip(results, self.batched):
            if r is None:
                out.append(None)
            elif _batched_through(r, level) or batched:
                out.append(_lower(r, level))  # (spread along the level where it is not batched)
            else:  # an unbatched input's gradient, already one for all samples
                out.append(r)
        return tuple(out)

    def release(self) -> None:
        self.ctx.release()


def _samples_follow(t: BatchedTensor, phys: Tensor, level: BatchTracer) -> None:
    """Give the samples ``t`` the tangent of their batch ``phys`` (at the active forward-AD
    level), raised to ``level`` (``_raise``); nothing when there is none."""
    dual = _forward_ad.active_level()
    if dual is None:
        return
    tangent = _forward_ad._tangent(phys, dual)
    if tangent is not None:
        with _forward_ad.suspended():
            raised = _raise(tangent, level)
        _forward_ad._set_tangent(t, raised, dual, follow=False)


def _physical(level: BatchTracer) -> Any:
    """Where an op on ``level``'s physical tensors runs: the chain of levels without ``level``
    (``_without_level``), whose values they are, with their forward-AD tangents -- these are
    batched at the levels inside ``level`` too (``_tangent_follows``: ``vmap(jacfwd(f))``'s
    columns), so the write of a tangent (``forward_ad.inplace_update``) needs those levels
    still batching.  Just ``level.prev`` when no level runs inside ``level``."""
    innermost = _tracer.current()
    if innermost is level or not isinstance(innermost, BatchTracer):
        return tracing(level.prev)
    if level not in innermost.levels():
        return tracing(level.prev)
    return _without_level(level, innermost)


def _batched_at(t: Any, level: BatchTracer) -> bool:
    return type(t) is BatchedTensor and t.__dict__["_level"] is level


def _batched_through(t: Any, level: BatchTracer) -> bool:
    """Whether ``t`` is batched at ``level``, itself or under the levels inside it."""
    while type(t) is BatchedTensor:
        owner = t.__dict__["_level"]
        if owner is level:
            return True
        if owner.depth < level.depth:
            return False
        t = t.__dict__["_phys"]
    return False


def _sample(phys: Tensor) -> np.ndarray:
    """One sample's array of a physical tensor (its first; an empty one for an empty batch)."""
    data = phys._data
    if data.shape[0]:
        return data[0, ...]  # (a 0-d array for a batch of scalars, not a numpy scalar: views work)
    return np.zeros(data.shape[1:], data.dtype)


def _bottom_array(t: Any) -> np.ndarray:
    while type(t) is BatchedTensor:
        t = t.__dict__["_phys"]
    return t._data


class BatchTracer(Tracer):
    """The tracer of one ``vmap`` call (a *level*): batch size, randomness, and the tracer it
    replaced (``prev``), to which everything that is not batched at this level goes."""

    primitive_nodes = True  # (conv and the norm layers as their primitives: batched one by one)

    def __init__(self, prev: Tracer | None, size: int, randomness: str) -> None:
        self.prev = prev
        self.size = size
        self.randomness = randomness
        self.depth = prev.depth + 1 if isinstance(prev, BatchTracer) else 1
        # the level that skips this one while a backward runs on its physical graph with the
        # levels inside it still batching (``_without_level``); None otherwise
        self.inside: BatchTracer | None = None

    def wrap(self, phys: Tensor) -> BatchedTensor:
        """A ``BatchedTensor`` of this level over the physical tensor ``phys``."""
        t = object.__new__(BatchedTensor)
        t._data = _sample(phys)
        t._dtype = phys._dtype
        t._requires_grad = False
        t._output_nr = 0
        t._grad = None
        t._version_counter = phys._version_counter
        t._base = None
        t._accumulator = None
        t._hooks = None
        t._post_acc_hooks = None
        t._retains_grad = False
        t._wrapped_number = False
        t._inference = phys._inference
        d = t.__dict__
        d["_phys"] = phys
        d["_level"] = self
        # a batch with a tangent (a backward's result on the physical graph, an input of
        # ``jvp(vmap(f))``): the samples' tangents are its tangent's samples
        _samples_follow(t, phys, self)
        return t

    def levels(self) -> list[BatchTracer]:
        """The ``vmap`` levels on this thread, outermost first."""
        out: list[BatchTracer] = []
        level: Any = self
        while isinstance(level, BatchTracer):
            out.append(level)
            level = level.prev
        return out[::-1]

    # ---- primitives ------------------------------------------------------------------------
    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        for t in inputs:
            if type(t) is BatchedTensor and t.__dict__["_level"] is self:
                break
        else:  # nothing batched at this level: the enclosing tracer's business
            prev = self.prev
            if prev is None:
                return NotImplemented
            with tracing(prev):
                return prev.apply(prim, inputs, attrs)
        operands = [
            (t.__dict__["_phys"], True) if _batched_at(t, self) else self._unbatched(t)
            for t in inputs
        ]
        rule = RULES.get(prim.name, loop)
        with tracing(self.prev):
            phys = rule(prim, operands, attrs, self.size)
        return self.wrap(phys)

    def _unbatched(self, t: Any) -> tuple:
        """The operand for an input not batched at this level: itself, unless forward-mode AD
        gave it a tangent batched at this level (a dual whose primal is shared by the samples:
        ``jacfwd``'s columns, whose primal computation is not lifted along the level).  The
        physical graph that a backward runs on (``backward``: ``jacfwd(jacrev(g, 1), 0)``,
        where ``g``'s other input is lifted) must then see the samples' tangents, so such an
        operand enters as its spread with its tangent lowered to the physical one (``_lower``)
        -- it would otherwise be saved with one sample's tangent, read as the first sample's
        once the level is out of the chain.  The spread is materialised (``clone``): the rule
        may take views of it, and a view's tangent is replayed from its base's, which the
        spread, itself a view, is not."""
        dual = _forward_ad._state.level
        if dual is None or not isinstance(t, Tensor):
            return (t, False)
        tangent = _forward_ad._tangent(t, dual)
        if tangent is None or not _batched_through(tangent, self):
            return (t, False)
        with _forward_ad.suspended(), tracing(self.prev):
            phys = F.clone(spread(t, self.size))
            lowered = _lower(tangent, self)
            _forward_ad._set_tangent(phys, lowered, dual)
        return (phys, True)

    def made(self, node: Any, inputs: tuple, out: Any) -> None:
        if self.prev is not None:  # (a call it let run eagerly: the enclosing tracer's)
            self.prev.made(node, inputs, out)

    def full(self, shape: tuple, value: Any, dtype: Any, device: Any) -> Any:
        if self.prev is None:
            return NotImplemented
        return self.prev.full(shape, value, dtype, device)

    # ---- autograd --------------------------------------------------------------------------
    def backward(
        self,
        roots: Any,
        grads: Any,
        retain_graph: bool,
        create_graph: bool,
        inputs: Any,
        accumulate: bool,
    ) -> Any:
        if _tracer_below() is not None and any(type(g) is BatchedTensor for g in grads):
            # batched output gradients (the vector-Jacobian products of ``jacrev``) would
            # reach a compiled region or recording below as one sample's tensors
            with without_tracer_below(roots[0], "a backward with batched output gradients"):
                return self.backward(roots, grads, retain_graph, create_graph, inputs, accumulate)
        level = _innermost_level(roots, self.levels())
        if level is None:
            # no output is batched (a graph made outside every vmap, as ``vjp``'s under
            # ``vmap(vjp_fn)``) and the output gradients may be: the engine runs the rules here,
            # through every level, on batched values
            below = _tracer_below()
            if below is None:
                return NotImplemented
            with tracing(below):
                return below.backward(roots, grads, retain_graph, create_graph, inputs, accumulate)
        if not all(_batched_at(r, level) for r in roots):
            raise RuntimeError(
                "vmap: backward through outputs of which some are batched and some are not "
                "is not supported; compute them in separate calls"
            )
        # the graph of the outputs is their batch's, one level down, where ``level``'s samples
        # are rows: the backward runs there, with the levels above ``level`` still batching
        # (their output gradients: ``jacrev``'s rows under ``vmap``, ``vmap(jacrev(f))``)
        with _without_level(level, self):
            phys_roots = [r.__dict__["_phys"] for r in roots]
            phys_grads = [_lower(g, level) for g in grads]
            phys_inputs = None
            if inputs is not None:
                phys_inputs = [x.__dict__["_phys"] if _batched_at(x, level) else x for x in inputs]
            if accumulate:
                api.backward(phys_roots, phys_grads, retain_graph, create_graph, phys_inputs)
                return None
            results = api.grad(
                phys_roots,
                phys_inputs,
                phys_grads,
                retain_graph=retain_graph,
                create_graph=create_graph,
                allow_unused=True,
            )
            return [
                None if g is None else (_raise(g, level) if _batched_at(x, level) else g)
                for x, g in zip(inputs, results)
            ]

    # ---- what the batch cannot go through --------------------------------------------------
    def host_read(self, tensor: Tensor, what: str, result: Any = None) -> None:
        if type(tensor) is BatchedTensor:
            raise RuntimeError(
                f"vmap: It looks like you're reading a batched Tensor's values with {what} "
                "(data-dependent control flow, or a conversion to Python or numpy). vmap "
                "cannot run one sample's Python code per sample; rewrite it with tensor ops "
                "(e.g. where() instead of if)"
            )
        if self.prev is not None:
            self.prev.host_read(tensor, what, result)

    def will_draw(self, generator: Any = None) -> None:
        if self.randomness == "error":
            raise RuntimeError(
                "vmap: called random operation while in randomness error mode. Please either "
                "use the 'same' or 'different' randomness flags on vmap or perform the "
                "randomness operation out of vmap"
            )
        if self.prev is not None:
            self.prev.will_draw(generator)

    def created(self, tensor: Tensor, redo: Any) -> None:
        if self.randomness == "different" and callable(redo) and type(tensor) is Tensor:
            # one draw per sample: the first is the one made, the others drawn again
            if self.prev is not None:  # (a recording replays the first draw too)
                self.prev.created(tensor, redo)
            with tracing(self.prev):
                draws = [tensor.detach()]
                draws += [_tracer.notify_created(redo(), redo) for _ in range(self.size - 1)]
                phys = F.stack(draws)
            tensor.__class__ = BatchedTensor
            tensor.__dict__["_phys"] = phys
            tensor.__dict__["_level"] = self
            tensor._data = _sample(phys)
            return
        if self.prev is not None:
            self.prev.created(tensor, redo)

    def wrote(self, target: Tensor, result: Tensor) -> None:
        if type(result) is BatchedTensor and not _batched_at(target, self):
            raise RuntimeError(
                "vmap: inplace arithmetic(self, *extra_args) is not possible because there "
                "exists a Tensor `other` in extra_args that has more elements than `self`. This "
                "happened due to `other` being vmapped over but `self` not being vmapped over in "
                "a vmap. Please try to use out-of-place operators instead of inplace arithmetic."
            )
        if self.prev is not None:
            self.prev.wrote(target, result)

    def check(self, tensor: Tensor, fn: Any) -> None:
        if _batched_at(tensor, self):
            fn(_bottom_array(tensor))  # every sample's values, not only the first's
            # the enclosing tracer sees the whole batch (a recording checks it on every call)
            tensor = tensor.__dict__["_phys"]
        if self.prev is not None:
            self.prev.check(tensor, fn)

    def side_effect(self, tensor: Tensor, what: str) -> None:
        if self.prev is not None:
            self.prev.side_effect(tensor, what)

    def opaque(self, owner: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        if self.prev is None:
            return NotImplemented
        return self.prev.opaque(owner, fn, args, kwargs)


def _innermost_level(tensors: Any, chain: list[BatchTracer]) -> BatchTracer | None:
    """The innermost of the levels ``chain`` (outermost first) at which one of ``tensors`` is
    batched (a ``BatchedTensor``'s own level is the innermost it is batched at), or None."""
    innermost = -1
    for t in tensors:
        if type(t) is BatchedTensor:
            owner = t.__dict__["_level"]
            for i, candidate in enumerate(chain):
                if candidate is owner and i > innermost:
                    innermost = i
    return chain[innermost] if innermost >= 0 else None


class _without_level:  # noqa: N801  (a context manager, used like a function)
    """Run the block with ``level`` taken out of this thread's chain of levels, whose
    innermost is ``innermost``: the level just inside it gets ``level.prev`` as its ``prev``
    (put back afterwards), and the installed tracer is ``innermost`` (``level.prev`` when
    ``level`` is the innermost).  In the block, ``level``'s physical tensors are values of
    the levels that remain, and a tensor batched at the levels inside ``level`` holds
    ``level``'s samples as an ordinary dim (``_lower``, ``_raise``).  ``level.inside`` names
    the level that skips it meanwhile (``_LevelFunction`` puts it back for its own backward).
    (A class, not a generator, as ``without_tracer_below``.)"""

    def __init__(self, level: BatchTracer, innermost: BatchTracer) -> None:
        self.level = level
        self.innermost = innermost
        self.inside: BatchTracer | None = None
        self.installed: Any = None

    def __enter__(self) -> None:
        level = self.level
        inside: Any = self.innermost
        while inside is not level and inside.prev is not level:
            inside = inside.prev
        if inside is level:  # the innermost level: nothing batches inside it
            self.installed = tracing(level.prev)
        else:
            self.inside = inside
            inside.prev = level.prev
            level.inside = inside
            self.installed = tracing(self.innermost)
        self.installed.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.installed.__exit__(*exc)
        if self.inside is not None:
            self.inside.prev = self.level
            self.level.inside = None


def _lower(t: Any, level: BatchTracer) -> Any:
    """``t``, a value of the whole chain of levels, as a value of the chain without ``level``
    (``_without_level``): its batch of ``level`` becomes its logical dim 0 (spread along it
    where ``t`` is not batched at ``level``), and it stays batched at the levels inside
    ``level`` that it was batched at, each of their samples holding ``level``'s as rows."""
    if type(t) is BatchedTensor:
        owner = t.__dict__["_level"]
        if owner is level:
            return t.__dict__["_phys"]
        if owner.depth > level.depth:
            rows = _lower(t.__dict__["_phys"], level)  # (level's batch, owner's batch, ...)
            with tracing(owner.prev):
                return owner.wrap(F.movedim(rows, 1, 0))
    with tracing(level.prev):
        return spread(t, level.size)


def _raise(t: Any, level: BatchTracer) -> Any:
    """The inverse of ``_lower``: ``t``, a value of the chain without ``level`` whose logical
    dim 0 is ``level``'s batch, as a value of the whole chain, batched at ``level``."""
    if type(t) is BatchedTensor:
        owner = t.__dict__["_level"]
        if owner.depth > level.depth:
            with tracing(owner.prev):
                rows = F.movedim(t.__dict__["_phys"], 0, 1)  # (level's batch, owner's, ...)
            return owner.wrap(_raise(rows, level))
    return level.wrap(t)


def _tracer_below() -> Tracer | None:
    """The tracer below this thread's ``vmap`` levels (a compiled region or recording)."""
    t = _tracer.current()
    while isinstance(t, BatchTracer):
        t = t.prev
    return t


class without_tracer_below:  # noqa: N801  (a context manager, used like a function)
    """Run the block as without a compiled region or recording below the ``vmap`` levels: a
    backward whose values a compiled program cannot carry (batched output gradients, forward-AD
    tangents, a graph that a later transform differentiates with those) runs with the eager
    engine, every op through the levels.  A recording stops first (``what``, the reason: what
    the engine does besides the ops is not recorded).  The levels are this call's own objects:
    the outermost one's ``prev`` is put back afterwards.  (A class, not a generator: the
    recording names the user's line, not contextlib's.)"""

    def __init__(self, tensor: Tensor, what: str) -> None:
        self.tensor = tensor
        self.what = what
        self.bottom: BatchTracer | None = None
        self.below: Tracer | None = None
        self.hidden: Any = None

    def __enter__(self) -> None:
        below = _tracer.current()
        while isinstance(below, BatchTracer):
            self.bottom, below = below, below.prev
        self.below = below
        if below is None:
            return
        below.side_effect(self.tensor, f"{self.what} under fusegrad.func")
        if self.bottom is None:
            self.hidden = tracing(None)
            self.hidden.__enter__()
        else:
            self.bottom.prev = None

    def __exit__(self, *exc: Any) -> None:
        if self.below is None:
            return
        if self.hidden is not None:
            self.hidden.__exit__(*exc)
        elif self.bottom is not None:
            self.bottom.prev = self.below


def current_levels() -> list[BatchTracer]:
    """The ``vmap`` levels active on this thread, outermost first."""
    t = _tracer.current()
    return t.levels() if isinstance(t, BatchTracer) else []


def lift(x: Tensor, levels: list[BatchTracer]) -> Tensor:
    """``x`` batched at every one of ``levels`` (outermost first): unbatched levels spread it
    (a view), so that a gradient with respect to it is one per sample."""
    if not levels:
        return x
    inner = levels[-1]
    if _batched_at(x, inner):
        phys = lift(x.__dict__["_phys"], levels[:-1])
    else:
        phys = lift(x, levels[:-1])
        with tracing(inner.prev):
            phys = spread(phys, inner.size)
    return inner.wrap(phys)


def tangent_only_levels(inputs: list, levels: list[BatchTracer], dual: Any) -> list:
    """Of ``levels``, those at which some of a transform's dual ``inputs`` has its tangent
    batched and none has its primal batched (``jacfwd``'s columns: its samples share one
    primal computation, so the inputs are not lifted along it, ``lift_dual``)."""
    pairs = [(x, _forward_ad._tangent(x, dual)) for x in inputs if isinstance(x, Tensor)]
    return [
        level
        for level in levels
        if any(t is not None and _batched_through(t, level) for _, t in pairs)
        and not any(_batched_through(x, level) for x, _ in pairs)
    ]


def lift_dual(
    primal: Tensor, tangent: Tensor, levels: list[BatchTracer], shared: list[BatchTracer]
) -> tuple:
    """A dual input's primal and tangent lifted apart (``lift``) for a transform's fresh
    input: the tangent at every level, the primal at every level but those of ``shared``
    (``tangent_only_levels``, computed over all the transform's inputs, so that they are all
    lifted alike: ``vmap(hessian(f), in_dims=(None, 0))`` needs one primal per sample)."""
    chosen = [level for level in levels if level not in shared or _batched_through(primal, level)]
    return lift(primal, chosen), lift(tangent, levels)


def zeros_batched_like(t: Tensor) -> Tensor:
    """Zeros like ``t``, batched at the same levels as ``t`` (each level's batch of zeros): a
    leaf made from it is one per sample, as ``t`` is."""
    levels = []
    bottom: Any = t
    while type(bottom) is BatchedTensor:
        levels.append(bottom.__dict__["_level"])
        bottom = bottom.__dict__["_phys"]
    zeros = F.zeros_like(bottom)
    for level in reversed(levels):
        zeros = level.wrap(zeros)
    return zeros


def _describe(func: Callable) -> str:
    return getattr(func, "__name__", repr(func))


def _flat_in_dims(func: Callable, in_dims: Any, args: tuple) -> tuple[list, list, Any]:
    """The flat leaves of ``args`` with one in_dim each (``in_dims`` is a prefix of the
    structure of ``args``: an int or None applies to a whole subtree)."""
    name = _describe(func)
    if not isinstance(in_dims, (int, tuple)) and in_dims is not None:
        raise ValueError(
            f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): expected `in_dims` to be int or a "
            f"(potentially nested) tuple matching the structure of inputs, got: {type(in_dims)}."
        )
    if isinstance(in_dims, tuple) and len(in_dims) != len(args):
        raise ValueError(
            f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims is not compatible with "
            f"the structure of `inputs`. in_dims has structure of length {len(in_dims)} but "
            f"inputs has length {len(args)}."
        )
    leaves, spec = tree_flatten(args)
    dims: list = []

    def walk(value: Any, dim: Any) -> None:
        if isinstance(dim, (tuple, list)) and isinstance(value, (tuple, list)):
            if len(dim) != len(value):
                raise ValueError(
                    f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims is not compatible "
                    "with the structure of `inputs`."
                )
            for v, d in zip(value, dim):
                walk(v, d)
        elif isinstance(dim, dict) and isinstance(value, dict):
            for k in value:
                walk(value[k], dim[k])
        elif isinstance(dim, (tuple, list, dict)):
            raise ValueError(
                f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims is not compatible "
                "with the structure of `inputs`."
            )
        else:
            sub, _ = tree_flatten(value)
            dims.extend([dim] * len(sub))

    walk(args, in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args))
    return leaves, dims, spec


def _batch_size(func: Callable, in_dims: Any, leaves: list, dims: list) -> int:
    name = _describe(func)
    sizes = []
    for x, d in zip(leaves, dims):
        if d is None:
            continue
        if not isinstance(d, int) or isinstance(d, bool):
            raise ValueError(
                f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims must be int or None, "
                f"got {d!r}"
            )
        if not isinstance(x, Tensor):
            raise ValueError(
                f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={d} for an input "
                f"but the input is of type {type(x)}. We cannot vmap over non-Tensor arguments, "
                "please use None as the respective in_dim"
            )
        if not -x.ndim <= d < x.ndim:
            raise ValueError(
                f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={d} for some "
                f"input, but that input is a Tensor of dimensionality {x.ndim} so expected "
                f"in_dim to satisfy -{x.ndim} <= in_dim < {x.ndim}."
            )
        sizes.append(x.shape[d])
    if not sizes:
        raise ValueError(
            f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): at least one input must be a "
            "Tensor with an in_dim that is not None (there is nothing to vmap over)"
        )
    if any(s != sizes[0] for s in sizes):
        raise ValueError(
            f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Expected all tensors to have the "
            f"same size in the mapped dimension, got sizes {sizes} for the mapped dimension"
        )
    return sizes[0]


def _call(
    func: Callable, leaves: list, dims: list, spec: Any, kwargs: dict, size: int,
    out_dims: Any, randomness: str,
) -> Any:  # fmt: skip
    level = BatchTracer(_tracer.current(), size, randomness)
    batched = []
    for x, d in zip(leaves, dims):
        if d is None:
            batched.append(x)
            continue
        phys = F.movedim(x, d, 0) if d % x.ndim else x
        batched.append(level.wrap(phys))  # (with its tangent, under forward-mode AD: ``wrap``)
    with tracing(level):
        out = func(*tree_unflatten(batched, spec), **kwargs)
    out_leaves, out_spec = tree_flatten(out)
    if isinstance(out_dims, int) or out_dims is None:
        flat_out_dims = [out_dims] * len(out_leaves)
    else:
        flat_out_dims = _prefix_dims(func, out_dims, out)
    results = []
    for value, d in zip(out_leaves, flat_out_dims):
        if not isinstance(value, Tensor):
            raise ValueError(
                f"vmap({_describe(func)}, ...): `{_describe(func)}` must only return Tensors, "
                f"got type {type(value)}. Did you mean to set out_dims= to None for output?"
            )
        if d is None:
            if _batched_at(value, level):
                raise ValueError(
                    f"vmap({_describe(func)}, ...): out_dims=None for an output that is "
                    "batched: every sample has its own value there"
                )
            results.append(value)
            continue
        phys = value.__dict__["_phys"] if _batched_at(value, level) else spread(value, size)
        if not -phys.ndim <= d < phys.ndim:
            raise ValueError(
                f"vmap({_describe(func)}, ...): out_dim={d} for an output of "
                f"{phys.ndim - 1} dims: expected -{phys.ndim} <= out_dim < {phys.ndim}"
            )
        results.append(F.movedim(phys, 0, d) if d % phys.ndim else phys)
    return tree_unflatten(results, out_spec)


def _prefix_dims(func: Callable, out_dims: Any, out: Any) -> list:
    dims: list = []

    def walk(value: Any, dim: Any) -> None:
        if isinstance(dim, (tuple, list)):
            if not isinstance(value, (tuple, list)) or len(value) != len(dim):
                raise ValueError(
                    f"vmap({_describe(func)}, ..., out_dims={out_dims})(<inputs>): out_dims is "
                    "not compatible with the structure of `outputs`."
                )
            for v, d in zip(value, dim):
                walk(v, d)
        else:
            dims.extend([dim] * len(tree_flatten(value)[0]))

    walk(out, out_dims)
    return dims


def vmap(
    func: Callable,
    in_dims: Any = 0,
    out_dims: Any = 0,
    randomness: str = "error",
    *,
    chunk_size: int | None = None,
) -> Callable:
    """``func`` of one sample, vectorised over a batch dim of its inputs (PyTorch's
    ``torch.func.vmap``).

    ``in_dims`` (an int, None, or a nested tuple matching the positional arguments) says which
    dim of each input is the batch (None: not batched, the same for every sample); keyword
    arguments are never batched.  ``out_dims`` says where the batch dim goes in each output.
    ``randomness``: ``"error"`` (random ops raise), ``"same"`` or ``"different"`` (per sample).
    ``chunk_size`` computes that many samples at a time (less memory; the same result)."""
    if randomness not in _RANDOMNESS:
        raise RuntimeError(
            f"Only allowed values for randomness are 'error', 'different', or 'same'. Got "
            f"{randomness}"
        )
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")

    @functools.wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        leaves, dims, spec = _flat_in_dims(func, in_dims, args)
        size = _batch_size(func, in_dims, leaves, dims)
        if chunk_size is None or chunk_size >= size:
            return _call(func, leaves, dims, spec, kwargs, size, out_dims, randomness)
        parts = []
        for start in range(0, size, chunk_size):
            stop = min(start + chunk_size, size)
            chunk = [
                x if d is None else F.narrow(x, d, start, stop - start)
                for x, d in zip(leaves, dims)
            ]
            parts.append(_call(func, chunk, dims, spec, kwargs, stop - start, out_dims, randomness))
        flat_parts = [tree_flatten(p) for p in parts]
        out_spec = flat_parts[0][1]
        n = len(flat_parts[0][0])
        if isinstance(out_dims, int) or out_dims is None:
            flat_out_dims = [out_dims] * n
        else:
            flat_out_dims = _prefix_dims(func, out_dims, parts[0])
        joined = []
        for i in range(n):
            d = flat_out_dims[i]
            if d is None:
                joined.append(flat_parts[0][0][i])
            else:
                joined.append(F.cat([fp[0][i] for fp in flat_parts], dim=d))
        return tree_unflatten(joined, out_spec)

    return wrapped
