"""Capture: turn one ``backward()`` / ``autograd.grad()`` call into a backward IR graph.

Two steps, both over the live eager graph:

1. ``walk`` -- a cheap, deterministic walk of the nodes reachable from the roots (iterative DFS,
   preorder) that builds the cache *key* (node types, primitive attributes, edge structure,
   dtypes, ranks, which sizes are 0 or 1 and which are equal to each other, which leaves get
   gradients, the call's flags, the structure of checkpoint recordings) and collects the
   runtime arguments in a fixed order: the size vector (every size of 2 or more, numbered in
   order of first appearance: ``symbolic``), the nodes' saved tensors (and what checkpoint
   recordings read) and the leaves.  The leaves' ``.grad`` state is kept apart
   (``Walk.grad_key``): it changes the program built from a graph, not the graph.  Anything the
   compiler cannot run (a forward-AD level, freed saved tensors, a hand-built node, ...) is
   reported as a fallback reason instead; a custom Function whose ``backward`` the key cannot
   vouch for becomes an opaque step (``Walk.opaque``).
2. ``Capture`` -- on a cache miss, the *same* engine (``engine.run_backward``) runs the *same*
   derivative rules, with a ``Capture`` as its executor (docs/ARCHITECTURE.md, contracts 1, 3 and
   10): the
   roots' gradients and saved tensors are ``SymbolicTensor``s, tensors with a shape and dtype but
   no data, and the capture is this thread's tracer for the duration, so every primitive call of
   a rule comes to ``Capture.apply`` and is recorded as an IR value.  Saved tensors become
   ``input`` values (their versions are checked exactly as in eager mode), ``.grad`` writes
   become effects, user hooks opaque steps at their eager positions, and tensors that rules
   create from nothing (index ranges) become constants.  A tensor packed by saved-tensor hooks
   becomes an ``unpack_saved`` step, which calls the unpack hook where eager mode would --
   unless a checkpoint packed it and recorded its function's forward (``autograd.recording``):
   then the recording's ops are recorded instead, at the first unpack (``Capture.recompute``),
   and a reentrant checkpoint's backward is the recording's, replayed with grad on and
   differentiated in a reentrant backward of the capture (``_checkpoint_backward``).  A
   custom Function's ``backward`` is traced like a rule, under watch (``functions``); one that
   turns out untraceable becomes a ``function`` step, its eager ``backward`` run where eager mode
   runs it, and the capture starts again (``OpaqueRestart``).  Nothing
   is patched: another thread's backward, eager or compiled, never sees this capture.

A capture is *symbolic* first: sizes are ``symbolic.SymInt``s (in the symbolic tensors' shapes,
and in what rules see of their node: ``NodeView``), so the graph's shapes and size attributes are
expressions over the size vector, valid for every call with the same key that satisfies the
capture's guards.  When something needs a concrete size or data on the way (``NeedsData``, or
any other failure), the capture is repeated with the call's concrete sizes, guarded to be exactly
those: correct, and only as general as captures were before symbolic sizes.

Backwards whose forward was recorded in a compiled region usually skip the walk (``tape``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fusegrad import dtypes as _dt
from fusegrad.autograd import anomaly, grad_mode
from fusegrad.autograd import engine as _engine
from fusegrad.autograd.function import FunctionCtx
from fusegrad.autograd.node import OpNode
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.errors import AutogradError
from fusegrad.ops import registry
from fusegrad.ops.registry import RULES as _RULES
from fusegrad.tensor import Tensor

from . import symbolic
from .cache import Programs
from .ddp import Buckets
from .functions import (
    TracedCtx,
    Untraceable,
    function_globals_key,
    none_gradients,
    reads_plain_values,
)
from .ir import Graph, Value
from .key import INLINED, Walk, sized_attrs
from .symbolic import FakeArray, Guard, NeedsData, ShapeEnv

# float16/bfloat16 values: numba has no CPU half type, so graphs holding them run eagerly
_HALF_REASON = "a float16/bfloat16 value (compiled programs take no half dtypes: eager)"
# complex values: the lowering table has real scalar expressions only (docs/complex.md)
_COMPLEX_REASON = "a complex value (compiled programs take no complex dtypes: eager)"
_SMALL_INT_REASON = "an int16/int8/uint8 value (compiled programs take no small integers: eager)"


class Fallback(Exception):
    """This backward cannot be compiled; ``str(e)`` is the one logged reason."""


class OpaqueRestart(Fallback):
    """A custom Function's ``backward`` could not be traced (``reason``): capture again with
    node ``site`` (its walk position) as an opaque step (``Capture._opaque_function``)."""

    def __init__(self, site: int, reason: str) -> None:
        super().__init__(reason)
        self.site = site
        self.reason = reason


class Refused(Fallback):
    """A fallback that holds for every call with the same walk key (a custom Function's
    backward that cannot be traced): remembered, so later calls skip the capture."""


class SymbolicTensor(Tensor):
    """A tensor that stands for an IR value: shape and dtype, no data.

    In a symbolic capture ``_data`` is a ``FakeArray`` whose shape holds ``SymInt``s; in a
    concrete one, a zero-stride numpy array of the right shape and dtype (it costs no memory).
    Either way every op-surface check that reads shapes or dtypes works unchanged, and no kernel
    runs: ``registry.apply`` hands the call to the capture, this thread's tracer."""

    __slots__ = ("_value",)

    @classmethod
    def of(cls, value: Value, env: ShapeEnv | None) -> SymbolicTensor:
        if env is None:
            data: Any = np.broadcast_to(np.zeros((), value.dtype.np), value.shape)
        else:
            data = FakeArray(symbolic.to_symints(value.shape, env), value.dtype.np)
        t = cls._make(data)
        t._value = value
        return t


class NodeView:
    """What a derivative rule sees of its node in a symbolic capture: the node's attributes and
    input shapes with sizes as ``SymInt``s.  Rules are written against this interface
    (``attrs``, ``input_shapes``, ``input_dtypes``, ``needs_input_grad``, ``name()``); anything
    else of the node would carry concrete sizes, so asking for it makes the capture concrete."""

    __slots__ = ("_node", "attrs", "input_dtypes", "input_shapes", "needs_input_grad")

    def __init__(self, node: OpNode, env: ShapeEnv) -> None:
        self._node = node
        self.attrs = sized_attrs(node._prim, node.attrs, env.size)
        self.input_shapes = tuple(env.shape(m[0]) for m in node._input_meta)
        self.input_dtypes = node.input_dtypes
        self.needs_input_grad = node.needs_input_grad

    def name(self) -> str:
        return self._node.name()

    def __getattr__(self, name: str) -> Any:
        raise NeedsData(f"a derivative rule read {name!r} of its node")


class Recorder(Tracer):
    """Records primitive calls on symbolic values as IR values of ``graph`` (this thread's
    tracer while it runs derivative rules): the capture's, and ``double``'s differentiation of a
    captured graph.  ``env`` holds the symbolic sizes (None: concrete ones); ``current`` names
    the node whose rule runs (IR values keep it as their origin); ``user`` is set while a custom
    Function's backward runs (``Capture._trace_function``), whose tensors ``made`` holds."""

    prefers_composites = True  # (the compiler fuses them: fusegrad.autograd.tracer)

    def __init__(self, graph: Graph, env: ShapeEnv | None) -> None:
        self.graph = graph
        self.env = env
        self.current = ""
        self.user = 0  # how deep in custom Functions' backwards (nested: reentrant ones)
        self.made: dict[int, Tensor] = {}
        # the no-data arrays of the values user code got, by id: a tensor sharing one
        # (``detach()``, a saved output rebuilt on unpack) stands for that value
        self.fake: dict[int, tuple[FakeArray, Value]] = {}

    def value_of(self, t: Any) -> Value | None:
        """The IR value tensor ``t`` stands for, if it stands for one."""
        if isinstance(t, SymbolicTensor):
            return t._value
        entry = self.fake.get(id(t._data))
        return entry[1] if entry is not None and entry[0] is t._data else None

    def symbolic(self, value: Value) -> SymbolicTensor:
        if self.user and self.env is None:
            # (inside a custom Function's backward: its values have no data even in a
            # concrete capture, and what it does is watched)
            # user code must never compute on the zeros a concrete capture's values hold:
            # reading data raises (``NeedsData``), and that backward falls back
            t = SymbolicTensor._make(FakeArray(tuple(value.shape), value.dtype.np))
            t._value = value
            self.fake[id(t._data)] = (t._data, value)
            return t
        t = SymbolicTensor.of(value, self.env)
        if self.user:
            self.fake[id(t._data)] = (t._data, value)
        return t

    def apply(self, prim: registry.Primitive, inputs: tuple, attrs: dict) -> Any:
        graph = self.graph
        values = []
        for a in inputs:
            known = self.value_of(a)
            if known is not None:
                values.append(known)
                continue
            if self.user and not a._wrapped_number and id(a) not in self.made:
                raise Refused(
                    f"the backward of {self.current} uses a tensor that is neither an input of "
                    "its backward (gradients, saved tensors, ctx attributes) nor made inside it"
                )
            if a._wrapped_number or (a._data.ndim == 0):
                values.append(graph.scalar(a._data.item(), a._dtype))
            else:
                values.append(graph.constant(a._data))
        env = self.env
        if env is not None:
            env.where = f"{prim.name} in the rule of {self.current}"
            shapes = tuple(symbolic.to_symints(v.shape, env) for v in values)
        else:
            shapes = tuple(v.shape for v in values)
        try:
            shape, dtype = prim.meta(shapes, tuple(v.dtype for v in values), **attrs)
        except registry.DataDependentShape as e:
            raise Fallback(f"{prim.name} in {self.current}: {e}") from None
        if dtype in _dt.HALF or any(v.dtype in _dt.HALF for v in values):
            raise Fallback(f"{prim.name} in {self.current}: {_HALF_REASON}")
        if dtype.is_complex or any(v.dtype.is_complex for v in values):
            raise Fallback(f"{prim.name} in {self.current}: {_COMPLEX_REASON}")
        if dtype in _dt.SMALL_INT or any(v.dtype in _dt.SMALL_INT for v in values):
            raise Fallback(f"{prim.name} in {self.current}: {_SMALL_INT_REASON}")
        value = graph.add(
            prim.name,
            tuple(values),
            symbolic.to_exprs(attrs) if env is not None else attrs,
            symbolic.to_exprs(tuple(shape)),
            dtype,
            origin=self.current,
        )
        out = self.symbolic(value)
        if self.user and prim.differentiable and grad_mode._state.enabled:
            # user code recording a graph (to call backward() on it: a reentrant backward)
            for a in inputs:
                if a._requires_grad or a.grad_fn is not None:
                    if env is not None:
                        raise NeedsData("a custom Function's backward records a graph")
                    out.grad_fn = OpNode(prim, _RULES[prim.name], attrs, inputs, (out,))
                    break
        return out

    def full(self, shape: tuple, value: Any, dtype: Any, device: Any) -> Any:
        """A constant a rule makes (``zeros_like(g)``, ``zeros(shape)``): one scalar broadcast
        to ``shape`` (which may be symbolic), fused into kernels like any broadcast read."""
        dims = symbolic.to_exprs(tuple(shape))
        return self.symbolic(self.graph.full(dims, value, dtype, self.current))


class Capture(_engine.Executor, Recorder):
    """One capture: the engine's executor and this thread's tracer while the engine runs the
    backward of ``w``'s graph on symbolic values (see the module docstring).  ``run`` returns
    the graph; ``Fallback`` says why there is none.  ``symbolic`` selects sizes as symbols (the
    guards the graph needs end up in ``guards``) or the call's concrete sizes."""

    def __init__(
        self,
        w: Walk,
        roots: Sequence[Tensor],
        grad_roots: Sequence[Tensor],
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
        symbolic: bool = True,
        create_graph: bool = False,
        opaque: dict | None = None,
        allow_opaque: bool = True,
    ) -> None:
        self.w = w
        # walk positions of Function nodes this capture runs as opaque steps (beyond the walk's
        # own ``w.opaque``), and whether a backward that cannot be traced may become one
        self.opaque_sites = opaque or {}  # site -> why
        self.allow_opaque = allow_opaque
        self.roots = roots
        self.grad_roots = grad_roots
        self.inputs = inputs
        self.accumulate = accumulate
        self.create_graph = create_graph
        Recorder.__init__(self, Graph(hints=w.sizes), ShapeEnv(w.sizes) if symbolic else None)
        self.saved_index = {id(s): k for k, (_, s) in enumerate(w.saved)}
        self.leaf_index = {id(t): k for k, t in enumerate(w.leaves)}
        self.input_index = {id(t): k for k, t in enumerate(inputs or ())}
        self.saved_values: dict[int, Value] = {}  # alias class -> its input value
        self.seq = iter(range(1 << 62))  # side-effecting values are never interned together
        self.last_store: dict[int, Value] = {}  # id(tensor) -> its latest store_grad value
        # saved tensors the engine unpacked (their nodes ran): only these are version-checked
        # when the program runs, as eager mode checks only those of the nodes it runs
        self.unpacked: set[int] = set()
        # the error of a saved tensor's real unpack (a version check): eager's own error, which
        # a custom Function's traced backward must raise as eager's would, not refuse
        self.unpack_error: BaseException | None = None
        # anomaly mode: each node's gradients become ``("check", (node, output), value)``
        # effects, which the program tests for NaN, in eager's order, before any other effect
        self.check_nan = anomaly._state.enabled and anomaly._state.check_nan
        self.buckets = None if w.ddp is None else Buckets(w.ddp, self.graph)
        self.regions: dict[int, dict] = {}  # region number -> its recomputed values, by ref
        self.holders: set[int] = set()  # ids of the checkpoint holders unpacked
        self.standins: dict[int, Tensor] = {}  # id(replayed outside tensor) -> the tensor

    @property
    def guards(self) -> list[Guard]:
        """What the graph assumes about the size vector (``symbolic.Guard``): in a concrete
        capture, that every size is the one it had."""
        if self.env is not None:
            return list(self.env.guards)
        return [
            Guard(symbolic.sub(symbolic.symbol(k), v), "==", "the capture used concrete sizes")
            for k, v in enumerate(self.w.sizes)
        ]

    def run(self) -> Graph:
        graph = self.graph
        sym_roots = [
            self.symbolic(graph.input("root", i, self.exprs(g._data.shape), g._dtype))
            for i, g in enumerate(self.grad_roots)
        ]
        # anomaly mode's per-node work is the program's (``check_nan``), not the capture's: the
        # engine's own NaN check and warnings would read symbolic values
        enabled, anomaly._state.enabled = anomaly._state.enabled, False
        try:
            with tracing(self):
                captured = _engine.run_backward(
                    self.roots,
                    sym_roots,
                    True,
                    self.create_graph,
                    self.inputs,
                    self.accumulate,
                    executor=self,
                )
        finally:
            anomaly._state.enabled = enabled
        if not self.accumulate:
            for pos, g in enumerate(captured or ()):
                if g is not None:
                    graph.effects.append(("capture", pos, self.as_value(g)))
        if self.buckets is not None:
            averaged = self.buckets.finish()
            if averaged is None:
                raise Fallback(
                    "a DistributedDataParallel parameter got no gradient (its hooks leave the "
                    "reduction unfinished, which eager mode reports at the next forward)"
                )
            graph.effects = [
                (kind, slot, averaged.get(slot, v) if kind == "grad" else v)
                for kind, slot, v in graph.effects
            ]
        return graph

    def exprs(self, shape: tuple) -> tuple:
        """A concrete shape of the walked graph as IR dims (symbols in a symbolic capture)."""
        if self.env is None:
            return tuple(shape)
        return tuple(symbolic.expr_of(self.env.size(d)) for d in shape)

    # ---- Tracer: every primitive call of a rule ------------------------------------------------
    def backward(
        self,
        roots: Sequence[Tensor],
        grads: Sequence[Tensor],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Tensor] | None,
        accumulate: bool,
    ) -> Any:
        """A reentrant backward inside a custom Function's backward: the engine runs it with
        this capture as its executor, over the graph that code recorded (rules never call
        backward)."""
        if not self.user or create_graph:
            raise Refused(f"a backward() inside the backward of {self.current}")
        if self.env is not None:
            raise NeedsData("a reentrant backward (captured with concrete sizes)")
        roots_grads = []
        for g in grads:
            v = self.value_of(g)
            roots_grads.append(self.symbolic(v if v is not None else self.as_value(g)))
        return _engine.run_backward(
            roots, roots_grads, retain_graph, False, inputs, accumulate, executor=self
        )

    # What a custom Function's backward must not do to be replayed (``functions``): each is
    # detected while it runs, and sends that backward to eager mode (remembered per key).
    def created(self, tensor: Tensor, redo: Any) -> None:
        if self.user:
            if redo is not None and not isinstance(redo, Tensor):
                raise Refused(f"the backward of {self.current} draws random numbers")
            self.made[id(tensor)] = tensor

    def will_draw(self, generator: Any = None) -> None:
        if self.user:  # (before the generator moves: the eager run draws what eager would)
            raise Refused(f"the backward of {self.current} draws random numbers")

    def host_read(self, tensor: Tensor, what: str, result: Any = None) -> None:
        if self.user:
            raise Refused(f"the backward of {self.current} reads tensor values ({what})")

    def wrote(self, target: Tensor, result: Tensor) -> None:
        if self.user:
            raise Refused(f"the backward of {self.current} writes into a tensor in place")

    def side_effect(self, tensor: Tensor, what: str) -> None:
        if self.user and self.value_of(tensor) is None:  # (its own values: ``requires_grad_``)
            raise Refused(f"the backward of {self.current} changes tensor state ({what})")

    def opaque(self, owner: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        if self.user:
            raise Refused(f"the backward of {self.current} calls {fn.__qualname__}")
        return NotImplemented

    def _trace_function(self, node: FunctionCtx, grads: list) -> tuple:
        """A custom Function node of the walk: traced (``_traced_function``), or an opaque step
        when its backward cannot be (found by the walk, or now: the capture restarts)."""
        site = self.w.index.get(node)
        if site is not None and (node in self.w.opaque or site in self.opaque_sites):
            return self._opaque_function(node, site, grads)
        try:
            return self._traced_function(node, grads)
        except Refused as e:
            if site is None or not self.allow_opaque or self.create_graph or self.check_nan:
                raise
            raise OpaqueRestart(site, str(e)) from None

    def _opaque_function(self, node: FunctionCtx, site: int, grads: list) -> tuple:
        """The node's eager ``backward`` as a step of the program, at its eager position (like a
        user hook): a ``function`` value takes the gradients it is given, and one
        ``function_output`` per input it is expected to return a gradient for -- every input
        that needs one (``needs_input_grad``) and leads somewhere.  Should it return None there
        after all, the program refuses (``program._function_output``)."""
        graph = self.graph
        layout = tuple(g is not None for g in grads)
        values = tuple(self.as_value(g) for g in grads if g is not None)
        why = self.w.opaque.get(node) or self.opaque_sites.get(site, "")
        none = none_gradients(node, layout)
        wanted = [
            child is not None and meta[1] is not None and node.needs_input_grad[i]
            for i, ((child, _), meta) in enumerate(zip(node._edges, node._input_meta))
        ]
        dropped = tuple(i for i, want in enumerate(wanted) if want and i in none)
        attrs = {"node": site, "layout": layout, "why": why, "dropped": dropped}
        token = graph.add(
            "function", values, {**attrs, "seq": next(self.seq)}, (), _dt.bool_, origin=self.current
        )
        out: list = []
        for i, (shape, dtype) in enumerate(node._input_meta):
            if not wanted[i] or i in none:
                out.append(None)
                continue
            value = graph.add(
                "function_output",
                (token,),
                {"index": i},
                self.exprs(shape),
                dtype,
                origin=self.current,
            )
            out.append(self.symbolic(value))
        return tuple(out)

    def _traced_function(self, node: FunctionCtx, grads: list) -> tuple:
        """Run custom Function ``node``'s ``backward`` on symbolic values: its ops are recorded
        like a rule's.  What ``FunctionCtx.apply`` does around it is done here on the symbolic
        values (zeros for missing gradients when materialized, the checks, dropping gradients of
        inputs that need none); anything the key cannot vouch for is ``Refused``."""
        name = self.current
        if node not in self.w.index:
            # made by an outer Function's backward (reentrant): what its code reads must be
            # fixed by the key, which holds only the outer one's
            try:
                reads = reads_plain_values(function_globals_key(node._cls.backward))
            except Untraceable as e:
                raise Refused(f"{name}: {e}") from None
            if reads:
                raise Refused(f"{name} (made inside a backward) reads Python values of globals")
        self.user += 1
        try:
            args = []
            for i, g in enumerate(grads):
                if g is None:
                    shape, dtype = node._output_meta[i]
                    if node.materialize_grads and dtype is not None:
                        g = self.full(self.exprs(shape), 0, dtype, None)
                else:
                    g = self.symbolic(self.as_value(g))
                args.append(g)
            ctx = TracedCtx(self, node, self.w.ctx_tensors.get(node, {}))
            number = self.w.reentrant.get(node)
            try:
                if number is not None:  # (a reentrant checkpoint replayed from its recording)
                    result = self._checkpoint_backward(node, number, args)
                else:
                    result = node._cls.backward(ctx, *args)
            except (Fallback, NeedsData):
                raise
            except AutogradError as e:
                if e is self.unpack_error:  # (a version check: eager raises it here too)
                    raise
                raise Refused(
                    f"the backward of {name} failed on symbolic values ({type(e).__name__}: {e})"
                ) from None
            except Untraceable as e:
                raise Refused(f"{name}: {e}") from None
            except Exception as e:  # noqa: BLE001 - eager mode raises it, if it is real
                raise Refused(
                    f"the backward of {name} failed on symbolic values ({type(e).__name__}: {e})"
                ) from None
        except NeedsData as e:
            if self.env is not None:
                raise  # (a concrete capture may do without symbolic sizes)
            raise Refused(f"the backward of {name} needs tensor values ({e})") from None
        finally:
            self.user -= 1
        try:
            result = node.backward_results(result)
        except AutogradError as e:  # (eager mode raises it)
            raise Refused(f"{name}: {e}") from None
        out: list = []
        for r in result:
            if r is not None and not isinstance(r, SymbolicTensor) and id(r) not in self.made:
                raise Refused(f"{name} returned a tensor made outside its backward")
            # back to the capture's own kind of value (zero-stride data in a concrete one)
            out.append(None if r is None else self.symbolic(self.as_value(r)))
        return tuple(out)

    # ---- Executor: the engine's steps -----------------------------------------------------------
    def input_meta(self, node: Any) -> tuple:
        if self.env is None or type(node) not in (OpNode, FunctionCtx):
            return node._input_meta
        return tuple((self.env.shape(s), d) for s, d in node._input_meta)

    def apply_node(self, node: Any, grads: list, retain_graph: bool) -> tuple:
        results = self._apply_node(node, grads)
        if self.check_nan and node in self.w.index:
            site = self.w.index[node]
            for i, r in enumerate(results):
                if isinstance(r, SymbolicTensor) and r._dtype.is_floating_point:
                    self.graph.effects.append(("check", (site, i), r._value))
        return results

    def _apply_node(self, node: Any, grads: list) -> tuple:
        self.current = node.name()
        if self.env is not None:
            self.env.where = f"the rule of {self.current}"
        if type(node) is FunctionCtx:
            return self._trace_function(node, grads)
        inlined = INLINED.get(type(node))
        if inlined is not None:
            return inlined.inline(self, node, grads)
        if type(node) is not OpNode:
            raise Fallback(
                f"{node.name()} is not a primitive's node (custom Function or other node type)"
            )
        rule = node._rule
        view: Any = node if self.env is None else NodeView(node, self.env)
        if not rule.save_index:
            return _engine.check_results(node, rule.fn(view, grads[0]))
        saved = node._saved
        if saved is None:
            node.apply(tuple(grads), True)  # raises the eager engine's error
        values = node.rule_arguments([self.unpack(s, node) for s in saved])
        return _engine.check_results(node, rule.fn(view, grads[0], *values))

    def unpack(self, saved: Any, node: Any) -> SymbolicTensor:
        w = self.w
        k = self.saved_index.get(id(saved))
        if k is None:
            if self.user:  # saved by a node user code recorded (reentrant backward)
                t = saved.unpack(node)
                value = self.value_of(t)
                if value is None and t._wrapped_number:  # (a Python number in a replayed op)
                    value = self.graph.scalar(t._data.item(), t._dtype)
                if value is not None:
                    return self.symbolic(value)
            raise Fallback(f"{node.name()} unpacked a tensor the walk did not see")
        if saved._unpack_hook is not None:
            region = w.region_of.get(k)
            if region is not None:
                return self.recomputed(region, saved, node)
            # the user's unpack hook runs when the program gets here, not now
            mshape, mdtype, _ = saved._meta
            value = self.graph.add(
                "unpack_saved",
                (),
                {"saved": k, "seq": next(self.seq)},
                self.exprs(mshape),
                mdtype,
                origin=self.current,
            )
            return self.symbolic(value)
        try:
            saved.unpack(node)  # the real unpack, for its version check (and error) only
        except AutogradError as e:
            self.unpack_error = e
            raise
        self.unpacked.add(k)
        remat = w.remat.get(k)
        if remat is not None:  # recompute from the leaf the program reads anyway
            prim_name, attrs, leaf_first = remat
            source = self.saved_input(leaf_first)
            value = self.graph.add(
                prim_name, (source,), dict(attrs), source.shape, source.dtype, origin=self.current
            )
            return self.symbolic(value)
        return self.symbolic(self.saved_input(w.saved_alias[k]))

    def recomputed(self, region: tuple, saved: Any, node: Any) -> SymbolicTensor:
        """A checkpointed function's saved tensor: its recording's ops become values of this
        graph (once per capture, on the first unpack, where eager mode recomputes), and this is
        the one ``saved``'s holder stands for."""
        number, ref = region
        holder = saved._packed
        if id(holder) in self.holders:
            raise Fallback(
                f"{node.name()} unpacked a checkpointed tensor twice (eager mode raises "
                "CheckpointError)"
            )
        self.holders.add(id(holder))
        values = self.regions.get(number)
        if values is None:
            values = self.regions[number] = self.recompute(number, node)
        return values[ref]

    def recompute(self, number: int, node: Any) -> dict:
        """The values of recording ``number`` of the walk, by ref: its arguments unpacked (and
        version-checked) as eager's recomputation unpacks them, its tensors from outside read
        as program inputs, its ops recorded as a rule's are."""
        rec, arg_ks, outside_ks, _ = self.w.regions[number]
        saved = self.w.saved
        values: dict = {}
        for j, k in enumerate(arg_ks):
            values[("a", j)] = self.unpack(saved[k][1], node)
        for j, k in enumerate(outside_ks):
            values[("e", j)] = self.symbolic(self.saved_input(self.w.saved_alias[k]))
        current = self.current
        self.current = f"the recomputation of a checkpoint (for {current})"
        try:
            self.replay(number, values)
        finally:
            self.current = current
        return values

    def replay(self, number: int, values: dict) -> None:
        """Record the ops of the walk's recording ``number`` on ``values`` (its arguments and
        tensors from outside, by ref), adding their results to it."""
        rec, _, _, draws = self.w.regions[number]
        env = self.env
        for i, op in enumerate(rec.ops):
            if op[0] == "full":
                values[("v", i)] = self.full(self.exprs(op[1]), op[2], op[3], None)
                continue
            if op[0] == "draw":
                values[("v", i)] = self.symbolic(self.saved_input(draws[i]))
                continue
            prim, attrs, refs = op[1], op[2], op[3]
            inputs = tuple(rec.numbers[r[1]] if r[0] == "n" else values[r] for r in refs)
            if env is not None and prim.size_attrs:
                attrs = sized_attrs(prim, attrs, env.size)
            values[("v", i)] = self.apply(prim, inputs, attrs)

    def _checkpoint_backward(self, node: FunctionCtx, number: int, grads: list) -> tuple:
        """``CheckpointFunction.backward`` with the recording's ops for ``run_function``: the
        arguments detached, the forward replayed with grad on, a reentrant backward through it
        (whose ``.grad`` writes to the parameters read from outside are the program's)."""
        if self.env is not None:
            raise NeedsData("a reentrant checkpoint's backward (a reentrant backward)")
        rec, _, outside_ks, _ = self.w.regions[number]
        values: dict = {}
        detached = []
        for j, s in enumerate(node._saved):
            d = self.symbolic(self.unpack(s, node)._value)
            if node.needs_input_grad[2 + node.tensor_indices[j]]:
                d.requires_grad_(True)
            self.made[id(d)] = d
            detached.append(d)
            values[("a", j)] = d
        for j, k in enumerate(outside_ks):
            t = rec.outside[j]
            d = self.symbolic(self.saved_input(self.w.saved_alias[k]))
            if t._requires_grad:
                d.requires_grad_(True)
                self.standins[id(d)] = t
            self.made[id(d)] = d
            values[("e", j)] = d
        with grad_mode.enable_grad():
            self.replay(number, values)
        roots, root_grads = [], []
        for ref, g in zip(rec.outputs, grads):
            if ref is not None and values[ref].requires_grad:
                roots.append(values[ref])
                root_grads.append(g)
        if not roots:
            raise Refused("none of the checkpoint's outputs requires grad (eager raises)")
        self.backward(roots, root_grads, False, False, None, True)
        result: list = [None] * len(node._input_meta)
        for j, i in enumerate(node.tensor_indices):
            result[2 + i] = detached[j]._grad
        return tuple(result)

    def saved_input(self, first: int) -> Value:
        """The program input for the saved array of alias class ``first``."""
        value = self.saved_values.get(first)
        if value is None:
            s = self.w.saved[first][1]
            data = s._data if s._tensor is None else s._tensor._data
            dtype = s._tensor._dtype if s._tensor is not None else _dt.from_numpy_dtype(data.dtype)
            value = self.graph.input("saved", first, self.exprs(data.shape), dtype)
            self.saved_values[first] = value
        return value

    def as_value(self, g: Tensor) -> Value:
        # a gradient a rule built from nothing (e.g. zeros for floor) is a constant
        return g._value if isinstance(g, SymbolicTensor) else self.graph.constant(g._data)

    def accumulate_grad(self, t: Tensor, g: Tensor, create_graph: bool) -> None:
        w = self.w
        t = self.standins.get(id(t), t)  # (a parameter a reentrant checkpoint reads)
        if id(t) in self.leaf_index:
            target: tuple = ("grad", self.leaf_index[id(t)])
        elif id(t) in self.input_index:
            target = ("input_grad", self.input_index[id(t)])
        elif t.grad_fn is not None and t.grad_fn in w.index:
            target = ("retain_grad", w.index[t.grad_fn], t._output_nr)  # retain_grad()
        elif self.user and self.value_of(t) is not None:
            # a leaf user code made (reentrant backward): its .grad lives in this capture
            t._grad = g if t._grad is None else t._grad + g
            return
        else:
            raise Fallback("a .grad write to a tensor the walk did not see")
        if not w.has_hooks:
            # no user code runs during this backward: writes can all happen at the end
            self.graph.effects.append((target[0], target[1], self.as_value(g)))
            if self.buckets is not None and target[0] == "grad":
                self.buckets.values[target[1]] = self.as_value(g)
            return
        self.last_store[id(t)] = self.graph.add(
            "store_grad",
            (self.as_value(g),),
            {"target": target, "seq": next(self.seq)},
            (),
            _dt.bool_,
            origin=self.current,
        )

    # A user hook is an opaque step of the program: record where it sits and what it gets.  The
    # hook may replace (a) the gradient (tensor hook), (b) the node's incoming gradients
    # (pre-hook) or (c) its results (post-hook): one hook_output value per slot.
    def tensor_pre_hook(self, hook: Any, node: Any, output_nr: int, position: int, g: Any) -> Any:
        return self._hook(node, "tensor", output_nr, position, [(g,)], [g])[0]

    def pre_hook(self, hook: Any, node: Any, position: int, grads: tuple) -> Any:
        return tuple(self._hook(node, "pre", 0, position, [grads], list(grads)))

    def post_hook(
        self, hook: Any, node: Any, position: int, grads_in: tuple, grads_out: tuple
    ) -> Any:
        return tuple(self._hook(node, "post", 0, position, [grads_in, grads_out], list(grads_in)))

    def post_acc_grad_hook(self, hook: Any, node: Any, position: int, tensor: Tensor) -> None:
        if self.buckets is not None:  # (DDP's hooks: the program averages, ``ddp.Buckets``)
            self.buckets.ready()
            return
        if not self.w.has_hooks:
            return  # (a whole step does DistributedDataParallel's work itself: ``step``)
        site = (self.w.index[node], "post_acc", 0, position)
        self.graph.add(
            "hook",
            (self.last_store[id(tensor)],),
            {"site": site, "layout": (), "seq": next(self.seq)},
            (),
            _dt.bool_,
            origin=node.name(),
        )

    def _hook(
        self, node: Any, kind: str, slot: int, position: int, groups: list, replaced: list
    ) -> list:
        graph = self.graph
        layout = []
        values = []
        for group in groups:
            mask = []
            for item in group:
                mask.append(item is not None)
                if item is not None:
                    values.append(self.as_value(item))
            layout.append(tuple(mask))
        site = (self.w.index[node], kind, slot, position)
        token = graph.add(
            "hook",
            tuple(values),
            {"site": site, "layout": tuple(layout), "seq": next(self.seq)},
            (),
            _dt.bool_,
            origin=node.name(),
        )
        outs: list[SymbolicTensor | None] = []
        for i, item in enumerate(replaced):
            if item is None:
                outs.append(None)
                continue
            v = self.as_value(item)
            # position i of what the hook returns, or v itself when it returns None
            out = graph.add(
                "hook_output", (token, v), {"index": i}, v.shape, v.dtype, origin=node.name()
            )
            outs.append(self.symbolic(out))
        return outs


@dataclass
class Captured:
    """A captured graph, the guards it holds under, how it was captured, and the programs built
    from it (per program key: ``region``)."""

    graph: Graph
    guards: tuple[Guard, ...]
    symbolic: bool
    reason: str = ""  # why the capture was concrete (empty for a symbolic one)
    unpacked: frozenset[int] = frozenset()  # saved tensors (walk order) the backward unpacks
    # its programs by program key (``region``, through the service)
    programs: Programs = field(default_factory=lambda: Programs(limit=Captured.MAX_PROGRAMS))
    # a ``create_graph`` backward's graph before the passes (what ``double`` differentiates:
    # the rules' own ops) and the VJP programs built from it
    raw: Graph | None = None
    vjp: dict = field(default_factory=dict)
    # walk positions of the custom Function nodes the capture found it could not trace (they
    # run as opaque steps, like those of ``Walk.opaque``) -> why
    opaque: dict = field(default_factory=dict)

    MAX_PROGRAMS: ClassVar[int] = 8  # program keys kept per graph (mode x .grad states x configs)


def _complex_node(w: Walk, grad_roots: Sequence[Tensor]) -> str | None:
    """The name of the first thing of the backward that holds a complex value, or None."""
    if any(g._dtype.is_complex for g in grad_roots):
        return "a root gradient"
    for n in w.nodes:
        meta = getattr(n, "_input_meta", None)
        if meta is not None and any(d is not None and d.is_complex for _, d in meta):
            return n.name()
        out = getattr(n, "_output_meta", None)
        if out is not None and any(d is not None and d.is_complex for _, d in out):
            return n.name()
        var = getattr(n, "variable", None)
        if var is not None and var._dtype.is_complex:
            return "a complex leaf"
    return None


def capture(
    w: Walk,
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    symbolic: bool = True,
    create_graph: bool = False,
    allow_opaque: bool = True,
) -> Captured:
    """Record the backward of ``roots`` as an IR graph (see the module docstring): symbolic
    sizes when possible, else the call's concrete sizes.  With ``create_graph`` the rules run
    in grad mode, as eager's do then (a rule may pick a differentiable formula: ``double``).
    A custom Function whose ``backward`` turns out untraceable becomes an opaque step and the
    capture starts again (``allow_opaque``; else it is ``Refused``, as for whole steps, which
    replay no Python): the backward then runs user code, so ``w.has_hooks`` is set.  A graph
    that holds a complex value anywhere is ``Refused`` before any rule runs (a rule may read a
    complex tensor's strides, which a symbolic value does not have)."""
    complex_node = _complex_node(w, grad_roots)
    if complex_node is not None:
        raise Refused(f"{complex_node}: {_COMPLEX_REASON}")
    opaque: dict = {}
    while True:
        try:
            captured = _capture(
                w, roots, grad_roots, inputs, accumulate, symbolic, create_graph, opaque,
                allow_opaque,
            )  # fmt: skip
        except OpaqueRestart as e:
            if e.site in opaque:  # (cannot happen: an opaque node is not traced again)
                raise Refused(e.reason) from None
            opaque[e.site] = e.reason
            w.has_hooks = True
            continue
        captured.opaque = opaque
        return captured


def _capture(
    w: Walk,
    roots: Sequence[Tensor],
    grad_roots: Sequence[Tensor],
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
    symbolic: bool,
    create_graph: bool,
    opaque: dict,
    allow_opaque: bool,
) -> Captured:
    reason = "symbolic sizes were turned off for this graph"
    args = (w, roots, grad_roots, inputs, accumulate)
    if symbolic:
        c = Capture(*args, True, create_graph, opaque, allow_opaque)
        try:
            graph = c.run()
            return Captured(graph, tuple(c.guards), True, unpacked=frozenset(c.unpacked))
        except Fallback:
            raise
        except NeedsData as e:
            reason = f"{c.current or 'the capture'} needed concrete sizes ({e})"
        except Exception as e:  # noqa: BLE001  (the concrete capture re-raises real errors)
            reason = f"{c.current or 'the capture'} failed with symbolic sizes ({e!r})"
    c = Capture(*args, False, create_graph, opaque, allow_opaque)
    try:
        graph = c.run()
    except Fallback:
        raise
    except Exception as e:
        if anomaly._state.enabled:  # eager mode raises it with anomaly mode's warnings
            raise Fallback(f"{c.current} raised {type(e).__name__} under anomaly mode") from None
        raise
    return Captured(graph, tuple(c.guards), False, reason, frozenset(c.unpacked))
