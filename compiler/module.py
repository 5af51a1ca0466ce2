"""``fusegrad.compile(module)``: a module that compiles its backward even when ``backward()`` is
called outside it (PyTorch's ``OptimizedModule``).

The wrapper is an ``nn.Module`` that owns nothing: parameters, buffers, submodules,
``state_dict`` (with the original's keys, no ``_orig_mod.`` prefix), ``train``/``eval`` and every
other attribute are the wrapped module's (``_orig_mod``).  Its forward runs the original inside
a compiled region, so a ``backward()`` called inside the forward is compiled as under
``compile(fn)``.

A backward called *outside* (``loss = loss_fn(cmodel(x), y); loss.backward()``, as most training
scripts do) is compiled too: each output that requires grad is handed out as an alias of the
real output whose ``grad_fn`` is one node, ``CompiledModuleBackward``, with an edge to every
parameter that requires grad and every tensor argument that does.  When the eager engine
reaches it, the node runs ``autograd.grad`` of the real outputs with respect to those
parameters and arguments inside a compiled region: one compiled program for the module's whole
backward, whose gradients the engine then delivers along the edges (so ``.grad``
accumulation, leaf hooks and ``autograd.grad`` with respect to parameters from outside behave as
in eager).  Aliases share their output's data and version counter: an in-place change of an
output the backward needs raises eager's error.

The node is only used when it can be exact: when the forward's graph reaches nothing but the
parameters and arguments (no tensor requiring grad from a closure or a module attribute, no
graph made before the call other than the arguments' own), checked after every forward --
through the forward's tape when it recorded every node, else by a walk of the new part of the
graph.  Otherwise the real outputs are returned (the backward then runs eagerly, as it would
without the wrapper) and the reason is logged once per reason on the ``fallback`` channel
(``fullgraph=True`` raises it).  A forward run inside another compiled region, or without grad
mode, returns the real outputs: the enclosing region compiles its backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fusegrad.autograd import grad_mode
from fusegrad.autograd import graph_base as _graph_base
from fusegrad.autograd.api import grad as _grad
from fusegrad.autograd.graph_base import AccumulateGrad, Node
from fusegrad.autograd.node import _freed_message
from fusegrad.autograd.tracer import current as _current_tracer
from fusegrad.errors import AutogradError
from fusegrad.nn.module import Module
from fusegrad.tensor import Tensor

from . import CompilationError, compiled_autograd, logs
from . import tape as _tape


class CompiledModuleBackward(Node):
    """The backward of one call of a compiled module: ``autograd.grad`` of the call's real
    outputs with respect to its parameters and tensor arguments, inside a compiled region."""

    __slots__ = ("_count", "_fullgraph", "_inputs", "_mode", "_outputs")

    def __init__(self, outputs: list, inputs: list, fullgraph: bool, mode: str) -> None:
        super().__init__(
            tuple(t._edge() for t in inputs), tuple((t._data.shape, t._dtype) for t in inputs)
        )
        self._outputs: list | None = outputs
        self._count = len(outputs)
        self._inputs: list | None = inputs
        self._fullgraph = fullgraph
        self._mode = mode

    def name(self) -> str:
        return "CompiledModuleBackward"

    @property
    def num_outputs(self) -> int:
        return self._count

    def apply(self, grads: tuple, retain: bool) -> tuple:
        if self._outputs is None:
            raise AutogradError(_freed_message)
        roots = [o for o, g in zip(self._outputs, grads) if g is not None]
        root_grads = [g for g in grads if g is not None]
        create = grad_mode.is_grad_enabled()  # the engine enables it for create_graph
        with compiled_autograd(self._fullgraph, self._mode):
            result = _grad(
                roots,
                self._inputs,
                root_grads,
                retain_graph=retain or create,
                create_graph=create,
                allow_unused=True,
            )
        if not retain:
            self._outputs = self._inputs = None
        return tuple(result)


def _tensors(tree: Any) -> Iterator[Tensor]:
    """The tensors in nested tuples, lists and dict values (the arguments' structure)."""
    if isinstance(tree, Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _map_tensors(tree: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``tree`` with every tensor replaced by ``fn(tensor)`` (tuples, lists, dicts rebuilt;
    named tuples keep their type)."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, tuple):
        items = [_map_tensors(x, fn) for x in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    if isinstance(tree, list):
        return [_map_tensors(x, fn) for x in tree]
    if isinstance(tree, dict):
        return {k: _map_tensors(v, fn) for k, v in tree.items()}
    return tree


def _outside_reason(
    roots: list, inputs: list, first_seq: int, tape: _tape.Tape | None
) -> str | None:
    """Why the graph of ``roots`` reaches beyond ``inputs`` (the parameters and tensor
    arguments), or None when it does not.  Nodes numbered from ``first_seq`` on were made by the
    call."""
    leaf_ids = {id(t) for t in inputs if t.grad_fn is None}
    edges = {(id(t.grad_fn), t._output_nr) for t in inputs if t.grad_fn is not None}
    if (
        tape is not None
        and tape.open
        and not edges
        and all(tape.position(r.grad_fn) >= 0 for r in roots)
    ):
        # every node the call made is on the tape (an edge to any other node closes it), with
        # its edges to leaves numbered there: nothing else to look at
        for ref in tape.leaves:
            acc = ref()
            if acc is not None and id(acc.variable) not in leaf_ids:
                return _leaf_reason(acc.variable)
        return None
    seen: set[int] = set()
    stack = [r.grad_fn for r in roots]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for child, nr in node._edges:
            if child is None or (id(child), nr) in edges:
                continue
            if type(child) is AccumulateGrad:
                if id(child.variable) not in leaf_ids:
                    return _leaf_reason(child.variable)
            elif child._seq < first_seq:
                return (
                    f"the forward reaches {child.name()}, made before the call and not an "
                    "argument's: its gradient would not flow on"
                )
            else:
                stack.append(child)
    return None


def _leaf_reason(t: Tensor) -> str:
    return (
        f"the forward uses a tensor of shape {list(t.shape)} that requires grad and is neither "
        "a parameter nor an argument (a closure or a plain attribute): its gradient would be lost"
    )


class OptimizedModule(Module):
    """What ``fusegrad.compile(module)`` returns (see the module docstring)."""

    def __init__(self, mod: Module, fullgraph: bool, mode: str) -> None:
        super().__init__()
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_fullgraph", fullgraph)
        object.__setattr__(self, "_compile_mode", mode)
        object.__setattr__(self, "_reasons_logged", set())

    # -- the original's state, not a copy -------------------------------------------------------
    @property
    def training(self) -> bool:  # type: ignore[override]
        return self._orig_mod.training

    @training.setter
    def training(self, value: bool) -> None:
        if "_orig_mod" in self.__dict__:
            self._orig_mod.training = value

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "training":
            object.__setattr__(self, name, value)
        elif "_orig_mod" in self.__dict__ and not name.startswith("_"):
            setattr(self._orig_mod, name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def named_modules(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.named_modules(*args, **kwargs)

    def named_children(self) -> Any:
        return self._orig_mod.named_children()

    def _named_members(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod._named_members(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, **kwargs: Any) -> Any:
        """The original's keys; a checkpoint saved from PyTorch's OptimizedModule (every key
        prefixed ``_orig_mod.``) loads too."""
        prefix = "_orig_mod."
        if state_dict and all(k.startswith(prefix) for k in state_dict):
            state_dict = type(state_dict)((k[len(prefix) :], v) for k, v in state_dict.items())
        return self._orig_mod.load_state_dict(state_dict, strict=strict, **kwargs)

    def train(self, mode: bool = True) -> OptimizedModule:
        self._orig_mod.train(mode)
        return self

    def _apply(self, fn: Callable[[Tensor], Tensor]) -> OptimizedModule:
        self._orig_mod._apply(fn)
        return self

    def apply(self, fn: Callable[[Module], None]) -> OptimizedModule:
        self._orig_mod.apply(fn)
        return self

    def requires_grad_(self, requires_grad: bool = True) -> OptimizedModule:
        self._orig_mod.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._orig_mod.zero_grad(set_to_none)

    def __repr__(self) -> str:
        inner = repr(self._orig_mod).replace("\n", "\n  ")
        return f"OptimizedModule(\n  (_orig_mod): {inner}\n)"

    # -- the compiled call ---------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        if _current_tracer() is not None or not grad_mode.is_grad_enabled():
            with compiled_autograd(self._fullgraph, self._compile_mode):
                return mod(*args, **kwargs)
        first_seq = next(_graph_base._sequence)
        with compiled_autograd(self._fullgraph, self._compile_mode):
            tape = _tape.state.tape
            out = mod(*args, **kwargs)
        roots = []
        for t in _tensors(out):
            if (
                t.grad_fn is not None
                and t.grad_fn._seq > first_seq
                and all(t is not r for r in roots)
            ):
                roots.append(t)
        if not roots:
            return out
        inputs = [p for p in mod.parameters() if p.requires_grad]
        seen = {id(p) for p in inputs}
        for t in _tensors((args, kwargs)):
            if t.requires_grad and id(t) not in seen:
                seen.add(id(t))
                inputs.append(t)
        reason = _outside_reason(roots, inputs, first_seq, tape)
        if reason is not None:
            self._note_eager_backward(reason)
            return out
        node = CompiledModuleBackward(roots, inputs, self._fullgraph, self._compile_mode)
        index = {id(r): k for k, r in enumerate(roots)}

        def alias(t: Tensor) -> Tensor:
            k = index.get(id(t))
            if k is None:
                return t
            a = Tensor._make(t._data)
            a._version_counter = t._version_counter
            a.grad_fn = node
            a._output_nr = k
            return a

        return _map_tensors(out, alias)

    def _note_eager_backward(self, reason: str) -> None:
        if self._fullgraph:
            raise CompilationError(f"compile({type(self._orig_mod).__name__}): {reason}")
        if reason not in self._reasons_logged:
            self._reasons_logged.add(reason)
            logs.log(
                "fallback",
                f"compile({type(self._orig_mod).__name__}): a backward outside the module runs "
                f"eagerly: {reason}",
            )
