"""``fusegrad.func``: PyTorch's function transforms (``torch.func``) -- ``vmap``, ``grad``,
``grad_and_value``, ``vjp``, ``jvp``, ``linearize``, ``jacrev``, ``jacfwd``, ``hessian``,
``functional_call``, ``stack_module_state`` and the smaller helpers (``docs/func.md``).

Where this sits: above autograd and the op surface.  ``vmap`` is a tracer (``func/vmap.py``)
with one batching rule per primitive (``autograd/batching.py``, beside the derivative table);
the differentiating transforms are in ``func/transforms.py``; modules as functions in
``func/module_state.py``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from .. import ops as F
from ..tensor import Tensor
from .module_state import functional_call, stack_module_state
from .transforms import grad, grad_and_value, hessian, jacfwd, jacrev, jvp, linearize, vjp
from .vmap import BatchedTensor, vmap


def functionalize(func: Callable, *, remove: str = "mutations") -> Callable:
    """``func`` with the same results (PyTorch's version rewrites in-place ops and views into
    out-of-place ones for its graph compilers; fusegrad's eager ops and its compiler need no
    such rewrite, so this returns a wrapper that calls ``func``)."""
    if remove not in ("mutations", "mutations_and_views"):
        raise RuntimeError(
            "functionalize(f, remove='mutations'): received invalid argument for remove="
            f"{remove}. Valid options are:\n     remove='mutations': all inplace and out= "
            "operators will be removed from the program, and replaced with their out-of-place "
            "equivalents.\n     remove='mutations_and_views': In addition to the above, all "
            "aliasing operators {view} will be replaced with their non-aliasing counterparts, "
            "{view}_copy.\n"
        )

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def debug_unwrap(tensor: Tensor, *, recurse: bool = True) -> Tensor:
    """The tensor behind a ``vmap`` batched tensor (its whole batch, batch dim first); other
    tensors as they are."""
    while isinstance(tensor, BatchedTensor):
        tensor = tensor.__dict__["_phys"]
        if not recurse:
            break
    return tensor


def replace_all_batch_norm_modules_(root: Any) -> Any:
    """Make every batch-norm module under ``root`` stop tracking running statistics (in
    place), so that it can run under ``vmap`` (which cannot update one buffer per sample)."""
    for module in root.modules():
        if hasattr(module, "track_running_stats") and hasattr(module, "running_mean"):
            module.running_mean = None
            module.running_var = None
            module.num_batches_tracked = None
            module.track_running_stats = False
    return root


_TOKEN = re.compile(r"\(|\)|\.\.\.|[A-Za-z_][A-Za-z0-9_]*|1")


def _parse_side(side: str) -> list:
    """A side of an einops pattern: a list of groups, each a list of axis names (``...`` for
    the ellipsis; an empty group for ``()``)."""
    groups: list = []
    current: list | None = None
    for token in _TOKEN.findall(side):
        if token == "(":
            if current is not None:
                raise ValueError(f"rearrange: nested parentheses in {side!r}")
            current = []
        elif token == ")":
            if current is None:
                raise ValueError(f"rearrange: unbalanced parentheses in {side!r}")
            groups.append(current)
            current = None
        elif token == "1":
            if current is None:
                groups.append([])  # an axis of size 1 (inside a group: a factor of 1)
        elif current is not None:
            current.append(token)
        else:
            groups.append([token])
    if current is not None:
        raise ValueError(f"rearrange: unbalanced parentheses in {side!r}")
    return groups


def rearrange(tensor: Any, pattern: str, **axes_lengths: int) -> Tensor:
    """einops-style ``rearrange`` (``"b (h w) c -> b h w c"``, ``h=2``): split, merge, permute
    and insert or drop size-1 axes, as one reshape, permute and reshape (views when possible)."""
    if isinstance(tensor, (list, tuple)):
        tensor = F.stack(list(tensor))
    if "->" not in pattern:
        raise ValueError(f"rearrange: pattern {pattern!r} has no '->'")
    left_text, right_text = pattern.split("->")
    left, right = _parse_side(left_text), _parse_side(right_text)
    ellipsis_rank = tensor.ndim - len(left) + (1 if any("..." in g for g in left) else 0)
    sizes: dict[str, int] = dict(axes_lengths)
    elementary: list[str] = []
    for dim, group in enumerate(_expand_ellipsis(left, ellipsis_rank)):
        size = tensor.shape[dim]
        unknown = [n for n in group if n not in sizes]
        known = 1
        for n in group:
            if n in sizes:
                known *= sizes[n]
        if len(unknown) > 1:
            raise ValueError(f"rearrange: could not infer sizes for {unknown}")
        if unknown:
            if known == 0 or size % known:
                raise ValueError(f"rearrange: shape mismatch, can't divide axis of length {size}")
            sizes[unknown[0]] = size // known
        elif known != size:
            raise ValueError(f"rearrange: shape mismatch, {known} != {size} in {pattern!r}")
        elementary.extend(group)
    split = F.reshape(tensor, tuple(sizes[n] for n in elementary))
    right_groups = _expand_ellipsis(right, ellipsis_rank)
    order = [n for g in right_groups for n in g]
    if sorted(order) != sorted(elementary):
        raise ValueError(f"rearrange: the two sides of {pattern!r} name different axes")
    permuted = F.permute(split, tuple(elementary.index(n) for n in order))
    shape = []
    for g in right_groups:
        size = 1
        for n in g:
            size *= sizes[n]
        shape.append(size)
    return F.reshape(permuted, tuple(shape))


def _expand_ellipsis(groups: list, rank: int) -> list:
    out = []
    for g in groups:
        if g == ["..."]:
            out.extend([[f"...{i}"] for i in range(rank)])
        elif "..." in g:
            at = g.index("...")
            out.append(g[:at] + [f"...{i}" for i in range(rank)] + g[at + 1 :])
        else:
            out.append(g)
    return out


__all__ = [
    "debug_unwrap",
    "functional_call",
    "functionalize",
    "grad",
    "grad_and_value",
    "hessian",
    "jacfwd",
    "jacrev",
    "jvp",
    "linearize",
    "rearrange",
    "replace_all_batch_norm_modules_",
    "stack_module_state",
    "vjp",
    "vmap",
]
