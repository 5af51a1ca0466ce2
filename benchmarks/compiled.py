"""Compiled autograd: fusegrad's compiled backward against its eager engine and its peers.

Four float32 workloads, each run by every implementation in the same process, the same thread
setting and interleaved rounds (``common.measure_interleaved``), forward and backward timed
separately:

* ``A``: ``sum(tanh(x*w + b) * sigmoid(x) + exp(-x*x) * 0.5)`` with ``x``, ``w`` of N elements and
  ``b`` of shape (1,), at N = 1e5, 1e6, 1e7.  Memory-bound at large N: the table is followed by
  this machine's memory bandwidth and the bandwidth bound of A's backward.
* ``B``: GELU (tanh approximation) then LayerNorm (weight and bias) on 256x1024; the loss is
  ``sum(out * R)`` for a fixed random ``R``.
* ``C``: MLP 784-512-512-10, batch 128, ReLU, cross-entropy (raw tensors; no optimizer step).
* ``D``: a 200-op elementwise chain (mul/add/tanh/sigmoid/exp/neg) on 1,000 elements in which
  the leaf ``w`` is used 10 times, summed.  Tiny tensors: framework overhead dominates.

Implementations (columns):

* ``fg eager``: fusegrad's eager engine.
* ``fg compiled``: the same eager forward; the backward runs inside
  ``fusegrad.compiler.compiled_autograd()``, measured in steady state (after warm-up: captured,
  compiled and cached).
* ``numpy``: a hand-written forward and backward (the honest baseline: what one would write
  without a framework).  For A also ``numpy fused``: preallocated buffers and ``out=`` ufuncs,
  no temporaries (the best plain numpy can do).
* ``torch`` eager and ``torch.compile`` (backward of a ``torch.compile``'d forward) when PyTorch
  is importable; ``torch.compile``'s own compile time (first forward+backward) is reported
  apart; it is skipped, with the reason, where it fails on this machine.
* ``jax jit``: ``jax.jit(jax.value_and_grad(loss))`` when JAX is importable (forward+backward
  only: JAX cannot time them apart).

Every timed step sets the leaves' ``.grad`` to None first (outside the timed region), as
``zero_grad(set_to_none=True)`` does; for A an extra row keeps ``.grad`` (each backward
accumulates into the existing gradient, in place).  Compile time is measured apart from steady
state, in fresh subprocesses (numba's in-memory state empty), per workload:

* ``cold``: empty ``FUSEGRAD_CACHE_DIR`` and ``NUMBA_CACHE_DIR``: nothing cached anywhere;
* ``warm from disk``: a second fresh process with the first one's cache directories.

Each is the wall time of the first compiled ``backward()`` (capture, passes, code generation,
numba JIT or cache load, and the run itself).  The gradients of every implementation are
compared with fusegrad eager's; the process exits non-zero when one disagrees or a compile-time
subprocess fails.

Run from the repository root::

    python -m benchmarks.compiled [--threads N] [--quick] [--workloads A,B,C,D] [--no-torch]
                                  [--json PATH] [--plot PNG] [--progress auto|plain|off]

or as a script (``python benchmarks/compiled.py``).  The header (machine, versions, units, the
ratio convention) is printed first, then each workload's rows as soon as it is measured
(``benchmarks.live``), with its progress on stderr.  Results go to
``benchmarks/results/compiled.json`` by default, with the machine info, so that
``python -m benchmarks.compare`` can put two runs side by side; ``--plot`` draws the ratios
against each peer (``benchmarks.plot``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import (  # after the script path fix above
    common,
    live,
    plot,
    steps,  # (``settle``: the calls of the trials before measuring)
)
from benchmarks import eager_overhead as eager  # MLP inputs and hand-written numpy MLP

# numpy, fusegrad, torch and jax are imported in ``main`` only, after the thread count is pinned.

WORKLOADS = ("A", "B", "C", "D", "E", "F", "G")
A_SIZES = (10**5, 10**6, 10**7)
A_SIZES_QUICK = (10**3, 10**4)
B_SHAPE = (256, 1024)
LN_EPS = 1e-5
GELU_C = math.sqrt(2.0 / math.pi)
GELU_K = 0.044715
D_SIZE = 1000
D_BLOCKS = 20  # 10 ops per block: 200 elementwise ops, then the sum
D_W_EVERY = 2  # w is the multiplier of every second block: used 10 times
E_SHAPE = (256, 64, 256)  # batch, features, critic width (WGAN-GP gradient penalty)
E_LAMBDA = 10.0
F_SIZE = 10**5  # Hessian-vector product over this many elements

IMPLS = (
    "fg_eager",
    "fg_compiled",
    "fg_step",
    "numpy",
    "numpy_fused",
    "numba_fused",
    "torch",
    "torch_compile",
    "jax",
)
HEADERS = {
    "fg_eager": "fg eager",
    "fg_compiled": "fg compiled",
    "fg_step": "fg whole step",
    "numpy": "numpy",
    "numpy_fused": "numpy fused",
    "numba_fused": "numba 1-loop",
    "torch": "torch",
    "torch_compile": "torch.compile",
    "jax": "jax jit",
}
RATIO_TO = ("fg_eager", "numpy", "torch", "torch_compile", "jax")  # compiled / each of these
# whole step (forward and backward in one compiled function) / each of these, in the
# forward+backward rows
STEP_RATIO_TO = ("fg_eager", "fg_compiled", "numpy", "numba_fused", "torch", "torch_compile", "jax")
METRICS = (("forward", "forward"), ("backward", "backward"), ("forward+backward", "total"))
KEPT_METRIC = "backward, .grad kept"
UNIT_SCALE = {"ms": 1e3, "µs": 1e6}

# (warm-up, measured) repetitions
DEFAULT_REPS = {
    "A1e5": (5, 60),
    "A1e6": (3, 30),
    "A1e7": (2, 10),
    "B": (3, 30),
    "C": (3, 30),
    "D": (10, 150),
    "E": (5, 60),
    "F": (5, 60),
    "G": (3, 30),
}
QUICK_REPS = (1, 2)
GRAD_RTOL = 2e-3
CHILD_MARKER = "COMPILE_CHILD_RESULT "
CHILD_TIMEOUT_S = 900


# ---- workloads ---------------------------------------------------------------------------------


@dataclass
class Ops:
    """The handful of functions the workloads call, for one framework (fusegrad, torch, jax)."""

    tanh: Callable[[Any], Any]
    sigmoid: Callable[[Any], Any]
    exp: Callable[[Any], Any]
    sum: Callable[[Any], Any]
    gelu_tanh: Callable[[Any], Any]
    layer_norm: Callable[[Any, Any, Any], Any]
    relu: Callable[[Any], Any]
    cross_entropy: Callable[[Any, Any], Any]
    # d(y)/d(x) for a scalar y, itself differentiable (``create_graph=True``)
    grad: Callable[[Any, Any], Any] | None = None
    # ``checkpoint(fn, *args)``: fn's activations recomputed in backward, not kept
    checkpoint: Callable[..., Any] | None = None


def a_forward(ops: Ops, x: Any, w: Any, b: Any) -> Any:
    """Workload A."""
    return ops.sum(ops.tanh(x * w + b) * ops.sigmoid(x) + ops.exp(-x * x) * 0.5)


def b_forward(ops: Ops, x: Any, weight: Any, bias: Any, r: Any) -> Any:
    """Workload B: GELU (tanh) then LayerNorm over the last dimension; loss = sum(out * r)."""
    return ops.sum(ops.layer_norm(ops.gelu_tanh(x), weight, bias) * r)


def c_forward(
    ops: Ops, W1: Any, b1: Any, W2: Any, b2: Any, W3: Any, b3: Any, inputs: Any, target: Any
) -> Any:
    """Workload C: the 784-512-512-10 ReLU MLP and its cross-entropy loss."""
    h1 = ops.relu(inputs @ W1 + b1)
    h2 = ops.relu(h1 @ W2 + b2)
    return ops.cross_entropy(h2 @ W3 + b3, target)


def d_forward(ops: Ops, x: Any, w: Any) -> Any:
    """Workload D: 20 blocks of 10 elementwise ops (200 in all), then a sum.

    Block: ``a = h*c`` (``c`` = ``w`` in every second block, else 0.8), ``+0.1``, ``tanh``,
    ``*0.5``, ``sigmoid``, ``neg``, ``mul``, ``exp``, ``mul``, ``h = h + s*exp(-a*a)``.  Every
    value stays bounded (``h`` grows by less than 1 per block) and so do the gradients."""
    h = x
    for k in range(D_BLOCKS):
        a = h * w if k % D_W_EVERY == 0 else h * 0.8  # mul
        a = a + 0.1  # add
        a = ops.tanh(a)  # tanh
        a = a * 0.5  # mul
        s = ops.sigmoid(a)  # sigmoid
        n = -a  # neg
        m = n * a  # mul
        e = ops.exp(m)  # exp
        y = s * e  # mul
        h = h + y  # add
    return ops.sum(h)


def e_forward(ops: Ops, x: Any, W1: Any, b1: Any, W2: Any, b2: Any) -> Any:
    """Workload E: a WGAN-GP critic step: a tanh MLP critic ``D``, the gradient of ``D(x)``
    with respect to its input (``create_graph=True``), and the loss ``mean(D(x)) +
    10 * mean((|grad|_2 - 1)^2)``, whose backward is a double backward."""
    assert ops.grad is not None
    out = ops.tanh(x @ W1 + b1) @ W2 + b2
    gx = ops.grad(ops.sum(out), x)
    norm = ((gx * gx).sum(1) + 1e-12).sqrt()
    return out.mean() + E_LAMBDA * ((norm - 1.0) * (norm - 1.0)).mean()


def f_forward(ops: Ops, x: Any, w: Any, v: Any) -> Any:
    """Workload F: a Hessian-vector product: ``g = d f / d x`` (``create_graph=True``) for
    ``f = sum(tanh(x*w) * x)``, loss ``sum(g * v)``; its backward leaves ``H v`` in ``x.grad``."""
    assert ops.grad is not None
    g = ops.grad(ops.sum(ops.tanh(x * w) * x), x)
    return ops.sum(g * v)


def g_forward(
    ops: Ops, W1: Any, b1: Any, W2: Any, b2: Any, W3: Any, b3: Any, inputs: Any, target: Any
) -> Any:
    """Workload G: workload C's MLP with its two hidden layers checkpointed (non-reentrant):
    their activations are recomputed in backward instead of kept."""
    assert ops.checkpoint is not None

    def hidden(x: Any, W1: Any, b1: Any, W2: Any, b2: Any) -> Any:
        return ops.relu(ops.relu(x @ W1 + b1) @ W2 + b2)

    h2 = ops.checkpoint(hidden, inputs, W1, b1, W2, b2)
    return ops.cross_entropy(h2 @ W3 + b3, target)


@dataclass
class Workload:
    """One workload at one size: inputs (numpy arrays), which are leaves (get gradients) and
    which constants, and the forward written once for every framework."""

    name: str  # A, B, C, D
    label: str  # table label, e.g. "A N=1e5"
    reps_key: str
    data: dict[str, Any]
    leaves: tuple[str, ...]
    consts: tuple[str, ...]
    forward: Callable[..., Any]
    unit: str
    size: int | None = None
    description: str = ""


def _exp_label(n: int) -> str:
    exponent = round(math.log10(n))
    return f"1e{exponent}" if 10**exponent == n else str(n)


def make_workloads(np: Any, names: Sequence[str], quick: bool) -> list[Workload]:
    """The selected workloads, A expanded over its sizes (small ones with ``quick``)."""
    out: list[Workload] = []
    rng = np.random.default_rng(0)
    for name in names:
        if name == "A":
            for n in A_SIZES_QUICK if quick else A_SIZES:
                out.append(
                    Workload(
                        "A",
                        f"A N={_exp_label(n)}",
                        f"A{_exp_label(n)}",
                        {
                            "x": rng.standard_normal(n).astype(np.float32),
                            "w": rng.standard_normal(n).astype(np.float32),
                            "b": rng.standard_normal(1).astype(np.float32),
                        },
                        ("x", "w", "b"),
                        (),
                        a_forward,
                        "µs" if n <= 10**5 else "ms",
                        size=n,
                        description="sum(tanh(x*w+b)*sigmoid(x)+exp(-x*x)*0.5), b of shape (1,)",
                    )
                )
        elif name == "B":
            m, d = B_SHAPE
            out.append(
                Workload(
                    "B",
                    f"B {m}x{d}",
                    "B",
                    {
                        "x": rng.standard_normal((m, d)).astype(np.float32),
                        "weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
                        "bias": (0.1 * rng.standard_normal(d)).astype(np.float32),
                        "r": rng.standard_normal((m, d)).astype(np.float32),
                    },
                    ("x", "weight", "bias"),
                    ("r",),
                    b_forward,
                    "ms",
                    description="layer_norm(gelu(x, approximate='tanh'), weight, bias); "
                    "loss sum(out*r)",
                )
            )
        elif name == "C":
            data = eager.mlp_inputs(np)
            out.append(
                Workload(
                    "C",
                    "C MLP",
                    "C",
                    data,
                    eager.MLP_PARAMS,
                    ("input", "target"),
                    c_forward,
                    "ms",
                    description=f"MLP {'-'.join(map(str, eager.MLP_SIZES))}, batch "
                    f"{eager.MLP_BATCH}, ReLU, cross_entropy",
                )
            )
        elif name == "G":
            out.append(
                Workload(
                    "G",
                    "G checkpointed MLP",
                    "G",
                    eager.mlp_inputs(np),
                    eager.MLP_PARAMS,
                    ("input", "target"),
                    g_forward,
                    "ms",
                    description="workload C with its two hidden layers in one checkpoint "
                    "(use_reentrant=False)",
                )
            )
        elif name == "D":
            out.append(
                Workload(
                    "D",
                    "D chain200",
                    "D",
                    {
                        "x": rng.standard_normal(D_SIZE).astype(np.float32),
                        "w": rng.uniform(0.5, 1.5, D_SIZE).astype(np.float32),
                    },
                    ("x", "w"),
                    (),
                    d_forward,
                    "µs",
                    description=f"{D_BLOCKS * 10}-op elementwise chain on {D_SIZE} elements, "
                    f"w used {D_BLOCKS // D_W_EVERY} times",
                )
            )
        elif name == "E":
            batch, feats, width = E_SHAPE
            out.append(
                Workload(
                    "E",
                    "E grad penalty",
                    "E",
                    {
                        "x": rng.standard_normal((batch, feats)).astype(np.float32),
                        "W1": (rng.standard_normal((feats, width)) / feats**0.5).astype(np.float32),
                        "b1": (0.1 * rng.standard_normal(width)).astype(np.float32),
                        "W2": (rng.standard_normal((width, 1)) / width**0.5).astype(np.float32),
                        "b2": np.zeros(1, np.float32),
                    },
                    ("x", "W1", "b1", "W2", "b2"),
                    (),
                    e_forward,
                    "ms",
                    description=f"WGAN-GP: critic {feats}-{width}-1 (tanh), batch {batch}; "
                    "grad(D(x), x, create_graph=True), then the penalty's backward",
                )
            )
        elif name == "F":
            out.append(
                Workload(
                    "F",
                    "F HVP",
                    "F",
                    {
                        "x": rng.standard_normal(F_SIZE).astype(np.float32),
                        "w": rng.uniform(0.5, 1.5, F_SIZE).astype(np.float32),
                        "v": rng.standard_normal(F_SIZE).astype(np.float32),
                    },
                    ("x", "w"),
                    ("v",),
                    f_forward,
                    "µs",
                    description=f"Hessian-vector product of sum(tanh(x*w)*x), {F_SIZE} elements",
                )
            )
        else:
            raise ValueError(f"unknown workload {name!r} (expected one of {', '.join(WORKLOADS)})")
    return out


# ---- implementations ---------------------------------------------------------------------------


@dataclass
class Impl:
    """One implementation of one workload: ``step`` times one repetition (``{phase: s}``),
    ``grads`` returns the last repetition's gradients (leaf name -> ndarray), ``loss`` its loss.
    Framework implementations also expose their leaf tensors, forward and arguments."""

    step: common.StepFn
    grads: Callable[[], dict[str, Any]]
    loss: Callable[[], float]
    leaf_tensors: list[Any] = field(default_factory=list)
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    first_call_s: float | None = None


def fg_ops(fg: Any) -> Ops:
    F = importlib.import_module("fusegrad.nn.functional")
    checkpoint = importlib.import_module("fusegrad.utils.checkpoint").checkpoint
    return Ops(
        tanh=lambda t: t.tanh(),
        sigmoid=lambda t: t.sigmoid(),
        exp=lambda t: t.exp(),
        sum=lambda t: t.sum(),
        gelu_tanh=lambda t: F.gelu(t, approximate="tanh"),
        layer_norm=lambda t, w, b: F.layer_norm(t, (t.shape[-1],), w, b, eps=LN_EPS),
        relu=F.relu,
        cross_entropy=F.cross_entropy,
        grad=lambda y, x: fg.autograd.grad(y, x, create_graph=True)[0],
        checkpoint=lambda f, *a: checkpoint(f, *a, use_reentrant=False),
    )


def torch_ops(torch: Any) -> Ops:
    F = torch.nn.functional
    checkpoint = importlib.import_module("torch.utils.checkpoint").checkpoint
    return Ops(
        tanh=torch.tanh,
        sigmoid=torch.sigmoid,
        exp=torch.exp,
        sum=torch.sum,
        gelu_tanh=lambda t: F.gelu(t, approximate="tanh"),
        layer_norm=lambda t, w, b: F.layer_norm(t, (t.shape[-1],), w, b, eps=LN_EPS),
        relu=torch.relu,
        cross_entropy=F.cross_entropy,
        grad=lambda y, x: torch.autograd.grad(y, x, create_graph=True)[0],
        checkpoint=lambda f, *a: checkpoint(f, *a, use_reentrant=False),
    )


def jax_ops(jax: Any, jnp: Any) -> Ops:
    def layer_norm(t: Any, w: Any, b: Any) -> Any:
        mu = jnp.mean(t, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(t - mu), axis=-1, keepdims=True)
        return (t - mu) * jax.lax.rsqrt(var + LN_EPS) * w + b

    def cross_entropy(logits: Any, target: Any) -> Any:
        logp = jax.nn.log_softmax(logits, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, target[:, None], axis=1))

    return Ops(
        tanh=jnp.tanh,
        sigmoid=jax.nn.sigmoid,
        exp=jnp.exp,
        sum=jnp.sum,
        gelu_tanh=lambda t: jax.nn.gelu(t, approximate=True),
        layer_norm=layer_norm,
        relu=jax.nn.relu,
        cross_entropy=cross_entropy,
        checkpoint=lambda f, *a: jax.checkpoint(f)(*a),
    )


def framework_impl(
    wl: Workload,
    ops: Ops,
    make_leaf: Callable[[Any], Any],
    make_const: Callable[[Any], Any],
    to_numpy: Callable[[Any], Any],
    *,
    context: Callable[[], Any] | None = None,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    keep_grad: bool = False,
) -> Impl:
    """``wl`` in fusegrad or torch (same API).  ``context`` is entered around every step (the
    compiled-autograd region: it changes only what ``backward()`` does); ``wrap`` turns the
    forward into a compiled one (``torch.compile``); ``keep_grad`` keeps ``.grad`` between
    steps, so every backward accumulates into it."""
    leaf_tensors = [make_leaf(wl.data[name]) for name in wl.leaves]
    args = (*leaf_tensors, *(make_const(wl.data[name]) for name in wl.consts))

    def forward(*tensors: Any) -> Any:
        return wl.forward(ops, *tensors)

    fn = wrap(forward) if wrap is not None else forward
    enter = context if context is not None else contextlib.nullcontext
    last: dict[str, float] = {}

    def step() -> dict[str, float]:
        if not keep_grad:
            for t in leaf_tensors:
                t.grad = None
        with enter():
            t0 = common.clock()
            loss = fn(*args)
            t1 = common.clock()
            loss.backward()
            t2 = common.clock()
        last["loss"] = float(loss.item())
        return {"forward": t1 - t0, "backward": t2 - t1}

    def grads() -> dict[str, Any]:
        return {
            name: None if t.grad is None else to_numpy(t.grad)
            for name, t in zip(wl.leaves, leaf_tensors)
        }

    return Impl(step, grads, lambda: last["loss"], leaf_tensors, fn, args)


def fg_step_impl(wl: Workload, fg: Any, *, keep_grad: bool = False) -> Impl:
    """``wl`` as one ``fusegrad.compile``d function holding forward and ``backward()``: a whole
    step (one fused program after the first call).  Timed as one phase."""
    ops = fg_ops(fg)
    leaf_tensors = [fg.tensor(wl.data[name], requires_grad=True) for name in wl.leaves]
    args = (*leaf_tensors, *(fg.tensor(wl.data[name]) for name in wl.consts))

    def whole(*tensors: Any) -> Any:
        loss = wl.forward(ops, *tensors)
        loss.backward()
        return loss.detach()

    fn = fg.compile(whole)
    last: dict[str, float] = {}

    def step() -> dict[str, float]:
        if not keep_grad:
            for t in leaf_tensors:
                t.grad = None
        t0 = common.clock()
        loss = fn(*args)
        t1 = common.clock()
        last["loss"] = float(loss.item())
        return {"forward+backward": t1 - t0}

    def grads() -> dict[str, Any]:
        return {
            name: None if t.grad is None else t.grad.numpy()
            for name, t in zip(wl.leaves, leaf_tensors)
        }

    return Impl(step, grads, lambda: last["loss"], leaf_tensors, fn, args)


def jax_impl(wl: Workload, jax: Any, jnp: Any) -> Impl:
    """``jax.jit(jax.value_and_grad(loss))`` over the leaves; one phase, forward+backward."""
    if wl.name in ("E", "F"):
        raise NotImplementedError("its forward differentiates (not written for JAX)")
    ops = jax_ops(jax, jnp)

    def loss_fn(*tensors: Any) -> Any:
        return wl.forward(ops, *tensors)

    fn = jax.jit(jax.value_and_grad(loss_fn, argnums=tuple(range(len(wl.leaves)))))
    args = [jnp.asarray(wl.data[name]) for name in (*wl.leaves, *wl.consts)]
    last: dict[str, Any] = {}

    def run() -> None:
        value, grads = fn(*args)
        jax.block_until_ready((value, grads))
        last["value"], last["grads"] = value, grads

    t0 = common.clock()
    run()  # trace + XLA compile + first run
    first = common.clock() - t0

    def step() -> dict[str, float]:
        t0 = common.clock()
        run()
        return {"forward+backward": common.clock() - t0}

    def grads() -> dict[str, Any]:
        import numpy as np

        return {name: np.asarray(g) for name, g in zip(wl.leaves, last["grads"])}

    return Impl(step, grads, lambda: float(last["value"]), first_call_s=first)


# ---- hand-written numpy ------------------------------------------------------------------------


def _numpy_impl(
    forward: Callable[[], tuple[Any, Any]], backward: Callable[[Any], dict[str, Any]]
) -> Impl:
    result: dict[str, Any] = {}

    def step() -> dict[str, float]:
        t0 = common.clock()
        loss, saved = forward()
        t1 = common.clock()
        result["grads"] = backward(saved)
        t2 = common.clock()
        result["loss"] = float(loss)
        return {"forward": t1 - t0, "backward": t2 - t1}

    return Impl(step, lambda: result["grads"], lambda: result["loss"])


def a_numpy(np: Any, data: dict[str, Any]) -> Impl:
    """A by hand, as one would write it: forward saves ``t = tanh(u)``, ``s = sigmoid(x)``,
    ``e = exp(-x*x)``; backward ``du = s(1-t^2)``, ``gx = du*w + t*s(1-s) - x*e``."""
    x, w, b = data["x"], data["w"], data["b"]
    half = np.float32(0.5)

    def forward() -> tuple[Any, Any]:
        t = np.tanh(x * w + b)
        s = 1 / (1 + np.exp(-x))
        e = np.exp(-x * x)
        return np.sum(t * s + e * half), (t, s, e)

    def backward(saved: Any) -> dict[str, Any]:
        t, s, e = saved
        du = s * (1 - t * t)
        return {
            "x": du * w + t * (s * (1 - s)) - x * e,
            "w": du * x,
            "b": du.sum(keepdims=True),
        }

    return _numpy_impl(forward, backward)


def a_numpy_fused(np: Any, data: dict[str, Any]) -> Impl:
    """A with preallocated buffers and ``out=`` ufuncs only (no temporaries, buffers reused
    across steps, gradients written in place): plain numpy's lower bound."""
    x, w, b = data["x"], data["w"], data["b"]
    n = x.shape[0]
    u, t, s, e, tmp, gx, gw = (np.empty(n, np.float32) for _ in range(7))
    for buf in (u, t, s, e, tmp, gx, gw):
        buf.fill(0)  # touch the pages once, outside the timed steps
    half = np.float32(0.5)
    gb = np.zeros(1, np.float32)

    def forward() -> tuple[Any, Any]:
        np.multiply(x, w, out=u)
        np.add(u, b, out=u)
        np.tanh(u, out=t)
        np.negative(x, out=s)
        np.exp(s, out=s)
        np.add(s, 1, out=s)
        np.reciprocal(s, out=s)
        np.multiply(x, x, out=e)
        np.negative(e, out=e)
        np.exp(e, out=e)
        np.multiply(t, s, out=tmp)
        np.multiply(e, half, out=u)
        np.add(tmp, u, out=tmp)
        return tmp.sum(), None

    def backward(_: Any) -> dict[str, Any]:
        np.multiply(t, t, out=u)
        np.subtract(1, u, out=u)
        np.multiply(u, s, out=u)  # du
        np.multiply(u, x, out=gw)
        gb[0] = u.sum()
        np.multiply(u, w, out=gx)
        np.subtract(1, s, out=tmp)
        np.multiply(tmp, s, out=tmp)
        np.multiply(tmp, t, out=tmp)
        np.add(gx, tmp, out=gx)
        np.multiply(x, e, out=tmp)
        np.subtract(gx, tmp, out=gx)
        return {"x": gx, "w": gw, "b": gb}

    return _numpy_impl(forward, backward)


def a_numba_fused(np: Any, data: dict[str, Any]) -> Impl:
    """A as one hand-written numba loop computing the loss and all three gradients at once
    (``math.tanh``/``math.exp``: what a user writes; the reference of the whole-step target)."""
    import math  # (numba: loaded by this reference only)

    import numba

    x, w, b = data["x"], data["w"], data["b"]
    n = x.shape[0]
    gx, gw = np.empty(n, np.float32), np.empty(n, np.float32)
    gb = np.zeros(1, np.float32)

    @numba.njit(cache=True, fastmath=False)
    def fused(x: Any, w: Any, b: Any, gx: Any, gw: Any, gb: Any) -> float:
        loss = 0.0
        gsum = 0.0
        bias = b[0]
        for i in range(x.shape[0]):
            xi, wi = x[i], w[i]
            t = math.tanh(xi * wi + bias)
            s = 1.0 / (1.0 + math.exp(-xi))
            e = math.exp(-xi * xi)
            loss += t * s + e * 0.5
            du = s * (1.0 - t * t)
            gw[i] = du * xi
            gx[i] = du * wi + t * (s * (1.0 - s)) - xi * e
            gsum += du
        gb[0] = gsum
        return loss

    fused(x[:2], w[:2], b, gx[:2], gw[:2], gb)  # compile (or load) outside the timing
    result: dict[str, Any] = {}

    def step() -> dict[str, float]:
        t0 = common.clock()
        result["loss"] = float(fused(x, w, b, gx, gw, gb))
        return {"forward+backward": common.clock() - t0}

    return Impl(step, lambda: {"x": gx, "w": gw, "b": gb}, lambda: result["loss"])


def b_numpy(np: Any, data: dict[str, Any]) -> Impl:
    """B by hand: GELU (tanh) and LayerNorm forward saving what the backward needs."""
    x, weight, bias, r = data["x"], data["weight"], data["bias"], data["r"]
    c, k = np.float32(GELU_C), np.float32(GELU_K)

    def forward() -> tuple[Any, Any]:
        x2 = x * x
        th = np.tanh(c * (x + k * x * x2))
        half = 0.5 * (1 + th)
        g = x * half
        xc = g - g.mean(axis=-1, keepdims=True)
        rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + np.float32(LN_EPS))
        xhat = xc * rstd
        y = xhat * weight + bias
        return np.sum(y * r), (x2, th, half, xhat, rstd)

    def backward(saved: Any) -> dict[str, Any]:
        x2, th, half, xhat, rstd = saved
        dy = r
        dxhat = dy * weight
        dg = rstd * (
            dxhat
            - dxhat.mean(axis=-1, keepdims=True)
            - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
        )
        dinner = (1 - th * th) * (c * (1 + 3 * k * x2))
        return {
            "x": dg * (half + 0.5 * x * dinner),
            "weight": (dy * xhat).sum(axis=0),
            "bias": dy.sum(axis=0),
        }

    return _numpy_impl(forward, backward)


def c_numpy(np: Any, data: dict[str, Any]) -> Impl:
    """C by hand: ``eager_overhead``'s numpy MLP (matmuls, ReLU masks, stable log-softmax)."""
    w = eager.mlp_numpy(np, data)
    return Impl(w.step, w.grads, w.loss)


def d_numpy(np: Any, data: dict[str, Any]) -> Impl:
    """D by hand: the forward saves five arrays per block, the backward walks them in reverse."""
    x0, w = data["x"], data["w"]
    k08, k01, half = np.float32(0.8), np.float32(0.1), np.float32(0.5)

    def forward() -> tuple[Any, Any]:
        saved = []
        h = x0
        for k in range(D_BLOCKS):
            uses_w = k % D_W_EVERY == 0
            a = h * w if uses_w else h * k08
            t = np.tanh(a + k01)
            a4 = t * half
            s = 1 / (1 + np.exp(-a4))
            n = -a4
            e = np.exp(n * a4)
            saved.append((h, t, a4, s, n, e, uses_w))
            h = h + s * e
        return np.sum(h), saved

    def backward(saved: Any) -> dict[str, Any]:
        gh = np.ones(D_SIZE, np.float32)
        gw = np.zeros(D_SIZE, np.float32)
        for h, t, a4, s, n, e, uses_w in reversed(saved):
            gs = gh * e  # y = s*e
            gm = (gh * s) * e  # e = exp(m)
            ga4 = gm * n - gm * a4 + gs * (s * (1 - s))  # m = n*a4, n = -a4, s = sigmoid(a4)
            ga = (ga4 * half) * (1 - t * t)  # *0.5, tanh, +0.1
            if uses_w:
                gw += ga * h
                gh = gh + ga * w
            else:
                gh = gh + ga * k08
        return {"x": gh, "w": gw}

    return _numpy_impl(forward, backward)


NUMPY_IMPLS: dict[str, dict[str, Callable[[Any, dict[str, Any]], Impl]]] = {
    "A": {"numpy": a_numpy, "numpy_fused": a_numpy_fused, "numba_fused": a_numba_fused},
    "B": {"numpy": b_numpy},
    "C": {"numpy": c_numpy},
    "D": {"numpy": d_numpy},
    "E": {},  # (double backward: no hand-written numpy version)
    "F": {},
    "G": {},  # (recomputation: no hand-written numpy version)
}


# ---- fusegrad program inspection ---------------------------------------------------------------


def _value_nbytes(np: Any, v: Any, sizes: Any = ()) -> int:
    from fusegrad.compiler.symbolic import substitute  # shapes may be symbolic

    return int(math.prod(substitute(v.shape, sizes))) * np.dtype(v.dtype.np).itemsize


def program_info(np: Any, fc: Any, impl: Impl) -> dict[str, Any]:
    """One extra (untimed) compiled backward of ``impl`` that records which program ran: its
    kernels and externs, and the bytes its kernels move (each distinct array a kernel reads
    counted once per kernel, every output written once; externs not counted).  Uses compiler
    internals (``compiler.key.walk``, the service's ``lookup``, ``Program.kernels``) and reports an
    error instead of failing when they change."""
    try:
        import fusegrad as fg
        from fusegrad.compiler.key import walk
        from fusegrad.compiler.service import service
    except ImportError as e:
        return {"error": f"compiler internals moved: {e}"}
    if impl.fn is None:
        return {"error": "no function to run"}
    for t in impl.leaf_tensors:
        t.grad = None
    with fc.compiled_autograd():
        loss = impl.fn(*impl.args)
        # the walk the backward does, made first (it only reads the graph)
        w = walk([loss], [fg.ones_like(loss)], None, True, False)
        arrays = None
        if w.fallback is None:
            with contextlib.suppress(Exception):
                arrays = [s.unpack(node)._data for node, s in w.saved]
        loss.backward()
    if w.fallback is not None:
        return {"fallback": w.fallback}
    program = service.lookup(w)
    if program is None:
        return {"error": "program not found in fusegrad.compiler's cache"}
    info: dict[str, Any] = {
        "kernels": len(program.kernels),
        "externs": len(program.externs),
        "extern_ops": sorted({v.op for v in program.externs}),
        "source_path": program.source_path,
    }
    try:
        read = written = 0
        for kernel in program.kernels:
            seen: set[tuple[int, int]] = set()
            for v in kernel.inputs:
                if v.op == "input" and v.attr("kind") == "saved" and arrays is not None:
                    a = arrays[v.attr("index")]
                    key = (a.__array_interface__["data"][0], a.nbytes)
                    if key not in seen:
                        seen.add(key)
                        read += a.nbytes
                else:
                    read += _value_nbytes(np, v, w.sizes)
            for v in kernel.outputs:
                written += _value_nbytes(np, v, w.sizes)
                if v in kernel.accumulate:
                    read += _value_nbytes(np, v, w.sizes)
            for v in kernel.reductions:
                written += _value_nbytes(np, v, w.sizes)
        info["kernel_bytes_read"] = read
        info["kernel_bytes_written"] = written
    except Exception as e:  # noqa: BLE001 - internals changed: report, do not fail
        info["traffic_error"] = f"{type(e).__name__}: {e}"
    return info


# ---- compile time in fresh processes -----------------------------------------------------------


def _helper_cache_stats() -> dict[str, int]:
    """Specialisations of fusegrad's numba helpers loaded from numba's disk cache / compiled."""
    loaded = compiled = 0
    for modname in ("fusegrad.compiler.codegen.fastmath", "fusegrad.compiler.codegen.cpu_helpers"):
        module = sys.modules.get(modname)
        if module is None:
            continue
        for obj in vars(module).values():
            stats = getattr(obj, "stats", None)
            if stats is None or not hasattr(obj, "py_func"):
                continue
            loaded += sum(stats.cache_hits.values())
            compiled += sum(stats.cache_misses.values())
    return {"helpers_from_disk": loaded, "helpers_compiled": compiled}


def compile_child(name: str, quick: bool, threads: int) -> dict[str, Any]:
    """In a fresh process: build workload ``name`` (A at its smallest size), run one eager
    forward and a compiled backward (timed: the compile), then a second step (in-memory hit)."""
    common.pin_threads(threads)
    t0 = common.clock()
    import numpy as np

    import fusegrad as fg

    t1 = common.clock()
    fc = importlib.import_module("fusegrad.compiler")
    t2 = common.clock()
    wl = make_workloads(np, [name], quick)[0]
    impl = framework_impl(
        wl, fg_ops(fg), _fg_leaf(fg), fg.tensor, _fg_numpy, context=fc.compiled_autograd
    )
    first = impl.step()
    # (with config.background_compile the first backward runs eagerly while the program is
    # compiled on a thread: its compile time is the program's, read after the wait)
    fc.wait_for_compiles()
    counters = fc.counters
    snapshot = {
        "captures": counters.captures,
        "compiles": counters.compiles,
        "disk_hits": counters.disk_hits,
        "fallbacks": dict(counters.fallbacks),
    }
    programs = fc.cached_programs()
    second = impl.step()
    return {
        "workload": wl.label,
        "import_fusegrad_s": t1 - t0,
        "import_compiler_s": t2 - t1,
        "first_backward_s": first["backward"],
        "second_backward_s": second["backward"],
        "program_compile_seconds": [p.compile_seconds for p in programs],
        "kernels": [len(p.kernels) for p in programs],
        "counters": snapshot,
        **_helper_cache_stats(),
        "fusegrad_cache_dir": os.environ.get("FUSEGRAD_CACHE_DIR"),
        "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
    }


def _run_child(name: str, quick: bool, threads: int, env: dict[str, str]) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.compiled",
        "--compile-child",
        name,
        "--threads",
        str(threads),
    ] + (["--quick"] if quick else [])
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(common.REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    try:
        proc = subprocess.run(
            command,
            cwd=common.REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(CHILD_MARKER):
            return json.loads(line[len(CHILD_MARKER) :])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    return {"error": f"exit {proc.returncode}: " + "\n".join(tail)}


COMPILE_CASES = ("cold", "warm_disk")
COMPILE_HEADERS = {"cold": "cold", "warm_disk": "warm from disk"}


def compile_time(name: str, quick: bool, threads: int) -> dict[str, Any]:
    """Workload ``name`` in two fresh processes: ``cold`` with an empty FUSEGRAD_CACHE_DIR and an
    empty NUMBA_CACHE_DIR (nothing cached anywhere, numba's in-memory state empty), then
    ``warm_disk``, a second process on the same two directories (generated module and machine
    code on disk)."""
    root = Path(tempfile.mkdtemp(prefix=f"fusegrad-bench-{name}-"))
    try:
        env = dict(os.environ)
        env["FUSEGRAD_CACHE_DIR"] = str(root / "fusegrad")
        env["NUMBA_CACHE_DIR"] = str(root / "numba")
        return {case: _run_child(name, quick, threads, env) for case in COMPILE_CASES}
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- checks and report -------------------------------------------------------------------------


def check_gradients(np: Any, impls: dict[str, Impl], rtol: float) -> dict[str, Any]:
    """Every implementation's loss and gradients against fusegrad eager's, relative to the
    largest reference magnitude per gradient.  Uses the last timed repetition."""
    reference, ref_loss = impls["fg_eager"].grads(), impls["fg_eager"].loss()
    report: dict[str, Any] = {
        "reference": "fg_eager",
        "rtol": rtol,
        "ok": True,
        "max_rel_error": {},
    }
    for name, impl in impls.items():
        if name == "fg_eager":
            continue
        grads = impl.grads()
        worst = abs(impl.loss() - ref_loss) / max(abs(ref_loss), 1e-12)
        for key, ref in reference.items():
            got = grads.get(key)
            if ref is None or got is None or np.shape(got) != np.shape(ref):
                worst = float("inf")
                break
            scale = max(float(np.max(np.abs(ref))), 1e-12)
            worst = max(worst, float(np.max(np.abs(np.asarray(got) - ref))) / scale)
        report["max_rel_error"][name] = worst
        if not worst <= rtol:
            report["ok"] = False
    return report


def build_rows(
    workloads: Sequence[Workload],
    stats: dict[str, dict[str, dict[str, common.Stats]]],
    kept: dict[str, dict[str, dict[str, common.Stats]]],
) -> list[dict[str, Any]]:
    """Per workload and metric: the median of every implementation in the workload's unit, and
    the ratios fg compiled / each other implementation."""
    rows = []
    for wl in workloads:
        specs: list[tuple[str, str, dict[str, dict[str, common.Stats]]]] = [
            (metric, phase, stats[wl.label]) for metric, phase in METRICS
        ]
        if wl.label in kept:
            specs.insert(2, (KEPT_METRIC, "backward", kept[wl.label]))
        for metric, phase, by_impl in specs:
            values: dict[str, float | None] = {}
            full: dict[str, Any] = {}
            for impl in IMPLS:
                phase_stats = by_impl.get(impl, {}).get(phase)
                if impl == "jax" and phase != "total":
                    phase_stats = None  # one fused phase: only forward+backward is meaningful
                scaled = phase_stats.scaled(UNIT_SCALE[wl.unit]) if phase_stats else None
                values[impl] = scaled.median if scaled else None
                full[impl] = common.stats_dict(scaled)
            rows.append(
                {
                    "workload": wl.label,
                    "metric": metric,
                    "unit": wl.unit,
                    **values,
                    **{
                        f"fg_compiled/{other}": common.ratio(values["fg_compiled"], values[other])
                        for other in RATIO_TO
                    },
                    **{
                        f"fg_step/{other}": common.ratio(values.get("fg_step"), values[other])
                        for other in STEP_RATIO_TO
                    },
                    "stats": full,
                }
            )
    return rows


def planned_impls(
    names: Sequence[str], have_torch: bool, torch_compile: bool, have_jax: bool
) -> list[str]:
    """The implementations a run will time (the table's columns, known before it measures):
    ``numpy fused`` and ``numba 1-loop`` exist for A only."""
    plan = {"fg_eager", "fg_compiled", "fg_step", "numpy"}
    if "A" in names:
        plan |= {"numpy_fused", "numba_fused"}
    if have_torch:
        plan.add("torch")
        if torch_compile:
            plan.add("torch_compile")
    if have_jax:
        plan.add("jax")
    return [i for i in IMPLS if i in plan]


def _ratio_columns(impls: Sequence[str]) -> list[str]:
    """The ratio keys of the table, in order: ``fg_compiled/x``, then ``fg_step/x``."""
    keys = [f"fg_compiled/{o}" for o in RATIO_TO if o in impls]
    if "fg_step" in impls:
        keys += [f"fg_step/{o}" for o in STEP_RATIO_TO if o in impls]
    return keys


def _ratio_header(key: str) -> str:
    numerator, _, other = key.partition("/")
    short = "compiled" if numerator == "fg_compiled" else "step"
    return f"{short}/{HEADERS[other].replace('fg ', '')}"


def table_headers(impls: Sequence[str]) -> tuple[list[str], list[str]]:
    """Headers and alignments of the time table for these implementations."""
    headers = ["workload", "metric", "unit", *(HEADERS[i] for i in impls)]
    headers += [_ratio_header(k) for k in _ratio_columns(impls)]
    return headers, ["l", "l", "l"] + ["r"] * (len(headers) - 3)


def table_cells(row: Mapping[str, Any], impls: Sequence[str]) -> list[str]:
    """One row of the time table: medians in the row's unit, then ratios with a ×."""
    cells = [row["workload"], row["metric"], row["unit"]]
    cells += [common.format_number(row[i]) for i in impls]
    for key in _ratio_columns(impls):
        value = row[key]
        cells.append(common.format_number(value, 2) + "×" if value is not None else "—")
    return cells


def render_table(rows: Sequence[dict[str, Any]], impls: Sequence[str]) -> str:
    headers, align = table_headers(impls)
    return common.markdown_table(headers, [table_cells(row, impls) for row in rows], align)


COMPILE_TABLE_HEADERS = [
    "workload",
    "kernels",
    "externs",
    *(f"{COMPILE_HEADERS[c]} (s)" for c in COMPILE_CASES),
    "steady bwd (ms)",
    "torch.compile 1st (s)",
    "jax 1st (s)",
]
COMPILE_TABLE_HEADERS.insert(4, "cold: JIT+1st run (s)")


def compile_table_cells(
    wl: Workload,
    workloads: Sequence[Workload],
    compile_results: dict[str, Any],
    programs: dict[str, dict[str, Any]],
    first_calls: dict[str, dict[str, float | None]],
    steady: Mapping[str, float | None],
) -> list[str]:
    """One row of the compile-time table (``COMPILE_TABLE_HEADERS``)."""
    info = programs.get(wl.label, {})
    cells = [wl.label, str(info.get("kernels", "—")), str(info.get("externs", "—"))]
    child = compile_results.get(wl.name, {}) if _first_of(workloads, wl) else {}
    for case in COMPILE_CASES:
        result = child.get(case)
        if result is None:
            cells.append("—")
        elif "error" in result:
            cells.append("FAILED")
        else:
            cells.append(common.format_number(result["first_backward_s"]))
        if case == "cold":  # the part spent in the program's first run (numba JIT)
            jit = (
                None
                if result is None or "error" in result
                else sum(result["program_compile_seconds"])
            )
            cells.append(common.format_number(jit))
    bwd = steady.get(wl.label)
    cells.append(common.format_number(bwd * 1e3 if bwd is not None else None))
    calls = first_calls.get(wl.label, {})
    cells.append(common.format_number(calls.get("torch_compile")))
    cells.append(common.format_number(calls.get("jax")))
    return cells


def render_compile_table(
    workloads: Sequence[Workload],
    compile_results: dict[str, Any],
    programs: dict[str, dict[str, Any]],
    first_calls: dict[str, dict[str, float | None]],
    steady: Mapping[str, float | None],
) -> str:
    body = [
        compile_table_cells(wl, workloads, compile_results, programs, first_calls, steady)
        for wl in workloads
    ]
    align = ["l"] + ["r"] * (len(COMPILE_TABLE_HEADERS) - 1)
    return common.markdown_table(COMPILE_TABLE_HEADERS, body, align)


def _first_of(workloads: Sequence[Workload], wl: Workload) -> bool:
    """Compile time is measured once per workload (A at its smallest size)."""
    return next(w for w in workloads if w.name == wl.name) is wl


def bandwidth_bound(
    wl: Workload,
    bandwidth: dict[str, Any],
    program: dict[str, Any],
    compiled_bwd: Mapping[str, float | None],
) -> dict[str, Any]:
    """A's backward at its largest N against the memory-bandwidth bound, three byte counts:
    ``naive``: 6*4*N (read x, w, b and write three gradients, each counted as N floats);
    ``minimum``: 4*4*N (b and its gradient are one element); ``program``: what the generated
    kernels actually read and write (saved activations included)."""
    n = wl.size or 0
    gbps = bandwidth["gbps"]
    counts = {"naive": 6 * 4 * n, "minimum": 4 * 4 * n}
    if "kernel_bytes_read" in program:
        counts["program"] = program["kernel_bytes_read"] + program["kernel_bytes_written"]
    out: dict[str, Any] = {"workload": wl.label, "N": n, "gbps": gbps, "bounds": {}}
    for label, nbytes in counts.items():
        bound_s = nbytes / (gbps * 1e9)
        out["bounds"][label] = {
            "bytes": nbytes,
            "bound_ms": bound_s * 1e3,
            **{
                f"fraction_{variant}": (bound_s / t if t else None)
                for variant, t in compiled_bwd.items()
            },
        }
    out["compiled_backward_ms"] = {k: (v * 1e3 if v else None) for k, v in compiled_bwd.items()}
    return out


# ---- driver ------------------------------------------------------------------------------------


def _fg_leaf(fg: Any) -> Callable[[Any], Any]:
    return lambda a: fg.tensor(a, requires_grad=True)


def _fg_numpy(t: Any) -> Any:
    return t.numpy()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


@dataclass
class Frameworks:
    """The imported frameworks the implementations are built from."""

    fg: Any
    fc: Any
    torch: Any | None
    torch_compile: bool


def fusegrad_impls(fw: Frameworks, wl: Workload, *, keep_grad: bool) -> dict[str, Impl]:
    """fusegrad eager and compiled (the same forward; the backward in compiled_autograd)."""
    ops, leaf = fg_ops(fw.fg), _fg_leaf(fw.fg)
    return {
        "fg_eager": framework_impl(wl, ops, leaf, fw.fg.tensor, _fg_numpy, keep_grad=keep_grad),
        "fg_compiled": framework_impl(
            wl,
            ops,
            leaf,
            fw.fg.tensor,
            _fg_numpy,
            context=fw.fc.compiled_autograd,
            keep_grad=keep_grad,
        ),
        "fg_step": fg_step_impl(wl, fw.fg, keep_grad=keep_grad),
    }


def torch_impls(
    fw: Frameworks, wl: Workload, notes: dict[str, str], *, keep_grad: bool
) -> dict[str, Impl]:
    """torch eager and, unless disabled or already failed (``notes``), torch.compile, whose
    first step (dynamo + AOTAutograd + inductor, forward and backward) runs and is timed here;
    a failure is recorded in ``notes`` and the column skipped."""
    torch = fw.torch
    if torch is None:
        return {}

    def leaf(a: Any) -> Any:
        return torch.from_numpy(a.copy()).requires_grad_(True)

    def const(a: Any) -> Any:
        return torch.from_numpy(a.copy())

    def to_np(t: Any) -> Any:
        return t.detach().numpy()

    ops = torch_ops(torch)
    out = {"torch": framework_impl(wl, ops, leaf, const, to_np, keep_grad=keep_grad)}
    if fw.torch_compile and "torch_compile" not in notes:
        impl = framework_impl(wl, ops, leaf, const, to_np, wrap=torch.compile, keep_grad=keep_grad)
        t0 = common.clock()
        try:
            impl.step()
        except Exception as e:  # noqa: BLE001 - a failing torch.compile is skipped
            notes["torch_compile"] = f"failed: {_first_line(e)}"
        else:
            impl.first_call_s = common.clock() - t0
            out["torch_compile"] = impl
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compiled",
        description="fusegrad compiled backward vs eager, numpy, PyTorch (eager and "
        "torch.compile) and JAX.",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="BLAS/OpenMP/numba/torch threads (default 1)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes (A at N=1e3, 1e4) and 1+2 repetitions: a smoke test, not a measurement",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated subset of A,B,C,D (default: all)",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch columns")
    parser.add_argument(
        "--no-torch-compile", action="store_true", help="skip torch.compile (keep torch eager)"
    )
    parser.add_argument(
        "--warm-inductor-cache",
        action="store_true",
        help="let torch.compile use inductor's usual on-disk cache (default: a fresh empty one)",
    )
    parser.add_argument("--no-jax", action="store_true", help="skip JAX even if importable")
    parser.add_argument(
        "--no-compile-time",
        action="store_true",
        help="skip the cold / warm-from-disk compile-time subprocesses",
    )
    parser.add_argument(
        "--compile-time-workloads",
        default=None,
        help="comma-separated workloads whose compile time is measured (default: every workload "
        "run; each costs two fresh processes, the first compiling everything cold)",
    )
    parser.add_argument("--warmup", type=int, default=None, help="override warm-up repetitions")
    parser.add_argument("--reps", type=int, default=None, help="override measured repetitions")
    parser.add_argument(
        "--json",
        type=Path,
        default=common.RESULTS_DIR / "compiled.json",
        help="where to write the JSON results (default: %(default)s)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="also draw the ratios against each peer as grouped bars into this PNG "
        "(needs matplotlib)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "plain", "off"),
        default="auto",
        help="progress on stderr: a tqdm bar per workload when tqdm is installed and stderr is "
        "a terminal, plain lines otherwise (auto); always plain lines; none",
    )
    parser.add_argument("--compile-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plot is not None and (missing := plot.matplotlib_missing()) is not None:
        parser.error(missing)
    names = [n.strip().upper() for n in args.workloads.split(",") if n.strip()]
    bad = [n for n in names if n not in WORKLOADS]
    if bad or not names:
        parser.error(f"--workloads: unknown {bad or 'empty list'}; choose from A,B,C,D")
    args.workload_names = list(dict.fromkeys(names))
    args.compile_time_names = None
    if args.compile_time_workloads is not None:
        timed = [n.strip().upper() for n in args.compile_time_workloads.split(",") if n.strip()]
        outside = [n for n in timed if n not in args.workload_names]
        if outside:
            parser.error(f"--compile-time-workloads: {outside} not among --workloads")
        args.compile_time_names = timed
    return args


def _import_torch(args: argparse.Namespace, threads: dict[str, Any]) -> tuple[Any, str]:
    """Import torch and pin its threads.  Unless TORCHINDUCTOR_CACHE_DIR is set already (or
    ``--warm-inductor-cache``), inductor gets a fresh, empty cache directory (removed at exit),
    so that torch.compile's first call is a cold compile, like fusegrad's ``cold`` column."""
    if args.no_torch:
        return None, "skipped (--no-torch)"
    if not args.no_torch_compile and not args.warm_inductor_cache:
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            cache = tempfile.mkdtemp(prefix="fusegrad-bench-inductor-")
            atexit.register(shutil.rmtree, cache, ignore_errors=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        return None, f"skipped (not importable: {e})"
    threads["torch"] = common.pin_torch_threads(torch, args.threads)
    return torch, torch.__version__


def _import_jax(args: argparse.Namespace) -> tuple[Any, Any, str]:
    if args.no_jax:
        return None, None, "skipped (--no-jax)"
    if importlib.util.find_spec("jax") is None:
        return None, None, "skipped (not importable)"
    if args.threads == 1 and "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = (
            "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    try:
        jax = importlib.import_module("jax")
        jnp = importlib.import_module("jax.numpy")
    except Exception as e:  # noqa: BLE001 - any import failure means: no JAX column
        return None, None, f"skipped (import failed: {_first_line(e)})"
    return jax, jnp, jax.__version__


def _repetitions(args: argparse.Namespace, wl: Workload) -> tuple[int, int]:
    warmup, reps = QUICK_REPS if args.quick else DEFAULT_REPS[wl.reps_key]
    warmup = args.warmup if args.warmup is not None else warmup
    reps = args.reps if args.reps is not None else reps
    return warmup, reps


PLOT_PANELS = [
    {
        "title": "compiled backward: fg compiled backward time / peer's backward time",
        "numerator": "fg_compiled",
        "peers": ["fg_eager", "numpy", "torch", "torch_compile"],
        "metrics": ["backward", KEPT_METRIC],
    },
    {
        "title": "whole step: fg whole step (forward+backward) time / peer's forward+backward time",
        "numerator": "fg_step",
        "peers": list(STEP_RATIO_TO),
        "metrics": ["forward+backward"],
    },
]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the report (each table row as soon as it is measured), write
    the JSON and, with ``--plot``, the picture; returns the JSON payload."""
    args = parse_args(argv)
    if args.compile_child:
        result = compile_child(args.compile_child, args.quick, args.threads)
        print(CHILD_MARKER + json.dumps(result))
        return result
    threads = common.pin_threads(args.threads)

    import numpy as np

    import fusegrad as fg

    fc = importlib.import_module("fusegrad.compiler")
    torch, torch_note = _import_torch(args, threads)
    torch_compile_note = torch_note
    if torch is not None:
        inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "default")
        fresh = os.path.basename(inductor_cache).startswith("fusegrad-bench-inductor-")
        torch_compile_note = "inductor, default mode, " + (
            "fresh empty inductor cache" if fresh else f"inductor cache {inductor_cache}"
        )
    if torch is not None and args.no_torch_compile:
        torch_compile_note = "skipped (--no-torch-compile)"
    jax, jnp, jax_note = _import_jax(args)
    environment = common.environment(threads=args.threads)

    workloads = make_workloads(np, args.workload_names, args.quick)
    fw = Frameworks(fg, fc, torch, not args.no_torch_compile)
    planned = planned_impls(
        args.workload_names, torch is not None, not args.no_torch_compile, jax is not None
    )
    repetitions = {}
    for wl in workloads:
        warmup, reps = _repetitions(args, wl)
        repetitions[wl.label] = {"warmup": warmup, "reps": reps}

    # ---- the header: everything known before measuring ----
    quick_note = " (QUICK: smoke test, not a measurement)" if args.quick else ""
    live.emit(f"# fusegrad compiled autograd{quick_note}")
    live.emit()
    live.emit(f"machine: {common.describe_environment(environment)}")
    live.emit(
        f"threads: {args.threads} (BLAS/OpenMP/numba env{' + torch' if torch else ''}); "
        f"torch: {torch_note}; torch.compile: {torch_compile_note}; jax: {jax_note}"
    )
    live.emit(
        "repetitions (warm-up/measured): "
        + ", ".join(f"{k} {r['warmup']}/{r['reps']}" for k, r in repetitions.items())
        + "; .grad set to None before every step (outside the timing) except in "
        "the '.grad kept' rows, where every backward accumulates into the existing .grad"
    )
    for wl in workloads:
        if _first_of(workloads, wl):
            live.emit(f"{wl.name}: {wl.description}")
    live.emit()
    live.emit(
        "Times: median wall time of one call, in the row's unit (µs or ms). "
        + live.RATIO_CONVENTION
        + " compiled/X = fg compiled time / X's time (the same eager forward, so forward rows "
        "are near 1×); step/X = fg whole step time / X's time (forward+backward rows only)."
    )
    live.emit()

    bandwidth = common.memory_bandwidth(np, mib=64 if args.quick else 256)
    copy_bw, add_bw = bandwidth["copy"], bandwidth["add"]
    live.emit(
        f"memory bandwidth ({bandwidth['array_mib']} MiB float32 arrays, {args.threads} "
        f"thread(s), median/best): copy {copy_bw['gbps_median']:.1f}/{copy_bw['gbps_best']:.1f} "
        f"GB/s (2 x bytes), add {add_bw['gbps_median']:.1f}/{add_bw['gbps_best']:.1f} GB/s "
        f"(3 x bytes); bounds below use {bandwidth['gbps']:.1f} GB/s"
    )
    live.emit()

    stats: dict[str, dict[str, dict[str, common.Stats]]] = {}
    kept: dict[str, dict[str, dict[str, common.Stats]]] = {}
    checks: dict[str, Any] = {}
    programs: dict[str, dict[str, Any]] = {}
    first_calls: dict[str, dict[str, float | None]] = {}
    compiler_events: dict[str, Any] = {}
    notes: dict[str, dict[str, str]] = {}
    present: set[str] = set()
    rows: list[dict[str, Any]] = []

    headers, align = table_headers(planned)
    label_width = max(len(wl.label) for wl in workloads)
    metric_width = max(len(m) for m, _ in (*METRICS, (KEPT_METRIC, "")))
    stream = live.StreamTable(headers, align, widths=[label_width, metric_width, 4])
    stream.start()
    for index, wl in enumerate(workloads, 1):
        warmup, reps = repetitions[wl.label]["warmup"], repetitions[wl.label]["reps"]
        wl_notes: dict[str, str] = {}
        calls: dict[str, float | None] = {}
        progress = live.Progress(wl.label, mode=args.progress, position=(index, len(workloads)))
        progress.stage("building (torch.compile / jax / whole step compile on first calls)")

        impls = fusegrad_impls(fw, wl, keep_grad=False)
        for name, builder in NUMPY_IMPLS[wl.name].items():
            impls[name] = builder(np, wl.data)
        impls.update(torch_impls(fw, wl, wl_notes, keep_grad=False))
        if "torch_compile" in impls:
            calls["torch_compile"] = impls["torch_compile"].first_call_s
        if jax is not None:
            try:
                impls["jax"] = jax_impl(wl, jax, jnp)
                calls["jax"] = impls["jax"].first_call_s
            except Exception as e:  # noqa: BLE001 - a failing JAX workload is skipped
                wl_notes["jax"] = f"failed: {_first_line(e)}"
        t0 = common.clock()
        impls["fg_step"].step()  # recorded (an eager call)
        impls["fg_step"].step()  # the program built and compiled (or loaded), then run
        fc.wait_for_compiles()  # (a JIT running in the background: measure compiled steps)
        calls["fg_step_first_two"] = common.clock() - t0
        before = (fc.counters.captures, fc.counters.compiled_runs, dict(fc.counters.fallbacks))
        t0 = common.clock()
        impls["fg_compiled"].step()  # this process's first compiled backward of this graph
        fc.wait_for_compiles()  # (compiled on a thread, the first backward eager meanwhile)
        calls["fg_compiled_in_process"] = common.clock() - t0
        # the calls of a trial between a program's two candidates (interpreted or generated
        # larger kernels, native segments: ``service.Trial``, they run in turn and the faster
        # stays), before anything is measured
        steps.settle(impls, ("fg_step", "fg_compiled"), ())
        after_first = fc.counters.captures
        progress.stage(f"measuring {len(impls)} implementations, {warmup}+{reps} repetitions")
        stats[wl.label] = common.measure_interleaved(
            {name: impl.step for name, impl in impls.items()},
            warmup=warmup,
            reps=reps,
            on_step=progress.update,
        )
        compiler_events[wl.label] = {
            "captures_first_call": after_first - before[0],
            "captures_steady_state": fc.counters.captures - after_first,
            "compiled_runs": fc.counters.compiled_runs - before[1],
            "fallbacks": sum(fc.counters.fallbacks.values()) - sum(before[2].values()),
            "fallback_reasons": {
                reason: count - before[2].get(reason, 0)
                for reason, count in fc.counters.fallbacks.items()
                if count != before[2].get(reason, 0)
            },
        }
        checks[wl.label] = check_gradients(np, impls, GRAD_RTOL)
        programs[wl.label] = program_info(np, fc, impls["fg_compiled"])
        present.update(impls)
        first_calls[wl.label] = calls
        if wl.name == "A":  # .grad kept: every backward accumulates into the existing .grad
            progress.stage("building the .grad-kept variants")
            kept_impls = {
                **fusegrad_impls(fw, wl, keep_grad=True),
                **torch_impls(fw, wl, wl_notes, keep_grad=True),
            }
            for impl in kept_impls.values():
                impl.step()  # capture / compile the accumulating variant
                impl.step()  # (a whole step: record, then build)
            fc.wait_for_compiles()
            progress.stage(f"measuring with .grad kept, {warmup}+{reps} repetitions")
            kept[wl.label] = common.measure_interleaved(
                {name: impl.step for name, impl in kept_impls.items()},
                warmup=warmup,
                reps=reps,
                on_step=progress.update,
            )
            del kept_impls
        notes[wl.label] = wl_notes
        del impls
        gc.collect()
        wl_rows = build_rows([wl], stats, kept)
        for row in wl_rows:
            stream.row(table_cells(row, planned))
        rows += wl_rows
        progress.close()

    impl_order = [i for i in IMPLS if i in present]
    table = render_table(rows, impl_order)
    steady = {wl.label: stats[wl.label]["fg_compiled"]["backward"].median for wl in workloads}

    # ---- compile time, one workload at a time ----
    live.emit()
    live.emit(
        "Compile time: wall time of the first backward in compiled autograd in a fresh process "
        "(capture + passes + codegen, then the eager run while numba compiles or loads the "
        "program on a thread: config.background_compile), in seconds. 'cold': "
        "empty FUSEGRAD_CACHE_DIR and NUMBA_CACHE_DIR; 'warm from disk': a second process on "
        "the first one's directories; 'cold: JIT+1st run': the thread's numba JIT and first "
        "run of the program (the time until a backward can run compiled). A at its smallest "
        "size. 'steady bwd': the compiled backward after "
        "warm-up (ms). torch.compile 1st: first forward+backward of the compiled forward in "
        "this process (dynamo + AOTAutograd + inductor; the first workload also pays for "
        "loading inductor; cold unless the inductor cache was given: see the torch.compile "
        "note). jax 1st: trace + XLA compile + first run."
        + (" (skipped: --no-compile-time)" if args.no_compile_time else "")
    )
    live.emit()
    compile_results: dict[str, Any] = {}
    compile_stream = live.StreamTable(
        COMPILE_TABLE_HEADERS,
        ["l"] + ["r"] * (len(COMPILE_TABLE_HEADERS) - 1),
        widths=[label_width],
    )
    compile_stream.start()
    names = [n for n in WORKLOADS if n in args.workload_names]
    timed = names if args.compile_time_names is None else args.compile_time_names
    for index, name in enumerate(names, 1):
        if not args.no_compile_time and name in timed:
            with live.Progress(
                f"compile time {name}", mode=args.progress, position=(index, len(names))
            ) as progress:
                progress.stage("cold and warm-from-disk processes")
                compile_results[name] = compile_time(name, args.quick, args.threads)
        for wl in workloads:
            if wl.name == name:
                compile_stream.row(
                    compile_table_cells(
                        wl, workloads, compile_results, programs, first_calls, steady
                    )
                )
    compile_table = render_compile_table(workloads, compile_results, programs, first_calls, steady)
    child_failures = [
        f"{name} {case}: {res['error']}"
        for name, cases in compile_results.items()
        for case, res in cases.items()
        if "error" in res
    ]

    largest_a = max(
        (w for w in workloads if w.name == "A"), key=lambda w: w.size or 0, default=None
    )
    bound = None
    if largest_a is not None:
        compiled_bwd = {
            "grad_none": stats[largest_a.label]["fg_compiled"]["backward"].median,
            "grad_kept": kept[largest_a.label]["fg_compiled"]["backward"].median,
        }
        bound = bandwidth_bound(largest_a, bandwidth, programs[largest_a.label], compiled_bwd)

    # ---- what else was found ----
    live.emit()
    if bound is not None:
        cb = bound["compiled_backward_ms"]
        live.emit(
            f"bandwidth bound of {bound['workload']} backward (fg compiled: "
            f"{cb['grad_none']:.2f} ms with .grad None, {cb['grad_kept']:.2f} ms with .grad "
            f"kept): bytes moved -> the time they take at {bandwidth['gbps']:.1f} GB/s; "
            "achieved = that time / the compiled backward's time"
        )
        explain = {
            "naive": "6*4*N: read x, w, b, write 3 gradients, each counted as N floats",
            "minimum": "4*4*N: read x, w, write grad_x, grad_w (b, grad_b: one element)",
            "program": "bytes the generated kernels read (distinct arrays, saved activations "
            "included) and write",
        }
        for label, b in bound["bounds"].items():
            fn, fk = b["fraction_grad_none"], b["fraction_grad_kept"]
            live.emit(
                f"  {label:8s} {common.format_number(b['bytes'] / 1e6):>6s} MB -> "
                f"{common.format_number(b['bound_ms']):>6s} ms; achieved "
                f"{(fn or 0) * 100:5.1f}% (.grad None), {(fk or 0) * 100:5.1f}% (.grad kept)"
                f"   [{explain[label]}]"
            )
    for label, info in programs.items():
        ev = compiler_events[label]
        extra = f"; FALLBACKS {ev['fallback_reasons']}" if ev["fallbacks"] else ""
        desc = (
            f"{info.get('kernels', '?')} kernel(s), {info.get('externs', '?')} extern(s)"
            + (f" {info['extern_ops']}" if info.get("extern_ops") else "")
            if "kernels" in info
            else info.get("fallback") or info.get("error", "?")
        )
        live.emit(
            f"program {label}: {desc}; captures: {ev['captures_first_call']} on first call, "
            f"{ev['captures_steady_state']} in steady state{extra}"
        )
    for label, wl_notes in notes.items():
        for impl_name, note in wl_notes.items():
            live.emit(f"note {label} {HEADERS[impl_name]}: {note}")
    for label, check in checks.items():
        errors = ", ".join(f"{HEADERS[k]} {v:.1e}" for k, v in check["max_rel_error"].items())
        status = "ok" if check["ok"] else "MISMATCH"
        live.emit(
            f"gradient check {label} vs fg eager (max relative error, rtol {check['rtol']:g}): "
            f"{status} ({errors})"
        )
    for failure in child_failures:
        live.emit(f"COMPILE-TIME SUBPROCESS FAILED: {failure}")

    payload = {
        "benchmark": "compiled",
        "quick": args.quick,
        "threads": threads,
        "repetitions": repetitions,
        "grad_policy": "set to None before every step, outside the timing; "
        f"'{KEPT_METRIC}' rows keep it (accumulate in place)",
        "workloads": {
            wl.label: {
                "name": wl.name,
                "size": wl.size,
                "unit": wl.unit,
                "description": wl.description,
            }
            for wl in workloads
        },
        "implementations": impl_order,
        "columns": dict(HEADERS),
        "ratio_convention": "fg_compiled/x and fg_step/x: that fusegrad column's median time "
        "divided by x's, in the same run (below 1: fusegrad faster)",
        "plot_panels": PLOT_PANELS,
        "torch": torch_note,
        "torch_compile": torch_compile_note,
        "jax": jax_note,
        "notes": notes,
        "rows": rows,
        "compile_time": compile_results,
        "first_calls_in_process_s": first_calls,
        "programs": programs,
        "compiler_events": compiler_events,
        "bandwidth": bandwidth,
        "bandwidth_bound": bound,
        "checks": checks,
        "ok": all(c["ok"] for c in checks.values()) and not child_failures,
        "table": table,
        "compile_table": compile_table,
        "environment": environment,
    }
    path = common.write_json(args.json, payload)
    live.emit(f"\nJSON written to {path} (compare two runs: python -m benchmarks.compare A B)")
    if args.plot is not None:
        live.emit(f"plot written to {plot.plot_payload(payload, args.plot)}")
    return payload


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result.get("ok", True) else 1)
