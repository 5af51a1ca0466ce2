"""A precompiled interpreter for small fused kernels: no code generation, no JIT per graph.

numba takes about 0.4 s to compile one generated kernel, which dominates the first backward of a
graph made of many small elementwise ops (a 200-op chain on 1,000 elements has ~10 kernels).
For kernels whose iteration space is small, the program instead encodes the kernel as an op
list and runs it with ``run_ops_<dtype>``: one numba function per float dtype, compiled once
(and cached on disk), that executes each op as a vectorisable loop over a block of registers
(``regs[r, :n]``, all in cache).  Its results equal the generated kernels' to rounding.

The interpreter is itself generated, once, from the lowering table (``machine``): its loops
(``LOOPS``) are a copy and the primitives with a lowering expression, in registry order, except
those another loop computes exactly with its operands reordered or a constant operand (``REWRITES``:
``lt`` is ``gt`` swapped, ``isnan(x)`` is ``x != x``, ...); ``OPCODES`` maps every interpretable op
to its loop.  The loop of each opcode computes that expression, with operands ``x[i]``, ``y[i]``,
``z[i]`` (the registers of the op's operands), spelled as the CPU emitter spells it — float32 math
through ``fastmath``'s vectorisable helpers, float64 through libm and the compiled helpers
(``common.format_expression`` with ``numba_cpu.SPELLING``).  A primitive added to the registry is
interpretable without a line here.  The source is loaded like a generated kernel module
(``common.load_module``: written once under a name hashed from the source and the CPU emitter's
flags), so numba's ``cache=True`` keeps the compiled interpreter across processes.  There are two
machines with one opcode numbering: the *core* one (``CORE``: the ops neural-network backwards are
made of) and the full one; a kernel runs on the core machine when all its ops are core ones, so most
programs never pay for compiling the rarer loops.

Eligible kernels (``eligible``): every value float or bool in one float dtype and over the
kernel's whole iteration space, ops from ``OPCODES`` only, and sums as reductions.  Inputs may be
full-size, single elements (broadcast by ``FILL`` rows) or broadcast along some dims (their
register is filled with the broadcast values, by numpy, before the run).  Full reductions run
inside ``run_ops``; partial ones (row or column sums, e.g. a bias gradient or a layer norm's
row statistics) are summed in float64 by numpy from the operand's register after the run.  Bool
values live in the registers as 0.0 / 1.0: a bool result is stored as ``one if ... else zero``,
a bool operand is read by the same expressions as a number (``x[i] if c[i] else ...``).  Casts
between those types are copies (float -> bool is rewritten as ``ne 0``), and so is a
``broadcast_to`` (its operand's register already holds the broadcast values).

The fuser caps kernels at ``passes.fuse.MAX_VALUES`` values to bound numba's compile time; an
interpreted kernel compiles nothing, so the program merges consecutive eligible kernels over the
same iteration space into one (``merge``): a 200-op chain is one ``run_ops_*`` call, not eight,
and the values that crossed the cap's boundaries never leave the registers.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import numpy as np

from fusegrad.ops.registry import REGISTRY

from ..passes.fuse import Kernel, merge_kernels
from ..settings import INTERPRETER_MAX_ELEMENTS
from . import common, numba_cpu
from .common import is_single, reduction_target
from .lowering import EXPRESSIONS

INTERPRETER_VERSION = 4

# the largest iteration space run by the interpreter (elements; ``config``'s default)
MAX_ELEMENTS = INTERPRETER_MAX_ELEMENTS

# elements per block of ``run_ops``: 8 KiB float32 rows, so an op's operands stay in L1/L2
BLOCK = 2048

# Ops that another op's loop computes exactly, from their operands reordered or with a constant
# operand: (the loop's op, its operands: an int is the op's operand of that index, a float a
# constant's register).  Each loop costs about 0.1 s of the interpreter's compile, and these
# are the same IEEE operations: a copy (a ``broadcast_to``'s register already holds the
# broadcast values; a cast between the kernel's one float dtype and bool, as 0.0 / 1.0, is a
# copy too, float -> bool being ``ne 0``), ``x < y`` is ``y > x`` (NaN included), ``isnan(x)`` is
# ``x != x``, ``1 / x`` a division, and ``not x`` is ``x == 0`` (-0 and NaN included).
REWRITES: dict[str, tuple[str, tuple]] = {
    "broadcast_to": ("copy", (0,)),
    "cast": ("copy", (0,)),
    "clone": ("copy", (0,)),
    "lt": ("gt", (1, 0)),
    "le": ("ge", (1, 0)),
    "isnan": ("ne", (0, 0)),
    "reciprocal": ("div", (1.0, 0)),
    "logical_not": ("eq", (0, 0.0)),
}

# the machine's loops, numbered: a copy, then every lowering that is not rewritten
LOOPS: dict[str, int] = {
    name: i
    for i, name in enumerate(("copy",) + tuple(op for op in EXPRESSIONS if op not in REWRITES))
}

# every op the interpreter runs -> the opcode of the loop that computes it
OPCODES: dict[str, int] = {
    op: LOOPS[REWRITES[op][0] if op in REWRITES else op]
    for op in ("broadcast_to",) + tuple(EXPRESSIONS)
}

# not an IR op: broadcast one of the call's scalars into a register (``run_ops``)
FILL = len(LOOPS)

# The opcodes of the *core* machine: what neural-network backwards are made of.  Compiling the
# interpreter costs about 0.1 s per opcode loop on top of a fixed cost (measured before
# ``REWRITES``: 32 core loops 4.1-4.4 s, all 47 7.0-7.3 s), so a kernel that uses only these
# runs on a machine without the rarer loops (trigonometry, rounding, atan2/hypot/logaddexp,
# erfc, the gamma family, xor); a kernel that needs one of those runs on the full machine,
# which is compiled (or loaded) when first needed.
CORE = frozenset(
    {
        "broadcast_to",
        "cast",
        "neg",
        "exp",
        "expm1",
        "log",
        "log1p",
        "tanh",
        "sqrt",
        "reciprocal",
        "abs",
        "sign",
        "sigmoid",
        "erf",
        "clone",
        "add",
        "sub",
        "mul",
        "maximum",
        "minimum",
        "div",
        "pow",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_not",
        "logical_and",
        "logical_or",
        "where",
        # ``isfinite`` (logsumexp's guard, so every cross-entropy and log-softmax) is made of
        # these two: without them a classifier's step compiled both machines
        "isnan",
        "isinf",
        # F.binary_cross_entropy and its input gradient (GANs, VAEs): before they were
        # primitives, their composite's ops were all core ones
        "binary_cross_entropy",
        "binary_cross_entropy_backward",
    }
    & set(OPCODES)
)
_CORE_CODES = frozenset(OPCODES[op] for op in CORE) | {FILL}

FLOAT_DTYPES = ("float32", "float64")


def eligible(kernel: Kernel) -> bool:
    """Whether the interpreter can run ``kernel`` (structure only: whether it *should*, for the
    sizes of a call, is ``size <= interpreter_max_elements``, decided by the program)."""
    if any(v.shape != kernel.shape for v in kernel.values):
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


# ---- the generated interpreter ------------------------------------------------------------------

_HEADER = '''"""Generated by fusegrad (interpreter v{version}); do not edit.

The op dispatch of the small-kernel interpreter (fusegrad.compiler.codegen.interpreter): one
vectorisable loop per opcode, computing the primitive's lowering expression over registers.
"""
{imports}
FILL = {fill}
BLOCK = {block}

'''

_RUN_OPS = '''
{decorator}
def run_ops_{dtype}(n, code, regs, scalars, reduce_regs, reduce_out):
    """Execute ``code`` (rows: opcode, dst, a, b, c) over registers ``regs[:, :n]`` of
    {dtype}, then the full reductions of ``reduce_regs`` into ``reduce_out`` (float64).
    ``FILL`` rows broadcast ``scalars[a]`` into a register.  The op list runs over blocks of
    ``BLOCK`` elements, so that the registers one op touches stay in cache."""
    one = np.{dtype}(1.0)
    zero = np.{dtype}(0.0)
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        m = hi - lo
        for k in range(code.shape[0]):
            op, dst, a, b, c = code[k, 0], code[k, 1], code[k, 2], code[k, 3], code[k, 4]
            out = regs[dst, lo:hi]
            if op == FILL:
                value = scalars[a]
                for i in range(m):
                    out[i] = value
                continue
            x = regs[a, lo:hi]
            y = regs[b, lo:hi]
            z = regs[c, lo:hi]
{dispatch}
    for k in range(reduce_regs.shape[0]):
        acc = 0.0
        r = regs[reduce_regs[k]]
        for i in range(n):
            acc += r[i]
        reduce_out[k] = acc
'''

_DECORATOR = '@numba.njit(cache=True, error_model="numpy", fastmath={"contract"}, nogil=True)'


def _loop(op: str, dtype: str) -> str:
    """The statement computing ``op`` for element ``i`` of a block."""
    if op == "copy":
        return "out[i] = x[i]"
    operands = ["x[i]", "y[i]", "z[i]"][: len(REGISTRY[op].inputs)]
    expr = common.format_expression(
        op, operands, numba_cpu.SPELLING, float32=dtype == "float32", one="one", dtype=dtype
    )
    if REGISTRY[op].bool_result:
        return f"out[i] = one if {expr} else zero"
    return f"out[i] = {expr}"


def source(core: bool = False) -> str:
    """The interpreter's module source: ``run_ops_float32`` and ``run_ops_float64``, over every
    opcode or (``core``) over ``CORE`` only, with the same numbering."""
    codes = {OPCODES[op] for op in CORE} if core else set(LOOPS.values())
    ops = [(op, code) for op, code in LOOPS.items() if code in codes]
    parts = [
        _HEADER.format(
            version=INTERPRETER_VERSION,
            imports=numba_cpu.module_imports(),
            fill=FILL,
            block=BLOCK,
        )
    ]
    for dtype in FLOAT_DTYPES:
        # (one function: a block function of its own was compiled and machine-coded alone,
        # then again inlined into ``run_ops``, about 0.9 s of the interpreter's 5 s compile)
        dispatch = "\n".join(_dispatch(ops, dtype, " " * 12))
        parts.append(_RUN_OPS.format(decorator=_DECORATOR, dtype=dtype, dispatch=dispatch))
    return "\n".join(parts)


# opcodes tested one after the other at the leaves of the dispatch tree
_LEAF = 4


def _dispatch(ops: list[tuple[str, int]], dtype: str, indent: str) -> list[str]:
    """The dispatch on ``op`` over ``ops`` (consecutive opcodes): a balanced tree of range tests
    down to ``_LEAF`` opcodes, then one test each.  A chain of 50 tests cost the ops at its end
    measurably more than those at its head (the interpreter runs one op per row of the op
    list, for every block); the tree makes every op a handful of comparisons away."""
    if len(ops) > _LEAF:
        middle = len(ops) // 2
        return (
            [f"{indent}if op < {ops[middle][1]}:"]
            + _dispatch(ops[:middle], dtype, indent + "    ")
            + [f"{indent}else:"]
            + _dispatch(ops[middle:], dtype, indent + "    ")
        )
    lines = []
    for k, (op, code) in enumerate(ops):
        template = "a copy" if op == "copy" else EXPRESSIONS[op]
        also = sorted(name for name, (loop, _) in REWRITES.items() if loop == op)
        note = f" (also {', '.join(also)})" if also else ""
        lines.append(
            f"{indent}{'if' if k == 0 else 'elif'} op == {code}:  # {op}: {template}{note}"
        )
        lines.append(f"{indent}    for i in range(m):")
        lines.append(f"{indent}        {_loop(op, dtype)}")
    return lines


_loaded: dict[str, ModuleType] = {}
_machines: dict[str, ModuleType] = {}  # flags -> the loaded interpreter module
_machine_lock = threading.Lock()


def flags(core: bool = False) -> str:
    """What names the interpreter's module (with its source): version, machine, CPU flags."""
    return f"interpreter v{INTERPRETER_VERSION}{' core' if core else ''}|{numba_cpu._flags()}"


def module_name(core: bool = False) -> str:
    """The name of the interpreter's module: a hash of its source and ``flags``."""
    return common.module_name(source(core), flags(core))


def loaded(core: bool = False) -> bool:
    """Whether this process loaded the interpreter's module (the core machine when ``core``)."""
    return flags(core) in _machines


def machine(core: bool = False) -> ModuleType:
    """The interpreter's module (the core machine when ``core``), generated and loaded on first
    use (once per process; numba compiles each ``run_ops_*`` on its first call, or loads it
    from the disk cache, through ``diskcache``'s guarded cache like every generated module)."""
    key = flags(core)
    module = _machines.get(key)
    if module is None:
        with _machine_lock:
            module = _machines.get(key)
            if module is None:
                entry_points = tuple(f"run_ops_{dtype}" for dtype in FLOAT_DTYPES)
                module, _, _ = common.load_module(source(core), key, _loaded, entry_points)
                _machines[key] = module
    return module


def float_dtype(kernel: Kernel) -> Any:
    """The one float dtype of an eligible kernel."""
    return next(v.dtype for v in kernel.values + kernel.inputs if v.dtype.is_floating_point)


def merge(group: list[Kernel], needed_outside: Any) -> Kernel:
    """One kernel computing the consecutive eligible kernels of ``group`` (same iteration space
    and float dtype; no member reads the reduction of an earlier one: a reduction is complete
    only after its loop): ``fuse.merge_kernels``."""
    return merge_kernels(group, needed_outside)


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
        self.float_dtype = float_dtype(kernel)
        reg: dict[Any, int] = {}  # IR value (or the zero constant) -> register
        # inputs are full-size (the kernel's shape), single elements, or broadcast along some
        # dims (a register each, filled with the broadcast values)
        self.full_inputs = [v for v in kernel.inputs if v.shape == kernel.shape]
        self.scalar_inputs = [
            v for v in kernel.inputs if v.shape != kernel.shape and is_single(v.shape)
        ]
        self.broadcast_inputs = [
            v for v in kernel.inputs if v.shape != kernel.shape and not is_single(v.shape)
        ]
        for v in self.full_inputs + self.broadcast_inputs:
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
            operands = [
                reg[i] if i in reg else scalar_register(i, i.attr("value"))  # (an IR scalar)
                for i in v.inputs
            ]
            if v.op == "cast" and v.dtype.name == "bool" and v.inputs[0].dtype.is_floating_point:
                loop, spec = "ne", (0, 0.0)  # float -> bool is "!= 0"
            else:
                loop, spec = REWRITES.get(v.op, (v.op, tuple(range(len(operands)))))
            args = [
                operands[s] if type(s) is int else scalar_register(("constant", s), s) for s in spec
            ]
            opcode = LOOPS[loop]
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
        # full reductions run in ``run_ops`` (float64 sums); partial ones (row or column sums)
        # in numpy afterwards, over the dims their target keeps as the literal 1
        full, self.partial = [], {}
        for r in kernel.reductions:
            target = reduction_target(r, kernel.shape)
            if all(type(t) is int and t == 1 for t in target):
                full.append(r)
            else:
                axes = tuple(d for d, t in enumerate(target) if type(t) is int and t == 1)
                self.partial[r] = (reg[r.inputs[0]], axes)
        self.reduce_regs = np.array([reg[r.inputs[0]] for r in full], dtype=np.int64)
        self.reduction_index = {r: k for k, r in enumerate(full)}
        self.outputs = [
            (v, self.reduction_index.get(v, -1), reg.get(v, 0), v.dtype.np)
            for v in kernel.outputs
            if v not in self.partial
        ]
        self.core = all(int(op) in _CORE_CODES for op in self.code[:, 0])
        self._run_ops = getattr(machine(self.core), f"run_ops_{self.float_dtype.name}")
        self._local = threading.local()

    def _registers(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This thread's register matrix for ``n`` elements, the flat view of its input rows
        and its full reductions' float64 sums (``run_ops`` writes every one of them; the
        outputs are copies), kept from call to call while ``n`` stays the same."""
        cached = getattr(self._local, "regs", None)
        if cached is None or cached[0].shape[1] != max(n, 1):
            regs = np.empty((self.n_regs, max(n, 1)), dtype=self.float_dtype.np)
            sums = np.zeros(len(self.reduce_regs), dtype=np.float64)
            cached = (regs, regs[: self.n_full].reshape(-1), sums)
            self._local.regs = cached
        return cached

    def __call__(
        self,
        env: dict,
        n: int | None = None,
        shapes: dict | None = None,
        space: tuple | None = None,
    ) -> dict:
        """Compute the kernel's outputs (and reductions) from ``env`` over the iteration space
        ``space`` of ``n`` elements; ``shapes`` gives each output's shape (all three default to
        the kernel's own, when they are concrete).  Returns value -> array."""
        if space is None:
            space = tuple(self.kernel.shape)
        if n is None:
            n = int(np.prod(space)) if space else 1
        if shapes is None:
            shapes = {v: v.shape for v in self.kernel.outputs}
        regs, input_rows, reduce_out = self._registers(n)
        if self.full_inputs and n:
            np.concatenate(
                [env[v] for v in self.full_inputs], axis=None, out=input_rows, casting="unsafe"
            )
        if self.broadcast_inputs and n:
            for k, v in enumerate(self.broadcast_inputs, self.n_full):
                np.copyto(regs[k, :n].reshape(space), env[v], casting="unsafe")
        scalars = self.constants
        if self.scalar_inputs:  # they take the first slots of ``scalars``
            scalars = scalars.copy()
            np.concatenate(
                [env[v] for v in self.scalar_inputs],
                axis=None,
                out=scalars[: len(self.scalar_inputs)],
                casting="unsafe",
            )
        self._run_ops(n, self.code, regs, scalars, self.reduce_regs, reduce_out)
        out = {}
        for v, reduction, row, dtype in self.outputs:
            if reduction >= 0:  # (one element: the cast ``np.full`` would make, without it)
                out[v] = reduce_out[reduction : reduction + 1].astype(dtype).reshape(shapes[v])
            else:
                out[v] = regs[row, :n].astype(dtype).reshape(shapes[v])
        for v, (row, axes) in self.partial.items():
            total = np.add.reduce(regs[row, :n].reshape(space), axis=axes, dtype=np.float64)
            out[v] = total.astype(v.dtype.np).reshape(shapes[v])
        return out
