"""``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``linearize``, ``jacrev``, ``jacfwd`` and
``hessian``: PyTorch's function transforms, over fusegrad's autograd.

Where this sits: ``fusegrad.func``, on top of the engine (``autograd.grad``), forward-mode AD
(``autograd.forward_ad``) and ``vmap`` (``func/vmap.py``).  Each transform calls the function
on *fresh* inputs -- a leaf that requires grad, or, when the input already requires grad (an
enclosing transform or ordinary autograd differentiates through this one), a ``clone`` of it --
so that nested transforms differentiate with respect to their own inputs and not each other's
(``grad(lambda x: grad(lambda y: x * y)(x))(x)`` is 1, not 2).  Under ``vmap`` those inputs are
batched at every level (``vmap.lift``) so that each sample gets its own gradient.  The graph of
a gradient is kept (``create_graph``) only when something outside can differentiate it:
grad mode is on and an input required grad, or another transform encloses this one.

Inside compiled code (``compiled_autograd()``, ``fusegrad.compile``) a transform's backward
is compiled like any other, except where a compiled program cannot carry its values -- under
forward-mode AD, or a graph kept for an enclosing transform -- where the eager engine runs it
(``_uncompiled``; batched output gradients likewise, in ``vmap``).

Jacobians: ``jacrev`` is ``vmap`` of the vector-Jacobian product over the rows of an identity
(one batched backward), ``jacfwd`` ``vmap`` of ``jvp`` over its columns; ``hessian`` is
``jacfwd(jacrev(f))``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import ops as F
from ..autograd import api as _api
from ..autograd import forward_ad as _fwAD
from ..autograd import grad_mode as _grad_mode
from ..tensor import Tensor
from ._pytree import tree_flatten, tree_unflatten
from .vmap import (
    current_levels,
    lift,
    lift_dual,
    tangent_only_levels,
    vmap,
    without_tracer_below,
    zeros_batched_like,
)


class _Depth(threading.local):
    def __init__(self) -> None:
        self.value = 0  # how many differentiating transforms are running on this thread


_depth = _Depth()


@contextlib.contextmanager
def _transform() -> Iterator[None]:
    _depth.value += 1
    try:
        yield
    finally:
        _depth.value -= 1


def _shared_levels(inputs: list) -> list:
    """The ``vmap`` levels the dual ones of a transform's ``inputs`` are not lifted along
    (``vmap.tangent_only_levels``); none outside forward-mode AD."""
    dual = _fwAD._state.level
    levels = current_levels()
    if dual is None or not levels:
        return []
    return tangent_only_levels(inputs, levels, dual)


def _fresh(x: Any, shared: list) -> Any:
    """A transform's own version of input ``x`` (see the module docstring)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"expected the inputs being differentiated to be Tensors, got {type(x)}")
    if not x.is_floating_point():
        raise RuntimeError(
            f"only Tensors of floating point dtype can require gradients (got {x.dtype})"
        )
    if _fwAD._state.level is not None and _fwAD.unpack_dual(x).tangent is not None:
        # a dual tensor (jacfwd of this transform: forward over reverse) keeps its tangent;
        # under vmap primal and tangent are lifted apart (a spread of the dual would run the
        # tangent's rule below the levels its tangent is batched at) and made a dual again
        primal, tangent = _fwAD.unpack_dual(x)
        levels = current_levels()
        if levels:
            x = _fwAD.make_dual(*lift_dual(primal, tangent, levels, shared))
        return F.clone(x) if x.requires_grad else F.clone(x).requires_grad_(True)
    x = lift(x, current_levels())
    if x.requires_grad:
        return F.clone(x)
    return x.detach().requires_grad_(True)


def _uncompiled(root: Tensor, keep: bool) -> Any:
    """Where a transform's backward runs: a compiled region or recording (``fusegrad.compile``)
    takes it, unless its values are beyond a compiled program -- under forward-mode AD (the
    tangents flow through the rules), or a graph kept for an enclosing transform (which
    differentiates it with batched or dual values) -- where the eager engine runs it
    (``vmap.without_tracer_below``)."""
    if _fwAD._state.level is not None:
        return without_tracer_below(root, "a backward under forward-mode AD")
    if keep and _depth.value > 1:
        return without_tracer_below(root, "a backward an enclosing transform differentiates")
    return contextlib.nullcontext()


def _keep_graph(originals: list) -> bool:
    return _grad_mode.is_grad_enabled() and (
        _depth.value > 1 or any(isinstance(x, Tensor) and x.requires_grad for x in originals)
    )


def _argnums(func: Callable, argnums: Any, args: tuple, name: str) -> tuple[int, ...]:
    if isinstance(argnums, int):
        nums: tuple[int, ...] = (argnums,)
    elif isinstance(argnums, tuple) and argnums and all(isinstance(a, int) for a in argnums):
        nums = argnums
    else:
        raise RuntimeError(
            f"{name}: argnums must be int or Tuple[int, ...], got: {argnums!r}"
            if not (isinstance(argnums, tuple) and not argnums)
            else f"{name}: argnums must be non-empty"
        )
    resolved = []
    for a in nums:
        if not -len(args) <= a < len(args):
            raise RuntimeError(
                f"Got argnums={a}, but only {len(args)} positional inputs were given to "
                f"{_name(func)}"
            )
        resolved.append(a % len(args))
    if len(set(resolved)) != len(resolved):
        raise RuntimeError(f"{name}: argnums must be unique, got {argnums!r}")
    return tuple(resolved)


def _name(func: Callable) -> str:
    return getattr(func, "__name__", repr(func))


def _zeros_for_none(grads: tuple, inputs: list) -> list:
    return [F.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]


def _split_aux(out: Any, has_aux: bool, name: str) -> tuple[Any, Any]:
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(
            f"{name}(f)(*args): output of function f should be a tuple: (output, aux) if "
            "has_aux is True"
        )
    return out


def _detached(tree: Any, keep: bool) -> Any:
    if keep:
        return tree
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([x.detach() if isinstance(x, Tensor) else x for x in leaves], spec)


# ---- grad ----------------------------------------------------------------------------------


def grad_and_value(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """``func``'s gradient with respect to the arguments ``argnums`` (pytrees of tensors) and
    its value: ``(grads, value)``, or ``(grads, (value, aux))`` with ``has_aux``.  ``func`` must
    return a tensor of one element."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums(func, argnums, args, "grad_and_value")
        with _transform(), _grad_mode.enable_grad():
            new_args = list(args)
            flat_inputs: list = []
            specs = []
            originals: list = []
            shared = _shared_levels([x for i in nums for x in tree_flatten(args[i])[0]])
            for i in nums:
                leaves, spec = tree_flatten(args[i])
                originals.extend(leaves)
                fresh = [_fresh(x, shared) for x in leaves]
                flat_inputs.extend(fresh)
                specs.append((spec, len(fresh)))
                new_args[i] = tree_unflatten(fresh, spec)
            keep = _keep_graph(originals)
            out, aux = _split_aux(func(*new_args, **kwargs), has_aux, "grad_and_value")
            if not isinstance(out, Tensor):
                raise RuntimeError(
                    "grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got "
                    f"{type(out)}"
                )
            if out.numel() != 1:
                raise RuntimeError(
                    "grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, "
                    f"got tensor with {out.ndim} dims. Maybe you wanted to use the vjp or "
                    "jacrev APIs instead?"
                )
            if out.requires_grad:
                with _uncompiled(out, keep):
                    grads = _api.grad(out, flat_inputs, create_graph=keep, allow_unused=True)
            else:
                grads = (None,) * len(flat_inputs)
            grads = _zeros_for_none(grads, flat_inputs)
        structured = []
        at = 0
        for spec, n in specs:
            structured.append(tree_unflatten(grads[at : at + n], spec))
            at += n
        result = structured[0] if isinstance(argnums, int) else tuple(structured)
        value = _detached(out, keep)
        if has_aux:
            return result, (value, _detached(aux, keep))
        return result, value

    return wrapper


def grad(func: Callable, argnums: Any = 0, has_aux: bool = False) -> Callable:
    """``func``'s gradient with respect to the arguments ``argnums`` (PyTorch's
    ``torch.func.grad``); with ``has_aux``, ``func`` returns ``(output, aux)`` and this
    ``(grads, aux)``."""
    inner = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        grads, value = inner(*args, **kwargs)
        if has_aux:
            return grads, value[1]
        return grads

    return wrapper


# ---- vjp, jvp, linearize -------------------------------------------------------------------


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """``(func(*primals), vjp_fn)`` (with ``aux`` last when ``has_aux``): ``vjp_fn(cotangents)``
    (one per output, the outputs' structure) gives the vector-Jacobian products, one per
    primal, in the primals' structure.  ``vjp_fn`` may be called many times, and under
    ``vmap`` (``jacrev``)."""
    with _transform(), _grad_mode.enable_grad():
        leaves, spec = tree_flatten(primals)
        shared = _shared_levels(leaves)
        fresh = [_fresh(x, shared) for x in leaves]
        keep = _keep_graph(leaves)
        out, aux = _split_aux(func(*tree_unflatten(fresh, spec)), has_aux, "vjp")
    out_leaves, out_spec = tree_flatten(out)
    for o in out_leaves:
        if not isinstance(o, Tensor):
            raise RuntimeError(
                f"vjp(f, *primals): Expected f to be a function that has only Tensors as "
                f"outputs, got {type(o)}"
            )

    def vjp_fn(
        *cotangents: Any, retain_graph: bool = True, create_graph: bool | None = None
    ) -> Any:
        cts = cotangents[0] if len(cotangents) == 1 else cotangents
        ct_leaves, ct_spec = tree_flatten(cts)
        if len(ct_leaves) != len(out_leaves):
            raise RuntimeError(
                "Expected pytree structure of cotangents to be the same as pytree structure of "
                f"outputs to the function: {len(ct_leaves)} cotangents for {len(out_leaves)} "
                "outputs"
            )
        for c, o in zip(ct_leaves, out_leaves):
            if tuple(c.shape) != tuple(o.shape):
                raise RuntimeError(
                    f"Mismatch in shape: a cotangent has a shape of {tuple(c.shape)} and the "
                    f"output has a shape of {tuple(o.shape)}."
                )
        differentiable = [(o, c) for o, c in zip(out_leaves, ct_leaves) if o.requires_grad]
        if create_graph is None:
            graph = keep or any(c.requires_grad for c in ct_leaves)
        else:
            graph = create_graph
        if differentiable:
            with _transform(), _grad_mode.enable_grad():
                with _uncompiled(differentiable[0][0], graph):
                    grads = _api.grad(
                        [o for o, _ in differentiable],
                        fresh,
                        [c for _, c in differentiable],
                        retain_graph=retain_graph,
                        create_graph=graph and _grad_mode.is_grad_enabled(),
                        allow_unused=True,
                    )
        else:
            grads = (None,) * len(fresh)
        grads = _zeros_for_none(grads, fresh)
        return tree_unflatten(grads, spec)

    value = _detached(out, keep)
    if has_aux:
        return value, vjp_fn, _detached(aux, keep)
    return value, vjp_fn


def jvp(
    func: Callable,
    primals: Any,
    tangents: Any,
    *,
    strict: bool = False,
    has_aux: bool = False,
) -> tuple:
    """``(func(*primals), jvp_out)``: the Jacobian-vector product of ``func`` at ``primals``
    with ``tangents`` (same structure), by forward-mode AD; ``aux`` last with ``has_aux``."""
    if not isinstance(primals, tuple):
        raise RuntimeError(
            f"jvp(f, primals, tangents): Expected primals to be a tuple. E.g. it should be "
            f"valid to call f(*primals). Got {type(primals)}"
        )
    p_leaves, p_spec = tree_flatten(primals)
    t_leaves, t_spec = tree_flatten(tangents if isinstance(tangents, tuple) else (tangents,))
    if len(p_leaves) != len(t_leaves):
        raise RuntimeError(
            "jvp(f, primals, tangents): Expected primals and tangents to have the same python "
            f"structure: {len(p_leaves)} primals, {len(t_leaves)} tangents"
        )
    for p, t in zip(p_leaves, t_leaves):
        if tuple(p.shape) != tuple(t.shape):
            raise RuntimeError(
                "jvp(f, primals, tangents): Expected primals and tangents to have the same "
                f"shape: {tuple(p.shape)} vs {tuple(t.shape)}"
            )
    if _fwAD._state.level is not None:
        # fusegrad has one dual level: a jvp inside another (jacfwd of jacfwd) goes through
        # reverse mode twice instead, the outer level's tangents flowing through it
        return _jvp_by_double_vjp(func, primals, t_leaves, has_aux)
    with _fwAD.dual_level():
        duals = [_fwAD.make_dual(p, t) for p, t in zip(p_leaves, t_leaves)]
        out, aux = _split_aux(func(*tree_unflatten(duals, p_spec)), has_aux, "jvp")
        out_leaves, out_spec = tree_flatten(out)
        values, jvps = [], []
        for o in out_leaves:
            if not isinstance(o, Tensor):
                raise RuntimeError(
                    "jvp(f, primals, tangents): Expected f(*primals) to return only tensors, "
                    f"got unsupported type {type(o)}"
                )
            primal, tangent = _fwAD.unpack_dual(o)
            values.append(primal)
            jvps.append(F.zeros_like(primal) if tangent is None else tangent)
    result = (tree_unflatten(values, out_spec), tree_unflatten(jvps, out_spec))
    return (*result, aux) if has_aux else result


def _jvp_by_double_vjp(func: Callable, primals: tuple, tangents: list, has_aux: bool) -> tuple:
    """``jvp`` as the vector-Jacobian product of a vector-Jacobian product: ``u -> J^T u`` is
    linear, so the gradient of ``<J^T u, t>`` with respect to ``u`` is ``J t``."""
    result = vjp(func, *primals, has_aux=has_aux)
    out, vjp_fn = result[0], result[1]
    out_leaves, out_spec = tree_flatten(out)
    # the products' graph is kept only where something outside can differentiate it (an input
    # or a tangent requires grad, or a transform encloses this one), as ``grad``'s is
    keep = _keep_graph([*tree_flatten(primals)[0], *tangents])
    with _transform(), _grad_mode.enable_grad():
        # batched as the outputs are: an unbatched dummy under vmap would be one leaf for every
        # sample, its gradient the sum of their products
        dummies = [zeros_batched_like(o).requires_grad_(True) for o in out_leaves]
        pulled, _ = tree_flatten(vjp_fn(tree_unflatten(dummies, out_spec), create_graph=True))
        pairs = [(g, t) for g, t in zip(pulled, tangents) if g.requires_grad]
        if pairs:
            jvps = _api.grad(
                [g for g, _ in pairs],
                dummies,
                [t for _, t in pairs],
                create_graph=keep,
                allow_unused=True,
            )
        else:
            jvps = (None,) * len(dummies)
    jvps = _zeros_for_none(jvps, out_leaves)
    value = tree_unflatten(list(out_leaves), out_spec)
    answer = (value, tree_unflatten(jvps, out_spec))
    return (*answer, result[2]) if has_aux else answer


def linearize(func: Callable, *primals: Any) -> tuple:
    """``(func(*primals), jvp_fn)``: ``jvp_fn(*tangents)`` is the Jacobian-vector product of
    ``func`` at ``primals`` (each call runs forward-mode AD through ``func`` again)."""
    out = func(*primals)
    p_leaves, p_spec = tree_flatten(primals)

    def jvp_fn(*tangents: Any) -> Any:
        t_leaves, _ = tree_flatten(tangents)
        if len(t_leaves) != len(p_leaves):
            raise RuntimeError(
                f"Expected {len(p_leaves)} tangents (one per primal), got {len(t_leaves)}"
            )
        return jvp(func, primals, tuple(tree_unflatten(t_leaves, p_spec)))[1]

    return out, jvp_fn


# ---- Jacobians and the Hessian -------------------------------------------------------------


def _basis(x: Tensor) -> Tensor:
    """The rows of an identity of ``x.numel()``, each shaped like ``x``: (n, *x.shape)."""
    n = x.numel()
    return F.reshape(F.eye(n, dtype=x.dtype), (n, *x.shape))


def _to_jacobian(rows: Tensor, out_shape: tuple, in_shape: tuple, rows_are_outputs: bool) -> Any:
    """A Jacobian block of shape ``out_shape + in_shape`` from ``rows``: (n_out, *in_shape)
    (reverse mode) or (n_in, *out_shape) (forward mode)."""
    if rows_are_outputs:
        return F.reshape(rows, (*out_shape, *in_shape))
    n_in = rows.shape[0]
    flat = F.reshape(rows, (n_in, -1))  # (n_in, n_out)
    return F.reshape(F.transpose(flat, 0, 1), (*out_shape, *in_shape))


def jacrev(
    func: Callable,
    argnums: Any = 0,
    *,
    has_aux: bool = False,
    chunk_size: int | None = None,
) -> Callable:
    """The Jacobian of ``func`` with respect to the arguments ``argnums`` by reverse mode: one
    batched vector-Jacobian product over the rows of an identity (``vmap`` of ``vjp``).  For
    an output of shape ``o`` and an input of shape ``i`` the block has shape ``o + i``."""

    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        nums = _argnums(func, argnums, args, "jacrev")

        def restricted(*chosen: Any) -> Any:
            full = list(args)
            for i, v in zip(nums, chosen):
                full[i] = v
            return func(*full)

        result = vjp(restricted, *(args[i] for i in nums), has_aux=has_aux)
        out, vjp_fn = result[0], result[1]
        out_leaves, out_spec = tree_flatten(out)
        in_leaves, in_spec = tree_flatten(tuple(args[i] for i in nums))
        blocks: list[list] = []  # [output][input]
        for j, o in enumerate(out_leaves):
            basis = _basis(o)

            def row(ct: Tensor, j: int = j) -> Any:
                cts = [ct if k == j else F.zeros_like(x) for k, x in enumerate(out_leaves)]
                return tree_flatten(vjp_fn(tree_unflatten(cts, out_spec)))[0]

            if basis.shape[0] == 0:
                rows = [F.zeros((0, *x.shape), dtype=x.dtype) for x in in_leaves]
            else:
                rows = vmap(row, chunk_size=chunk_size)(basis)
            blocks.append(
                [
                    _to_jacobian(r, tuple(o.shape), tuple(x.shape), True)
                    for r, x in zip(rows, in_leaves)
                ]
            )
        jac = _structure(blocks, out_spec, in_spec, isinstance(argnums, int))
        if has_aux:
            return jac, result[2]
        return jac

    return wrapper


def _structure(blocks: list, out_spec: Any, in_spec: Any, single_arg: bool) -> Any:
    """Per output (the outputs' structure): the Jacobian blocks in the inputs' structure (one
    argument: its structure; several: a tuple of them)."""
    per_output = []
    for row in blocks:
        structured = tree_unflatten(row, in_spec)  # a tuple of the chosen arguments
        per_output.append(structured[0] if single_arg else structured)
    return tree_unflatten(per_output, out_spec)


def jacfwd(
    func: Callable,
    argnums: Any = 0,
    has_aux: bool = False,
    *,
    randomness: str = "error",
) -> Callable:
    """The Jacobian of ``func`` with respect to the arguments ``argnums`` by forward mode:
    ``vmap`` of ``jvp`` over the columns of an identity."""

    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        nums = _argnums(func, argnums, args, "jacfwd")
        chosen = tuple(args[i] for i in nums)
        in_leaves, in_spec = tree_flatten(chosen)

        def restricted(*values: Any) -> Any:
            full = list(args)
            for i, v in zip(nums, tree_unflatten(list(values), in_spec)):
                full[i] = v
            return func(*full)

        columns: list[list] = []  # [input][output]
        aux = None
        out_spec = None
        out_shapes: list = []
        for k, x in enumerate(in_leaves):

            def column(t: Tensor, k: int = k) -> Any:
                tangents = tuple(t if m == k else F.zeros_like(v) for m, v in enumerate(in_leaves))
                result = jvp(restricted, tuple(in_leaves), tangents, has_aux=has_aux)
                return result[1] if not has_aux else (result[1], result[2])

            basis = _basis(x)
            res = vmap(column, randomness=randomness)(basis)
            if has_aux:
                res, aux_batched = res
                aux = tree_flatten(aux_batched)[0]
                aux = tree_unflatten([a[0] for a in aux], tree_flatten(aux_batched)[1])
            leaves, out_spec = tree_flatten(res)
            if not out_shapes:
                out_shapes = [tuple(t.shape[1:]) for t in leaves]
            columns.append(
                [
                    _to_jacobian(t, shape, tuple(x.shape), False)
                    for t, shape in zip(leaves, out_shapes)
                ]
            )
        blocks = [[columns[k][j] for k in range(len(in_leaves))] for j in range(len(out_shapes))]
        jac = _structure(blocks, out_spec, in_spec, isinstance(argnums, int))
        if has_aux:
            return jac, aux
        return jac

    return wrapper


def hessian(func: Callable, argnums: Any = 0) -> Callable:
    """The Hessian of a scalar ``func``: ``jacfwd(jacrev(func))`` (forward over reverse)."""
    return jacfwd(jacrev(func, argnums), argnums)
