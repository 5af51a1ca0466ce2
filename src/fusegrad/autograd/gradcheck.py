"""gradcheck / gradgradcheck: compare analytical gradients with central finite differences.

``gradcheck`` builds, for every (output, differentiable input) pair, the numerical Jacobian by
perturbing one input element at a time (``(f(x + eps) - f(x - eps)) / 2 eps``, float64 advised)
and the analytical Jacobian row by row through ``autograd.grad`` with one-hot output gradients.
It also checks that backward is deterministic (reentrant) and that a zero output gradient gives
zero input gradients.  ``fast_mode`` compares random projections ``v^T J u`` instead of whole
Jacobians.  ``gradgradcheck`` runs gradcheck on the function that computes first gradients with
``create_graph=True``.  Inputs are perturbed in place (any memory layout; restored afterwards,
also when the function raises); a CUDA input through a host copy written back before each call.

Complex inputs and outputs are checked in real coordinates, as PyTorch's gradcheck checks
them: each complex element is a pair (real part, imaginary part), perturbed one part at a time,
and the gradient ``g`` of a complex input is compared as the pair (Re g, Im g), which under
PyTorch's convention is (dL/dx, dL/dy) for the real function ``L`` whose output gradient is 1
(``L = Re w``) or ``1j`` (``L = Im w``) at one output element ``w`` (docs/complex.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import storage as _storage
from ..errors import AutogradError
from ..tensor import Tensor
from .api import grad


class GradcheckError(AutogradError):
    """A gradient check failed (a RuntimeError, as in PyTorch)."""


def _tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _diff_inputs(inputs: tuple) -> list[int]:
    return [i for i, x in enumerate(inputs) if _is_tensor(x) and x.requires_grad]


def _outputs(fn: Callable, inputs: tuple) -> tuple:
    out = _tuple(fn(*inputs))
    return tuple(
        o for o in out if _is_tensor(o) and (o.dtype.is_floating_point or o.dtype.is_complex)
    )


def _real_coordinates(arr: Any) -> np.ndarray:
    """An array as float64 numbers in real coordinates, flattened: a complex element gives two
    (its real part, then its imaginary part)."""
    arr = np.asarray(_storage.to_host(arr))
    if arr.dtype.kind == "c":
        return np.stack([arr.real, arr.imag], -1).astype(np.float64).reshape(-1)
    return np.array(arr, dtype=np.float64, copy=True).reshape(-1)


def _from_real_coordinates(v: np.ndarray, like: Tensor) -> Any:
    """A vector of real coordinates as an array of ``like``'s shape and dtype, on its
    device."""
    if like.dtype.is_complex:
        v = v[0::2] + 1j * v[1::2]
    return _storage.placed_like(v.reshape(like._data.shape).astype(like.dtype.np), like._data)


def _real_size(t: Tensor) -> int:
    return t.numel() * (2 if t.dtype.is_complex else 1)


def _eval(fn: Callable, inputs: tuple) -> list[np.ndarray]:
    # grad mode stays on: for gradgradcheck ``fn`` itself differentiates
    return [_real_coordinates(o._data) for o in _outputs(fn, inputs)]


def _numerical(
    fn: Callable, inputs: tuple, i: int, eps: float, direction: np.ndarray | None = None
) -> list[np.ndarray]:
    """d outputs / d inputs[i]: a Jacobian (out_numel, in_numel) per output, or, with
    ``direction``, the directional derivative J u per output (flattened), all in real
    coordinates (a complex element counts as two).

    The input's array is perturbed in place (any layout, element by element in C order, the
    order of a flattened gradient; a complex element's real part, then its imaginary part) and
    restored afterwards, also when ``fn`` raises."""
    device = inputs[i]._data
    # a CUDA input is perturbed in a host copy, written back to the device before each call
    on_device = not _storage.is_host(device)
    data = _storage.to_host(device).copy() if on_device else device
    if not on_device and not data.flags.writeable:
        raise GradcheckError(
            f"gradcheck: input {i} is a read-only (e.g. expanded) array whose elements share "
            "memory; pass a contiguous copy"
        )
    saved = data.copy()

    def evaluate() -> list[np.ndarray]:
        if on_device:
            _storage.copyto(device, _storage.placed_like(data, device))
        return _eval(fn, inputs)

    def central(perturb: Callable[[float], None]) -> list[np.ndarray]:
        perturb(eps)
        plus = evaluate()
        data[...] = saved
        perturb(-eps)
        minus = evaluate()
        data[...] = saved
        return [((p - m) / (2 * eps)).reshape(-1) for p, m in zip(plus, minus)]

    complex_input = data.dtype.kind == "c"
    try:
        if direction is not None:
            u = _from_real_coordinates(direction, inputs[i])

            def along(step: float) -> None:
                data[...] = saved + step * u

            return central(along)
        cols: list[list[np.ndarray]] = []
        for index in np.ndindex(*data.shape):
            for part in (1.0, 1j) if complex_input else (1.0,):

                def at(step: float, index: tuple = index, part: Any = part) -> None:
                    data[index] = saved[index] + step * part

                diffs = central(at)
                if not cols:
                    cols = [[] for _ in diffs]
                for k, d in enumerate(diffs):
                    cols[k].append(d)
    finally:
        data[...] = saved
        if on_device:
            _storage.copyto(device, _storage.placed_like(saved, device))
    if not cols:  # empty input: one empty Jacobian per output
        return [np.zeros((o.size, 0)) for o in _eval(fn, inputs)]
    return [np.stack(c, axis=1) for c in cols]


def _vjp(outputs: tuple, inputs: tuple, diff: list[int], k: int, v: np.ndarray) -> list:
    """The gradients of the inputs ``diff`` for output ``k``'s gradient ``v`` (in real
    coordinates: a complex output's gradient is ``v[0::2] + 1j v[1::2]``)."""
    out = outputs[k]
    g = Tensor._make(_from_real_coordinates(v, out))
    if not out.requires_grad:
        return [None] * len(diff)
    return list(grad(out, [inputs[i] for i in diff], g, retain_graph=True, allow_unused=True))


def _analytical(fn: Callable, inputs: tuple, diff: list[int]) -> tuple[list, tuple]:
    """Per output k, per diff input: the Jacobian built row by row through ``grad``, in real
    coordinates."""
    outputs = _outputs(fn, inputs)
    jac = []
    for k, out in enumerate(outputs):
        n_out = _real_size(out)
        rows = [np.zeros((n_out, _real_size(inputs[i]))) for i in diff]
        for r in range(n_out):
            v = np.zeros(n_out)
            v[r] = 1.0
            for col, g in enumerate(_vjp(outputs, inputs, diff, k, v)):
                if g is not None:
                    rows[col][r] = _real_coordinates(g._data)
        jac.append(rows)
    return jac, outputs


def _fail(msg: str, raise_exception: bool) -> bool:
    if raise_exception:
        raise GradcheckError(msg)
    return False


def gradcheck(
    func: Callable[..., Any],
    inputs: Any,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    check_backward_ad: bool = True,
    fast_mode: bool = False,
    seed: int = 0,
) -> bool:
    """True when analytical and numerical Jacobians agree (else raise ``GradcheckError``)."""
    inputs = _tuple(inputs)
    diff = _diff_inputs(inputs)
    if not diff:
        raise ValueError("gradcheck expects at least one input tensor to require gradient")
    for i in diff:
        if inputs[i].dtype.name not in ("float64", "complex128"):
            warnings.warn(
                f"gradcheck: input {i} is {inputs[i].dtype.name}, not float64; the check may "
                "fail from rounding alone",
                stacklevel=2,
            )
    if not check_backward_ad:
        return True
    if fast_mode:
        return _fast_check(
            func,
            inputs,
            diff,
            eps,
            atol,
            rtol,
            nondet_tol,
            raise_exception,
            seed,
            check_undefined_grad,
        )
    analytical, outputs = _analytical(func, inputs, diff)
    for col, i in enumerate(diff):
        numerical = _numerical(func, inputs, i, eps)
        for k in range(len(outputs)):
            a, n = analytical[k][col], numerical[k]
            if a.shape != n.shape or not np.allclose(a, n, rtol=rtol, atol=atol):
                return _fail(
                    f"Jacobian mismatch for output {k} with respect to input {i},\n"
                    f"numerical:{n}\nanalytical:{a}\n",
                    raise_exception,
                )
    again, _ = _analytical(func, inputs, diff)
    for k in range(len(outputs)):
        for col in range(len(diff)):
            if np.abs(again[k][col] - analytical[k][col]).max(initial=0.0) > nondet_tol:
                return _fail(
                    "Backward is not reentrant, i.e., running backward with same input and "
                    "grad_output multiple times gives different values, although analytical "
                    f"gradient matches numerical gradient (output {k}, input {diff[col]})",
                    raise_exception,
                )
    if check_undefined_grad:
        return _check_zero_grad(outputs, inputs, diff, raise_exception)
    return True


def _fast_check(
    func: Callable,
    inputs: tuple,
    diff: list[int],
    eps: float,
    atol: float,
    rtol: float,
    nondet_tol: float,
    raise_exception: bool,
    seed: int,
    check_undefined_grad: bool,
) -> bool:
    """Compare ``v^T J u`` (random ``v`` per output, ``u`` per input) both ways: one vjp per
    output (twice, for determinism) against one directional finite difference per input."""
    rng = np.random.default_rng(seed)
    outputs = _outputs(func, inputs)
    vs = [rng.standard_normal(_real_size(o)) for o in outputs]
    us = [rng.standard_normal(_real_size(inputs[i])) for i in diff]

    def project(grads: list, col: int) -> float:
        g = grads[col]
        if g is None:
            return 0.0
        return float(_real_coordinates(g._data) @ us[col])

    analytic: list[list[float]] = []  # [output][input]
    for k in range(len(outputs)):
        first = _vjp(outputs, inputs, diff, k, vs[k])
        second = _vjp(outputs, inputs, diff, k, vs[k])
        row = []
        for col in range(len(diff)):
            a, b = project(first, col), project(second, col)
            if abs(a - b) > nondet_tol:
                return _fail(
                    "Backward is not reentrant, i.e., running backward with same input and "
                    f"grad_output multiple times gives different values (fast mode; output {k}, "
                    f"input {diff[col]})",
                    raise_exception,
                )
            row.append(a)
        analytic.append(row)
    for col, i in enumerate(diff):
        ju = _numerical(func, inputs, i, eps, direction=us[col])
        for k in range(len(outputs)):
            numeric = float(vs[k] @ ju[k])
            if not np.isclose(analytic[k][col], numeric, rtol=rtol, atol=atol):
                return _fail(
                    f"Jacobian mismatch for output {k} with respect to input {i} (fast mode: "
                    f"v^T J u),\nnumerical:{numeric}\nanalytical:{analytic[k][col]}\n",
                    raise_exception,
                )
    if check_undefined_grad:
        return _check_zero_grad(outputs, inputs, diff, raise_exception)
    return True


def _check_zero_grad(outputs: tuple, inputs: tuple, diff: list[int], raise_exception: bool) -> bool:
    """A zero gradient for an output must give zero (or no) gradients for every input."""
    for k, out in enumerate(outputs):
        for col, g in enumerate(_vjp(outputs, inputs, diff, k, np.zeros(_real_size(out)))):
            if g is not None and np.any(_storage.to_host(g._data) != 0):
                return _fail(
                    f"gradcheck: a zero gradient for output {k} gave a nonzero gradient for "
                    f"input {diff[col]}",
                    raise_exception,
                )
    return True


def gradgradcheck(
    func: Callable[..., Any],
    inputs: Any,
    grad_outputs: Sequence[Any] | None = None,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    gen_non_contig_grad_outputs: bool = False,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    fast_mode: bool = False,
    seed: int = 0,
) -> bool:
    """gradcheck of the gradient: checks second derivatives (vector-Hessian products)."""
    inputs = _tuple(inputs)
    diff = _diff_inputs(inputs)
    outputs = _outputs(func, inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(seed)
        grad_outputs = []
        for o in outputs:
            values = rng.standard_normal(o._data.shape)
            if o.dtype.is_complex:
                values = values + 1j * rng.standard_normal(o._data.shape)
            # (writable, also when 0-d; on the output's device)
            g = Tensor._make(_storage.placed_like(np.array(values, dtype=o.dtype.np), o._data))
            g.requires_grad_(True)
            grad_outputs.append(g)
    grad_outputs = tuple(grad_outputs)
    n_in = len(inputs)

    def first_grads(*args: Any) -> tuple:
        ins, gos = args[:n_in], args[n_in:]
        outs = _outputs(func, ins)
        pairs = [(o, g) for o, g in zip(outs, gos) if o.requires_grad]
        if not pairs:
            return ()
        gs = grad(
            [p[0] for p in pairs],
            [ins[i] for i in diff],
            [p[1] for p in pairs],
            create_graph=True,
            allow_unused=True,
        )
        return tuple(g for g in gs if g is not None)

    return gradcheck(
        first_grads,
        inputs + grad_outputs,
        eps=eps,
        atol=atol,
        rtol=rtol,
        raise_exception=raise_exception,
        nondet_tol=nondet_tol,
        check_undefined_grad=check_undefined_grad,
        fast_mode=fast_mode,
        seed=seed,
    )
