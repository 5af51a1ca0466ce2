"""Backward graphs for the CUDA tests, and a harness that runs a captured program with its fused
kernels on CUDA.

Shared by ``test_cuda_kernels.py`` (run in numba's simulator) and ``test_cuda_ptx.py`` (compiled to
PTX without the simulator).  Importing this module imports neither ``numba.cuda`` nor the CUDA
emitter: each test module does, after checking which mode its process runs in.

A ``Case`` makes fresh leaves and a loss closure; ``capture`` records the compiled backward's
``Program`` (fusion done, ``.grad`` accumulation epilogues marked) and the runtime arguments
*without running it*; ``run_program`` executes its steps — externs with their eager kernels,
kernels with a caller-supplied runner — and ``final_grads`` applies the effects as the engine
would, so the result compares with an eager backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import op_table

import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import compiler
from fusegrad.compiler.codegen.lowering import EXPRESSIONS
from fusegrad.compiler.ir import Graph, Value
from fusegrad.compiler.passes.fuse import Extern, Kernel
from fusegrad.compiler.program import Program
from fusegrad.ops.registry import REGISTRY

Make = Callable[[str], tuple[list, Callable[[], Any]]]


@dataclass
class Case:
    name: str
    make: Make  # dtype name -> (leaves, loss closure)
    dtypes: tuple[str, ...] = ("float32", "float64")


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(name.encode()))


def _leaf(rng: np.random.Generator, shape: tuple, dtype: str) -> Any:
    return fg.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def _golden(n: int) -> Make:
    """Workload A: ``sum(tanh(x*w+b)*sigmoid(x)+exp(-x*x)*0.5)``, ``b`` broadcast."""

    def make(dtype: str) -> tuple[list, Callable[[], Any]]:
        rng = _rng("golden")
        x, w, b = _leaf(rng, (n,), dtype), _leaf(rng, (n,), dtype), _leaf(rng, (1,), dtype)
        return [x, w, b], lambda: ((x * w + b).tanh() * x.sigmoid() + (-x * x).exp() * 0.5).sum()

    return make


def _golden_2d(with_grads: bool) -> Make:
    """The golden graph over rows, ``b`` broadcast along them and ``c`` along columns; with
    ``with_grads`` every leaf already has a ``.grad`` (the ``+=`` epilogue)."""

    def make(dtype: str) -> tuple[list, Callable[[], Any]]:
        rng = _rng("golden_2d")
        x, w = _leaf(rng, (6, 5), dtype), _leaf(rng, (6, 5), dtype)
        b, c = _leaf(rng, (5,), dtype), _leaf(rng, (6, 1), dtype)
        leaves = [x, w, b, c]
        if with_grads:
            for t in leaves:
                t.grad = fg.tensor(rng.standard_normal(t.shape).astype(dtype))
        return leaves, lambda: ((x * w + b).tanh() * x.sigmoid() + (-x * x).exp() * c).sum()

    return make


def _mlp(dtype: str) -> tuple[list, Callable[[], Any]]:
    """A two-layer MLP with cross entropy: bias gradients are ``sum_to`` over rows, the softmax's
    are sums over classes."""
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)).to(getattr(fg, dtype))
    rng = _rng("mlp")
    x = fg.tensor(rng.standard_normal((5, 8)).astype(dtype))
    y = fg.tensor(rng.integers(0, 3, 5))
    return list(model.parameters()), lambda: F.cross_entropy(model(x), y)


def _partial_reductions(dtype: str) -> tuple[list, Callable[[], Any]]:
    """Rank 3, each operand broadcast along different dims: reductions keeping the first, the
    middle and the last dims, in one loop."""
    rng = _rng("partial")
    x = _leaf(rng, (3, 4, 5), dtype)
    a, b, c = _leaf(rng, (4, 1), dtype), _leaf(rng, (5,), dtype), _leaf(rng, (3, 1, 1), dtype)
    return [x, a, b, c], lambda: ((x * a + b) * c).sigmoid().sum()


def _long_reductions(dtype: str) -> tuple[list, Callable[[], Any]]:
    """Sums long enough to be split into several slices per output (two passes)."""
    rng = _rng("long")
    x = _leaf(rng, (70, 6), dtype)
    b = _leaf(rng, (6,), dtype)
    s = _leaf(rng, (1, 1), dtype)
    return [x, b, s], lambda: ((x + b).tanh() * s).sum()


def _dim_sums(dtype: str) -> tuple[list, Callable[[], Any]]:
    """softmax, log_softmax and layer_norm: ``sum`` over a dim inside the backward kernels."""
    rng = _rng("dims")
    x = _leaf(rng, (4, 6), dtype)
    w, b = _leaf(rng, (6,), dtype), _leaf(rng, (6,), dtype)
    weights = fg.tensor(rng.standard_normal((4, 6)).astype(dtype))

    def loss() -> Any:
        y = x.softmax(1) * weights + x.log_softmax(0) + F.layer_norm(x, (6,), w, b) * weights
        return y.sum()

    return [x, w, b], loss


CASES = [
    Case("golden", _golden(300)),
    Case("golden_2d", _golden_2d(False)),
    Case("golden_2d_accumulate", _golden_2d(True)),
    Case("mlp", _mlp),
    Case("partial_reductions", _partial_reductions),
    Case("long_reductions", _long_reductions),
    Case("dim_sums", _dim_sums),
]

# differentiable elementwise ops of the op table, and the samples taken of each
OP_NAMES = (
    "add", "sub", "mul", "div", "neg", "pow", "pow_fractional", "abs", "exp", "expm1", "log",
    "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "relu",
    "gelu", "silu", "softplus", "clamp", "maximum", "minimum", "where", "lerp",
)  # fmt: skip
SAMPLE_NAMES = ("2d", "0d", "empty", "noncontig", "same", "bcast", "bcast_rank")
SAMPLES_PER_OP = 3


def _op_case(entry: op_table.OpInfo, sample: op_table.Sample) -> Make:
    def make(dtype: str) -> tuple[list, Callable[[], Any]]:
        leaves, fn = op_table.build(entry, op_table.FG, sample, dtype)
        rng = _rng(entry.name + sample.name)

        def loss() -> Any:
            out = fn(*leaves)
            weights = fg.tensor(rng.standard_normal(out.shape).astype(dtype))
            return (out * weights).sum()

        return leaves, loss

    return make


def op_cases() -> list[Case]:
    cases = []
    entries = {e.name: e for e in op_table.OPS}
    for name in OP_NAMES:
        entry = entries[name]
        samples = [s for s in entry.get_samples() if s.name in SAMPLE_NAMES and s.grad]
        for sample in samples[:SAMPLES_PER_OP]:
            cases.append(Case(f"{name}-{sample.name}", _op_case(entry, sample), ("float32",)))
    return cases


def one_op_kernel(op: str, shapes: list, input_dtypes: Any, **attrs: Any) -> Kernel:
    """A kernel of one primitive (elementwise, or a reduction of an input), as the eager CUDA
    path builds them: inputs are ``saved`` inputs of a fresh graph (``input_dtypes``: one dtype
    for all, or one per input)."""
    dtypes = input_dtypes if isinstance(input_dtypes, tuple) else (input_dtypes,) * len(shapes)
    g = Graph()
    inputs = [g.input("saved", k, s, d) for k, (s, d) in enumerate(zip(shapes, dtypes))]
    shape, dtype = REGISTRY[op].meta(tuple(shapes), dtypes, **attrs)
    v = g.add(op, tuple(inputs), attrs, shape, dtype)
    if op in ("sum", "sum_to"):
        return Kernel(shape=tuple(shapes[0]), reductions=[v], inputs=inputs, outputs=[v])
    space = tuple(np.broadcast_shapes(*shapes))
    return Kernel(shape=space, values=[v], inputs=inputs, outputs=[v])


def expression_kernels(dtype: Any) -> list[Kernel]:
    """One kernel per primitive of ``lowering.EXPRESSIONS`` (every elementwise formula), over
    ``dtype`` operands, the second operand broadcast: each formula through the strided form."""
    kernels = []
    for name in EXPRESSIONS:
        arity = len(REGISTRY[name].inputs)
        shapes = [(3, 4), (4,), (3, 1)][:arity]
        dtypes: tuple = (dtype,) * arity
        attrs: dict = {}
        if name.startswith("logical_"):
            dtypes = (fg.bool,) * arity
        elif name == "where":
            dtypes = (fg.bool, dtype, dtype)
        elif name == "cast":
            attrs = {"dtype": fg.int64 if dtype.is_floating_point else fg.float32}
        kernels.append(one_op_kernel(name, shapes, dtypes, **attrs))
    return kernels


# ---- capturing and running programs -------------------------------------------------------------


@dataclass
class Captured:
    program: Program
    walk: Any
    grad_roots: list
    leaves: list


def capture(loss: Callable[[], Any]) -> Captured:
    """The compiled backward of ``loss()`` as a ``Program``, captured with concrete sizes (so
    that its steps can be run here, attribute by attribute) but not run (no CPU kernel is
    compiled); kernels are generated code, never the interpreter, and never CPU row kernels."""
    recorded: list = []

    def record(
        self: Program, w: Any, sizes: Any, grad_roots: Any, retain_graph: bool, inputs: Any
    ) -> None:
        recorded.append(Captured(self, w, list(grad_roots), list(w.leaves)))
        return None

    compiler.reset()
    config = compiler.config
    previous = config.interpreter_max_elements, config.symbolic_sizes, config.row_fusion
    config.interpreter_max_elements = 0
    config.symbolic_sizes = False
    config.row_fusion = False  # (the CPU emitter's row kernels: a CUDA program has none)
    try:
        with mock.patch.object(Program, "run", record):
            with compiler.compiled_autograd(fullgraph=True):
                loss().backward()
    finally:
        config.interpreter_max_elements, config.symbolic_sizes, config.row_fusion = previous
        compiler.reset()
    (captured,) = recorded
    return captured


def input_arrays(c: Captured) -> dict[Value, np.ndarray]:
    """The program's runtime arguments, scalars and constants as host arrays."""
    env: dict[Value, np.ndarray] = {}
    for v in c.program.graph.values:
        if v.op == "input":
            kind, index = v.attr("kind"), v.attr("index")
            if kind == "root":
                env[v] = c.grad_roots[index]._data
            elif kind == "saved":
                node, saved = c.walk.saved[index]
                env[v] = saved.unpack(node)._data
            else:
                env[v] = c.leaves[index]._grad._data
        elif v.op == "scalar":
            env[v] = np.array(v.attr("value"), dtype=v.dtype.np)
        elif v.op == "constant":
            env[v] = c.program.graph.constants[v.attr("index")]
    return env


def grad_slots(c: Captured) -> dict[Value, int]:
    """Kernel outputs accumulated into an existing ``.grad`` -> that leaf's position."""
    accumulated = {v for k in c.program.kernels for v in k.accumulate}
    return {v: slot for kind, slot, v in c.program.graph.effects if v in accumulated}


def run_program(c: Captured, run_kernel: Callable[[Kernel, dict], dict]) -> dict:
    """Every value of the program: externs by their eager kernels, kernels by ``run_kernel(kernel,
    env)``, which returns host arrays of the kernel's outputs."""
    env: dict = input_arrays(c)
    for step in c.program.steps:
        if isinstance(step, Extern):
            v = step.value
            env[v] = np.asarray(REGISTRY[v.op].kernel(*[env[i] for i in v.inputs], **dict(v.attrs)))
        else:
            env.update(run_kernel(step, env))
    return env


def final_grads(c: Captured, env: dict, leaves: list) -> list:
    """The ``.grad`` of each of ``leaves`` after the backward (accumulated outputs already hold
    it); the program numbers leaves in walk order."""
    grads: list = [None if t._grad is None else t._grad._data.copy() for t in c.leaves]
    accumulated = grad_slots(c)
    for kind, slot, v in c.program.graph.effects:
        assert kind == "grad"
        if v in accumulated:
            grads[slot] = np.array(env[v])
        else:
            grads[slot] = env[v] if grads[slot] is None else grads[slot] + env[v]
    slot_of = {id(t): k for k, t in enumerate(c.leaves)}
    return [grads[slot_of[id(t)]] if id(t) in slot_of else None for t in leaves]


def eager_grads(make: Make, dtype: str) -> list:
    leaves, loss = make(dtype)
    loss().backward()
    return [None if t.grad is None else t.grad.numpy().copy() for t in leaves]


def tolerance(dtype: str) -> dict:
    return {"rtol": 2e-5, "atol": 2e-6} if dtype == "float32" else {"rtol": 1e-10, "atol": 1e-12}
