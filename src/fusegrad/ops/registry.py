"""THE op registry: one record per primitive, and ``apply``, the single place where a primitive
runs and, when autograd needs it, a backward node is recorded.

A primitive record holds everything about one primitive except its derivative: its eager kernel
(numpy arrays in, array out; calls with a CUDA input go to ``fusegrad.cuda.ops`` instead, which
runs the primitive's CUDA kernel), its kind (elementwise | reduce | movement | opaque), the names
of its tensor inputs, its shape/dtype rule, and for elementwise primitives the scalar expression
that compiled code computes it with (``Lowering``, with the ``ScalarFunction``s it calls) and how
its op-surface function promotes operands.  The Tensor method, in-place method and aliases it
has are flags of the record too.  Everything else derives from these records: the compiler's
lowering table and interpreter, the target spellings of scalar functions, the CUDA simulator's
``math``, the generated op-surface functions (``ops/generated.py``) and the method tables of
``Tensor`` (``ops/__init__.py``).  Its derivative rule lives in ``autograd/derivatives.py``
(``RULES``) and is looked up by name.  Composites (softmax, layer_norm, ...) never appear here:
they are written in the op surface over these primitives.

``apply`` sends every call to this thread's tracer first, when one is installed and takes
calls (``autograd.tracer``, the eager core's one extension point): the compiler's capture
records derivative rules written in the op surface as IR instead of computing them
(docs/ARCHITECTURE.md, contract 3).  ``run`` is the eager execution proper; it tells the tracer
of every backward node it makes (``Tracer.made``: the compiler's regions record forwards so).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..autograd import grad_mode
from ..autograd.anomaly import _state as _anomaly_state
from ..autograd.anomaly import anomaly_threads as _anomaly_threads
from ..autograd.anomaly import record_forward_trace as _record_forward_trace
from ..autograd.forward_state import state as _forward_state
from ..autograd.node import OpNode as _OpNode
from ..autograd.tracer import state as _tracer_state
from ..autograd.tracer import tracer_threads as _tracer_threads
from ..cuda.array import CudaArray
from ..cuda.ops import run as _device_run  # a call with a CUDA input: the device runs it
from ..errors import AutogradError
from ..tensor import Tensor


@dataclass(frozen=True, slots=True)
class ScalarFunction:
    """A scalar function that a lowering expression calls as ``{name}(...)``.

    ``python`` is the one source of the function: a Python callable on floats (and numpy
    scalars) that returns inf or nan where the function has a pole or no value, never raising.
    Where ``libm`` names a function of C's math library, compiled code calls ``math.<libm>``
    instead (numba lowers it to the C library on the CPU and to libdevice on CUDA), and
    ``python`` only stands in for it where Python runs the generated code (numba's CUDA
    simulator, whose ``math`` is built from these records).  Without ``libm``, ``python`` must
    use only ``math`` and arithmetic: it is compiled as it is — an inlined numba function on the
    CPU, a device function on CUDA — so every target computes the same formula.  ``numpy`` names
    a numpy scalar ufunc that the CPU target uses instead of ``math.<libm>`` (``np.floor``
    returns a float where numba's ``math.floor`` returns an integer).  The compiler may replace
    the float32 CPU form by a vectorisable helper of the same name
    (``fusegrad.compiler.codegen.fastmath``)."""

    name: str
    python: Callable[..., Any]
    libm: str | None = None
    numpy: str | None = None

    def __post_init__(self) -> None:
        if self.numpy is not None and self.libm is None:
            # CUDA has no numpy: a numpy spelling needs a libm one beside it
            raise ValueError(f"scalar function {self.name!r}: numpy={self.numpy!r} without libm")


@dataclass(frozen=True, slots=True)
class Lowering:
    """How compiled code computes an elementwise primitive: a scalar expression template in
    Python syntax.  ``{0}``, ``{1}``, ... are the operands' scalar expressions, ``{f}`` the target's
    spelling of the ``ScalarFunction`` named ``f`` (listed in ``functions``), ``{one}`` the
    constant 1 of the result's type and ``{dtype}`` the result's dtype name.  Bare names
    (``_maximum``, ``_sign``, ``_pow``, ``_cast_float32``) are helpers every target provides."""

    expression: str
    functions: tuple[ScalarFunction, ...] = ()


@dataclass(frozen=True, slots=True)
class Primitive:
    name: str
    kind: str  # "elementwise" | "reduce" | "movement" | "opaque"
    inputs: tuple[str, ...]  # names of the tensor inputs ("*" suffix: variadic)
    kernel: Callable[..., Any]
    differentiable: bool = True
    variadic: bool = False
    doc: str = field(default="", compare=False)
    # shape/dtype rule: ``meta(shapes, dtypes, **attrs) -> (shape, dtype)`` over the inputs'
    # shapes and fusegrad dtypes, without data.  Used by the compiler's capture (symbolic values
    # have shapes but no data) and by the IR verifier; set with ``set_meta``.
    meta: Callable[..., tuple] | None = field(default=None, compare=False)
    # the scalar expression of an elementwise primitive in compiled code (None: not elementwise,
    # or computed by its eager kernel between fused loops)
    lowering: Lowering | None = None
    # an elementwise primitive whose result is bool whatever its operands (comparisons, ...)
    bool_result: bool = False
    # the op-surface function generated from this record (``ops/generated.py``): "float"
    # promotes integer and bool operands to the default float dtype (exp, atan2, ...), "same"
    # computes in the operands' promoted dtype (mul, eq, ...); None: hand-written, or internal
    surface: str | None = None
    # ``Tensor.<name>`` is the op-surface function of the same name, ``Tensor.<name>_`` its
    # in-place form; each alias is another name of the function (and of those methods)
    method: bool = False
    inplace: bool = False
    aliases: tuple[str, ...] = ()
    # the attributes that hold sizes (a shape, an index key's slice bounds and ints, pad widths),
    # as opposed to dims, flags and dtypes: a capture may treat them as symbols, so that a graph
    # holds for other sizes (``fusegrad.compiler.symbolic``); set with ``set_meta``
    size_attrs: tuple[str, ...] = field(default=(), compare=False)
    # the bare numpy ufunc of a kernel that is only that ufunc on the inputs, with numpy's
    # floating-point errors ignored (``ops.primitives``): ``run`` calls it itself, one call
    # fewer per op (``kernel`` stays what everything else calls)
    ufunc: Any = field(default=None, compare=False)


REGISTRY: dict[str, Primitive] = {}

# numpy's error state (a context variable since numpy 2): kernels ignore floating-point errors
# (IEEE results, as in PyTorch) by setting it to ``QUIET`` around their arithmetic.  None where
# numpy has no such variable (each kernel then keeps its own ``np.errstate``).
try:
    from numpy._core._ufunc_config import _extobj_contextvar as ERROR_STATE
    from numpy._core._ufunc_config import _make_extobj

    QUIET: Any = _make_extobj(all="ignore")
    _error_state, _set_error_state, _reset_error_state = (
        ERROR_STATE.get,
        ERROR_STATE.set,
        ERROR_STATE.reset,
    )
except ImportError:  # pragma: no cover - numpy < 2
    ERROR_STATE = QUIET = None


@dataclass(frozen=True, slots=True)
class Rule:
    """A derivative rule: ``fn(node, g, *saved) -> tuple of input gradients``.

    ``save`` names what the rule needs: forward input names, or ``"out"`` for the output.
    ``save_index`` maps those names to input positions (>= 0) or outputs (-1 is output 0).
    ``save_for`` (empty when every value is always saved) gives, per saved name, the input
    positions whose gradient uses it, or None for "always": a value none of those inputs needs
    is not saved, and the rule receives None in its place (PyTorch saves ``other`` of
    ``self * other`` only when ``self`` requires grad)."""

    prim: str
    fn: Callable[..., tuple]
    save: tuple[str, ...]
    save_index: tuple[int, ...]
    save_for: tuple[tuple[int, ...] | None, ...] = ()
    # how ``OpNode`` saves, decided once from the above: one ``(k, where, position,
    # wanted_by)`` per saved name ``k``, ``where`` being "out" (output ``position``), "inputs"
    # (a variadic name: inputs from ``position`` on) or "input" (input ``position``), and
    # ``wanted_by`` the entry of ``save_for`` (None: always saved)
    save_steps: tuple[tuple[int, str, int, tuple[int, ...] | None], ...] = field(
        init=False, compare=False, repr=False
    )
    # ``save_steps`` resolved for each combination of inputs requiring grad, for a primitive of
    # one or two inputs (not variadic; empty otherwise): entry ``sum(2**(n-1-i) for each input
    # i that requires grad)`` is ``(((where, position), ...), unsaved)``, the values to save in
    # order and the positions in ``save`` of those left out (None: none), as ``OpNode`` would
    # work them out from ``save_steps`` per call
    save_plans: tuple[tuple[tuple[tuple[str, int], ...], tuple[int, ...] | None], ...] = field(
        init=False, compare=False, repr=False
    )
    # the rule's array form (``vjp_arrays``), or None
    arrays: Callable[..., tuple] | None = None

    def __post_init__(self) -> None:
        inputs = REGISTRY[self.prim].inputs
        variadic_at = len(inputs) - 1 if inputs and inputs[-1].endswith("*") else -2
        steps = []
        for k, position in enumerate(self.save_index):
            wanted_by = self.save_for[k] if self.save_for else None
            if position < 0:
                steps.append((k, "out", -1 - position, wanted_by))
            elif position == variadic_at:
                steps.append((k, "inputs", position, wanted_by))
            else:
                steps.append((k, "input", position, wanted_by))
        plans = []
        if variadic_at == -2 and len(inputs) in (1, 2):
            for flags in itertools.product((False, True), repeat=len(inputs)):
                plan: list = []
                unsaved: tuple[int, ...] | None = None
                for k, where, position, wanted_by in steps:
                    if wanted_by is not None and not any(flags[i] for i in wanted_by):
                        unsaved = (*unsaved, k) if unsaved else (k,)
                    else:
                        plan.append((where, position))
                plans.append((tuple(plan), unsaved))
        object.__setattr__(self, "save_steps", tuple(steps))  # (frozen: set once, here)
        object.__setattr__(self, "save_plans", tuple(plans))


RULES: dict[str, Rule] = {}

JVPS: dict[str, Callable[..., Any]] = {}
"""The forward-mode table (``autograd/jvps.py``): primitive name -> its Jacobian-vector product
rule ``fn(inputs, tangents, out, attrs) -> tangent of out`` (``tangents`` has None for inputs
without one), written in the op surface like the VJP rules."""


def primitive(
    name: str,
    kind: str,
    inputs: str,
    *,
    differentiable: bool = True,
    lowering: Lowering | None = None,
    bool_result: bool = False,
    surface: str | None = None,
    method: bool = False,
    inplace: bool = False,
    aliases: tuple[str, ...] = (),
    ufunc: Any = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``kernel`` as the eager implementation of primitive ``name``, with the rest of
    its record (see ``Primitive``)."""
    names = tuple(inputs.split())
    variadic = bool(names) and names[-1].endswith("*")
    if lowering is not None and kind != "elementwise":
        raise ValueError(f"{name}: only elementwise primitives have a scalar lowering")
    if surface not in (None, "float", "same"):
        raise ValueError(f"{name}: surface must be None, 'float' or 'same', got {surface!r}")

    def register(kernel: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY:
            raise ValueError(f"primitive {name!r} registered twice")
        REGISTRY[name] = Primitive(
            name,
            kind,
            names,
            kernel,
            differentiable,
            variadic,
            kernel.__doc__ or "",
            lowering=lowering,
            bool_result=bool_result,
            surface=surface,
            method=method,
            inplace=inplace,
            aliases=tuple(aliases),
            ufunc=ufunc if ERROR_STATE is not None else None,
        )
        return kernel

    return register


class DataDependentShape(Exception):
    """A primitive's output shape depends on input *values* (boolean-mask indexing)."""


def set_meta(name: str, fn: Callable[..., tuple], size_attrs: tuple[str, ...] = ()) -> None:
    """Attach the shape/dtype rule of primitive ``name`` and name its size attributes (see
    ``Primitive.meta`` and ``Primitive.size_attrs``)."""
    REGISTRY[name] = dataclasses.replace(REGISTRY[name], meta=fn, size_attrs=size_attrs)


def vjp(
    name: str, save: str | dict[str, str] = ""
) -> Callable[[Callable[..., tuple]], Callable[..., tuple]]:
    """Register the derivative rule of primitive ``name`` (see ``Rule``).  ``save`` is either
    the names the rule always needs (``"a b out"``) or a dict from each name to the inputs whose
    gradient uses it (``{"a": "b", "b": "a"}`` for ``mul``: ``a`` is saved only if ``b``
    requires grad), so that a node saves only what its inputs that require grad need."""
    prim = REGISTRY[name]
    save_for: tuple[tuple[int, ...] | None, ...] = ()
    if isinstance(save, dict):
        names = tuple(save)
        users = []
        for n, wanted_by in save.items():
            if n.endswith("*"):
                raise ValueError(f"rule for {name!r}: variadic {n!r} cannot be saved per input")
            for i in wanted_by.split():
                if i not in prim.inputs:
                    raise ValueError(f"rule for {name!r}: {n!r} is needed by unknown input {i!r}")
            users.append(tuple(prim.inputs.index(i) for i in wanted_by.split()))
        save_for = tuple(users)
    else:
        names = tuple(save.split())
    index = []
    for n in names:
        if n == "out":
            index.append(-1)
        elif n in prim.inputs:
            index.append(prim.inputs.index(n))
        else:
            raise ValueError(f"rule for {name!r} saves unknown value {n!r}")

    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        if name in RULES:
            raise ValueError(f"rule for {name!r} registered twice")
        RULES[name] = Rule(name, fn, names, tuple(index), save_for)
        return fn

    return register


def vjp_arrays(name: str) -> Callable[[Callable[..., tuple]], Callable[..., tuple]]:
    """Register the array form of ``name``'s derivative rule: ``fn(node, g, *saved)`` with the
    numpy arrays of the incoming gradient and of the saved values (None for one not saved), which
    makes exactly the kernel calls of the rule's tensor form -- the same ufuncs on the same
    operands in the same order, so the same bits -- without a tensor per intermediate value.
    The eager engine uses it where nothing could tell the two apart (``OpNode.run_arrays``: grad
    mode off, no tracer, no forward AD, one float dtype, numpy arrays); everything else (double
    backward, the compiler's capture, CUDA) runs the tensor form, the definition."""

    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        rule = RULES[name]
        if rule.arrays is not None:
            raise ValueError(f"array rule for {name!r} registered twice")
        RULES[name] = dataclasses.replace(rule, arrays=fn)
        return fn

    return register


def jvp(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the forward-mode rule of primitive ``name`` (see ``JVPS``)."""
    if name not in REGISTRY:
        raise ValueError(f"jvp rule for unknown primitive {name!r}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in JVPS:
            raise ValueError(f"jvp rule for {name!r} registered twice")
        JVPS[name] = fn
        return fn

    return register


# ``run`` wraps every result: bound once, a module global instead of two attribute lookups
_make = Tensor._make
_grad_state = grad_mode._state  # (the thread-local object itself is never replaced)
_grad_off_threads = grad_mode.grad_off_threads  # (empty: grad mode is on in every thread)
_ndarray = np.ndarray


def apply(prim: Primitive, inputs: tuple, attrs: dict) -> Any:
    """Run ``prim`` on Tensors ``inputs`` with keyword ``attrs`` (recording a node if needed),
    or hand the call to this thread's tracer when one is installed.  While a forward-AD dual
    level exists, ``autograd.forward_ad`` also computes the result's tangent (its one check
    here is all that forward AD costs otherwise)."""
    level = _forward_state.level
    if level is not None:
        return level.apply(prim, inputs, attrs, JVPS, _apply_primal)
    tracer = _tracer_state.calls if _tracer_threads else None  # (one that takes calls)
    if tracer is not None:
        result = tracer.apply(prim, inputs, attrs)
        if result is not NotImplemented:
            return result
    return run(prim, inputs, attrs)


def _apply_primal(prim: Primitive, inputs: tuple, attrs: dict) -> Any:
    """``apply`` without forward AD (the primal computation of a dual call)."""
    tracer = _tracer_state.calls
    if tracer is not None:
        result = tracer.apply(prim, inputs, attrs)
        if result is not NotImplemented:
            return result
    return run(prim, inputs, attrs)


def run(prim: Primitive, inputs: tuple, attrs: dict) -> Any:
    """Eager execution of ``prim``: its kernel on the arrays, and a backward node when grad mode
    is on and an input requires grad.

    This is the hot path of eager execution: keep it free of per-call imports and checks that
    the op surface has already done.  One and two inputs (nearly every call) are spelled out:
    a list comprehension and a ``**{}`` cost as much as the rest of the dispatch."""
    n = len(inputs)
    if n == 2:
        a0 = inputs[0]._data
        a1 = inputs[1]._data
        if type(a0) is CudaArray or type(a1) is CudaArray:  # a CUDA tensor: the device runs it
            data = _device_run(prim, [a0, a1], attrs)
        else:
            ufunc = prim.ufunc
            if ufunc is None or attrs:
                data = prim.kernel(a0, a1, **attrs) if attrs else prim.kernel(a0, a1)
            elif _error_state() is QUIET:  # (the backward engine set it for all its kernels)
                data = ufunc(a0, a1)
            else:  # the kernel's wrapper, in line
                token = _set_error_state(QUIET)
                try:
                    data = ufunc(a0, a1)
                finally:
                    _reset_error_state(token)
            if type(data) is not _ndarray and type(data) is not CudaArray:  # (to_device)
                data = np.asarray(data)
    elif n == 1:
        a0 = inputs[0]._data
        if type(a0) is CudaArray:
            data = _device_run(prim, [a0], attrs)
        else:
            ufunc = prim.ufunc
            if ufunc is None or attrs:
                data = prim.kernel(a0, **attrs) if attrs else prim.kernel(a0)
            elif _error_state() is QUIET:
                data = ufunc(a0)
            else:
                token = _set_error_state(QUIET)
                try:
                    data = ufunc(a0)
                finally:
                    _reset_error_state(token)
            if type(data) is not _ndarray and type(data) is not CudaArray:
                data = np.asarray(data)
    else:
        arrays = [t._data for t in inputs]
        for a in arrays:
            if type(a) is CudaArray:
                data = _device_run(prim, arrays, attrs)
                break
        else:
            data = prim.kernel(*arrays, **attrs)
            if type(data) is not _ndarray and type(data) is not CudaArray:
                data = np.asarray(data)
    out = _make(data)
    if prim.differentiable and (not _grad_off_threads or _grad_state._enabled):
        for t in inputs:
            if t._requires_grad or t.grad_fn is not None:
                break
        else:
            return out
        rule = RULES.get(prim.name)
        if rule is None:
            raise AutogradError(f"{prim.name}: no derivative rule is registered")
        node = _OpNode(prim, rule, attrs, inputs, (out,))
        out.grad_fn = node
        if _anomaly_threads and _anomaly_state.enabled:
            _record_forward_trace(node)
        if _tracer_threads:  # (``Tracer.made``: compiled autograd records the node)
            tracer = _tracer_state.innermost
            if tracer is not None:
                tracer.made(node, inputs, out)
    return out
