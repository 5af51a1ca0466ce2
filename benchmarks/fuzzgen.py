"""Differential fuzzing of compiled vs eager autograd: the seeded program generator and checker.

``tests/compiler/test_fuzz.py`` runs a few hundred programs in CI; ``python -m benchmarks.fuzz``
(``benchmarks/fuzz.py``) runs the long campaign.  Both use this module.

**Programs.**  ``generate(seed)`` turns a seed into a ``Program``: leaves (shapes, dtypes,
``requires_grad``, literal data, sometimes with +-inf / NaN / signed zeros), forward statements
written with the public API only (``fusegrad`` functions, Tensor methods,
``fusegrad.nn.functional``), and a backward section (``loss.backward()``,
``autograd.backward`` with root gradients, ``autograd.grad`` with ``grad_outputs``,
``backward(inputs=[...])``, accumulation by a second backward or into a preset ``.grad``).
Statements are drawn from tables of templates (unary, binary with size-1 / 0-d / Python-scalar
broadcasting, reductions, views, in-place ops on non-leaves and on views of them, matmul,
softmax / layer_norm / losses, casts, hooks and ``retain_grad``); operands are drawn from the
values made so far with a bias towards recent ones, so values fan out.  The generator executes
each candidate statement eagerly as it goes, to learn the shapes it needs for the next one and
to drop candidates the eager library rejects (a view of a non-contiguous tensor, an empty
``amax``, ...), so every forward it emits runs.  The only randomness is a
``numpy.random.Generator`` seeded with the program's seed: a seed always gives the same program.

``Program.source()`` is a standalone Python script (the repro of a failure): ``leaves()``,
``forward()``, ``run(region)`` returning every gradient by name, and a ``__main__`` that
compares eager with one compiled configuration.  The checker executes exactly that source.

**Checking** (``check``).  ``run()`` executes eagerly, then inside
``compiler.compiled_autograd()``: in default mode; in default mode twice more, the second time
with every float leaf scaled by ``NEW_SCALE`` (a program-cache hit that must compute on the new
arrays, compared with eager on the scaled data); in ``mode="debug"`` (the reference executor);
for every fourth seed with ``config.interpreter_max_elements = 0`` (every kernel as
generated code); and, for another fourth, as a whole step and as a compiled module, each built
with native segments (``config.native_programs = True``).  Each configuration starts from
empty in-memory program caches (compiled modules stay on disk): its result depends on nothing
run before it, so the repro script, which runs that configuration alone, reproduces it.  Every
gradient the program produces (leaf ``.grad``, ``retain_grad`` values, ``autograd.grad``
results, whether a preset ``.grad`` kept its identity, the root gradients after backward) is
compared.  A configuration that raises where eager does not is a *crash*; an exception eager
raises must be raised by the compiled run with the same type and message.  Programs whose
backward fell back to eager (``compiler.counters.fallbacks``) are counted as fallbacks, and
their results are still compared.  Every tenth seed is a smooth float64 program (no inf / NaN
data, arguments of log / sqrt / division kept positive, no gradient-changing hooks or
``detach``) whose gradients are also checked against central finite differences by
``fusegrad.autograd.gradcheck`` with the analytical Jacobian from the compiled backward, one
scalar per output (each output weighted by its root gradient, summed) so that finite
differences resolve every output at its own scale.  When eager fails gradcheck too, the verdict
is *inconclusive* (an eager rule or a function too badly scaled for finite differences), not a
compiler failure.

**Comparison** (``compare``).  Per gradient: same presence (None or not), shape and dtype;
NaN, +inf and -inf at exactly the same positions (the sign of a zero is not compared); finite
elements within

    |compiled - eager| <= rtol * |eager| + FLOOR * u * max(max|eager|, max|root gradient|)
                          + SHADOW * max(estimate, change)

``rtol`` is docs/numerics.md's (1e-10 float64, 1e-5 float32) and ``u`` the unit roundoff of the
gradient's dtype.  The second term is a norm-wise floor of a few roundoffs of the scale of the
backward's terms (the largest of the tensor's largest element, the largest root gradient and
the largest gradient that flows into the result in eager's backward, measured by
``_TermScales`` through the engine's executor): an FMA contraction legitimately leaves the
rounding error of a product where eager's terms cancel to an exact zero, and that product can
be far larger than the result and the root gradients (``(a - b) * (a + b)`` with a = 1e30).
The third term is what makes the comparison principled where sums cancel: compiled code may
contract ``a*b+c`` into an FMA and accumulate float32 sums in
float64, so its result differs from eager's by up to the *rounding error of the computation*,
``~ u * sum |terms|``, which exceeds ``rtol * |result|`` by any factor when the terms cancel.
That error is measured, not guessed: the program runs eagerly once more with every float dtype
changed to one precision (a *shadow* run: float64 if the program uses float32 anywhere, float32
if it uses float64 anywhere, both for a mixed program), and since to first order rounding error
scales with the unit roundoff, ``estimate = max over shadows of |eager - shadow| * min(1, u /
u_shadow)``.  For float32 results against the float64 shadow this is eager's actual error; for
float64 results against the float32 shadow it is the float32 discrepancy scaled down by 2**-29.
Where a shadow is not finite but eager is, that shadow's estimate is ``|eager| * min(1, u /
u_shadow)`` (no usable information).  A float64 result of a mixed program that the float64
shadow moves by more than ``MIXED`` (relative to the backward's scale) carries float32
rounding (a float64 leaf whose gradient passes through float32 values: eager casts a float32
sum up); the estimate is one sample of that error and can be small by luck, so such an
element's floor is float32's, ``FLOOR * u_float32 * scale``.  A float64 result that the float32
values do not reach keeps float64's floor, which is what finds a float64 rule computed in
float32.

The estimate is one sample of eager's rounding error, and where eager's value is an exact
cancellation it is 0 by luck: ``change`` is a second measure.  The program runs eagerly
``PERTURBED_RUNS`` more times with every finite nonzero root gradient moved by one ulp of its
dtype, up or down at random (seeded): a change of the data below the rounding of any
computation on it, so that whatever the results move by, ``change = max |eager - perturbed|``
(``|eager|`` where a perturbed result is not finite), the results are determined no better
than that, by eager or any other rounding.  It is what an ill-conditioned backward amplifies:
a normalisation over a few elements whose gradient is multiplied by 1e30 (fuzz seed 1006449,
native: eager's 0 is an exact cancellation for about half of the roundings, +-8.4e-15 for the
others, compiled's -8.4e-15; the exact value is 2.7e-61).  Only root gradients move: the
forward, and so every comparison, max and tie that routes the gradient, stays eager's, and a
result that eager computes exactly (the +0 of a constant normalisation) stays exact.

The floor bounds a contraction's rounding error where the gradient is written, but a node
whose terms cancel (``g - exp(out) sum(g)``, log_softmax's backward, at a class of
probability 1 - 4e-16: terms of 0.555 leave 2.2e-16) carries an error of ``u * |terms|``
into every node after it, which may amplify it (fuzz seed 301685, native: ``pow`` and
``var`` downstream multiplied it by 51, and the compiled program's FMA gave 1.25e-14 where
eager's separately rounded product gave 1.13e-14, both within 2.5 roundoffs of the terms
times 51 of the exact 1.07e-14; the floor was 2.5e-16).  ``JITTERED_RUNS`` more eager runs
measure that: every node of the backward runs a second time on its incoming gradients scaled
by a random factor in 1.25..1.75, and where its result scaled back differs from the first by more
than a few roundoffs of the result (its rounding error is the terms', not its own), the element
moves by that difference, up or down at random (``_Jitter``); the runs' changes join
``change``.  Elements rounded to a few roundoffs of themselves (products, scalings, sums of one
sign), exact zeros and non-finite elements stay, so that a constant gradient stays constant,
eager's exact cancellations stay exact, and a gradient scaled by 1e-30 is not taken for one.

All of that keeps eager's forward, which is what the configurations that run the forward
eagerly compute from.  Those that compile it (whole step, compiled module, and their native and
quick forms) compute the forward's values by other code: another exp, an FMA, a float64
accumulator, each an ulp or a few from eager's, and the backward then amplifies that (fuzz seed
302916, whole step: numpy's float32 exp(4.517175) is 91.57653, 2.1 ulp below the correctly
rounded 91.576546 that compiled code computes, and sin(v9) cos(v9)'s gradient times v9 changes
by 38 per unit of v9, so that one ulp of v9, 7.6e-6, is 2.9e-4 of grad(v5): eager 13.759516,
compiled 13.758944, against a tolerance of 4.4e-4 whose shadow estimate was small by luck,
eager's own exp error cancelling the rounding of v5).  ``FORWARD_JITTERED_RUNS`` more eager
runs, jittered as above, also move every element that a forward primitive rounded by one ulp
(``_forward_moved``: rounded where the primitive on its float inputs widened -- float32 to
float64, float64 to long double -- gives another value, so that a selection, a sign, a floor
or a product by 2 stays exact; a kernel that cannot compute in the wider dtype cannot tell, and
its results stay), up or down as a hash of its value says, so that equal values
move alike and a tie between two computations of one value stays a tie; zeros and non-finite
elements stay.  Their changes join ``change`` for the configurations that compile the forward
only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import re
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import compiler
from fusegrad.autograd.engine import Executor, run_backward
from fusegrad.autograd.graph_base import AccumulateGrad
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.ops.registry import run as run_primitive

__all__ = [
    "CONFIGS",
    "Config",
    "Finding",
    "Program",
    "Report",
    "check",
    "compare",
    "generate",
]

# the largest tensor the generator keeps (elements) and the highest rank: small tensors keep
# eager fast and gradcheck's finite differences cheap; what matters is structure, not size
MAX_NUMEL = 48
MAX_NDIM = 4
DEFAULT_MAX_OPS = 10
NEW_SCALE = 0.75  # the cached configuration's second run scales every float leaf by this

RTOL = {"float32": 1e-5, "float64": 1e-10}
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53}
FLOOR = 4.0  # norm-wise floor, in unit roundoffs of the scale of the backward's terms
SHADOW = 4.0  # how many times the measured rounding error the compiled result may deviate
# eager runs with the root gradients moved by one ulp: independent samples of eager's rounding;
# their largest change is the estimate, and an element whose eager value is an exact
# cancellation for about half of the roundings needs several (fuzz seed 1006449: 22 of 40
# samples 0, the others +-8.4e-15; all of 8 samples 0 has odds 1 in 120)
PERTURBED_RUNS = 8
# eager runs with the cancellations inside the backward moved by a measured sample of their
# rounding error (``_Jitter``): what later nodes amplify an FMA's rounding by (fuzz seed 301685)
JITTERED_RUNS = 4
# eager runs that also move every value the forward rounds by one ulp (``_forward_moved``),
# whose changes join the others' for the configurations that compile the forward (whole step,
# compiled module): a compiled forward rounds otherwise (fuzz seed 302916: numpy's float32
# exp is 2.1 ulp off where compiled code's is not, and exp's result meets a gradient of 38 per
# unit)
FORWARD_JITTERED_RUNS = 4
# relative change (to the backward's scale) of a float64 result in the float64 shadow beyond
# which the result carries float32 rounding: far above float64 rounding, far below float32's
MIXED = 2.0**-40


# ---- programs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """An input of the program: ``name = fg.tensor(scale * np.array(literal), dtype=...,
    requires_grad=...)`` (``scale`` is 1 but in the cached configuration's second run)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "LO" or "HI" (the script's float dtypes) or "fg.int64"
    requires_grad: bool
    literal: str  # Python source of the data (nested lists; inf and nan are script globals)

    def line(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        if self.dtype == "fg.int64":
            return f"{self.name} = fg.tensor({self.literal}, dtype=fg.int64)"
        data = f"scale * np.array({self.literal})"
        return f"{self.name} = fg.tensor({data}, dtype={self.dtype}{grad})"


@dataclass(frozen=True)
class Config:
    """One compiled configuration a program runs under."""

    name: str
    mode: str = "default"
    interpreter_max_elements: int | None = None  # None: leave the process-wide setting
    # run() once per scale of the leaf data, in one program cache; the last result counts
    scales: tuple[float, ...] = (1.0,)
    # the forward and backward as one ``fusegrad.compile``d function (``whole()``, called by
    # ``run_whole``): recorded on the first scale's call, replayed on the next
    whole: bool = False
    # forward() as the forward of a ``fusegrad.compile``d module (``FORWARD``), the backward
    # outside it: recorded on the first scale's call, replayed (ahead of time) on the next
    module: bool = False
    # the whole step's program built with native segments (``config.native_programs``): one
    # numba function per run of steps instead of a Python call per step
    native: bool = False
    # whole-step and module programs built as their quick tier (``config.quick_programs``):
    # every kernel interpreted or run by eager kernels, no generated code
    quick: bool = False

    def region(self) -> Callable[[], Any]:
        return lambda: compiler.compiled_autograd(mode=self.mode)

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        previous = compiler.config.interpreter_max_elements
        background = compiler.config.background_compile
        native = compiler.config.native_programs
        quick = compiler.config.quick_programs
        if self.interpreter_max_elements is not None:
            compiler.config.interpreter_max_elements = self.interpreter_max_elements
        # compiled code must run on the calls compared (no uncompiled run while it compiles)
        compiler.config.background_compile = False
        if self.native:
            compiler.config.native_programs = True
        if self.quick:
            compiler.config.quick_programs = True
        try:
            yield
        finally:
            compiler.config.quick_programs = quick
            compiler.config.interpreter_max_elements = previous
            compiler.config.background_compile = background
            compiler.config.native_programs = native


DEFAULT = Config("default")
# the same program again with its leaf data scaled: a program-cache hit, computing on new arrays
CACHED = Config("default, cached", scales=(1.0, NEW_SCALE))
DEBUG = Config("debug", mode="debug")
GENERATED = Config("generated code", interpreter_max_elements=0)
GRADCHECK = Config("gradcheck")  # gradcheck on the compiled path (smooth programs)
# whole-step compile: recorded at scale 1, replayed on the scaled data
WHOLE = Config("whole step", scales=(1.0, NEW_SCALE), whole=True)
MODULE = Config("compile(module)", scales=(1.0, NEW_SCALE), module=True)
# the whole step as native segments (every fourth seed: numba compiles them for longer)
NATIVE = Config("native whole step", scales=(1.0, NEW_SCALE), whole=True, native=True)
# the forward as a compiled module's program built with native segments (the same seeds): the
# programs whose whole step cannot be recorded (a hook registered inside it, ...) reach native
# code through it
NATIVE_MODULE = Config("native compile(module)", scales=(1.0, NEW_SCALE), module=True, native=True)
# the compiled-autograd backward with native segments at its size vector (``Program.per_size``:
# the program over symbolic sizes hands the call to a native program of its graph at the
# call's sizes), the same seeds
NATIVE_BACKWARD = Config("native compiled backward", scales=(1.0, NEW_SCALE), native=True)
# the whole step as its quick tier, what a background compile runs first (every seed: it
# compiles nothing but the interpreter)
QUICK = Config("quick whole step", scales=(1.0, NEW_SCALE), whole=True, quick=True)
CONFIGS = {
    c.name: c
    for c in (
        DEFAULT,
        CACHED,
        DEBUG,
        GENERATED,
        GRADCHECK,
        WHOLE,
        MODULE,
        NATIVE,
        NATIVE_MODULE,
        NATIVE_BACKWARD,
        QUICK,
    )
}


@dataclass(frozen=True)
class Program:
    """A generated program; ``source()`` renders it as a standalone script."""

    seed: int
    precision: str  # "float32", "float64" or "mixed" (dtypes of the leaves and casts)
    leaves: tuple[Leaf, ...]
    forward: tuple[str, ...]  # statements of forward()
    outputs: tuple[str, ...]  # values forward() returns as the backward's roots
    kept: tuple[str, ...]  # non-leaves forward() also returns (retain_grad, grad inputs)
    cotangents: tuple[str, ...]  # literal root gradients, one per output
    presets: tuple[tuple[str, str], ...]  # (leaf, literal): .grad set before backward
    strided_presets: tuple[str, ...]  # presets stored as a transposed (non-contiguous) view
    backward: tuple[str, ...]  # statements of run() after the forward
    results: tuple[tuple[str, str], ...]  # (label, expression) returned by run()
    forward_in_region: bool  # whether the forward runs inside the compiled region
    gradcheck: bool  # smooth float64 program: also checked against finite differences
    generated_code: bool  # also run with every kernel as generated code
    native: bool = False  # also run the whole step as native segments

    def configs(self) -> list[Config]:
        configs = [DEFAULT, CACHED, DEBUG, WHOLE, MODULE, QUICK]
        if self.generated_code:
            configs.append(GENERATED)
        if self.native:
            configs += [NATIVE, NATIVE_MODULE, NATIVE_BACKWARD]
        return configs

    def source(self, config: Config = DEFAULT, verdict: str = "") -> str:
        """The program as a standalone script comparing eager with ``config``."""
        return _render(self, config, verdict)


def generate(seed: int, max_ops: int = DEFAULT_MAX_OPS) -> Program:
    """The program of ``seed`` (deterministic: same seed, same program)."""
    return _Builder(seed, max_ops).build()


# ---- the generator ----------------------------------------------------------------------------

_SCALARS = ("0.5", "2.0", "-1.5", "3", "0.25", "-2")
_SPECIALS = (np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, 40.0, -40.0, 1e-30)

# unary templates: (template, domain); domain "pos" wants a positive argument (``_positive``)
_UNARY: tuple[tuple[str, str], ...] = (
    ("{a}.exp()", ""),
    ("fg.exp({a})", ""),
    ("{a}.log()", "pos"),
    ("fg.log({a})", "pos"),
    ("{a}.log1p()", "pos"),
    ("{a}.expm1()", ""),
    ("{a}.tanh()", ""),
    ("F.tanh({a})", ""),
    ("{a}.sigmoid()", ""),
    ("F.sigmoid({a})", ""),
    ("{a}.sqrt()", "pos"),
    ("{a}.rsqrt()", "pos"),
    ("{a}.abs()", ""),
    ("fg.abs({a})", ""),
    ("-{a}", ""),
    ("{a}.neg()", ""),
    ("{a}.sin()", ""),
    ("{a}.cos()", ""),
    ("F.relu({a})", ""),
    ("{a}.relu()", ""),
    ("F.gelu({a})", ""),
    ("F.gelu({a}, approximate='tanh')", ""),
    ("fg.erf({a})", ""),
    ("{a}.reciprocal()", "pos"),
    ("1.0 / {a}", "pos"),
    ("{a}.sign()", ""),
    ("{a}.floor()", ""),
    ("{a}.ceil()", ""),
    ("{a}.square()", ""),
    ("{a} ** 2", ""),
    ("{a} ** 3", ""),
    ("{a}.pow(0.5)", "pos"),
    ("{a} ** -1.5", "pos"),
    ("2.0 ** {a}", ""),
    ("{a}.exp2()", ""),
    ("{a}.log2()", "pos"),
    ("F.softplus({a})", ""),
    ("F.silu({a})", ""),
    ("F.leaky_relu({a}, 0.1)", ""),
    ("F.elu({a})", ""),
    ("F.logsigmoid({a})", ""),
    ("F.mish({a})", ""),
    ("F.hardtanh({a})", ""),
    ("{a}.clamp(-0.5, 0.75)", ""),
    ("{a}.clamp(min=0.1)", ""),
    ("fg.clamp({a}, max=0.3)", ""),
    ("{a} * 2.5", ""),
    ("{a} + 1", ""),
    ("3.0 - {a}", ""),
    ("{a} / 4.0", ""),
    ("0.5 * {a} - {a}", ""),
    ("{a} * {a}", ""),
    ("{a} + {a}.exp()", ""),
    ("{a}.sin() * {a}.cos()", ""),
    ("{a} - {a}", ""),
)

# binary templates over {a} and its broadcast partner {b}; {pa} / {pb} are them made positive
_BINARY: tuple[str, ...] = (
    "{a} + {b}",
    "{a} - {b}",
    "{a} * {b}",
    "{a} / {pb}",
    "fg.add({a}, {b}, alpha=0.5)",
    "fg.sub({a}, {b}, alpha=2)",
    "fg.mul({a}, {b})",
    "fg.div({a}, {pb})",
    "fg.maximum({a}, {b})",
    "fg.minimum({a}, {b})",
    "{pa} ** {b}",
    "fg.pow({pa}, {b})",
    "fg.where({a} > {b}, {a}, {b})",
    "fg.where({a} < 0.2, {a} * 2.0, {b})",
    "fg.where({b} >= 0, {a}, {b})",
    "{a}.lerp({b}, 0.25)",
    "fg.addcmul({a}, {b}, {a}, value=0.5)",
    "{a}.masked_fill({b} > 0.5, 0.5)",
    "{a} * {b} + {b}",
    "({a} - {b}) * ({a} + {b})",
)


class _Rejected(Exception):
    """A candidate statement the generator does not keep (too big, wrong kind, ...)."""


@dataclass
class _State:
    leaves: list[Leaf] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)  # float tensors usable as operands
    consumed: set[str] = field(default_factory=set)
    kept: list[str] = field(default_factory=list)
    hooked: set[str] = field(default_factory=set)


class _Builder:
    """Builds one program; see the module docstring."""

    def __init__(self, seed: int, max_ops: int) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.max_ops = max_ops
        # every tenth program is smooth float64 and checked against finite differences
        self.gradcheck = seed % 10 == 0
        self.smooth = self.gradcheck
        if self.gradcheck:
            self.precision = "float64"
        else:
            self.precision = str(
                self.rng.choice(["float32", "float64", "mixed"], p=[0.4, 0.3, 0.3])
            )
        self.specials = not self.smooth and self.rng.random() < 0.35
        self.empty = not self.smooth and self.rng.random() < 0.06
        self.ns: dict[str, Any] = _namespace()
        self.s = _State()
        self.counter = 0
        self.base = self._base_shape()

    # -- small helpers --

    def _chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def _choice(self, items: Any) -> Any:
        return items[int(self.rng.integers(len(items)))]

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.ns[name].shape)

    def _dtype_name(self) -> str:
        if self.precision == "float32":
            return "LO"
        if self.precision == "float64":
            return "HI"
        return "LO" if self._chance(0.5) else "HI"

    def _base_shape(self) -> tuple[int, ...]:
        rank = int(self.rng.choice([0, 1, 2, 3], p=[0.08, 0.22, 0.42, 0.28]))
        dims = [int(self.rng.integers(1, 6)) for _ in range(rank)]
        while int(np.prod(dims)) > MAX_NUMEL // 2:
            dims[int(np.argmax(dims))] -= 1
        if self.empty and dims:
            dims[int(self.rng.integers(len(dims)))] = 0
        return tuple(dims)

    def _variant(self, shape: tuple[int, ...], grow: bool) -> tuple[int, ...]:
        """A shape that broadcasts against ``shape``: size-1 dims, dropped leading dims, 0-d,
        and (``grow``) an extra leading dim."""
        if self._chance(0.1):
            return ()
        dims = [1 if self._chance(0.35) else d for d in shape]
        if dims and self._chance(0.25):
            dims = dims[int(self.rng.integers(1, len(dims) + 1)) :]
        if grow and len(dims) < MAX_NDIM and self._chance(0.12):
            dims = [int(self.rng.integers(2, 4)), *dims]
        return tuple(dims)

    def _data(self, shape: tuple[int, ...], positive: bool = False) -> np.ndarray:
        scale = float(self._choice([1.0, 1.0, 1.0, 3.0, 0.2]))
        values = np.asarray(self.rng.standard_normal(shape) * scale)
        if positive:
            values = np.abs(values) + 0.1
        if not self.smooth:
            # 4 decimals keep the script readable; ties (a max over equal values) are then
            # possible, and legitimate: eager and compiled must split them the same way
            values = np.round(values, 4)
        values = np.array(values, dtype=np.float64)  # 0-d results of numpy ops are scalars
        if self.specials and values.size and self._chance(0.5):
            for _ in range(int(self.rng.integers(1, 3))):
                index = tuple(int(self.rng.integers(d)) for d in shape)
                values[index] = self._choice(_SPECIALS)
        return values

    def _leaf(
        self,
        shape: tuple[int, ...],
        requires_grad: bool | None = None,
        positive: bool = False,
        dtype: str | None = None,
    ) -> str:
        """Create a float leaf now (in the namespace and the program); returns its name."""
        name = self._name("x")
        if requires_grad is None:
            requires_grad = self._chance(0.8)
        leaf = Leaf(
            name,
            shape,
            dtype or self._dtype_name(),
            requires_grad,
            _literal(self._data(shape, positive)),
        )
        exec(leaf.line(), self.ns)
        self.s.leaves.append(leaf)
        self.s.pool.append(name)
        return name

    def _int_leaf(self, values: np.ndarray) -> str:
        name = self._name("i")
        leaf = Leaf(name, tuple(values.shape), "fg.int64", False, repr(values.tolist()))
        exec(leaf.line(), self.ns)
        self.s.leaves.append(leaf)
        return name

    def _pick(self, pred: Callable[[Any], bool] | None = None) -> str:
        names = [n for n in self.s.pool if pred is None or pred(self.ns[n])]
        if not names:
            raise _Rejected("no operand")
        # unused values first (few dead ends), then recent ones (deep chains); any value
        # at all gives fan-out
        unused = [n for n in names if n not in self.s.consumed]
        r = self.rng.random()
        if unused and r < 0.45:
            return self._choice(unused)
        if r < 0.75:
            return self._choice(names[-3:])
        return self._choice(names)

    def _positive(self, name: str) -> str:
        """An expression of ``name`` inside a positive domain (always for smooth programs,
        half the time otherwise, so log / sqrt of negatives and division by zero occur)."""
        if not self.smooth and self._chance(0.5):
            return name
        forms = ["({a} * {a} + 0.25)", "({a}.sigmoid() + 0.05)", "({a}.abs() + 0.1)"]
        if not self.smooth:
            forms.append("{a}.exp()")
        return self._choice(forms).format(a=name)

    def _partner(self, shape: tuple[int, ...], grow: bool = True, scalar: bool = True) -> str:
        """An operand broadcasting against ``shape``: a Python scalar, an existing value or a
        new leaf of a size-1 / 0-d / lower-rank variant of the shape."""
        r = self.rng.random()
        if scalar and r < 0.15:
            return self._choice(_SCALARS)
        if r < 0.5:

            def fits(t: Any) -> bool:
                try:
                    out = np.broadcast_shapes(shape, tuple(t.shape))
                except ValueError:
                    return False
                return int(np.prod(out)) <= MAX_NUMEL and (grow or out == shape)

            with contextlib.suppress(_Rejected):
                return self._pick(fits)
        return self._leaf(self._variant(shape, grow))

    # -- statements --

    def _attempt(self, make: Callable[[], tuple[list[str], str | None]]) -> bool:
        """Run one statement maker; keep its lines when they execute eagerly and the result is
        small, else roll back everything it created."""
        before = _snapshot_state(self.s)
        names_before = set(self.ns)
        try:
            lines, target = make()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec("\n".join(lines), self.ns)
            if target is not None:
                value = self.ns[target]
                if not isinstance(value, fg.Tensor) or not value.dtype.is_floating_point:
                    raise _Rejected("not a float tensor")
                if value.numel() > MAX_NUMEL or value.dim() > MAX_NDIM:
                    raise _Rejected("too big")
        except Exception:
            self.s = before
            for name in set(self.ns) - names_before:
                del self.ns[name]
            return False
        self.s.lines.extend(lines)
        if target is not None:
            self.s.pool.append(target)
        # an in-place op can make other values unusable (a view returned by split whose base
        # was modified refuses even ``requires_grad``): they leave the pool
        self.s.pool = [n for n in self.s.pool if self._usable(n)]
        return True

    def _usable(self, name: str) -> bool:
        try:
            t = self.ns[name]
            return isinstance(t.requires_grad, bool) and isinstance(t.is_leaf, bool)
        except Exception:
            return False

    def _use(self, *names: str) -> None:
        self.s.consumed.update(names)

    def _unary(self) -> tuple[list[str], str]:
        a = self._pick()
        template, domain = self._choice(_UNARY)
        operand = self._positive(a) if domain == "pos" else a
        self._use(a)
        out = self._name("v")
        return [f"{out} = {template.format(a=operand)}"], out

    def _binary(self) -> tuple[list[str], str]:
        a = self._pick()
        b = self._partner(self._shape(a))
        template = self._choice(_BINARY)
        if b in _SCALARS and ("{b} >" in template or "{b} >=" in template):
            template = "{a} * {b}"
        self._use(a, b)
        out = self._name("v")
        pa, pb = self._positive(a), self._positive(b) if b not in _SCALARS else b
        code = template.format(a=a, b=b, pa=pa, pb=pb)
        if self._chance(0.15):  # operands swapped: the partner broadcasts on the left
            code = template.format(a=b, b=a, pa=self._positive(b), pb=self._positive(a))
            if b in _SCALARS:
                code = template.format(a=a, b=b, pa=pa, pb=pb)
        return [f"{out} = {code}"], out

    def _dim(self, ndim: int) -> int:
        d = int(self.rng.integers(ndim))
        return d - ndim if self._chance(0.3) else d

    def _reduction(self) -> tuple[list[str], str]:
        a = self._pick()
        nd = self.ns[a].dim()
        kd = "True" if self._chance(0.4) else "False"
        out = self._name("v")
        self._use(a)
        if nd == 0 or self._chance(0.2):
            forms = ["{a}.sum()", "{a}.mean()", "{a}.amax()", "{a}.max()", "{a}.norm()"]
            forms += ["{a}.prod()", "fg.sum({a})", "{a}.var()", "{a}.std()"]
            return [f"{out} = {self._choice(forms).format(a=a)}"], out
        d = self._dim(nd)
        forms = [
            "{a}.sum(dim={d}, keepdim={k})",
            "{a}.sum({d})",
            "{a}.mean(dim={d}, keepdim={k})",
            "{a}.amax(dim={d}, keepdim={k})",
            "{a}.amin({d})",
            "{a}.max(dim={d}, keepdim={k}).values",
            "{a}.min(dim={d}).values",
            "{a}.prod({d}, keepdim={k})",
            "{a}.var({d}, keepdim={k})",
            "{a}.var(dim={d}, unbiased=False)",
            "{a}.std({d})",
            "fg.logsumexp({a}, {d}, keepdim={k})",
            "{a}.norm(dim={d})",
            "{a}.cumsum({d})",
        ]
        if nd >= 2:
            d2 = (d + 1) % nd
            forms += ["{a}.sum(dim=({d}, {d2}), keepdim={k})", "{a}.mean(({d}, {d2}))"]
            forms += ["{a}.amax(dim=({d}, {d2}))"]
            code = self._choice(forms).format(a=a, d=d, d2=d2, k=kd)
        else:
            code = self._choice(forms).format(a=a, d=d, k=kd)
        return [f"{out} = {code}"], out

    def _view_expr(self, a: str) -> str:
        """A view (or view-like shape op) of ``a``."""
        shape = self._shape(a)
        nd = len(shape)
        forms: list[str] = ["{a}.unsqueeze({u})", "{a}.reshape(-1)", "{a}.flatten()"]
        u = int(self.rng.integers(-nd - 1, nd + 1))
        extra: dict[str, Any] = {"u": u}
        if nd >= 1:
            d = self._dim(nd)
            n = shape[d]
            start = int(self.rng.integers(0, max(n, 1)))
            extra.update(d=d, s=start, length=max(n - start, 0), i=start if n else 0)
            forms += [
                "{a}[1:]",
                "{a}[::2]",
                "{a}[..., 1:3]",
                "{a}[-1]",
                "{a}.narrow({d}, {s}, {length})",
                "{a}.select({d}, {i})",
                "{a}.flip({d})",
                "{a}.view(-1)",
                "{a}.contiguous()",
                "{a}.reshape({rs})",
                "{a}.view({rs})",
                "{a}.expand({ex})",
            ]
            extra["rs"] = self._reshape_target(shape)
            extra["ex"] = self._expand_target(shape)
        if 1 in shape:
            forms += ["{a}.squeeze({sq})", "{a}.squeeze()"]
            extra["sq"] = shape.index(1)
        if nd >= 2:
            perm = [int(p) for p in self.rng.permutation(nd)]
            extra.update(perm=tuple(perm), i0=0, i1=nd - 1)
            forms += [
                "{a}.transpose({i0}, {i1})",
                "{a}.permute{perm}",
                "{a}.mT",
                "{a}[:, ::2]",
                "{a}[:, 1]",
                "{a}.diagonal()",
                "fg.diagonal({a}, offset=1, dim1=-2, dim2=-1)",
                "{a}.movedim(0, -1)",
            ]
            if nd == 2:
                forms += ["{a}.t()", "{a}.T"]
        return self._choice(forms).format(a=a, **extra)

    def _reshape_target(self, shape: tuple[int, ...]) -> str:
        n = int(np.prod(shape)) if shape else 1
        divisors = [d for d in range(1, n + 1) if n % d == 0] or [1]
        first = self._choice(divisors)
        if n == 0:
            return self._choice(["(0, -1)", "(-1, 0)", "-1"]) if 0 in shape else "-1"
        if self._chance(0.5):
            return f"({first}, -1)"
        return f"({first}, {n // first})" if n // first != 1 else f"({first}, 1, -1)"

    def _expand_target(self, shape: tuple[int, ...]) -> str:
        dims = [d if d != 1 else int(self.rng.integers(1, 4)) for d in shape]
        if len(dims) < MAX_NDIM and self._chance(0.4):
            dims = [2, *dims]
        return repr(tuple(dims))

    def _view(self) -> tuple[list[str], str]:
        a = self._pick()
        self._use(a)
        out = self._name("v")
        return [f"{out} = {self._view_expr(a)}"], out

    def _inplace(self) -> tuple[list[str], str]:
        """An in-place op on a non-leaf, or through a view of one (CopySlices)."""
        lines: list[str] = []
        nonleaf = [n for n in self.s.pool if not self.ns[n].is_leaf]
        if nonleaf and self._chance(0.25):
            # an existing non-leaf, possibly saved by an op already (eager then raises its
            # "modified by an inplace operation" error, which compiled mode must repeat)
            t = self._choice(nonleaf)
        else:
            a = self._pick()
            t = self._name("v")
            base = self._choice(["{a}.clone()", "{a} * 1.5", "{a} + 0.0", "{a}.exp()", "-{a}"])
            lines.append(f"{t} = {base.format(a=a)}")
            exec(lines[-1], self.ns)
            self._use(a)
        target = t
        if self.ns[t].dim() >= 1 and self._chance(0.45):
            target = self._view_expr(t)
        shape = tuple(eval(target, self.ns).shape)
        b = self._partner(shape, grow=False)
        pb = b if b in _SCALARS else self._positive(b)
        forms = [
            "{t}.add_({b})",
            "{t}.sub_({b}, alpha=0.5)",
            "{t}.mul_({b})",
            "{t}.div_({pb})",
            "{t}.clamp_(-0.5, 0.5)",
            "{t}.clamp_(min=0.0)",
            "{t}.relu_()",
            "{t}.sigmoid_()",
            "{t}.tanh_()",
            "{t}.exp_()",
            "{t}.zero_()",
            "{t}.fill_(0.5)",
            "{t}.copy_({b})",
            "{t}.pow_(2)",
            "{t}.masked_fill_({t} > 0.3, -1.0)",
        ]
        if shape:
            n = shape[0]
            forms += [f"{{t}}[{int(self.rng.integers(max(n, 1)))}] = {{b0}}", "{t}[::2] = {b}"]
        b0 = b if b in _SCALARS else self._choice(_SCALARS)
        code = self._choice(forms).format(t=target, b=b, pb=pb, b0=b0)
        if b not in _SCALARS:
            self._use(b)
        lines.append(code)
        return lines, None if t in self.s.pool else t

    def _matmul(self) -> tuple[list[str], str]:
        a = self._pick(lambda t: t.dim() >= 1)
        shape = self._shape(a)
        k = int(self.rng.integers(1, 5))
        out = self._name("v")
        self._use(a)
        nd = len(shape)
        forms: list[Callable[[], str]] = [
            lambda: f"{a} @ {self._leaf((shape[-1], k))}",
            lambda: f"F.linear({a}, {self._leaf((k, shape[-1]))}, {self._leaf((k,))})",
            lambda: f"F.linear({a}, {self._leaf((k, shape[-1]))})",
            lambda: f"fg.matmul({a}, {self._leaf((shape[-1],))})",
        ]
        if nd >= 2:
            forms += [
                lambda: f"{a} @ {a}.transpose(-2, -1)",
                lambda: f"{a}.mT @ {a}",
                lambda: f"{self._leaf((k, shape[-2]))} @ {a}",
            ]
        if nd == 2:
            forms += [
                lambda: f"fg.mm({a}, {self._leaf((shape[-1], k))})",
                lambda: f"{a}.mv({self._leaf((shape[-1],))})",
                lambda: f"fg.einsum('ij,jk->ik', {a}, {self._leaf((shape[-1], k))})",
            ]
        if nd == 3:
            forms.append(lambda: f"fg.bmm({a}, {self._leaf((shape[0], shape[2], k))})")
        if nd == 1:
            forms += [
                lambda: f"fg.dot({a}, {self._leaf(shape)})",
                lambda: f"fg.outer({a}, {self._leaf((k,))})",
            ]
        return [f"{out} = {self._choice(forms)()}"], out

    def _nn(self) -> tuple[list[str], str]:
        a = self._pick(lambda t: t.dim() >= 1)
        shape = self._shape(a)
        nd = len(shape)
        d = self._dim(nd)
        out = self._name("v")
        self._use(a)
        n = shape[-1]
        forms: list[Callable[[], str]] = [
            lambda: f"F.softmax({a}, dim={d})",
            lambda: f"F.log_softmax({a}, dim={d})",
            lambda: f"{a}.softmax({d})",
            lambda: f"fg.log_softmax({a}, {d})",
            lambda: f"F.layer_norm({a}, ({n},))",
            lambda: f"F.layer_norm({a}, ({n},), {self._leaf((n,))}, {self._leaf((n,))})",
            lambda: f"F.normalize({a}, dim=-1)",
            lambda: f"F.mse_loss({a}, {self._leaf(shape, requires_grad=False)})",
            lambda: f"F.l1_loss({a}, {self._leaf(shape)}, reduction='sum')",
            lambda: (
                f"F.binary_cross_entropy_with_logits({a}, "
                f"{self._leaf(shape, requires_grad=False, positive=True)}.clamp(max=1.0))"
            ),
        ]
        if nd >= 2:
            norm = f"({shape[-2]}, {n})"
            forms.append(lambda: f"F.layer_norm({a}, {norm})")
        if nd == 2 and n >= 1:
            forms += [
                lambda: f"F.cross_entropy({a}, {self._target(shape)})",
                lambda: f"F.cross_entropy({a}, {self._target(shape)}, reduction='sum')",
                lambda: f"F.cross_entropy({a}, {self._target(shape)}, label_smoothing=0.1)",
                lambda: f"F.nll_loss(F.log_softmax({a}, dim=1), {self._target(shape)})",
            ]
        return [f"{out} = {self._choice(forms)()}"], out

    def _target(self, shape: tuple[int, ...]) -> str:
        return self._int_leaf(self.rng.integers(0, shape[1], size=shape[0]))

    def _misc(self) -> tuple[list[str], str]:
        a = self._pick()
        shape = self._shape(a)
        out = self._name("v")
        self._use(a)
        forms: list[Callable[[], str]] = [
            lambda: f"{a}.to(HI)",
            lambda: f"fg.stack([{a}, {a}.exp()])",
            lambda: f"{a}.clone()",
            lambda: f"{a}.expand_as({self._partner(shape, grow=True, scalar=False)} + {a})",
        ]
        if not self.smooth:  # a detached use is invisible to gradcheck's finite differences
            forms.append(lambda: f"{a} * {a}.detach()")
        if self.precision != "float64":  # (a float64 program stays float64: see _reference)
            forms.append(lambda: f"{a}.to(LO)")
        if shape:
            n = shape[0]
            forms += [
                lambda: f"fg.cat([{a}, {self._leaf(shape)}], dim=0)",
                lambda: f"{a}[{self._index(n, 3)}]",
                lambda: f"{a}.index_select(0, {self._index(n, 2)})",
                lambda: f"{a}.roll(1, 0)",
                lambda: f"{a}.repeat({(2,) + (1,) * (len(shape) - 1)})",
                lambda: f"{a}.split(2)[0]",
                lambda: f"{a}.cumsum(0).flip(0)",
                lambda: f"{a}.unbind(0)[0] * {a}.unbind(0)[-1]",  # multi-output nodes
                lambda: f"fg.gather({a}, -1, {self._gather_index(shape)})",
                lambda: f"{a}[{a} > 0]",  # a data-dependent shape: falls back to eager
            ]
        if len(shape) >= 2:
            forms += [lambda: f"{a}.tril()", lambda: f"F.pad({a}, (1, 0))"]
        heights = [d for d in range(2, int(np.prod(shape))) if np.prod(shape) % d == 0]
        if len(shape) >= 1 and heights:
            h = self._choice(heights)
            image = f"{a}.reshape(1, 1, {h}, -1)"  # N, C, H, W
            forms += [
                lambda: f"F.avg_pool2d({image}, 2, stride=1)",
                lambda: f"F.max_pool2d({image}, 2, stride=1)",
                lambda: f"F.conv2d({image}, {self._leaf((2, 1, 2, 2))}, {self._leaf((2,))})",
            ]
        return [f"{out} = {self._choice(forms)()}"], out

    def _gather_index(self, shape: tuple[int, ...]) -> str:
        n = shape[-1]
        index_shape = (*shape[:-1], int(self.rng.integers(1, 4)))
        values = self.rng.integers(0, n, size=index_shape) if n else np.zeros(index_shape, int)
        return self._int_leaf(values)

    def _index(self, n: int, size: int) -> str:
        """An int64 index leaf into a dim of size ``n`` (repeats allowed: gradients add)."""
        return self._int_leaf(self.rng.integers(0, n, size=size) if n else np.zeros(0, np.int64))

    def _hook(self) -> tuple[list[str], None]:
        names = [n for n in self.s.pool if self.ns[n].requires_grad and n not in self.s.hooked]
        if not names:
            raise _Rejected("nothing to hook")
        t = self._choice(names)
        leaf = self.ns[t].is_leaf
        forms = ["lambda g: None"]  # an observer: gradients unchanged (fine for gradcheck)
        if not self.smooth:
            forms += ["lambda g: g * 2.0", "lambda g: g.clamp(-1.0, 1.0)", "lambda g: g + 1.0"]
        lines = []
        if not leaf and self._chance(0.5):
            lines.append(f"{t}.retain_grad()")
            self.s.kept.append(t)
        else:
            lines.append(f"{t}.register_hook({self._choice(forms)})")
        self.s.hooked.add(t)
        return lines, None

    # -- the program --

    def build(self) -> Program:
        n_leaves = int(self.rng.integers(1, 4))
        self._leaf(self.base, requires_grad=True)
        for _ in range(n_leaves - 1):
            self._leaf(self._variant(self.base, grow=False))
        makers: list[tuple[Callable[[], tuple[list[str], str | None]], float]] = [
            (self._unary, 22),
            (self._binary, 22),
            (self._reduction, 10),
            (self._view, 13),
            (self._inplace, 8),
            (self._matmul, 6),
            (self._nn, 8),
            (self._misc, 5),
            (self._hook, 4),
        ]
        weights = np.array([w for _, w in makers], dtype=float)
        weights /= weights.sum()
        n_ops = int(self.rng.integers(2, self.max_ops + 1))
        made = tries = 0
        while made < n_ops and tries < 20 * n_ops:
            tries += 1
            make = makers[int(self.rng.choice(len(makers), p=weights))][0]
            if self._attempt(make):
                made += 1
        return self._finish()

    def _finish(self) -> Program:
        s = self.s
        grad_values = [n for n in s.pool if self.ns[n].requires_grad]
        sinks = [n for n in grad_values if n not in s.consumed and not self.ns[n].is_leaf]
        # every value nothing else used is an output (the newest few), so little is dead code
        outputs = sinks[-5:] or grad_values[-1:] or s.pool[-1:]
        cotangents = tuple(_literal(self._cotangent(self._shape(o))) for o in outputs)
        leaves_rg = [leaf.name for leaf in s.leaves if leaf.requires_grad]
        kept = list(dict.fromkeys(s.kept))
        backward: list[str] = []
        results: list[tuple[str, str]] = []
        presets: list[tuple[str, str]] = []
        strided: list[str] = []
        loss = " + ".join(f"(outs[{i}] * C[{i}]).sum()" for i in range(len(outputs)))
        kind = str(
            self.rng.choice(
                ["loss", "autograd.backward", "grad", "inputs", "create_graph"],
                p=[0.38, 0.22, 0.2, 0.17, 0.03],
            )
        )
        twice = kind in ("loss", "autograd.backward", "inputs") and self._chance(0.12)
        if kind == "grad" or kind == "inputs":
            candidates = leaves_rg + [n for n in s.pool if not self.ns[n].is_leaf]
            candidates = [n for n in candidates if self.ns[n].requires_grad]
            count = int(self.rng.integers(1, min(3, len(candidates)) + 1)) if candidates else 0
            chosen = [candidates[int(i)] for i in self.rng.permutation(len(candidates))[:count]]
            if not chosen:
                kind = "loss"
            for n in chosen:
                if not self.ns[n].is_leaf and n not in kept:
                    kept.append(n)
        else:
            chosen = []
        ref = {n: n if self.ns[n].is_leaf else f'kept["{n}"]' for n in s.pool}
        if kind != "grad" and leaves_rg and not self.smooth and self._chance(0.15):
            for name in leaves_rg[: int(self.rng.integers(1, len(leaves_rg) + 1))]:
                presets.append((name, _literal(self._cotangent(self._shape(name)))))
                if len(self._shape(name)) >= 2 and self._chance(0.4):
                    strided.append(name)
        retain = ", retain_graph=True" if twice else ""
        if kind == "loss" or kind == "create_graph":
            flag = ", create_graph=True" if kind == "create_graph" else retain
            backward += [f"loss = {loss}", f"loss.backward({flag.lstrip(', ')})"]
            if twice:
                backward.append("loss.backward()")
        elif kind == "autograd.backward":
            backward.append(f"fg.autograd.backward(outs, C{retain})")
            if twice:
                backward.append("fg.autograd.backward(outs, C)")
        elif kind == "inputs":
            inputs = "[" + ", ".join(ref[n] for n in chosen) + "]"
            backward += [f"loss = {loss}", f"loss.backward(inputs={inputs}{retain})"]
            if twice:
                backward.append(f"loss.backward(inputs={inputs})")
            results += [(f"{n}.grad", f"{ref[n]}.grad") for n in chosen if n not in leaves_rg]
        else:
            inputs = "[" + ", ".join(ref[n] for n in chosen) + "]"
            backward.append(
                f"gs = fg.autograd.grad(outs, {inputs}, grad_outputs=C, allow_unused=True)"
            )
            results += [(f"grad({n})", f"gs[{i}]") for i, n in enumerate(chosen)]
        nonleaf = [n for n in chosen if not self.ns[n].is_leaf]
        if nonleaf and np.random.default_rng((self.seed, 17)).random() < 0.5:
            # then a backward through the history of a non-leaf input: the call above must
            # have left it alone (eager runs nothing beyond its inputs, and frees nothing
            # there); a separate stream, so that the draws above and below stay as they were
            backward.append(f"({ref[nonleaf[0]]} * 0.5).sum().backward()")
        results = [(f"{n}.grad", f"{n}.grad") for n in leaves_rg] + results
        results += [(f"{n}.grad", f'kept["{n}"].grad') for n in s.kept]
        results += [(f"{n}.grad is preset", f"{n}.grad is P_{n}") for n, _ in presets]
        results += [(f"C[{i}] after backward", f"C[{i}]") for i in range(len(outputs))]
        # one entry per label (a retained value may also be an input of backward(inputs=))
        unique = dict(results)
        return Program(
            seed=self.seed,
            precision=self.precision,
            leaves=tuple(s.leaves),
            forward=tuple(s.lines),
            outputs=tuple(outputs),
            kept=tuple(kept),
            cotangents=cotangents,
            presets=tuple(presets),
            strided_presets=tuple(strided),
            backward=tuple(backward),
            results=tuple(unique.items()),
            forward_in_region=self._chance(0.6),
            gradcheck=self.gradcheck,
            generated_code=self.seed % 4 == 3,
            native=self.seed % 4 == 1,
        )

    def _cotangent(self, shape: tuple[int, ...]) -> np.ndarray:
        values = np.asarray(self.rng.standard_normal(shape))
        return values if self.smooth else np.round(values, 3)


def _snapshot_state(s: _State) -> _State:
    return _State(
        list(s.leaves),
        list(s.lines),
        list(s.pool),
        set(s.consumed),
        list(s.kept),
        set(s.hooked),
    )


def _namespace() -> dict[str, Any]:
    """The globals of a program's script, for the generator's eager execution."""
    return {
        "scale": 1.0,
        "np": np,
        "fg": fg,
        "F": F,
        "LO": fg.float32,
        "HI": fg.float64,
        "inf": np.inf,
        "nan": np.nan,
    }


def _number(x: float) -> str:
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def _literal(values: np.ndarray) -> str:
    """Python source for a float array: nested lists, or ``np.zeros(shape)`` when empty."""
    if values.size == 0:
        return f"np.zeros({tuple(values.shape)!r})"

    def rec(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(rec(x) for x in v) + "]"
        return _number(v)

    return rec(values.tolist())


# ---- the script --------------------------------------------------------------------------------

_SCRIPT_HELPERS = '''
def attempt(region=contextlib.nullcontext, scales=(1.0,), step=None):
    """run() once per scale of the leaf data (the last result kept) -- or run_whole(step), the
    whole-step form, when a compiled ``step`` is given -- or what it raised."""
    try:
        for scale in scales:
            result = run(region, scale) if step is None else run_whole(step, scale)
        return result
    except Exception as e:  # compared by type and message
        return e


def differences(want, got):
    """What differs between two results of run(): presence, dtype, shape, NaN/+inf/-inf
    positions, and finite values beyond rtol (1e-5 float32, 1e-10 float64) with an absolute
    floor of rtol * max|eager| (the checker adds a measured rounding-error term, see
    benchmarks/fuzzgen.py)."""
    if isinstance(want, Exception) or isinstance(got, Exception):
        same = type(want) is type(got) and str(want) == str(got)
        if same:
            return []
        return [
            f"{name}: {r!r}" if isinstance(r, Exception) else f"{name}: no exception"
            for name, r in (("eager", want), ("compiled", got))
        ]
    bad = []
    for key, w in want.items():
        g = got.get(key)
        if not isinstance(w, fg.Tensor) or not isinstance(g, fg.Tensor):
            if not (w is g or (isinstance(w, bool) and w == g)):
                bad.append(f"{key}: eager {w!r}, compiled {g!r}")
            continue
        a, b = w.detach().numpy(), g.detach().numpy()
        if w.dtype != g.dtype or a.shape != b.shape:
            bad.append(f"{key}: eager {w.dtype} {a.shape}, compiled {g.dtype} {b.shape}")
            continue
        for test in (np.isnan, np.isposinf, np.isneginf):
            if (test(a) != test(b)).any():
                bad.append(f"{key}: {test.__name__} differs\\n  eager    {a!r}\\n  compiled {b!r}")
        finite = np.isfinite(a) & np.isfinite(b)
        rtol = 1e-5 if w.dtype == fg.float32 else 1e-10
        atol = rtol * float(np.abs(a[finite]).max(initial=0.0))
        if not np.allclose(b[finite], a[finite], rtol=rtol, atol=atol):
            err = float(np.abs(b[finite] - a[finite]).max())
            bad.append(f"{key}: max |difference| {err:.3g}\\n  eager    {a!r}\\n  compiled {b!r}")
    return bad
'''


def _render(p: Program, config: Config, verdict: str) -> str:
    names = [leaf.name for leaf in p.leaves]
    args = ", ".join(names)
    tuple_ = f"({names[0]},)" if len(names) == 1 else args
    lines: list[str] = []
    add = lines.append
    add(f'"""fusegrad fuzz program, seed {p.seed} ({p.precision}), from benchmarks/fuzzgen.py.')
    add("")
    if config is GRADCHECK:
        add("Runs fusegrad.autograd.gradcheck(objective, leaves()) on the compiled path;")
    else:
        add(f"Runs the program eagerly and compiled ({_describe(config)}), prints what")
        add("differs and exits 1 if anything does.")
    if verdict:
        add("")
        add("The checker reported:")
        lines.extend("    " + v for v in verdict.rstrip().splitlines())
    add('"""')
    add("")
    add("import contextlib")
    add("import sys")
    add("")
    add("import numpy as np")
    add("")
    add("import fusegrad as fg")
    add("import fusegrad.nn.functional as F")
    add("from fusegrad import compiler")
    add("")
    add("# the program's float dtypes; the checker's shadow run sets both to one dtype")
    add("LO, HI = fg.float32, fg.float64")
    add("inf, nan = np.inf, np.nan")
    add("")
    add("")
    add("def leaves(scale=1.0):")
    lines.extend("    " + leaf.line() for leaf in p.leaves)
    add(f"    return {tuple_}")
    add("")
    add("")
    add(f"def forward({args}):")
    lines.extend("    " + line for line in p.forward)
    kept = ", ".join(f'"{n}": {n}' for n in p.kept)
    add(f"    return [{', '.join(p.outputs)}], {{{kept}}}")
    add("")
    add("")
    add("class Net(fg.nn.Module):")
    add('    """forward() as a module (the compile(module) configuration compiles it)."""')
    add("")
    add("    def forward(self, *xs):")
    add("        return forward(*xs)")
    add("")
    add("")
    add("FORWARD = forward  # the compile(module) configuration: fg.compile(Net())")
    add("")
    add("")
    add("COTANGENTS = [")
    lines.extend(f"    np.array({c})," for c in p.cotangents)
    add("]")
    if p.presets:
        add("PRESETS = {")
        lines.extend(f'    "{n}": np.array({c}),' for n, c in p.presets)
        add("}")
    add("")
    add("")
    add("def roots(outs):")
    add('    """The root gradients: COTANGENTS in the dtypes of the outputs."""')
    add("    return [fg.tensor(c, dtype=o.dtype) for c, o in zip(COTANGENTS, outs)]")
    add("")
    add("")
    add("def run(region=contextlib.nullcontext, scale=1.0):")
    add(f"    {tuple_} = leaves(scale)" if len(names) > 1 else f"    ({names[0]},) = leaves(scale)")
    lines.extend(_preset_lines(p))
    indent = "    "
    if not p.forward_in_region:
        add(f"    outs, kept = FORWARD({args})")
    add("    with region():")
    indent = "        "
    if p.forward_in_region:
        add(f"{indent}outs, kept = FORWARD({args})")
    add(f"{indent}C = roots(outs)")
    lines.extend(indent + line for line in p.backward)
    add("    return {")
    lines.extend(f'        "{label}": {expr},' for label, expr in p.results)
    add("    }")
    add("")
    add("")
    # the whole-step form: leaves, root gradients and preset gradients are arguments (tensors
    # made inside a compiled function from Python data are not replayable); identity checks
    # of the presets are made outside, after the call
    presets = [f"P_{n}" for n, _ in p.presets]
    add(f"def whole({', '.join([*names, 'C', *presets])}):")
    add(f"    outs, kept = forward({args})")
    lines.extend("    " + line for line in p.backward)
    add("    return {")
    lines.extend(
        f'        "{label}": {expr},' for label, expr in p.results if not label.endswith("preset")
    )
    add("    }")
    add("")
    add("")
    add("def run_whole(step, scale=1.0):")
    add(f"    {tuple_} = leaves(scale)" if len(names) > 1 else f"    ({names[0]},) = leaves(scale)")
    lines.extend(_preset_lines(p))
    add("    outs, _ = forward(*leaves(scale))  # (the root gradients' dtypes)")
    add("    C = roots(outs)")
    add(f"    result = step({', '.join([*names, 'C', *presets])})")
    for label, expr in p.results:
        if label.endswith("preset"):
            add(f'    result["{label}"] = {expr}')
    add("    return result")
    add("")
    add("")
    add("def objective(*xs):")
    add('    """What gradcheck differentiates: each output weighted by its COTANGENT, summed (one')
    add('    scalar per output, so that finite differences resolve each at its own scale)."""')
    add("    outs, _ = forward(*xs)")
    add("    weighted = [o * fg.tensor(c, dtype=o.dtype) for o, c in zip(outs, COTANGENTS)]")
    add("    return tuple(w.sum() for w in weighted)")
    add("")
    lines.extend(_SCRIPT_HELPERS.splitlines())
    add("")
    add("")
    add('if __name__ == "__main__":')
    add("    compiler.config.background_compile = False  # (compiled code on the calls compared)")
    if config is GRADCHECK:
        add("    with compiler.compiled_autograd():")
        add("        fg.autograd.gradcheck(objective, leaves())  # raises on a Jacobian mismatch")
        add('    print("gradcheck passed")')
        return "\n".join(lines) + "\n"
    scales = ", scales=" + repr(config.scales) if config.scales != (1.0,) else ""
    add(f"    eager = attempt(scales={config.scales!r})")
    if config.module:
        add("    FORWARD = fg.compile(Net())")
        add(f"    compiled = attempt(scales={config.scales!r})")
        add("    problems = differences(eager, compiled)")
        add("    print(compiler.counters)")
        add('    print("\\n".join(problems) or "no difference")')
        add("    sys.exit(1 if problems else 0)")
        return "\n".join(lines) + "\n"
    if config.whole:
        if config.native:
            add("    compiler.config.native_programs = True  # (native segments)")
        add(f"    compiled = attempt(step=fg.compile(whole){scales})")
        add("    problems = differences(eager, compiled)")
        add("    print(compiler.counters)")
        add('    print("\\n".join(problems) or "no difference")')
        add("    sys.exit(1 if problems else 0)")
        return "\n".join(lines) + "\n"
    if config.interpreter_max_elements is not None:
        add(f"    compiler.config.interpreter_max_elements = {config.interpreter_max_elements}")
    if config.native:
        add("    compiler.config.native_programs = True  # (native segments at the sizes)")
    add(f'    compiled = attempt(lambda: compiler.compiled_autograd(mode="{config.mode}"){scales})')
    add("    problems = differences(eager, compiled)")
    add("    print(compiler.counters)")
    add('    print("\\n".join(problems) or "no difference")')
    add("    sys.exit(1 if problems else 0)")
    return "\n".join(lines) + "\n"


def _preset_lines(p: Program) -> list[str]:
    """run()'s lines that set the preset ``.grad`` of leaves (and keep them as ``P_name``)."""
    lines = []
    for n, _ in p.presets:
        if n in p.strided_presets:  # accumulation into a non-contiguous .grad
            data = f'PRESETS["{n}"].swapaxes(-1, -2)'
            lines.append(f"    {n}.grad = fg.tensor({data}, dtype={n}.dtype).transpose(-1, -2)")
        else:
            lines.append(f'    {n}.grad = fg.tensor(PRESETS["{n}"], dtype={n}.dtype)')
        lines.append(f"    P_{n} = {n}.grad")
    return lines


def _describe(config: Config) -> str:
    if config is CACHED:
        return (
            'compiled_autograd(mode="default") twice, the second time with the leaf data '
            f"scaled by {NEW_SCALE}: a cache hit that must compute on the new arrays"
        )
    if config.interpreter_max_elements == 0:
        return (
            'compiled_autograd(mode="default") with config.interpreter_max_elements = 0: '
            "every kernel as generated code"
        )
    return f'compiled_autograd(mode="{config.mode}")'


# ---- the checker -------------------------------------------------------------------------------


@dataclass
class Finding:
    """One failure of one program under one configuration."""

    seed: int
    config: str
    kind: str  # "mismatch", "crash" or "gradcheck"
    message: str
    script: str  # the standalone repro

    def __str__(self) -> str:
        return f"seed {self.seed} [{self.config}] {self.kind}: {self.message}"


@dataclass
class Report:
    """What checking one program found, and what the compiler did meanwhile."""

    seed: int
    findings: list[Finding] = field(default_factory=list)
    fallbacks: Counter = field(default_factory=Counter)  # reason -> backward calls
    captures: int = 0  # backward graphs captured
    builds: int = 0  # programs built (a program-cache miss)
    cache_hits: int = 0  # backwards run by a cached program
    compiled_runs: int = 0
    step_runs: int = 0  # whole-step replays
    step_breaks: Counter = field(default_factory=Counter)  # recordings not replayable, by reason
    native_runs: int = 0  # native segment calls that ran to the end
    native_steps: int = 0  # program steps those calls ran
    native_dropped: Counter = field(default_factory=Counter)  # segments run step by step, why
    eager_error: str | None = None  # the exception eager raised (compiled must match it)
    gradcheck: str = "n/a"  # "passed", "failed", "skipped (...)", "inconclusive (...)", "n/a"
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings


class _Module:
    """A program's script, executed once: its functions, and its dtype globals."""

    def __init__(self, program: Program) -> None:
        source = program.source()
        filename = f"<fuzz program {program.seed}>"
        # tracebacks show the program's lines; only the latest program's are kept (a campaign
        # runs thousands)
        for old in [k for k in linecache.cache if k.startswith("<fuzz program ")]:
            del linecache.cache[old]
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        self.ns: dict[str, Any] = {"__name__": f"fuzz_{program.seed}"}
        exec(compile(source, filename, "exec"), self.ns)

    @contextlib.contextmanager
    def dtypes(self, dtype: Any) -> Iterator[None]:
        previous = self.ns["LO"], self.ns["HI"]
        self.ns["LO"] = self.ns["HI"] = dtype
        try:
            yield
        finally:
            self.ns["LO"], self.ns["HI"] = previous

    @contextlib.contextmanager
    def moved_roots(self, rng: np.random.Generator) -> Iterator[None]:
        """``roots()`` with every finite nonzero element of every root gradient moved by one
        ulp of its output's dtype, up or down at random: a change of the data below the
        rounding of any computation on it (the comparison's perturbed runs)."""
        original = self.ns["roots"]

        def moved(outs: Sequence[Any]) -> list:
            out = []
            for t in original(outs):
                a = t.numpy()
                if t.dtype.is_floating_point and a.size:
                    up = rng.random(a.shape) < 0.5
                    toward = np.where(up, np.inf, -np.inf).astype(a.dtype)
                    change = np.isfinite(a) & (a != 0)
                    a = np.where(change, np.nextafter(a, toward), a)
                    t = fg.tensor(a, dtype=t.dtype)
                out.append(t)
            return out

        self.ns["roots"] = moved
        try:
            yield
        finally:
            self.ns["roots"] = original

    def run(
        self,
        region: Callable[[], Any] | None = None,
        scales: Sequence[float] = (1.0,),
        term_scales: dict[str, float] | None = None,
        whole: bool = False,
        module: bool = False,
        jitter: np.random.Generator | None = None,
        jitter_forward: bool = False,
    ) -> Any:
        """Snapshots of run()'s results (once per leaf-data scale, the last kept), or the
        exception it raised.  ``term_scales`` (eager runs only) receives each result's term
        scale (``_TermScales``); ``jitter`` (eager runs only): the backward's cancellations
        move by a sample of their rounding error, at random from it (``_Jitter``), and with
        ``jitter_forward`` every value the forward rounds moves by one ulp too."""
        observer = _TermScales() if term_scales is not None else None
        tracer = _Jitter(jitter, jitter_forward) if jitter is not None else observer
        try:
            with warnings.catch_warnings(), tracing(tracer):
                warnings.simplefilter("ignore")
                step = fg.compile(self.ns["whole"]) if whole else None
                if module:
                    self.ns["FORWARD"] = fg.compile(self.ns["Net"]())
                for scale in scales:
                    if observer is not None:
                        observer.reset()
                    if step is not None:
                        result = self.ns["run_whole"](step, scale)
                        continue
                    result = self.ns["run"](region or contextlib.nullcontext, scale)
                if observer is not None and term_scales is not None:
                    term_scales.update(observer.by_key(result))
                return {k: _snapshot(v) for k, v in result.items()}
        except Exception as e:
            return e
        finally:
            self.ns["FORWARD"] = self.ns["forward"]


def _finite_max(t: Any) -> float:
    if not isinstance(t, fg.Tensor) or not t.dtype.is_floating_point:
        return 0.0
    a = np.asarray(t.detach().numpy(), dtype=np.float64)
    return float(np.abs(a[np.isfinite(a)]).max(initial=0.0))


class _TermScales(Executor, Tracer):
    """Observes an eager backward: a tracer whose ``backward`` runs the eager engine with this
    executor, which performs every step as ``EAGER`` does and records the largest finite
    gradient flowing on any path into each ``.grad`` it writes.  That is the scale of the terms
    a compiled kernel may contract into an FMA: where eager's terms cancel exactly (``g*a -
    g*a``), the contraction leaves the rounding error of one product, ``~u * |g*a|``, which the
    results and the root gradients alone do not bound (seeds 3195, 3495)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.upstream: dict[Any, float] = {}
        self.written: list[tuple[Any, float]] = []  # (the .grad tensor, its scale)
        self.largest = 0.0

    def backward(  # type: ignore[override]
        self,
        roots: Sequence[Any],
        grads: Sequence[Any],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Any] | None,
        accumulate: bool,
    ) -> Any:
        for g in grads:
            self.largest = max(self.largest, _finite_max(g))
        return run_backward(
            roots, grads, retain_graph, create_graph, inputs, accumulate, executor=self
        )

    def apply_node(self, node: Any, grads: list, retain_graph: bool) -> tuple:
        here = max([self.upstream.get(node, 0.0), *(_finite_max(g) for g in grads)])
        results = super().apply_node(node, grads, retain_graph)
        for edge, r in zip(node.next_functions, results):
            target = edge[0] if edge is not None else None
            if target is not None:
                reach = max(here, _finite_max(r))
                self.upstream[target] = max(self.upstream.get(target, 0.0), reach)
                self.largest = max(self.largest, reach)
        return results

    def accumulate_grad(self, t: Any, g: Any, create_graph: bool) -> None:
        scale = _finite_max(g)
        for node, reach in self.upstream.items():
            if isinstance(node, AccumulateGrad) and node.variable is t:
                scale = max(scale, reach)
        if t.grad_fn is not None:
            scale = max(scale, self.upstream.get(t.grad_fn, 0.0))
        super().accumulate_grad(t, g, create_graph)
        self.written.append((t.grad, scale))

    def by_key(self, result: dict) -> dict[str, float]:
        """Each result's scale: the largest of its ``.grad`` writes, else (a result ``grad()``
        returned, a tensor of the forward) the largest gradient of the whole backward."""
        scales: dict[str, float] = {}
        for key, value in result.items():
            mine = [scale for t, scale in self.written if t is value]
            scales[key] = max(mine) if mine else self.largest
        return scales


class _Jitter(Executor, Tracer):
    """Runs an eager backward with each node's result moved by a measured sample of its own
    rounding error, where that error is beyond a few roundoffs of the result (a cancellation):
    each node's rule runs a second time on its incoming gradients scaled by a random factor
    in 1.25..1.75 (every rule is linear in them), and the second result scaled back
    differs from the first only by rounding -- ``u`` times the terms the rule sums, not times
    the result.  Where that difference exceeds ``8 u |result|``, the element moves by it, up
    or down at random; later nodes then carry and amplify it as they would an FMA's rounding
    error (fuzz seed 301685: log_softmax's backward cancels terms of 0.555 to 2.2e-16, which
    pow and var multiply by 51).  Elements whose rounding is their own (a product, a sum of
    terms of one sign, a scaling by 1e-30), exact zeros and non-finite elements stay, so a
    constant gradient stays constant and eager's exact cancellations exact.

    With ``forward``, it also takes the forward's primitive calls (``apply``) and moves every
    element they round by one ulp (``_forward_moved``): the rounding of a compiled forward,
    which the backward then amplifies (fuzz seed 302916)."""

    def __init__(self, rng: np.random.Generator, forward: bool = False) -> None:
        self.rng = rng
        # ``forward``: the forward's computed values move too (``_forward_moved``), each by one
        # ulp in a direction that is a function of the value and of this salt alone
        self.salt = int(rng.integers(1, 2**63)) if forward else None
        self.backward_depth = 0  # (the rules a backward runs are not the forward's)

    def backward(  # type: ignore[override]
        self,
        roots: Sequence[Any],
        grads: Sequence[Any],
        retain_graph: bool,
        create_graph: bool,
        inputs: Sequence[Any] | None,
        accumulate: bool,
    ) -> Any:
        self.backward_depth += 1
        try:
            return run_backward(
                roots, grads, retain_graph, create_graph, inputs, accumulate, executor=self
            )
        finally:
            self.backward_depth -= 1

    def apply(self, prim: Any, inputs: tuple, attrs: dict) -> Any:
        """A forward's primitive call (``forward`` runs only): run eagerly by a kernel whose
        result moves as ``_forward_moved`` says; the backward node is eager's, saving the moved
        result, as a compiled forward's backward reads the compiled forward's values.  Movement
        primitives (views, copies, gathers) compute nothing and stay, and so do casts, which
        compiled code rounds to nearest as numpy does."""
        if self.salt is None or self.backward_depth or prim.kind == "movement":
            return NotImplemented
        if prim.name == "cast":
            return NotImplemented
        kernel = prim.kernel

        def moved_kernel(*arrays: Any, **kwargs: Any) -> Any:
            data = kernel(*arrays, **kwargs)
            if self.backward_depth or self.salt is None:  # (a rule that calls node.prim)
                return data
            return _forward_moved(data, kernel, arrays, kwargs, self.salt)

        return run_primitive(
            dataclasses.replace(prim, kernel=moved_kernel, ufunc=None), inputs, attrs
        )

    def apply_node(self, node: Any, grads: list, retain_graph: bool) -> tuple:
        # (a factor of order 1, so that the second run's products round at other fractions
        # of an ulp: a factor near 1 rounds them alike -- 0.555 f (1 - 2**-51) drops 2.22 f
        # ulp of 0.555 f, rounded to 2 for every f below 1.12: seed 301685's cancellation)
        factor = 1.0 + float(self.rng.uniform(0.25, 0.75))
        floats = [isinstance(g, fg.Tensor) and g.dtype in _FLOATS for g in grads]
        if not any(floats):
            return super().apply_node(node, grads, retain_graph)
        try:  # (first, keeping the saved tensors for the run that counts)
            with fg.no_grad():
                scaled = [g * factor if f else g for g, f in zip(grads, floats)]
                again = super().apply_node(node, scaled, True)
        except Exception:
            again = None
        results = super().apply_node(node, grads, retain_graph)
        if again is None or len(again) != len(results):
            return results
        return tuple(self._moved(r, a, factor) for r, a in zip(results, again))

    def _moved(self, r: Any, again: Any, factor: float) -> Any:
        if not (isinstance(r, fg.Tensor) and isinstance(again, fg.Tensor)):
            return r
        if r.dtype not in _FLOATS or again.dtype != r.dtype or again.shape != r.shape:
            return r
        a = r.detach().numpy().astype(np.float64)
        with np.errstate(all="ignore"):
            noise = np.abs(again.detach().numpy().astype(np.float64) / factor - a)
            moved = np.isfinite(a) & (a != 0) & np.isfinite(noise)
            moved &= noise > 8.0 * UNIT_ROUNDOFF[r.dtype.name] * np.abs(a)
        if not moved.any():
            return r
        sign = np.where(self.rng.random(a.shape) < 0.5, 1.0, -1.0)
        delta = np.where(moved, sign * noise, 0.0).astype(r.detach().numpy().dtype)
        return r + fg.tensor(delta, dtype=r.dtype)


_FLOATS = (fg.float32, fg.float64)
# the dtype each float dtype's exactness is checked in (``_forward_moved``): x86's long double
# has 11 more bits than float64
_WIDER = {np.dtype(np.float32): np.dtype(np.float64), np.dtype(np.float64): np.dtype(np.longdouble)}
_HASH = np.uint64(0x9E3779B97F4A7C15)  # (Fibonacci hashing's odd constant)


def _forward_moved(
    data: Any, kernel: Callable[..., Any], arrays: tuple, attrs: dict, salt: int
) -> Any:
    """A forward kernel's result ``data`` with each element the kernel rounded moved by one ulp
    of its dtype (``_Jitter``'s forward runs): a compiled forward computes the same values by
    other code -- another exp (numpy's float32 exp is 2.1 ulp off at 4.517175, fuzz seed
    302916), an FMA, a float64 accumulator -- so its values differ from eager's by an ulp or a
    few, and the results that depend on them move by what the program amplifies that by.

    An element moves where the kernel rounded it: where the same kernel on the float inputs
    widened (float32 to float64, float64 to long double) gives another value.  Exact elements
    (a selection, a maximum, a sign, a floor, a product by 2, a mean of one element) stay, so
    that compiled code, which computes them exactly too, is not granted the spread of a floor
    moved across an integer or of a tie broken; so do the results of a kernel that cannot
    compute in the wider dtype (it raises, or computes in float64 anyway), which cannot tell.
    Zeros and non-finite elements stay.  The direction is a hash of the element's
    bits and ``salt``: equal values move alike, so that a tie between two computations of the
    same value stays a tie, as it does in compiled code."""
    if not isinstance(data, np.ndarray) or data.dtype not in _WIDER or data.size == 0:
        return data
    wider = _WIDER[data.dtype]
    try:
        widened = [
            a.astype(wider) if isinstance(a, np.ndarray) and a.dtype in _WIDER else a
            for a in arrays
        ]
        with np.errstate(all="ignore"):
            exact = np.asarray(kernel(*widened, **attrs))
        rounded = np.broadcast_to(data.astype(wider) != exact, data.shape)
    except Exception:  # (a kernel that takes no wider dtype)
        return data
    if exact.dtype != wider:
        # a kernel that computes in float64 whatever its input (scipy's functions, the norm
        # kernels' statistics) cannot tell which of its float64 elements are exact: they stay,
        # as in the checker without these runs (a layer norm over one element, whose mean is
        # exact and whose output is 0: moving the mean made the zeros unequal, and the amax
        # of them took another route, fuzz seed 303090)
        return data
    move = rounded & np.isfinite(data) & (data != 0)
    if not move.any():
        return data
    bits = data.view(np.uint32 if data.dtype == np.float32 else np.uint64).astype(np.uint64)
    mixed = (bits ^ np.uint64(salt)) * _HASH  # (uint64 arrays wrap)
    up = ((mixed ^ (mixed >> np.uint64(29))) >> np.uint64(40)) & np.uint64(1)
    toward = np.where(up == 1, np.inf, -np.inf).astype(data.dtype)
    return np.where(move, np.nextafter(data, toward), data)


@dataclass(frozen=True)
class _Array:
    values: np.ndarray
    dtype: str  # the fusegrad dtype's name


def _snapshot(value: Any) -> Any:
    if isinstance(value, fg.Tensor):
        return _Array(np.array(value.detach().numpy(), copy=True), value.dtype.name)
    return value


def _counts() -> tuple:
    c = compiler.counters
    return (
        c.captures,
        c.builds,
        c.cache_hits,
        c.compiled_runs,
        Counter(c.fallbacks),
        c.step_runs,
        Counter(c.step_breaks),
        c.native_runs,
        c.native_steps,
        Counter(c.native_dropped),
    )


def check(program: Program, only: Sequence[Config] | None = None) -> Report:
    """Run ``program`` eagerly and under every configuration; see the module docstring.

    ``only``: run just these configurations (each whether or not the seed draws it; gradcheck
    only when ``GRADCHECK`` is among them and the program is smooth)."""
    start = time.perf_counter()
    report = Report(program.seed)
    module = _Module(program)
    references = {1.0: _reference(program, module)}
    eager = references[1.0][0]
    if isinstance(eager, Exception):
        report.eager_error = f"{type(eager).__name__}: {eager}"
    configs = program.configs() if only is None else [c for c in only if c is not GRADCHECK]
    for config in configs:
        for scale in config.scales:
            if scale not in references:
                references[scale] = _reference(program, module, scale)
            # a configuration runs its scales in turn and stops at the first that raises
            # (the cached one: a program that raises at scale 1 but not at 0.75)
            if isinstance(references[scale][0], Exception):
                break
        finding = _run_config(program, module, config, *references[scale], report)
        if finding is not None:
            report.findings.append(finding)
    wanted = only is None or GRADCHECK in only
    if wanted and program.gradcheck and not isinstance(eager, Exception):
        report.gradcheck = _gradcheck(program, module, report)
    report.seconds = time.perf_counter() - start
    return report


def _reference(
    program: Program, module: _Module, scale: float = 1.0
) -> tuple[Any, list[dict], dict[str, float], list[dict], list[dict]]:
    """Eager results, the shadow runs' (none when eager raised), each result's term scale
    (``_TermScales``: the largest gradient flowing into it), and the perturbed runs' results.

    A shadow run is the same program with every float dtype changed to one precision: float64
    when the program uses float32 anywhere, float32 when it uses float64 anywhere (a mixed
    program gets both).  A perturbed run is the same program, eagerly, with its root gradients
    moved by one ulp (``_Module.moved_roots``; ``PERTURBED_RUNS`` of them, seeded by the
    program's seed), or with the cancellations inside its backward moved by a sample of their
    rounding error (``_Jitter``; ``JITTERED_RUNS`` of them), and the runs that also move every
    value the forward rounds by one ulp (``FORWARD_JITTERED_RUNS``), for the configurations
    that compile the forward: see the module docstring."""
    term_scales: dict[str, float] = {}
    eager = module.run(scales=(scale,), term_scales=term_scales)
    if isinstance(eager, Exception):
        return eager, [], {}, [], []
    rng = np.random.default_rng([program.seed, 1])
    perturbed = []
    for _ in range(PERTURBED_RUNS):
        with module.moved_roots(rng):
            moved = module.run(scales=(scale,))
        if not isinstance(moved, Exception):
            perturbed.append(moved)
    for _ in range(JITTERED_RUNS):
        moved = module.run(scales=(scale,), jitter=rng)
        if not isinstance(moved, Exception):
            perturbed.append(moved)
    forward_moved = []
    for _ in range(FORWARD_JITTERED_RUNS):
        moved = module.run(scales=(scale,), jitter=rng, jitter_forward=True)
        if not isinstance(moved, Exception):
            forward_moved.append(moved)
    precisions = []
    if program.precision != "float64":
        precisions.append(fg.float64)
    if program.precision != "float32":
        precisions.append(fg.float32)
    shadows = []
    for dtype in precisions:
        with module.dtypes(dtype):
            shadow = module.run(scales=(scale,))
        if not isinstance(shadow, Exception):
            shadows.append(shadow)
    return eager, shadows, term_scales, perturbed, forward_moved


def _run_config(
    program: Program,
    module: _Module,
    config: Config,
    eager: Any,
    shadows: list[dict],
    term_scales: dict[str, float],
    perturbed: list[dict],
    forward_moved: list[dict],
    report: Report | None,
) -> Finding | None:
    if config is not CACHED:
        # each configuration starts from empty in-memory program caches (compiled modules
        # stay on disk), so that its result does not depend on what ran before: the repro
        # script runs it alone
        compiler.reset()
    before = _counts()
    with config.settings():
        if config.module:
            got = module.run(None, config.scales, module=True)
        else:
            got = module.run(config.region(), config.scales, whole=config.whole)
    if report is not None:
        _add_counts(report, before)
    if config.whole or config.module:  # (the forward compiled: its values rounded otherwise)
        perturbed = perturbed + forward_moved
    kind, problems = _verdict(eager, got, shadows, term_scales, perturbed)
    if not problems:
        return None
    verdict = "\n".join(problems)
    script = program.source(config, f"{kind} [{config.name}]:\n{verdict}")
    return Finding(program.seed, config.name, kind, verdict, script)


def _add_counts(report: Report, before: tuple) -> None:
    after = _counts()
    report.step_runs += after[5] - before[5]
    report.step_breaks.update(after[6] - before[6])
    report.captures += after[0] - before[0]
    report.builds += after[1] - before[1]
    report.cache_hits += after[2] - before[2]
    report.compiled_runs += after[3] - before[3]
    report.fallbacks.update(after[4] - before[4])
    report.native_runs += after[7] - before[7]
    report.native_steps += after[8] - before[8]
    report.native_dropped.update(after[9] - before[9])


def _verdict(
    eager: Any,
    got: Any,
    shadows: list[dict],
    term_scales: dict[str, float] | None = None,
    perturbed: Sequence[dict] = (),
) -> tuple[str, list[str]]:
    if isinstance(got, Exception) and not isinstance(eager, Exception):
        return "crash", [_format_exception(got)]
    if isinstance(eager, Exception) or isinstance(got, Exception):
        if type(eager) is type(got) and str(eager) == str(got):
            return "mismatch", []
        return "mismatch", [
            f"eager raised    {type(eager).__name__}: {eager}"
            if isinstance(eager, Exception)
            else "eager raised nothing",
            f"compiled raised {type(got).__name__}: {got}"
            if isinstance(got, Exception)
            else "compiled raised nothing",
        ]
    return "mismatch", compare(eager, got, shadows, term_scales=term_scales, perturbed=perturbed)


def _format_exception(e: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-6))
    return f"{type(e).__name__}: {e}\n{tb}"


def compare(
    eager: dict,
    got: dict,
    shadows: Sequence[dict] = (),
    root_scale: float | None = None,
    term_scales: dict[str, float] | None = None,
    perturbed: Sequence[dict] = (),
) -> list[str]:
    """The differences between two results of ``run()`` (module docstring: Comparison).

    ``shadows`` are results of the shadow runs; ``root_scale`` is the largest root gradient,
    by default read from the results labelled ``C[...]`` (the root gradients after backward);
    ``term_scales`` is each result's largest incoming gradient (``_TermScales``), which raises
    that result's scale above ``root_scale``; ``perturbed`` are results of eager runs with the
    root gradients moved by one ulp (``_Module.moved_roots``)."""
    if root_scale is None:
        root_scale = max(
            (
                float(np.abs(v.values[np.isfinite(v.values)]).max(initial=0.0))
                for k, v in eager.items()
                if k.startswith("C[") and isinstance(v, _Array)
            ),
            default=0.0,
        )
    problems: list[str] = []
    for key in dict.fromkeys([*eager, *got]):
        if key not in eager or key not in got:
            problems.append(f"{key}: only in {'eager' if key in eager else 'compiled'}")
            continue
        want, have = eager[key], got[key]
        if not isinstance(want, _Array) or not isinstance(have, _Array):
            if not (want is have or (isinstance(want, bool) and want == have)):
                problems.append(f"{key}: eager {_short(want)}, compiled {_short(have)}")
            continue
        refs = [r[key] for r in shadows if isinstance(r.get(key), _Array)]
        moved = [r[key] for r in perturbed if isinstance(r.get(key), _Array)]
        scale = max(root_scale, (term_scales or {}).get(key, 0.0))
        problems += _compare_arrays(key, want, have, refs, scale, moved)
    return problems


def _short(value: Any) -> str:
    if isinstance(value, _Array):
        return f"a {value.dtype} tensor of shape {value.values.shape}"
    return repr(value)


def _compare_arrays(
    key: str,
    want: _Array,
    have: _Array,
    shadows: list[_Array],
    root_scale: float,
    perturbed: Sequence[_Array] = (),
) -> list[str]:
    a, b = want.values, have.values
    if want.dtype != have.dtype or a.shape != b.shape:
        return [f"{key}: eager {want.dtype} {a.shape}, compiled {have.dtype} {b.shape}"]
    problems = []
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        differ = test(a) != test(b)
        if differ.any():
            where = tuple(int(i) for i in np.argwhere(differ)[0])
            problems.append(
                f"{key}: {name} positions differ, first at {where}: "
                f"eager {a[where]!r}, compiled {b[where]!r}"
            )
    if problems:
        return problems
    finite = np.isfinite(a)
    if not finite.any():
        return []
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = _tolerance(want.dtype, a64, finite, shadows, root_scale, perturbed)
    with np.errstate(invalid="ignore"):  # inf - inf outside ``finite``
        err = np.where(finite, np.abs(b64 - a64), 0.0)
    bad = err > tol
    if not bad.any():
        return []
    where = tuple(int(i) for i in np.argwhere(bad)[np.argmax((err - tol)[bad])])
    return [
        f"{key}: {int(bad.sum())} of {a.size} elements beyond tolerance; worst at {where}: "
        f"eager {a[where]!r}, compiled {b[where]!r}, |difference| {err[where]:.3g} > "
        f"tolerance {tol[where]:.3g}"
    ]


def _tolerance(
    dtype: str,
    a64: np.ndarray,
    finite: np.ndarray,
    shadows: list[_Array],
    root_scale: float,
    perturbed: Sequence[_Array] = (),
) -> np.ndarray:
    """Per element: rtol*|eager| + a norm-wise floor + the measured rounding error (the
    shadows' estimate, or eager's change under one-ulp perturbations of the root gradients,
    whichever is larger)."""
    rtol, u = RTOL[dtype], UNIT_ROUNDOFF[dtype]
    magnitude = np.abs(np.where(finite, a64, 0.0))
    scale = max(float(magnitude.max()), root_scale)
    tol = rtol * magnitude + FLOOR * u * scale
    estimate = np.zeros_like(a64)
    for shadow in shadows:
        if shadow.values.shape != a64.shape:
            continue
        ratio = min(1.0, u / UNIT_ROUNDOFF[shadow.dtype])
        s64 = shadow.values.astype(np.float64)
        with np.errstate(invalid="ignore"):
            error = np.where(np.isfinite(s64), np.abs(a64 - s64), magnitude) * ratio
        estimate = np.maximum(estimate, np.where(finite, error, 0.0))
        if dtype == "float64" and shadow.dtype == "float64":
            # a float64 result that moves when the program's float32 values become float64
            # carries float32 rounding: its floor is float32's (one sample of that error, the
            # estimate, can be small by luck)
            carries = np.where(finite, error, 0.0) > MIXED * scale
            tol = np.where(carries, tol + FLOOR * UNIT_ROUNDOFF["float32"] * scale, tol)
    for moved in perturbed:
        if moved.values.shape != a64.shape or moved.dtype != dtype:
            continue
        m64 = moved.values.astype(np.float64)
        with np.errstate(invalid="ignore"):
            change = np.where(np.isfinite(m64), np.abs(a64 - m64), magnitude)
        estimate = np.maximum(estimate, np.where(finite, change, 0.0))
    return tol + SHADOW * estimate


def _gradcheck(program: Program, module: _Module, report: Report) -> str:
    """gradcheck(objective) with its analytical Jacobian from the compiled backward.

    Returns "passed", "failed" (a finding is added), "skipped (...)" when the objective is not
    finite or its eager backward raises, or "inconclusive (...)" when eager fails gradcheck too:
    then finite differences cannot judge the compiled backward (an eager rule, or a function
    too badly scaled for central differences)."""
    objective, leaves = module.ns["objective"], module.ns["leaves"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            values = objective(*leaves())
            if not all(bool(np.isfinite(v.detach().numpy()).all()) for v in values):
                return "skipped (objective not finite)"
            fg.autograd.backward(list(values))
        except Exception as e:  # eager ran; this is the program's own error
            return f"skipped (eager objective raised {type(e).__name__})"
    before = _counts()
    try:
        # in the foreground, as the repro script runs it: a background compile would run
        # gradcheck's first backwards uncompiled and the later ones compiled, whose rounding
        # differs, and gradcheck's reentrancy check (exact) would fail on that
        with warnings.catch_warnings(), GRADCHECK.settings(), compiler.compiled_autograd():
            warnings.simplefilter("ignore")
            fg.autograd.gradcheck(objective, leaves())
    except Exception as e:
        outcome, message = "failed", _format_exception(e)
    else:
        outcome, message = "passed", ""
    _add_counts(report, before)
    if outcome == "passed":
        return outcome
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fg.autograd.gradcheck(objective, leaves())
    except Exception as e:
        return f"inconclusive (eager fails gradcheck too: {type(e).__name__})"
    text = f"eager passes gradcheck, compiled fails:\n{message}"
    report.findings.append(
        Finding(program.seed, "gradcheck", "gradcheck", text, program.source(GRADCHECK, text))
    )
    return outcome


def describe(program: Program) -> str:
    """A one-line summary of a program (for progress output)."""
    return (
        f"seed {program.seed}: {program.precision}, {len(program.leaves)} leaves, "
        f"{len(program.forward)} statements, backward: {program.backward[-1]}"
    )


# ---- shrinking ---------------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^(\w+) = ")


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def shrink(finding: Finding, program: Program, budget_s: float = 60.0) -> Program:
    """A smaller program that still fails like ``finding`` (same configuration and kind):
    greedily drops outputs and statements nothing else uses, then unused leaves, while the
    failure persists, within ``budget_s`` seconds."""
    deadline = time.perf_counter() + budget_s

    def fails(candidate: Program) -> bool:
        try:
            module = _Module(candidate)
            if finding.kind == "gradcheck":
                return _gradcheck(candidate, module, Report(candidate.seed)) == "failed"
            config = CONFIGS[finding.config]
            references = _reference(candidate, module, config.scales[-1])
            found = _run_config(candidate, module, config, *references, None)
        except Exception:
            return False
        return found is not None and found.kind == finding.kind

    changed = True
    while changed and time.perf_counter() < deadline:
        changed = False
        candidates = [_without_output(program, i) for i in range(len(program.outputs))]
        candidates += [_without_line(program, i) for i in reversed(range(len(program.forward)))]
        for candidate in candidates:
            if time.perf_counter() > deadline:
                break
            if candidate is not None and fails(_without_unused_leaves(candidate)):
                program = _without_unused_leaves(candidate)
                changed = True
                break
    return program


def _without_output(p: Program, i: int) -> Program | None:
    return _drop_output(p, i) if len(p.outputs) > 1 else None


def _drop_output(p: Program, i: int) -> Program:
    outputs = p.outputs[:i] + p.outputs[i + 1 :]
    cotangents = p.cotangents[:i] + p.cotangents[i + 1 :]
    loss = " + ".join(f"(outs[{k}] * C[{k}]).sum()" for k in range(len(outputs)))
    backward = tuple(
        f"loss = {loss}" if line.startswith("loss = ") else line for line in p.backward
    )
    results = tuple(
        (label, expr) for label, expr in p.results if not label.startswith(f"C[{len(outputs)}]")
    )
    return dataclasses.replace(
        p, outputs=outputs, cotangents=cotangents, backward=backward, results=results
    )


def _without_line(p: Program, i: int) -> Program | None:
    forward = p.forward[:i] + p.forward[i + 1 :]
    match = _ASSIGNMENT.match(p.forward[i])
    if match is None:  # an in-place statement, a hook: nothing depends on its name
        return dataclasses.replace(p, forward=forward)
    name = match.group(1)
    if name in p.outputs or any(_mentions(line, name) for line in forward + p.backward):
        return None
    kept = tuple(k for k in p.kept if k != name)
    results = tuple((label, e) for label, e in p.results if not _mentions(e, name))
    return dataclasses.replace(p, forward=forward, kept=kept, results=results)


def _without_unused_leaves(p: Program) -> Program:
    used = [
        leaf
        for leaf in p.leaves
        if any(_mentions(line, leaf.name) for line in p.forward + p.backward)
    ]
    gone = {leaf.name for leaf in p.leaves} - {leaf.name for leaf in used}
    if not gone:
        return p
    results = tuple((label, e) for label, e in p.results if not any(_mentions(e, n) for n in gone))
    presets = tuple((n, c) for n, c in p.presets if n not in gone)
    return dataclasses.replace(p, leaves=tuple(used), results=results, presets=presets)
