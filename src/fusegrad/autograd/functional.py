"""``fusegrad.autograd.functional``: derivatives of whole Python functions, as
``torch.autograd.functional`` computes them: ``vjp``, ``jvp``, ``jacobian``, ``hessian``,
``hvp`` and ``vhp``.

Each takes a function of Tensors and its inputs (a Tensor or a tuple of Tensors), runs the
function once with fresh inputs that require grad, and differentiates it with ``autograd.grad``
(reverse mode) -- or, where asked (``strategy="forward-mode"``), with forward-mode AD
(``autograd.forward_ad``).  Results mirror the structure of the inputs and outputs: a Tensor for
a Tensor, a tuple for a tuple, and for Jacobians a tuple (over outputs) of tuples (over inputs)
of blocks of shape ``output.shape + input.shape``.

``create_graph=True`` keeps the results differentiable; otherwise they are detached.
``strict=True`` raises where an output is independent of an input instead of returning zeros
(the error texts are PyTorch's).

``vectorize=True`` in reverse mode (``jacobian``, and the outer Jacobian of ``hessian``)
computes all the rows of an output's block with one compiled program: the backward graph gets a
batch dimension holding every one-hot cotangent (``fusegrad.compiler.batching``, which this
loads on first use).  Where that graph cannot be batched (an op without a batching rule, user
hooks, CUDA tensors, ``create_graph=True``) the rows are computed one at a time, each a
separate backward pass over the function's graph, with the reason in the compiler's ``perf``
log; forward mode computes one column at a time.  The results are the same either way.

This sits above the engine, ``api`` (``grad``) and ``forward_ad``; it is plain user-level code
over those, with no engine hooks of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import ops as F
from ..tensor import Tensor
from . import forward_ad as fwAD
from .api import grad as _grad
from .grad_mode import enable_grad, no_grad

__all__ = ["hessian", "hvp", "jacobian", "jvp", "vhp", "vjp"]


# ---- argument handling -------------------------------------------------------------------------


def _as_tuple(value: Any, arg_name: str, fn_name: str) -> tuple[bool, tuple]:
    """``(was a tuple, the Tensors as a tuple)``, with PyTorch's error for anything else."""
    is_tuple = isinstance(value, tuple)
    items = value if is_tuple else (value,)
    for i, el in enumerate(items):
        if not isinstance(el, Tensor):
            where = (
                f"the value at index {i} has type {type(el)}."
                if is_tuple
                else f"the given {arg_name} has type {type(el)}."
            )
            raise TypeError(
                f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of "
                f"Tensors but {where}"
            )
    return is_tuple, items


def _unpack(result: tuple, is_tuple: bool) -> Any:
    return result if is_tuple else result[0]


def _unpack2(result: tuple, outer_tuple: bool, inner_tuple: bool) -> Any:
    """A Jacobian-shaped result (outer index, inner index) with each level unpacked where the
    corresponding argument was a single Tensor."""
    if not inner_tuple:
        result = tuple(row[0] for row in result)
    return result if outer_tuple else result[0]


def _prepare_inputs(inputs: tuple, create_graph: bool, need_graph: bool) -> tuple:
    """Fresh Tensor objects for the function's inputs.  With ``create_graph`` an input that
    requires grad stays connected to its history (a view of it), so that the results can be
    differentiated with respect to the caller's tensors; every other input is detached and
    requires grad iff ``need_graph``."""
    fresh = []
    for t in inputs:
        if create_graph and t.requires_grad:
            fresh.append(t.view_as(t))
        else:
            fresh.append(t.detach().requires_grad_(need_graph))
    return tuple(fresh)


def _finish(values: tuple, create_graph: bool) -> tuple:
    """Results as returned: detached unless the caller wants a graph."""
    if create_graph:
        return values
    return tuple(v.detach() if v is not None else None for v in values)


def _check_v(v: tuple, reference: tuple, reference_is_tuple: bool) -> None:
    if len(v) != len(reference):
        if reference_is_tuple:
            raise RuntimeError(
                f"v is a tuple of invalid length: should be {len(reference)} but got {len(v)}."
            )
        raise RuntimeError("The given v should contain a single Tensor.")
    for i, (el_v, el_ref) in enumerate(zip(v, reference)):
        if el_v.shape != el_ref.shape:
            prefix = f"Entry {i} in " if reference_is_tuple else ""
            raise RuntimeError(
                f"{prefix}v has invalid size: should be {el_ref.shape} but got {el_v.shape}."
            )


def _prepare_v(
    v: Any, fn_name: str, reference: tuple, reference_is_tuple: bool, create_graph: bool
) -> tuple:
    """``v`` as a tuple, checked against ``reference``; detached unless ``create_graph`` (then a
    ``v`` that requires grad stays connected, so that results are differentiable in it too)."""
    _, v = _as_tuple(v, "v", fn_name)
    v = _prepare_inputs(v, create_graph, need_graph=False)
    _check_v(v, reference, reference_is_tuple)
    return v


def _check_requires_grad(values: tuple, kind: str, strict: bool) -> None:
    """Strict mode: refuse values that do not depend on the inputs (PyTorch's texts)."""
    if not strict:
        return
    for i, value in enumerate(values):
        if value is None:
            raise RuntimeError(
                f"The output of the user-provided function is independent of input {i}. This "
                "is not allowed in strict mode."
            )
        if value.requires_grad:
            continue
        if kind == "hessian":
            raise RuntimeError(
                f"The hessian of the user-provided function with respect to input {i} is "
                "independent of the input. This is not allowed in strict mode. You should "
                "ensure that your function is thrice differentiable and that the hessian "
                "depends on the inputs."
            )
        if kind == "jacobian":
            raise RuntimeError(
                "While computing the hessian, found that the jacobian of the user-provided "
                f"function with respect to input {i} is independent of the input. This is not "
                "allowed in strict mode. You should ensure that your function is twice "
                "differentiable and that the jacobian depends on the inputs (this would be "
                "violated by a linear function for example)."
            )
        if kind == "grad_inputs":
            raise RuntimeError(
                f"The gradient with respect to input {i} is independent of the inputs of the "
                "user-provided function. This is not allowed in strict mode."
            )
        raise RuntimeError(
            f"Output {i} of the user-provided function does not require gradients. The outputs "
            "must be computed in a differentiable manner from the input when running in strict "
            "mode."
        )


def _grad_allow_none(
    outputs: tuple,
    inputs: tuple,
    grad_outputs: tuple | None = None,
    create_graph: bool = False,
    retain_graph: bool | None = None,
) -> tuple:
    """``autograd.grad`` over the outputs that require grad (others are skipped, as are their
    cotangents); unused inputs give None.  No output requiring grad: all None, no engine run."""
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    kept = [
        (out, g) for out, g in zip(outputs, grad_outputs) if out is not None and out.requires_grad
    ]
    if not kept:
        return (None,) * len(inputs)
    return _grad(
        tuple(out for out, _ in kept),
        inputs,
        tuple(g for _, g in kept),
        retain_graph=retain_graph,
        create_graph=create_graph,
        allow_unused=True,
    )


_MISSING = {
    "back": "The output of the user-provided function is independent of input {i}. This is not "
    "allowed in strict mode.",
    "back_trick": "The gradient with respect to the input is independent of entry {i} in the "
    "grad_outputs when using the double backward trick to compute forward mode gradients. This "
    "is not allowed in strict mode.",
    "double_back": "The jacobian of the user-provided function is independent of input {i}. "
    "This is not allowed in strict mode.",
    "double_back_trick": "The hessian of the user-provided function is independent of entry {i} "
    "in the grad_jacobian. This is not allowed in strict mode as it prevents from using the "
    "double backward trick to replace forward mode AD.",
}


def _fill_in_zeros(
    grads: tuple, refs: tuple, strict: bool, create_graph: bool, stage: str
) -> tuple:
    """Replace missing gradients by zeros shaped like ``refs`` (strict mode: raise instead)."""
    out = []
    for i, (g, ref) in enumerate(zip(grads, refs)):
        if g is None:
            if strict:
                raise RuntimeError(_MISSING[stage].format(i=i))
            g = F.zeros_like(ref)
        elif strict and create_graph and not g.requires_grad:
            what = "hessian" if "double" in stage else "jacobian"
            raise RuntimeError(
                f"The {what} of the user-provided function is independent of input {i}. This "
                "is not allowed in strict mode when create_graph=True."
            )
        out.append(g)
    return tuple(out)


# ---- vjp / jvp ---------------------------------------------------------------------------------


def vjp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(*inputs), v^T J)``: the vector-Jacobian product of ``func`` at ``inputs`` with
    ``v`` (shaped like the outputs; may be omitted for a single one-element output)."""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _prepare_inputs(inputs, create_graph, need_graph=True)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(
            outputs, "outputs of the user-provided function", "vjp"
        )
        _check_requires_grad(outputs, "outputs", strict)
        if v is not None:
            v = _prepare_v(v, "vjp", outputs, is_outputs_tuple, create_graph)
        elif len(outputs) != 1 or outputs[0].numel() != 1:
            raise RuntimeError(
                "The vector v can only be None if the user-provided function returns a single "
                "Tensor with a single element."
            )
        grads = _grad_allow_none(outputs, inputs, v, create_graph=create_graph)
        result = _fill_in_zeros(grads, inputs, strict, create_graph, "back")
    outputs = _finish(outputs, create_graph)
    return _unpack(outputs, is_outputs_tuple), _unpack(
        _finish(result, create_graph), is_inputs_tuple
    )


def jvp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(*inputs), J v)``: the Jacobian-vector product of ``func`` at ``inputs`` with
    ``v`` (shaped like the inputs; may be omitted for a single one-element input).

    fusegrad computes it with forward-mode AD (``forward_ad``): one pass of ``func`` on dual
    inputs, about three times faster than the alternative on a small MLP.  PyTorch's
    ``torch.autograd.functional.jvp`` instead uses reverse mode twice (the "double backward
    trick": ``u -> J^T u`` is linear in the cotangent ``u``, so differentiating it with respect
    to ``u`` in direction ``v`` gives ``J v``), which fusegrad uses where forward AD does not
    apply: with ``strict=True`` (its checks are those of the double backward), inside a dual
    level (levels do not nest), and when forward AD meets an op it cannot differentiate (a
    custom Function without ``jvp``; ``func`` then runs a second time).  The values are the same
    either way; with ``create_graph=True`` the result is differentiable in the inputs and in a
    ``v`` that requires grad."""
    with enable_grad():
        is_inputs_tuple, given = _as_tuple(inputs, "inputs", "jvp")
        inputs = _prepare_inputs(given, create_graph, need_graph=True)
        if v is not None:
            v = _prepare_v(v, "jvp", inputs, is_inputs_tuple, create_graph)
        elif len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError(
                "The vector v can only be None if the input to the user-provided function is a "
                "single Tensor with a single element."
            )
        if not strict and fwAD._state.level is None:
            # without create_graph nothing needs a reverse-mode graph: inputs that do not
            # require grad keep the forward pass free of recording
            duals_of = _prepare_inputs(given, create_graph, need_graph=create_graph)
            try:
                is_outputs_tuple, outputs, result = _jvp_forward(func, duals_of, v)
            except NotImplementedError:
                pass  # an op without forward AD: the double backward below
            else:
                return (
                    _unpack(_finish(outputs, create_graph), is_outputs_tuple),
                    _unpack(_finish(result, create_graph), is_outputs_tuple),
                )
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(
            outputs, "outputs of the user-provided function", "jvp"
        )
        _check_requires_grad(outputs, "outputs", strict)
        # the cotangent's value does not matter (J^T u is linear in u and u is differentiated
        # away); zeros, since they cannot bring inf or nan into the products
        cotangents = tuple(F.zeros_like(out, requires_grad=True) for out in outputs)
        grad_inputs = _grad_allow_none(outputs, inputs, cotangents, create_graph=True)
        _check_requires_grad(grad_inputs, "grad_inputs", strict)
        grads = _grad_allow_none(grad_inputs, cotangents, v, create_graph=create_graph)
        result = _fill_in_zeros(grads, outputs, strict, create_graph, "back_trick")
    outputs = _finish(outputs, create_graph)
    return (
        _unpack(outputs, is_outputs_tuple),
        _unpack(_finish(result, create_graph), is_outputs_tuple),
    )


def _jvp_forward(func: Callable[..., Any], inputs: tuple, v: tuple | None) -> tuple:
    """``(outputs were a tuple, outputs, J v)`` by forward-mode AD (zeros for an output that
    does not depend on the inputs)."""
    directions = v if v is not None else tuple(F.ones_like(t) for t in inputs)
    with fwAD.dual_level():
        duals = tuple(fwAD.make_dual(x, d) for x, d in zip(inputs, directions))
        outputs = func(*duals)
        is_outputs_tuple, outputs = _as_tuple(
            outputs, "outputs of the user-provided function", "jvp"
        )
        tangents = tuple(fwAD.unpack_dual(out).tangent for out in outputs)
    result = tuple(
        F.zeros_like(out) if tangent is None else tangent for out, tangent in zip(outputs, tangents)
    )
    return is_outputs_tuple, outputs, result


# ---- jacobian ----------------------------------------------------------------------------------


def _one_hot(t: Tensor, k: int) -> Tensor:
    """A tensor of ``t``'s shape, dtype and device: 1 at flat position ``k``, 0 elsewhere (one
    at a time: an identity of ``numel`` rows could be far larger than the Jacobian)."""
    flat = F.zeros(t.numel(), dtype=t.dtype, device=t.device)
    with no_grad():
        flat[k] = 1.0
    return flat.reshape(t.shape)


BATCH_ELEMENTS = 1 << 26  # (``_batched_rows``: 256 MiB of float32 at once, give or take)


def _batched_rows(out: Tensor, inputs: tuple) -> list | None:
    """All the rows of ``out``'s Jacobian blocks by one batched backward program (per input an
    array ``(out.numel(), *input.shape)``, None where ``out`` does not depend on it), or None
    when the backward cannot be batched (``fusegrad.compiler.batching``)."""
    if type(out._data) is not np.ndarray or any(type(t._data) is not np.ndarray for t in inputs):
        return None
    # the compiler (and numba) load on first use, as ``fusegrad.compile`` loads them
    batching = importlib.import_module("fusegrad.compiler.batching")
    n = out.numel()
    # rows per program run: every value of the batched program holds that many rows, so a
    # large Jacobian goes in chunks (about BATCH_ELEMENTS elements of cotangents and results)
    per_row = n + sum(t.numel() for t in inputs)
    chunk = max(1, min(n, BATCH_ELEMENTS // max(1, 8 * per_row)))
    parts: list[list] = [[] for _ in inputs]
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        cotangents = np.zeros((stop - start, n), dtype=out.dtype.np)
        cotangents[np.arange(stop - start), np.arange(start, stop)] = 1
        got = batching.batched_vjp(out, inputs, cotangents.reshape((-1, *out._data.shape)))
        if got is None:
            return None
        for j, arr in enumerate(got):
            parts[j].append(arr)
    return [
        None if any(a is None for a in p) else p[0] if len(p) == 1 else np.concatenate(p)
        for p in parts
    ]


def _jacobian_reverse(
    outputs: tuple, inputs: tuple, create_graph: bool, strict: bool, vectorize: bool = False
) -> tuple[tuple, ...]:
    """J[i][j] of shape ``outputs[i].shape + inputs[j].shape``, one backward pass per output
    element (a one-hot cotangent) through the graph, which is kept between passes -- or, with
    ``vectorize`` (and no ``create_graph``), all of them in one batched program."""
    jac = []
    for i, out in enumerate(outputs):
        rows: list[list[Tensor]] = [[] for _ in inputs]
        n = out.numel()
        batched = _batched_rows(out, inputs) if vectorize and n and not create_graph else None
        if batched is not None:
            blocks = []
            for arr, inp in zip(batched, inputs):
                shape = tuple(out.shape) + tuple(inp.shape)
                if arr is None:
                    blocks.append(F.zeros(shape, dtype=inp.dtype, device=inp.device))
                else:
                    blocks.append(Tensor._make(arr.reshape(shape)))
            jac.append(tuple(blocks))
            continue
        for k in range(n):
            cotangent = _one_hot(out, k)
            vj = _grad_allow_none(
                (out,), inputs, (cotangent,), retain_graph=True, create_graph=create_graph
            )
            for j, (g, inp) in enumerate(zip(vj, inputs)):
                if g is None:
                    if strict:
                        raise RuntimeError(
                            f"Output {i} of the user-provided function is independent of input "
                            f"{j}. This is not allowed in strict mode."
                        )
                    g = F.zeros_like(inp)
                elif strict and create_graph and not g.requires_grad:
                    raise RuntimeError(
                        f"The jacobian of the user-provided function is independent of input "
                        f"{i}. This is not allowed in strict mode when create_graph=True."
                    )
                rows[j].append(g)
        blocks = []
        for j, inp in enumerate(inputs):
            shape = tuple(out.shape) + tuple(inp.shape)
            if n:
                block = F.stack(rows[j]).reshape(shape)
            else:
                block = F.zeros(shape, dtype=inp.dtype, device=inp.device)
            blocks.append(block)
        jac.append(tuple(_finish(tuple(blocks), create_graph)))
    return tuple(jac)


def _jacobian_forward(func: Callable[..., Any], inputs: tuple) -> tuple[bool, tuple[tuple, ...]]:
    """``(outputs were a tuple, J)`` by forward-mode AD: one forward pass of ``func`` per input
    element, with a one-hot tangent on that element (column by column, no vmap)."""
    columns: list[list[list[Tensor]]] | None = None  # [output][input] -> list of columns
    output_shapes: list[tuple] = []
    is_outputs_tuple = False
    for j, inp in enumerate(inputs):
        n = inp.numel()
        for k in range(max(n, 1)):
            with fwAD.dual_level():
                args = tuple(
                    fwAD.make_dual(t, _one_hot(t, k)) if jj == j and n else t
                    for jj, t in enumerate(inputs)
                )
                outputs = func(*args)
                is_outputs_tuple, outputs = _as_tuple(
                    outputs, "outputs of the user-provided function", "jacobian"
                )
                tangents = [fwAD.unpack_dual(out).tangent for out in outputs]
                primals = [fwAD.unpack_dual(out).primal for out in outputs]
            if columns is None:
                columns = [[[] for _ in inputs] for _ in outputs]
                output_shapes = [tuple(p.shape) for p in primals]
            if not n:
                break
            for i, (tangent, primal) in enumerate(zip(tangents, primals)):
                col = F.zeros_like(primal) if tangent is None else tangent
                columns[i][j].append(col.detach().reshape(-1))
    assert columns is not None  # at least one pass ran
    jac = []
    for i, shape in enumerate(output_shapes):
        blocks = []
        for j, inp in enumerate(inputs):
            full = shape + tuple(inp.shape)
            if columns[i][j]:
                blocks.append(F.stack(columns[i][j], dim=-1).reshape(full))
            else:
                blocks.append(F.zeros(full, dtype=inp.dtype, device=inp.device))
        jac.append(tuple(blocks))
    return is_outputs_tuple, tuple(jac)


def jacobian(
    func: Callable[..., Any],
    inputs: Any,
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    strategy: str = "reverse-mode",
) -> Any:
    """The Jacobian of ``func`` at ``inputs``: block ``[i][j]`` has shape
    ``outputs[i].shape + inputs[j].shape``; a level of the nesting is dropped where the
    outputs, or the inputs, are a single Tensor.

    ``strategy="reverse-mode"`` runs one backward pass per output element;
    ``"forward-mode"`` one forward pass per input element with forward-mode AD (cheaper when
    the function has more outputs than inputs).  As in PyTorch, forward mode needs
    ``vectorize=True`` and supports neither ``create_graph`` nor ``strict``.  In reverse mode
    ``vectorize=True`` computes each output's rows with one batched program where it can (see
    the module docstring)."""
    if strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError(
            'Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your '
            'function has more outputs than inputs, "forward-mode" tends to be more performant. '
            'Otherwise, prefer to use "reverse-mode".'
        )
    if strategy == "forward-mode":
        if create_graph:
            raise NotImplementedError(
                "torch.autograd.functional.jacobian: `create_graph=True` and "
                '`strategy="forward-mode"` are not supported together (yet). Please either set '
                '`create_graph=False` or `strategy="reverse-mode"`.'
            )
        if strict:
            raise RuntimeError(
                "torch.autograd.functional.jacobian: `strict=True` and "
                '`strategy="forward-mode"` are not supported together (yet). Please either set '
                '`strict=False` or `strategy="reverse-mode"`.'
            )
        if not vectorize:
            raise NotImplementedError(
                "Computing Jacobian using forward-AD or forward-over-reverse Hessian is only "
                "implemented for `vectorize=True`."
            )
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        # inputs that require grad keep their history, so that a reverse-mode pass inside
        # ``func`` (forward-over-reverse Hessians) can differentiate them
        inputs = tuple(t if t.requires_grad else t.detach() for t in inputs)
        is_outputs_tuple, jac = _jacobian_forward(func, inputs)
        return _unpack2(jac, is_outputs_tuple, is_inputs_tuple)

    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _prepare_inputs(inputs, create_graph, need_graph=True)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(
            outputs, "outputs of the user-provided function", "jacobian"
        )
        _check_requires_grad(outputs, "outputs", strict)
        if vectorize and strict:
            raise RuntimeError(
                "torch.autograd.functional.jacobian: `strict=True` and `vectorized=True` are "
                "not supported together. Please either set `strict=False` or "
                "`vectorize=False`."
            )
        jac = _jacobian_reverse(outputs, inputs, create_graph, strict, vectorize)
    return _unpack2(jac, is_outputs_tuple, is_inputs_tuple)


# ---- second order ------------------------------------------------------------------------------


def _single_output(func: Callable[..., Any], inputs: tuple, fn_name: str, strict: bool) -> tuple:
    """``func(*inputs)`` checked to be one Tensor with one element (as a 1-tuple)."""
    outputs = func(*inputs)
    is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function", fn_name)
    _check_requires_grad(outputs, "outputs", strict)
    if is_outputs_tuple:
        raise RuntimeError(f"The function given to {fn_name} should return a single Tensor")
    if outputs[0].numel() != 1:
        raise RuntimeError(
            f"The Tensor returned by the function given to {fn_name} should contain a single "
            "element"
        )
    return outputs


def hessian(
    func: Callable[..., Any],
    inputs: Any,
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    outer_jacobian_strategy: str = "reverse-mode",
) -> Any:
    """The Hessian of scalar function ``func`` at ``inputs``: block ``[i][j]`` has shape
    ``inputs[i].shape + inputs[j].shape`` (levels dropped for a single input).

    It is the Jacobian of the gradient: the gradient is computed in reverse mode with a graph,
    and its Jacobian with ``outer_jacobian_strategy`` -- ``"reverse-mode"`` (reverse over
    reverse, one more backward pass per input element) or ``"forward-mode"`` (forward over
    reverse: one forward-AD pass per input element through the gradient computation; needs
    ``vectorize=True``, as in PyTorch)."""
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode".')

    def single_output(*args: Tensor) -> Tensor:
        out = _single_output(func, args, "hessian", strict)[0]
        return out.reshape(())

    def gradient(*args: Tensor) -> tuple:
        if outer_jacobian_strategy == "forward-mode":
            # the forward-mode Jacobian hands over dual tensors: the inner reverse pass needs
            # them to require grad (they are fresh leaves)
            args = tuple(a.requires_grad_(True) if not a.requires_grad else a for a in args)
        grads = jacobian(single_output, args, create_graph=True)
        _check_requires_grad(grads, "jacobian", strict)
        return grads

    result = jacobian(
        gradient,
        inputs,
        create_graph=create_graph,
        strict=strict,
        vectorize=vectorize,
        strategy=outer_jacobian_strategy,
    )
    return _unpack2(result, is_inputs_tuple, is_inputs_tuple)


def vhp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(*inputs), v^T H)`` for scalar function ``func``: the gradient with a graph, then
    one more backward pass with ``v`` (reverse over reverse)."""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vhp")
        inputs = _prepare_inputs(inputs, create_graph, need_graph=True)
        if v is not None:
            v = _prepare_v(v, "vhp", inputs, is_inputs_tuple, create_graph)
        elif len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError(
                "The vector v can only be None if the input to the user-provided function is a "
                "single Tensor with a single element."
            )
        outputs = _single_output(func, inputs, "vhp", strict)
        jac = _grad_allow_none(outputs, inputs, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict)
        grads = _grad_allow_none(jac, inputs, v, create_graph=create_graph)
        result = _fill_in_zeros(grads, inputs, strict, create_graph, "double_back")
    return (
        _finish(outputs, create_graph)[0],
        _unpack(_finish(result, create_graph), is_inputs_tuple),
    )


def _hvp_forward(
    func: Callable[..., Any], inputs: tuple, v: tuple | None, create_graph: bool
) -> tuple:
    """``(outputs, H v)`` forward over reverse: the gradient of ``func`` computed on dual
    inputs carries ``H v`` as its tangent (zeros where the gradient is missing or constant)."""
    directions = v if v is not None else tuple(F.ones_like(t) for t in inputs)
    with fwAD.dual_level():
        duals = tuple(fwAD.make_dual(x, d) for x, d in zip(inputs, directions))
        outputs = _single_output(func, duals, "hvp", strict=False)
        grads = _grad_allow_none(outputs, inputs, create_graph=create_graph)
        tangents = tuple(None if g is None else fwAD.unpack_dual(g).tangent for g in grads)
    result = tuple(
        F.zeros_like(x) if tangent is None else tangent for x, tangent in zip(inputs, tangents)
    )
    return outputs, result


def hvp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(*inputs), H v)`` for scalar function ``func``.

    fusegrad computes it forward over reverse: one pass of ``func`` and its gradient on dual
    inputs (forward AD, ``forward_ad``), whose gradient's tangent is ``H v`` (about 1.6 times
    faster than the alternative on a small function).  PyTorch's uses the double backward trick
    on the gradient instead (``u -> u^T H`` differentiated with respect to ``u`` in direction
    ``v``, three reverse passes), which fusegrad uses where forward AD does not apply, as for
    ``jvp``: ``strict=True``, inside a dual level, or an op without forward AD (``func`` then
    runs again).  (For a twice continuously differentiable function H is symmetric and ``vhp``
    gives the same product with two reverse passes.)"""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hvp")
        inputs = _prepare_inputs(inputs, create_graph, need_graph=True)
        if v is not None:
            v = _prepare_v(v, "hvp", inputs, is_inputs_tuple, create_graph)
        elif len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError(
                "The vector v can only be None if the input to the user-provided function is a "
                "single Tensor with a single element."
            )
        if not strict and fwAD._state.level is None:
            try:
                outputs, result = _hvp_forward(func, inputs, v, create_graph)
            except NotImplementedError:
                pass  # an op without forward AD: the double backward below
            else:
                return (
                    _finish(outputs, create_graph)[0],
                    _unpack(_finish(result, create_graph), is_inputs_tuple),
                )
        outputs = _single_output(func, inputs, "hvp", strict)
        jac = _grad_allow_none(outputs, inputs, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict)
        cotangents = tuple(F.zeros_like(t, requires_grad=True) for t in inputs)
        double_back = _grad_allow_none(jac, inputs, cotangents, create_graph=True)
        _check_requires_grad(jac, "hessian", strict)
        grads = _grad_allow_none(double_back, cotangents, v, create_graph=create_graph)
        result = _fill_in_zeros(grads, inputs, strict, create_graph, "double_back_trick")
    return (
        _finish(outputs, create_graph)[0],
        _unpack(_finish(result, create_graph), is_inputs_tuple),
    )
