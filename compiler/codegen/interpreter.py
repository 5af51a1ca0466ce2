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

The fuser caps kernels at ``passes.fuse.MAX_VALUES`` values to bound numba's compile time; an
interpreted kernel compiles nothing, so the program merges consecutive eligible kernels over the
same iteration space into one (``merge``): a 200-op chain is one ``run_ops`` call, not eight,
and the values that crossed the cap's boundaries never leave the registers.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numba
import numpy as np

from ..ir import Value
from ..passes.fuse import Kernel
from . import fastmath
from .cpu_helpers import HELPERS, _maximum, _minimum, _sign

_sigmoid64 = HELPERS["_sigmoid"]

# the largest iteration space run by the interpreter (elements); larger ones get generated code
MAX_ELEMENTS = 1 << 16

# elements per block of ``run_ops``: 8 KiB float32 rows, so an op's operands stay in L1/L2
BLOCK = 2048

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

# not an IR op: broadcast one of the call's scalars into a register (``run_ops``)
FILL = len(OPCODES)


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
def run_ops(n, code, regs, scalars, reduce_regs, reduce_out, is32):  # type: ignore[no-untyped-def]
    """Execute ``code`` (rows: opcode, dst, a, b, c) over registers ``regs[:, :n]``, then the
    full reductions of ``reduce_regs`` into ``reduce_out``.  ``is32`` picks the float32 math
    helpers (vectorisable) or libm; it is tested once per op, outside the element loops.
    ``FILL`` rows broadcast ``scalars[a]`` into a register.  The op list runs over blocks of
    ``BLOCK`` elements, so that the registers one op touches stay in cache.
    A module-level function (not a closure), so numba's disk cache keeps it across processes."""
    one = regs.dtype.type(1.0)
    zero = regs.dtype.type(0.0)
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        _run_block(lo, hi, code, regs, scalars, is32, one, zero)
    for k in range(reduce_regs.shape[0]):
        acc = 0.0
        r = regs[reduce_regs[k]]
        for i in range(n):
            acc += r[i]
        reduce_out[k] = acc


@numba.njit(cache=True, error_model="numpy", fastmath={"contract"}, nogil=True)
def _run_block(lo, hi, code, regs, scalars, is32, one, zero):  # type: ignore[no-untyped-def]
    """``run_ops`` over elements ``lo:hi``."""
    n = hi - lo
    for k in range(code.shape[0]):
        op, dst, a, b, c = code[k, 0], code[k, 1], code[k, 2], code[k, 3], code[k, 4]
        out = regs[dst, lo:hi]
        if op == FILL:
            value = scalars[a]
            for i in range(n):
                out[i] = value
            continue
        x = regs[a, lo:hi]
        y = regs[b, lo:hi]
        z = regs[c, lo:hi]
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


def float_dtype(kernel: Kernel) -> Any:
    """The one float dtype of an eligible kernel."""
    return next(v.dtype for v in kernel.values + kernel.inputs if v.dtype.is_floating_point)


def merge(group: list[Kernel], needed_outside: Any) -> Kernel:
    """One kernel computing the consecutive eligible kernels of ``group`` (same iteration space
    and float dtype; no member reads the reduction of an earlier one: a reduction is complete
    only after its loop).  Outputs are the members' reductions and the values for which
    ``needed_outside(value)`` holds (read by a step outside the group, or an effect).  Merging
    consecutive steps keeps the schedule valid: nothing runs between them."""
    values = [v for k in group for v in k.values]
    reductions = [r for k in group for r in k.reductions]
    produced = set(values) | set(reductions)
    inputs: list[Value] = []
    seen: set[Value] = set()
    for kern in group:
        for i in kern.inputs:
            if i not in produced and i not in seen:
                seen.add(i)
                inputs.append(i)
    outputs = [
        o for kern in group for o in kern.outputs if o in kern.reductions or needed_outside(o)
    ]
    return Kernel(group[0].shape, values, reductions, inputs, outputs)


_ZERO = object()  # the register key of the 0.0 constant used by float -> bool casts


class InterpretedKernel:
    """A kernel encoded as an op list over registers (see the module docstring).

    Everything that does not depend on the call's data is decided here, once:

    * registers ``0 .. F-1`` hold the full-size inputs, in order, so one ``np.concatenate``
      fills them all (``axis=None`` flattens each input, as ``reshape(-1)`` would; bools become
      0.0 / 1.0 through ``casting="unsafe"``);
    * single-element inputs and the IR's scalars go to the vector ``scalars`` (the IR scalars
      are written once here), and ``FILL`` rows at the head of the op list broadcast them;
    * computed values get registers by linear scan: a register whose value has had its last
      use is handed to a later value (never to one of the same op's operands), so a long chain
      needs few registers; outputs and reduction operands keep theirs to the end;
    * the register matrix is reused from call to call (per thread); outputs are copies.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.n = int(np.prod(kernel.shape)) if kernel.shape else 1
        self.float_dtype = float_dtype(kernel)
        n = self.n
        reg: dict[Any, int] = {}  # IR value (or the zero constant) -> register
        self.full_inputs = [v for v in kernel.inputs if int(np.prod(v.shape)) == n]
        self.scalar_inputs = [v for v in kernel.inputs if int(np.prod(v.shape)) != n]
        for v in self.full_inputs:
            reg[v] = len(reg)
        self.n_full = len(self.full_inputs)
        constants: list[float] = []  # the IR scalars, then the single-element inputs
        fills: list[list[int]] = []
        next_reg = [len(reg)]
        free: list[int] = []

        def new_register() -> int:
            if free:
                return free.pop()
            next_reg[0] += 1
            return next_reg[0] - 1

        def scalar_register(key: Any, value: float | None) -> int:
            """The register of an IR scalar (``value``) or a single-element input (None)."""
            if key not in reg:
                # a fresh register: FILL rows run first, so it must hold nothing else ever
                next_reg[0] += 1
                reg[key] = next_reg[0] - 1
                fills.append([FILL, reg[key], len(constants), 0, 0])
                constants.append(0.0 if value is None else value)
            return reg[key]

        for v in self.scalar_inputs:
            scalar_register(v, None)
        # last use of every value inside the kernel (reduction operands and outputs: never)
        last: dict[Any, int] = {}
        for k, v in enumerate(kernel.values):
            for i in v.inputs:
                last[i] = k
        keep = set(kernel.outputs) | {r.inputs[0] for r in kernel.reductions}
        computed = set(kernel.values)
        code = []
        for k, v in enumerate(kernel.values):
            args = []
            for i in v.inputs:
                if i in reg:
                    args.append(reg[i])
                else:  # an IR scalar: a register filled once per call
                    args.append(scalar_register(i, i.attr("value")))
            opcode = OPCODES[v.op]
            if v.op == "cast" and v.dtype.name == "bool" and v.inputs[0].dtype.is_floating_point:
                # float -> bool is "!= 0" (bool -> float and same-dtype casts are copies)
                opcode = OPCODES["ne"]
                args = [args[0], scalar_register(_ZERO, 0.0)]
            reg[v] = new_register()
            args += [0] * (3 - len(args))
            code.append([opcode, reg[v], *args[:3]])
            for i in set(v.inputs):
                # computed values only: inputs and scalars keep their registers
                if last.get(i) == k and i in computed and i not in keep:
                    free.append(reg[i])
        self.code = np.array(fills + code, dtype=np.int64).reshape(-1, 5)
        self.reg = reg
        self.n_regs = max(next_reg[0], 1)
        self.constants = np.array(constants, dtype=self.float_dtype.np)
        self.reduce_regs = np.array([reg[r.inputs[0]] for r in kernel.reductions], dtype=np.int64)
        self.reduction_index = {r: k for k, r in enumerate(kernel.reductions)}
        self.outputs = [
            (v, self.reduction_index.get(v, -1), reg.get(v, 0), v.dtype.np, v.shape)
            for v in kernel.outputs
        ]
        self.is32 = self.float_dtype.np == np.float32
        self._local = threading.local()

    def _registers(self) -> tuple[np.ndarray, np.ndarray]:
        """This thread's register matrix and the flat view of its input rows."""
        cached = getattr(self._local, "regs", None)
        if cached is None:
            regs = np.empty((self.n_regs, max(self.n, 1)), dtype=self.float_dtype.np)
            cached = (regs, regs[: self.n_full].reshape(-1))
            self._local.regs = cached
        return cached

    def __call__(self, env: dict) -> dict:
        """Compute the kernel's outputs (and reductions) from ``env``; returns value -> array."""
        regs, input_rows = self._registers()
        if self.full_inputs and self.n:
            np.concatenate(
                [env[v] for v in self.full_inputs], axis=None, out=input_rows, casting="unsafe"
            )
        scalars = self.constants
        if self.scalar_inputs:  # they take the first slots of ``scalars``
            scalars = scalars.copy()
            np.concatenate(
                [env[v] for v in self.scalar_inputs],
                axis=None,
                out=scalars[: len(self.scalar_inputs)],
                casting="unsafe",
            )
        reduce_out = np.zeros(len(self.reduce_regs), dtype=np.float64)
        run_ops(self.n, self.code, regs, scalars, self.reduce_regs, reduce_out, self.is32)
        out = {}
        n = self.n
        for v, reduction, row, dtype, shape in self.outputs:
            if reduction >= 0:
                out[v] = np.full(shape, reduce_out[reduction], dtype=dtype)
            else:
                out[v] = regs[row, :n].astype(dtype).reshape(shape)
        return out
