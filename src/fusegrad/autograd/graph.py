"""``fusegrad.autograd.graph``: the backward graph as users see it, and saved-tensor hooks.

* ``Node``: base class of every ``grad_fn`` (``isinstance(y.grad_fn, Node)``), with ``name()``,
  ``next_functions``, ``metadata``, ``register_hook`` / ``register_prehook`` and, on primitive
  nodes, ``_saved_<name>`` / ``_raw_saved_<name>`` accessors.
* ``saved_tensors_hooks(pack_hook, unpack_hook)``: while active on a thread, every tensor an op
  or a custom Function saves for backward is replaced by ``pack_hook(tensor)`` (called once, at
  save time, under no_grad); backward calls ``unpack_hook(packed)`` on every access and uses the
  tensor it returns.  Nested contexts: the innermost pair wins.  Non-reentrant checkpointing
  (``fusegrad.utils.checkpoint``) is built on this.
* ``save_on_cpu``: PyTorch's offloading hooks.  fusegrad's eager tensors always live in host
  memory, so here it packs a *copy* of each saved tensor (the forward's tensor may then be freed
  or modified in place without affecting backward) and unpacks it as is.
* ``disable_saved_tensors_hooks(message)``: registering hooks inside raises ``message``.

The hook stack itself lives in ``node.py`` next to ``SavedTensor``, which applies it; it is
thread-local and registered in ``engine.THREAD_STATE`` so that deeply nested (reentrant) backward
calls, which run on fresh threads, see the caller's hooks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from . import engine
from .node import (
    AccumulateGrad,
    Node,
    SavedTensor,
    pop_saved_hooks,
    push_saved_hooks,
    saved_hooks_state,
)

__all__ = [
    "AccumulateGrad",
    "Node",
    "SavedTensor",
    "disable_saved_tensors_hooks",
    "get_gradient_edge",
    "save_on_cpu",
    "saved_tensors_hooks",
]


class saved_tensors_hooks:
    """Context manager: pack / unpack every tensor saved for backward inside it.

    ``pack_hook(tensor) -> Any`` runs once when an op saves ``tensor``; ``unpack_hook(packed) ->
    Tensor`` runs every time backward (or ``grad_fn._saved_<name>``) needs it and must return a
    tensor with the same content.  The innermost active pair applies.  A pack hook must not
    modify its input in place; an unpack hook must return a Tensor (both are errors).  To avoid
    reference cycles, ``pack_hook`` should not return its input itself (``lambda x: x.detach()``
    rather than ``lambda x: x``)."""

    def __init__(self, pack_hook: Callable[[Any], Any], unpack_hook: Callable[[Any], Any]) -> None:
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError(
                "saved_tensors_hooks: pack_hook and unpack_hook must be callable, got "
                f"{type(pack_hook).__name__} and {type(unpack_hook).__name__}"
            )
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self) -> None:
        push_saved_hooks(self.pack_hook, self.unpack_hook)

    def __exit__(self, *exc: object) -> None:
        pop_saved_hooks()


class save_on_cpu(saved_tensors_hooks):
    """Saved tensors are kept as host-memory copies and handed back on use.

    In PyTorch this moves activations off the GPU.  fusegrad's eager tensors are always host
    (numpy) arrays, so the copy is the only effect: backward reads the copy, never the tensor
    the forward pass produced.  ``pin_memory`` and ``device_type`` are accepted for
    compatibility and ignored."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        def pack_to_cpu(tensor: Any) -> tuple:
            return (tensor.device, tensor.detach().clone())

        def unpack_from_cpu(packed: tuple) -> Any:
            _device, tensor = packed
            return tensor

        super().__init__(pack_to_cpu, unpack_from_cpu)


@contextlib.contextmanager
def disable_saved_tensors_hooks(error_message: str) -> Iterator[None]:
    """Inside, entering ``saved_tensors_hooks`` raises ``RuntimeError(error_message)``.

    Hooks already active when this is entered stay active (as in PyTorch)."""
    previous = saved_hooks_state.disabled_message
    saved_hooks_state.disabled_message = error_message
    try:
        yield
    finally:
        saved_hooks_state.disabled_message = previous


def get_gradient_edge(tensor: Any) -> tuple:
    """The ``(node, input_nr)`` edge that gradients for ``tensor`` flow into (its ``grad_fn``
    and output number, or its AccumulateGrad for a leaf)."""
    if not tensor.requires_grad:
        raise RuntimeError(
            "It is not possible to get the gradient edge for a Tensor that does not require "
            "gradients"
        )
    return tensor._edge()


def _hooks_state() -> tuple:
    return (list(saved_hooks_state.stack), saved_hooks_state.disabled_message)


def _set_hooks_state(state: tuple) -> None:
    # Pop and push through the counted API so that node.py's fast-path counter stays right
    # (the engine restores a worker thread's own empty state when its backward call ends).
    stack, message = state
    while saved_hooks_state.stack:
        pop_saved_hooks()
    saved_hooks_state.disabled_message = None
    for pack_hook, unpack_hook in stack:
        push_saved_hooks(pack_hook, unpack_hook)
    saved_hooks_state.disabled_message = message


engine.THREAD_STATE.append((_hooks_state, _set_hooks_state))
