"""The multi-tensor kernels of the ``foreach``/``fused`` optimizer updates: one numba call per
param group and dtype updates every parameter of the group in one pass over its memory.

Each kernel takes the group's arrays as addresses (``addresses[i, k]``: array ``k`` -- the
parameter, its gradient, its state buffers -- of parameter ``i``, each C-contiguous with
``sizes[i]`` elements of the kernel's dtype), and the per-parameter scalars of the update as an
array of that dtype (``scalars[i, j]``).  Addresses keep one signature per (kernel, dtype): a
group of any number of parameters runs the code compiled once and cached on disk, where a tuple
of arrays would compile once per parameter count.

The arithmetic is the per-parameter update's (``optim/adam.py`` and its siblings), operation by
operation, in the arrays' dtype: each scalar is cast to that dtype first (as a Python number is
when an eager op meets a float32 tensor), each ``add``/``mul``/``div``/``sqrt`` rounds on its
own (no fast-math flag at all, so no FMA contraction and no reassociation), ``lerp`` is
fusegrad's ``start + weight * (end - start)``, ``addcmul``/``addcdiv`` are
``x + (a * b) * value`` and ``x + (a / b) * value``.  So the result is bit for bit what the
per-parameter path computes (tests/optim/test_foreach_fused.py checks it).

This module imports numba: it is imported on first use only (by ``optim/_foreach.py``), so that
``import fusegrad`` stays free of numba (docs/ARCHITECTURE.md, "Two packages, one direction").
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir as _llvm_ir
from numba import types
from numba.extending import intrinsic

from .._numba_cache import fast_loading

# no fastmath: every operation rounds as numpy's does; error_model="numpy": a division by zero
# gives inf/nan as numpy does instead of raising
_JIT = {"cache": True, "error_model": "numpy", "nogil": True}


@intrinsic
def _pointer(typingctx, address, like):  # type: ignore[no-untyped-def]
    """The integer ``address`` as a pointer to elements of ``like``'s type."""
    signature = types.CPointer(like)(address, like)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], _llvm_ir.PointerType(context.get_value_type(like)))

    return signature, codegen


@numba.njit(inline="always", **_JIT)
def _array(addresses, i, k, n, like):  # type: ignore[no-untyped-def]
    """Array ``k`` of parameter ``i``: ``n`` elements of ``like``'s type."""
    return numba.carray(_pointer(addresses[i, k], like), n)


@numba.njit(inline="always", **_JIT)
def _count(addresses, i):  # type: ignore[no-untyped-def]
    """``step.add_(1)`` on parameter i's 0-d float32 step counter (column 2)."""
    step = numba.carray(_pointer(addresses[i, 2], np.float32(0)), 1)
    step[0] = step[0] + np.float32(1)


@numba.njit(inline="always", **_JIT)
def _maximum(a, b):  # type: ignore[no-untyped-def]
    """``maximum``'s element: NaN when either is NaN."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


@numba.njit(**_JIT)
def address(flat):  # type: ignore[no-untyped-def]
    """The address of the first element of the 1-d array ``flat`` (numpy's
    ``__array_interface__`` takes about six times as long: a dict built per call)."""
    return flat.ctypes.data


# Each kernel: ``for i in parameters: for j in elements: the update of element j``.  The
# option flags are loop-invariant, so LLVM hoists their branches out of the element loop.


@numba.njit(**_JIT)
def sgd(addresses, sizes, scalars, maximize, weight_decay, momentum, nesterov):  # type: ignore[no-untyped-def]
    """SGD.  Arrays: p, grad[, momentum_buffer].  Scalars: weight_decay, momentum,
    1 - dampening, -lr, and 1 where the parameter's buffer is new (it takes the gradient)."""
    for i in range(sizes.shape[0]):
        n = sizes[i]
        s = scalars[i]
        wd, mom, damp, neg_lr = s[0], s[1], s[2], s[3]
        p = _array(addresses, i, 0, n, wd)
        grad = _array(addresses, i, 1, n, wd)
        if momentum:
            buf = _array(addresses, i, 2, n, wd)
            new = s[4] != 0
        else:
            buf = p  # (unused)
            new = False
        for j in range(n):
            g = -grad[j] if maximize else grad[j]
            if weight_decay:
                g = g + p[j] * wd
            if momentum:
                if new:
                    b = g
                else:
                    b = buf[j] * mom
                    b = b + g * damp
                buf[j] = b
                if nesterov:
                    g = g + b * mom
                else:
                    g = b
            p[j] = p[j] + g * neg_lr


@numba.njit(**_JIT)
def adam(addresses, sizes, scalars, maximize, weight_decay, decoupled, amsgrad):  # type: ignore[no-untyped-def]
    """Adam/AdamW.  Arrays: p, grad, step, exp_avg, exp_avg_sq[, max_exp_avg_sq].  Scalars:
    weight_decay, 1 - beta1, beta2, 1 - beta2, eps, 1 - lr * weight_decay,
    sqrt(1 - beta2^t), -lr / (1 - beta1^t)."""
    for i in range(sizes.shape[0]):
        n = sizes[i]
        s = scalars[i]
        wd, omb1, b2, omb2, eps, decay, bc2, neg_step = (
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            s[5],
            s[6],
            s[7],
        )
        p = _array(addresses, i, 0, n, wd)
        grad = _array(addresses, i, 1, n, wd)
        m = _array(addresses, i, 3, n, wd)
        v = _array(addresses, i, 4, n, wd)
        vmax = _array(addresses, i, 5, n, wd) if amsgrad else v
        _count(addresses, i)
        for j in range(n):
            g = -grad[j] if maximize else grad[j]
            x = p[j]
            if weight_decay:
                if decoupled:
                    x = x * decay
                else:
                    g = g + x * wd
            mj = m[j]
            mj = mj + omb1 * (g - mj)
            m[j] = mj
            vj = v[j] * b2
            vj = vj + (g * g) * omb2
            v[j] = vj
            if amsgrad:
                vj = _maximum(vmax[j], vj)
                vmax[j] = vj
            denom = np.sqrt(vj) / bc2
            denom = denom + eps
            p[j] = x + (mj / denom) * neg_step


@numba.njit(**_JIT)
def rmsprop(addresses, sizes, scalars, maximize, weight_decay, centered, momentum):  # type: ignore[no-untyped-def]
    """RMSprop.  Arrays: p, grad, step, square_avg[, momentum_buffer][, grad_avg].  Scalars:
    weight_decay, alpha, 1 - alpha, eps, momentum, -lr, -1 (centered's ``value=-1``), 1."""
    for i in range(sizes.shape[0]):
        n = sizes[i]
        s = scalars[i]
        wd, alpha, oma, eps, mom, neg_lr, minus_one, one = (
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            s[5],
            s[6],
            s[7],
        )
        p = _array(addresses, i, 0, n, wd)
        grad = _array(addresses, i, 1, n, wd)
        sq = _array(addresses, i, 3, n, wd)
        k = 4
        buf = sq
        if momentum:
            buf = _array(addresses, i, k, n, wd)
            k += 1
        avg = _array(addresses, i, k, n, wd) if centered else sq
        _count(addresses, i)
        for j in range(n):
            g = -grad[j] if maximize else grad[j]
            x = p[j]
            if weight_decay:
                g = g + x * wd
            v = sq[j] * alpha
            v = v + (g * g) * oma
            sq[j] = v
            if centered:
                a = avg[j]
                a = a + oma * (g - a)
                avg[j] = a
                root = np.sqrt(v + (a * a) * minus_one)
            else:
                root = np.sqrt(v)
            root = root + eps
            if momentum:
                b = buf[j] * mom
                b = b + (g / root) * one
                buf[j] = b
                p[j] = x + b * neg_lr
            else:
                p[j] = x + (g / root) * neg_lr


@numba.njit(**_JIT)
def adagrad(addresses, sizes, scalars, maximize, weight_decay):  # type: ignore[no-untyped-def]
    """Adagrad.  Arrays: p, grad, step, sum.  Scalars: weight_decay, eps,
    -lr / (1 + (t-1) lr_decay), 1 (``addcmul``'s value)."""
    for i in range(sizes.shape[0]):
        n = sizes[i]
        s = scalars[i]
        wd, eps, neg_clr, one = s[0], s[1], s[2], s[3]
        p = _array(addresses, i, 0, n, wd)
        grad = _array(addresses, i, 1, n, wd)
        acc = _array(addresses, i, 3, n, wd)
        _count(addresses, i)
        for j in range(n):
            g = -grad[j] if maximize else grad[j]
            x = p[j]
            if weight_decay:
                g = g + x * wd
            a = acc[j] + (g * g) * one
            acc[j] = a
            std = np.sqrt(a) + eps
            p[j] = x + (g / std) * neg_clr


@numba.njit(**_JIT)
def adadelta(addresses, sizes, scalars, maximize, weight_decay):  # type: ignore[no-untyped-def]
    """Adadelta.  Arrays: p, grad, step, square_avg, acc_delta.  Scalars: weight_decay, rho,
    1 - rho, eps, -lr."""
    for i in range(sizes.shape[0]):
        n = sizes[i]
        s = scalars[i]
        wd, rho, omr, eps, neg_lr = s[0], s[1], s[2], s[3], s[4]
        p = _array(addresses, i, 0, n, wd)
        grad = _array(addresses, i, 1, n, wd)
        sq = _array(addresses, i, 3, n, wd)
        acc = _array(addresses, i, 4, n, wd)
        _count(addresses, i)
        for j in range(n):
            g = -grad[j] if maximize else grad[j]
            x = p[j]
            if weight_decay:
                g = g + x * wd
            v = sq[j] * rho
            v = v + (g * g) * omr
            sq[j] = v
            std = np.sqrt(v + eps)
            delta = np.sqrt(acc[j] + eps) / std
            delta = delta * g
            u = acc[j] * rho
            u = u + (delta * delta) * omr
            acc[j] = u
            p[j] = x + delta * neg_lr


@numba.njit(**_JIT)
def adamax(addresses, sizes, scalars, maximize, weight_decay):  # type: ignore[no-untyped-def]
    """Adamax.  Arrays: p, grad, step, exp_avg, exp_inf.  Scalars: weight_decay, 1 - beta1,
    beta2, eps, -lr / (1 - beta1^t)."""
    for i in range(sizes.shape[0]):
        n = sizes[i]
        s = scalars[i]
        wd, omb1, b2, eps, neg_step = s[0], s[1], s[2], s[3], s[4]
        p = _array(addresses, i, 0, n, wd)
        grad = _array(addresses, i, 1, n, wd)
        m = _array(addresses, i, 3, n, wd)
        u = _array(addresses, i, 4, n, wd)
        _count(addresses, i)
        for j in range(n):
            g = -grad[j] if maximize else grad[j]
            x = p[j]
            if weight_decay:
                g = g + x * wd
            mj = m[j]
            mj = mj + omb1 * (g - mj)
            m[j] = mj
            uj = _maximum(u[j] * b2, abs(g) + eps)
            u[j] = uj
            p[j] = x + (mj / uj) * neg_step


KERNELS = {
    "sgd": sgd,
    "adam": adam,
    "adamax": adamax,
    "rmsprop": rmsprop,
    "adagrad": adagrad,
    "adadelta": adadelta,
}


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
