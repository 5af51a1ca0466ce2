"""A precompiled interpreter for small fused kernels: no code generation, no JIT per graph.

numba takes about 0.4 s to compile one generated kernel, which dominates the first backward of a
graph made of many small elementwise ops (a 200-op chain on 1,000 elements has ~10 kernels).
For kernels whose iteration space is small, the program instead encodes the kernel as an op
list and runs it with ``run_ops``: one numba function, compiled once (and cached on disk) for
float32 and once for float64, that executes each op as a vectorisable loop over a block of
registers (``regs[r, :n]``, all in cache).  Its results equal the generated kernels' to rounding.

Eligible kernels (``eligible``): flat (every input full-size or a single element), every value
float or bool in one float dtype, elementwise ops from ``OPCODES`` only, and full reductions
only.  Bool values live in the registers as 0.0 / 1.0.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from ..ir import Value
from ..passes.fuse import Kernel
from . import fastmath
from .cpu_helpers import _maximum, _minimum, _sigmoid64, _sign

# the largest iteration space run by the interpreter (elements); larger ones get generated code
MAX_ELEMENTS = 1 << 16

OPCODES: dict[str, int] = {
    name: i
    for i, name in enumerate(
        [
            "load",
            "neg",
            "add",
            "sub",
            "mul",
            "div",
            "pow",
            "maximum",
            "minimum",
            "reciprocal",
            "abs",
            "sign",
            "exp",
            "expm1",
            "log",
            "log1p",
            "sin",
            "cos",
            "tanh",
            "sigmoid",
            "erf",
            "sqrt",
            "floor",
            "ceil",
            "trunc",
            "where",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "logical_and",
            "logical_or",
            "logical_xor",
            "logical_not",
            "isnan",
            "isinf",
            "clone",
            "cast",
            "broadcast_to",
        ]
    )
}


def eligible(kernel: Kernel, flat: bool, max_elements: int = MAX_ELEMENTS) -> bool:
    size = int(np.prod(kernel.shape)) if kernel.shape else 1
    if not flat or size > max_elements:
        return False
    floats = {v.dtype.name for v in kernel.values + kernel.inputs if v.dtype.is_floating_point}
    if len(floats) != 1:
        return False
    for v in kernel.values + kernel.inputs:
        if not (v.dtype.is_floating_point or v.dtype.name == "bool"):
            return False
    for v in kernel.values:
        if v.op not in OPCODES:
            return False
        if v.op == "cast" and not (
            v.inputs[0].dtype.is_floating_point or v.inputs[0].dtype.name == "bool"
        ):
            return False
    return all(r.op in ("sum", "sum_to") for r in kernel.reductions)


@numba.njit(cache=True, error_model="numpy", fastmath={"contract"}, nogil=True)
def run_ops(n, code, regs, reduce_regs, reduce_out, is32):  # type: ignore[no-untyped-def]
    """Execute ``code`` (rows: opcode, dst, a, b, c) over registers ``regs[:, :n]``, then the
    full reductions of ``reduce_regs`` into ``reduce_out``.  ``is32`` picks the float32 math
    helpers (vectorisable) or libm; it is tested once per op, outside the element loops.
    A module-level function (not a closure), so numba's disk cache keeps it across processes."""
    one = regs.dtype.type(1.0)
    zero = regs.dtype.type(0.0)
    for k in range(code.shape[0]):
        op, dst, a, b, c = code[k, 0], code[k, 1], code[k, 2], code[k, 3], code[k, 4]
        out = regs[dst]
        x = regs[a]
        y = regs[b]
        z = regs[c]
        if op == 0 or op == 38 or op == 39 or op == 40:  # load, clone, cast, broadcast_to
            for i in range(n):
                out[i] = x[i]
        elif op == 1:
            for i in range(n):
                out[i] = -x[i]
        elif op == 2:
            for i in range(n):
                out[i] = x[i] + y[i]
        elif op == 3:
            for i in range(n):
                out[i] = x[i] - y[i]
        elif op == 4:
            for i in range(n):
                out[i] = x[i] * y[i]
        elif op == 5:
            for i in range(n):
                out[i] = x[i] / y[i]
        elif op == 6:
            for i in range(n):
                out[i] = np.power(x[i], y[i])
        elif op == 7:
            for i in range(n):
                out[i] = _maximum(x[i], y[i])
        elif op == 8:
            for i in range(n):
                out[i] = _minimum(x[i], y[i])
        elif op == 9:
            for i in range(n):
                out[i] = one / x[i]
        elif op == 10:
            for i in range(n):
                out[i] = abs(x[i])
        elif op == 11:
            for i in range(n):
                out[i] = _sign(x[i])
        elif op >= 12 and op <= 21:
            _math_op(op, n, x, out, is32)
        elif op == 22:
            for i in range(n):
                out[i] = np.floor(x[i])
        elif op == 23:
            for i in range(n):
                out[i] = np.ceil(x[i])
        elif op == 24:
            for i in range(n):
                out[i] = np.trunc(x[i])
        elif op == 25:
            for i in range(n):
                out[i] = y[i] if x[i] != zero else z[i]
        elif op == 26:
            for i in range(n):
                out[i] = one if x[i] == y[i] else zero
        elif op == 27:
            for i in range(n):
                out[i] = one if x[i] != y[i] else zero
        elif op == 28:
            for i in range(n):
                out[i] = one if x[i] < y[i] else zero
        elif op == 29:
            for i in range(n):
                out[i] = one if x[i] <= y[i] else zero
        elif op == 30:
            for i in range(n):
                out[i] = one if x[i] > y[i] else zero
        elif op == 31:
            for i in range(n):
                out[i] = one if x[i] >= y[i] else zero
        elif op == 32:
            for i in range(n):
                out[i] = one if (x[i] != zero and y[i] != zero) else zero
        elif op == 33:
            for i in range(n):
                out[i] = one if (x[i] != zero or y[i] != zero) else zero
        elif op == 34:
            for i in range(n):
                out[i] = one if ((x[i] != zero) != (y[i] != zero)) else zero
        elif op == 35:
            for i in range(n):
                out[i] = one if x[i] == zero else zero
        elif op == 36:
            for i in range(n):
                out[i] = one if x[i] != x[i] else zero
        elif op == 37:
            for i in range(n):
                out[i] = one if math.isinf(x[i]) else zero
    for k in range(reduce_regs.shape[0]):
        acc = 0.0
        r = regs[reduce_regs[k]]
        for i in range(n):
            acc += r[i]
        reduce_out[k] = acc


@numba.njit(cache=True, error_model="numpy", fastmath={"contract"}, nogil=True)
def _math_op(op, n, x, out, is32):  # type: ignore[no-untyped-def]
    """exp .. sqrt (opcodes 12-21): float32 helpers or libm."""
    if is32:
        if op == 12:
            for i in range(n):
                out[i] = fastmath.fast_exp_f32(x[i])
        elif op == 13:
            for i in range(n):
                out[i] = fastmath.fast_expm1_f32(x[i])
        elif op == 14:
            for i in range(n):
                out[i] = fastmath.fast_log_f32(x[i])
        elif op == 15:
            for i in range(n):
                out[i] = fastmath.fast_log1p_f32(x[i])
        elif op == 16:
            for i in range(n):
                out[i] = fastmath.fast_sin_f32(x[i])
        elif op == 17:
            for i in range(n):
                out[i] = fastmath.fast_cos_f32(x[i])
        elif op == 18:
            for i in range(n):
                out[i] = fastmath.fast_tanh_f32(x[i])
        elif op == 19:
            for i in range(n):
                out[i] = fastmath.fast_sigmoid_f32(x[i])
        elif op == 20:
            for i in range(n):
                out[i] = fastmath.fast_erf_f32(x[i])
        else:
            for i in range(n):
                out[i] = fastmath.fast_sqrt_f32(x[i])
        return
    if op == 12:
        for i in range(n):
            out[i] = math.exp(x[i])
    elif op == 13:
        for i in range(n):
            out[i] = math.expm1(x[i])
    elif op == 14:
        for i in range(n):
            out[i] = math.log(x[i])
    elif op == 15:
        for i in range(n):
            out[i] = math.log1p(x[i])
    elif op == 16:
        for i in range(n):
            out[i] = math.sin(x[i])
    elif op == 17:
        for i in range(n):
            out[i] = math.cos(x[i])
    elif op == 18:
        for i in range(n):
            out[i] = math.tanh(x[i])
    elif op == 19:
        for i in range(n):
            out[i] = _sigmoid64(x[i])
    elif op == 20:
        for i in range(n):
            out[i] = math.erf(x[i])
    else:
        for i in range(n):
            out[i] = np.sqrt(x[i])


_ZERO = object()  # the register key of the 0.0 constant used by float -> bool casts


class InterpretedKernel:
    """A kernel encoded as an op list over registers (see the module docstring)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        reg: dict[Any, int] = {}  # IR value (or the zero constant) -> register
        self.scalars: list[tuple[int, Any]] = []
        for v in kernel.inputs:
            reg[v] = len(reg)
        code = []

        def operand(v: Value) -> int:
            if v not in reg:  # an IR scalar: a register filled once per call
                reg[v] = len(reg)
                self.scalars.append((reg[v], v.attr("value")))
            return reg[v]

        for v in kernel.values:
            args = [operand(i) for i in v.inputs]
            opcode = OPCODES[v.op]
            if v.op == "cast" and v.dtype.name == "bool" and v.inputs[0].dtype.is_floating_point:
                # float -> bool is "!= 0" (bool -> float and same-dtype casts are copies)
                if _ZERO not in reg:
                    reg[_ZERO] = len(reg)
                    self.scalars.append((reg[_ZERO], 0.0))
                opcode = OPCODES["ne"]
                args = [args[0], reg[_ZERO]]
            reg[v] = len(reg)
            args += [0] * (3 - len(args))
            code.append([opcode, reg[v], *args[:3]])
        self.code = np.array(code, dtype=np.int64).reshape(-1, 5)
        self.reg = reg
        self.n_regs = len(reg)
        self.reduce_regs = np.array([reg[r.inputs[0]] for r in kernel.reductions], dtype=np.int64)
        self.float_dtype = next(
            v.dtype for v in kernel.values + kernel.inputs if v.dtype.is_floating_point
        )

    def __call__(self, env: dict) -> dict:
        """Compute the kernel's outputs (and reductions) from ``env``; returns value -> array."""
        n = int(np.prod(self.kernel.shape)) if self.kernel.shape else 1
        dt = self.float_dtype.np
        regs = np.empty((self.n_regs, max(n, 1)), dtype=dt)
        for v in self.kernel.inputs:
            a = env[v]
            regs[self.reg[v], :n] = a.reshape(-1) if a.size == n else a.reshape(-1)[0]
        for r, value in self.scalars:
            regs[r, :n] = value
        reduce_out = np.zeros(len(self.reduce_regs), dtype=np.float64)
        run_ops(n, self.code, regs, self.reduce_regs, reduce_out, dt == np.float32)
        out = {}
        for v in self.kernel.outputs:
            if v in self.kernel.reductions:
                k = self.kernel.reductions.index(v)
                out[v] = np.full(v.shape, reduce_out[k], dtype=v.dtype.np)
            else:
                row = regs[self.reg[v], :n]
                out[v] = row.astype(v.dtype.np).reshape(v.shape)
        return out
