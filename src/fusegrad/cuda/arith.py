"""CUDA kernels of the elementwise primitives that the lowering table keeps as externs (on the CPU
they run through numpy, never fused): ``round``, ``remainder``, ``floor_divide`` and the bitwise
ops.  Each follows numpy's scalar definition (``npy_divmod`` for floats: the sign of the
divisor, ``floor_divide(x, 0) = x / 0``; integer division by zero raises, as the CPU kernel does;
``round`` to even, with ``decimals`` as a power-of-ten scaling).

One kernel per (primitive, operand dtypes, rank): a grid-stride loop over the output whose
operands are broadcast views of the inputs (zero strides), like the copy kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import reduce
from .array import CudaArray, empty, probe_view
from .kernels import build, grid_loop, index, launch_config

# device functions, one per primitive and operand kind: ``a``/``b`` are the operands
_FLOAT = {
    "remainder": [
        "m = math.fmod(a, b)",
        "if m != 0:",
        "    if (b < 0) != (m < 0):",
        "        m += b",
        "else:",
        "    m = math.copysign(0.0, b)",
        "return m",
    ],
    "floor_divide": [
        "if b == 0:",
        "    return a / b",
        "m = math.fmod(a, b)",
        "d = (a - m) / b",
        "if m != 0 and (b < 0) != (m < 0):",
        "    d -= 1.0",
        "if d != 0:",
        "    f = math.floor(d)",
        "    if d - f > 0.5:",
        "        f += 1.0",
        "    return f",
        "return math.copysign(0.0, a / b)",
    ],
    "round": [
        "if not math.isfinite(a):",
        "    return a",
        "y = a * SCALE if SCALE >= 1 else a / INV",
        "f = math.floor(y)",
        "d = y - f",
        "if d > 0.5 or (d == 0.5 and f % 2 != 0):",
        "    f += 1.0",
        "return f / SCALE if SCALE >= 1 else f * INV",
    ],
}
_INT = {
    "remainder": ["if b == 0:", "    return 0", "return a % b"],  # Python's sign rule
    "floor_divide": ["return a // b"],  # b == 0 is refused before the launch
    "round": ["return a"],
}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


def supports(name: str) -> bool:
    return name in _FLOAT or name in _BITWISE


@functools.cache
def _kernel(name: str, dtypes: tuple, out_dtype: np.dtype, rank: int, decimals: int) -> Any:
    float_op = out_dtype.kind == "f"
    if name in _BITWISE:
        body = [f"return a {_BITWISE[name]} b"]
    else:
        body = (_FLOAT if float_op else _INT)[name]
    args = "a, b" if len(dtypes) == 2 else "a"
    idx = index(rank)
    conv = f"np.{out_dtype.name}" if out_dtype != np.bool_ else ""
    operands = ", ".join(f"{conv}(in{k}[{idx}])" for k in range(len(dtypes)))
    ins = ", ".join(f"in{k}" for k in range(len(dtypes)))
    lines = [
        f"SCALE = {10.0**decimals!r}",
        f"INV = {10.0 ** (-decimals)!r}",
        "",
        '@cuda.jit(device=True, inline="always")',
        f"def op({args}):",
        *("    " + line for line in body),
        "",
        grid_loop(
            f"def elementwise(out, {ins}, n):", rank, [f"out[{idx}] = op({operands})"], "out"
        ),
    ]
    return build("\n".join(lines), "elementwise", f"{name} {dtypes} -> {out_dtype}")


def run(name: str, arrays: list[CudaArray], attrs: dict, out_dtype: np.dtype) -> CudaArray:
    if name == "floor_divide" and out_dtype.kind in "iub":
        # every divisor nonzero, asked on the device (one reduction, one element back)
        nonzero = reduce.run("all", arrays[1], {"dim": None, "keepdim": False})
        if not nonzero.item():
            raise ZeroDivisionError("floor_divide: integer division by zero")
    shape = tuple(np.broadcast_shapes(*[a.shape for a in arrays]))
    views = [
        a if a.shape == shape else probe_view(a, lambda p: np.broadcast_to(p, shape))
        for a in arrays
    ]
    rank = max(len(shape), 1)
    if not shape:  # one element: index the (1,) views below
        views = [v.reshape((1,)) for v in views]
    out = empty(shape if shape else (1,), out_dtype)
    if out.size:
        kernel = _kernel(
            name, tuple(a.dtype for a in arrays), out_dtype, rank, int(attrs.get("decimals", 0))
        )
        blocks, threads = launch_config(out.size)
        kernel[blocks, threads](out.kernel_array(), *(v.kernel_array() for v in views), out.size)
    return out.reshape(shape)
