"""A compiled backward: the schedule of fused kernels and externs, and how to run it.

Building a ``Program`` runs fusion (``passes.fuse``), emits one module for all its kernels
(``codegen.numba_cpu``) and loads it.  ``mode="debug"`` skips fusion and code generation and
evaluates the graph value by value with the primitives' eager kernels (the reference executor).

Running a program on one call's data:

1. unpack every saved tensor first, through ``SavedTensor.unpack`` — the same version checks
   and errors as eager mode — before anything is computed or written (a failing check leaves
   every ``.grad`` untouched);
2. run the steps in order: externs through their eager kernel, kernels through generated code
   (sizes passed at run time), dropping each array after its last use;
3. perform the effects with the engine's own ``.grad`` semantics (first write stores, later
   writes add in place into the existing ``.grad``, keeping its identity);
4. free the nodes' saved tensors unless ``retain_graph``.

``run_bound`` is the same run for the tape path (``capture.Binding``): the saved arrays come
already gathered and known current (``graph_epoch`` unchanged since the forward), so step 1 is
the binding's checks, and freeing drops each node's saved list at once.

Consecutive kernels that all run on the interpreter are merged into one (``codegen.interpreter``
``.merge``): the fuser's size cap exists for numba's compile time, which the interpreter does
not pay.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusegrad.autograd import engine as _engine
from fusegrad.autograd import grad_mode
from fusegrad.autograd import node as _node
from fusegrad.autograd.node import OpNode
from fusegrad.ops.registry import REGISTRY
from fusegrad.tensor import Tensor

from . import logs
from .capture import Walk
from .ir import EFFECT_OPS, IR_OWN_OPS, Graph, Value, format_graph
from .passes.fuse import Extern, Kernel, fuse

# externs whose result may share memory with an input
VIEW_OPS = frozenset({"reshape", "permute", "broadcast_to", "getitem", "diagonal", "hook_output"})


@dataclass
class Program:
    graph: Graph
    mode: str = "default"
    steps: list = field(default_factory=list)
    plans: list = field(default_factory=list)  # (KernelPlan, function) per kernel step
    source_path: str | None = None
    compile_seconds: float = 0.0
    _first_run: bool = True

    # leaves (by walk position) whose .grad existed at capture; the cache key guarantees the
    # same at every run, so their accumulation can be fused into the kernels
    leaves_with_grad: frozenset = frozenset()
    # kernels over at most this many elements use the interpreter (0: always generate code)
    interpreter_max_elements: int = 0
    # where the arrays live: "cpu" (numpy; numba CPU code) or "cuda" (CudaArrays; numba-cuda)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.mode == "debug":
            self.steps = [
                Extern(v) for v in self.graph.values if v.op not in ("input", "constant", "scalar")
            ]
        else:
            self.steps = fuse(self.graph)
        kernels = [s for s in self.steps if isinstance(s, Kernel)]
        # small flat kernels run on the precompiled interpreter (no JIT per graph)
        self._interpreted: dict[int, Any] = {}
        if kernels and self.interpreter_max_elements > 0 and self.device == "cpu":
            from .codegen.interpreter import InterpretedKernel, eligible
            from .codegen.numba_cpu import is_flat

            self.steps = _merge_interpretable(self.steps, self.graph, self.interpreter_max_elements)
            kernels = [s for s in self.steps if isinstance(s, Kernel)]
            for kern in kernels:
                if eligible(kern, is_flat(kern), self.interpreter_max_elements):
                    self._interpreted[id(kern)] = InterpretedKernel(kern)
            kernels = [k for k in kernels if id(k) not in self._interpreted]
        # the .grad accumulation epilogue: a kernel output that is the gradient of exactly one
        # leaf with an existing .grad is added straight into that .grad by the kernel
        self._epilogue: dict[Value, int] = {}
        users: dict[Value, int] = {}
        for _, _, v in self.graph.effects:
            users[v] = users.get(v, 0) + 1
        for kind, slot, v in self.graph.effects:
            if kind == "grad" and slot in self.leaves_with_grad and users[v] == 1:
                for kern in kernels:
                    if v in kern.outputs and v not in kern.reductions and v.dtype.is_floating_point:
                        kern.accumulate.add(v)
                        self._epilogue[v] = slot
        self._kernel_fns: dict[int, Any] = {}
        self._cuda_kernels: dict[int, Any] = {}
        if kernels and self.device == "cuda":
            from .codegen import numba_cuda

            compiled, path = numba_cuda.compile_kernels(
                kernels, f"{len(kernels)} fused kernel(s) of a backward graph (CUDA)"
            )
            self.source_path = path
            logs.log("output_code", f"generated code: {path}")
            for step, ck in zip(kernels, compiled):
                self._cuda_kernels[id(step)] = ck
        elif kernels:
            from .codegen import numba_cpu
            from .codegen.numba_cpu import emit_module, load_module

            summary = (
                f"{len(kernels)} fused kernel(s) of a backward graph with "
                f"{len(self.graph.values)} IR values"
            )
            source, plans = emit_module(kernels, summary)
            # compiles and disk hits are counted per function as numba needs them (diskcache)
            module, path, _ = load_module(source)
            self.source_path = path
            logs.log("output_code", f"generated code: {path}")
            for step, plan in zip(kernels, plans):
                self._kernel_fns[id(step)] = (plan, numba_cpu.kernel_function(module, plan))
        self._plan_buffers()
        if logs.enabled("fusion"):
            logs.log("fusion", self.describe_schedule())
        # per-call work precomputed once: where inputs come from, fixed arrays, extern calls
        self._inputs = [
            (v, v.attr("kind") == "root", v.attr("index"))
            for v in self.graph.values
            if v.op == "input"
        ]
        self._fixed = {}
        for v in self.graph.values:
            if v.op == "scalar":
                self._fixed[v] = np.array(v.attr("value"), dtype=v.dtype.np)
            elif v.op == "constant":
                self._fixed[v] = self.graph.constants[v.attr("index")]
        if self.device == "cuda":  # constants live on the device, copied there once
            from fusegrad.cuda.array import to_device

            self._fixed = {v: to_device(a) for v, a in self._fixed.items()}
        self._externs = {
            k: (REGISTRY[s.value.op].kernel, dict(s.value.attrs))
            for k, s in enumerate(self.steps)
            if isinstance(s, Extern) and s.value.op in REGISTRY
        }
        # last use of every value, by step index, for freeing arrays early
        effect_values = {v for _, _, v in self.graph.effects}
        self._dying: dict[int, list[Value]] = {}
        last: dict[Value, int] = {}
        for k, step in enumerate(self.steps):
            for v in _step_inputs(step):
                last[v] = k
        for v, k in last.items():
            # inputs, constants and scalars stay alive elsewhere (saved by their nodes, held by
            # the caller or the program): dropping them from ``env`` would free nothing
            if v not in effect_values and v.op not in ("input", "constant", "scalar"):
                self._dying.setdefault(k, []).append(v)

    def _plan_buffers(self) -> None:
        """Which arrays may become a ``.grad`` without a copy (``_fresh``), and which kernel
        outputs may live in buffers reused from call to call (``_pooled``).

        Fresh: computed by a kernel or by an extern that allocates (not a view), used by exactly
        one effect.  Pooled: a kernel output that cannot escape the program — not an effect or
        captured gradient, not reachable from one through views, and no user hook in the graph
        (a hook may keep what it is given).  Reusing them saves the page faults of fresh
        allocations (about 2x on 40 MB buffers)."""
        users: dict[Value, int] = {}
        for _, _, v in self.graph.effects:
            users[v] = users.get(v, 0) + 1
        self._fresh: set = set()
        for step in self.steps:
            produced = step.outputs if isinstance(step, Kernel) else [step.value]
            for v in produced:
                if users.get(v) == 1 and v.op not in VIEW_OPS and v.op not in IR_OWN_OPS:
                    self._fresh.add(v)
        escaping: set = set()
        stack = [v for _, _, v in self.graph.effects]
        while stack:
            v = stack.pop()
            if v in escaping:
                continue
            escaping.add(v)
            if v.op in VIEW_OPS:
                stack.extend(v.inputs)
        has_hooks = any(v.op in EFFECT_OPS for v in self.graph.values)
        self._pooled: set = (
            set()
            if has_hooks
            else {
                v
                for k in self.kernels
                for v in k.outputs
                if v not in escaping and v not in k.reductions and v not in k.accumulate
            }
        )
        # per thread: two threads running this program at once must not share buffers
        self._pools = threading.local()

    def __str__(self) -> str:
        return format_graph(self.graph)

    def describe_schedule(self) -> str:
        """One line per step: kernels with the IR values fused into them, and externs."""
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel):
                how = "interpreted" if id(step) in self._interpreted else "generated"
                fused = ", ".join(f"%{v.id} {v.op}" for v in step.values + step.reductions)
                lines.append(f"kernel over {list(step.shape)} ({how}): {fused}")
            else:
                lines.append(f"extern %{step.value.id} = {step.value.op}")
        return "\n".join(lines)

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    @property
    def externs(self) -> list[Value]:
        return [s.value for s in self.steps if isinstance(s, Extern)]

    def run(
        self,
        w: Walk,
        grad_roots: Sequence[Tensor],
        retain_graph: bool,
        inputs: Sequence[Tensor] | None,
    ) -> list | None:
        saved_arrays = _saved_arrays(w)  # version checks first, before anything is written
        # as in the eager engine, the backward (and any user hook in it) runs without recording
        prev_mode = grad_mode._state.enabled
        grad_mode._state.enabled = False
        try:
            captured = self._run(w, saved_arrays, w.leaves, grad_roots, inputs)
        finally:
            grad_mode._state.enabled = prev_mode
        if not retain_graph:
            for n in w.nodes:
                if type(n) is OpNode:
                    n.release()
        return captured

    def run_bound(
        self,
        saved_arrays: list,
        leaves: list,
        release: list,
        grad_roots: Sequence[Tensor],
        retain_graph: bool,
    ) -> None:
        """Run on arguments found through the tape (``capture.Binding``): saved arrays known
        to be at their saved versions (``graph_epoch`` unchanged), no hooks, no ``inputs``.
        Freeing is ``OpNode.release`` without the per-SavedTensor part, which only matters for
        a SavedTensor someone else holds: raw access to one bumps the epoch (no tape path)."""
        prev_mode = grad_mode._state.enabled
        grad_mode._state.enabled = False
        try:
            self._run(None, saved_arrays, leaves, grad_roots, None)
        finally:
            grad_mode._state.enabled = prev_mode
        if not retain_graph:
            for n in release:
                n._saved = None
            _node.graph_epoch.value += 1

    def _run(
        self,
        w: Walk | None,
        saved_arrays: Any,
        leaves: list,
        grad_roots: Sequence[Tensor],
        inputs: Sequence[Tensor] | None,
    ) -> list | None:
        env: dict = dict(self._fixed)  # scalars and constants
        for v, is_root, index in self._inputs:
            env[v] = grad_roots[index]._data if is_root else saved_arrays[index]
        start = time.perf_counter() if self._first_run else 0.0
        for k, step in enumerate(self.steps):
            if isinstance(step, Extern):
                v = step.value
                if v.op in _SPECIAL:
                    assert w is not None  # hooks: never on the tape path (``run_bound``)
                    env[v] = _SPECIAL[v.op](v, env, w, inputs)
                    continue
                kernel, attrs = self._externs[k]
                if self.device == "cuda":
                    env[v] = _cuda_extern(v, [env[i] for i in v.inputs], attrs)
                    continue
                result = kernel(*[env[i] for i in v.inputs], **attrs)
                env[v] = result if type(result) is np.ndarray else np.asarray(result)
            elif self.device == "cuda":
                _run_cuda_kernel(step, self._cuda_kernels[id(step)], env, self._epilogue, leaves)
            elif id(step) in self._interpreted:
                env.update(self._interpreted[id(step)](env))
            else:
                plan, fn = self._kernel_fns[id(step)]
                pool = self._pools.__dict__.setdefault("pool", {})
                _run_kernel(
                    step, plan, fn, env, self._epilogue, leaves, self._pooled, pool, self._fresh
                )
            for dead in self._dying.get(k, ()):
                env.pop(dead, None)
        if self._first_run:
            self._first_run = False
            self.compile_seconds = time.perf_counter() - start  # includes numba's JIT
            logs.log(
                "perf",
                f"first run (JIT or cache load included): {1e3 * self.compile_seconds:.1f} ms",
            )
        captured: list | None = None
        if inputs is not None:
            captured = [None] * len(inputs)
        fresh = self._fresh
        for kind, slot, v in self.graph.effects:
            if v in self._epilogue:
                continue  # already added into .grad by its kernel
            g = Tensor._make(env[v])
            if kind == "grad" and v in fresh and leaves[slot]._grad is None:
                # a kernel's freshly allocated output, used by this effect only: it becomes
                # the .grad without the defensive copy _store_grad makes
                leaves[slot]._grad = g
            elif kind == "grad":
                _engine._store_grad(leaves[slot], g, False)
            elif kind == "input_grad":
                _engine._store_grad(inputs[slot], g, False)  # type: ignore[index]
            else:
                captured[slot] = g  # type: ignore[index]
        return captured


# ---- the side-effecting steps of graphs whose backward runs user hooks ------------------------


def _site_hooks(node: Any, kind: str, slot: int) -> list:
    """The hooks registered *now* at a site (the walk key fixed how many there are)."""
    if kind == "tensor":
        return _engine._tensor_hooks(node, slot)
    if kind == "pre":
        return list(node._pre_hooks.values())
    if kind == "post":
        return list(node._post_hooks.values())
    return list(node.variable._post_acc_hooks.values())  # post_acc


def _run_hook(v: Value, env: dict, w: Walk, inputs: Any) -> Any:
    node_index, kind, slot, position = v.attr("site")
    node = w.nodes[node_index]
    hooks = _site_hooks(node, kind, slot)
    if position >= len(hooks):
        return None  # removed during this backward before its turn (as eager: it still ran)
    hook = hooks[position]
    if kind == "post_acc":
        return hook(node.variable)
    arrays = iter(env[i] for i in v.inputs)
    groups = []
    for mask in v.attr("layout"):
        groups.append(tuple(Tensor._make(next(arrays)) if present else None for present in mask))
    if kind == "tensor":
        old = groups[0][0]
        out = hook(old)
        return None if out is None else _engine._check_hook_result(hook, old, out)
    out = hook(*groups)
    if out is None:
        return None
    return _engine._hook_tuple(hook, out, len(groups[0]))


def _hook_output(v: Value, env: dict, w: Walk, inputs: Any) -> np.ndarray:
    returned, original = env[v.inputs[0]], env[v.inputs[1]]
    if returned is None:
        return original
    item = returned if isinstance(returned, Tensor) else returned[v.attr("index")]
    return original if item is None else item._data


def _store(v: Value, env: dict, w: Walk, inputs: Any) -> None:
    target = v.attr("target")
    g = Tensor._make(env[v.inputs[0]])
    if target[0] == "grad":
        _engine._store_grad(w.leaves[target[1]], g, False)
    elif target[0] == "input_grad":
        _engine._store_grad(inputs[target[1]], g, False)
    else:  # retain_grad: only while the tensor's history still ends in this node
        node = w.nodes[target[1]]
        ref = (node._retain_grad_hooks or {}).get(target[2])
        t = ref() if ref is not None else None
        if t is not None and t.grad_fn is node:
            _engine._store_grad(t, g, False)
    return None


_SPECIAL = {"hook": _run_hook, "hook_output": _hook_output, "store_grad": _store}


def _merge_interpretable(steps: list, graph: Graph, max_elements: int) -> list:
    """The schedule with each run of consecutive interpretable kernels over the same iteration
    space and float dtype merged into one (``codegen.interpreter.merge``)."""
    from .codegen.interpreter import eligible, float_dtype, merge
    from .codegen.numba_cpu import is_flat

    users: dict[Value, set[int]] = {}
    for k, step in enumerate(steps):
        for v in _step_inputs(step):
            users.setdefault(v, set()).add(k)
    effects = {v for _, _, v in graph.effects}
    ok = [isinstance(s, Kernel) and eligible(s, is_flat(s), max_elements) for s in steps]
    merged: list = []
    k = 0
    while k < len(steps):
        if not ok[k]:
            merged.append(steps[k])
            k += 1
            continue
        group = [steps[k]]
        reductions = set(steps[k].reductions)
        j = k + 1
        while (
            j < len(steps)
            and ok[j]
            and steps[j].shape == group[0].shape
            and float_dtype(steps[j]) is float_dtype(group[0])
            and not any(i in reductions for i in steps[j].inputs)
        ):
            group.append(steps[j])
            reductions.update(steps[j].reductions)
            j += 1
        if len(group) == 1:
            merged.append(group[0])
        else:
            members = set(range(k, j))
            merged.append(
                merge(group, lambda v, m=members: v in effects or bool(users.get(v, set()) - m))
            )
        k = j
    return merged


def _step_inputs(step: Any) -> list[Value]:
    if isinstance(step, Extern):
        return list(step.value.inputs)
    return list(step.inputs)


def _saved_arrays(w: Walk) -> list:
    """The saved arrays in walk order, each version-checked; a failing check raises the eager
    engine's own error (through ``SavedTensor.unpack``)."""
    arrays: list[np.ndarray] = []
    append = arrays.append
    for node, s in w.saved:
        counter = s._counter
        if counter is not None and counter.value == s._version and s._unpack_hook is None:
            t = s._tensor
            append(s._data if t is None else t._data)
        else:
            append(s.unpack(node)._data)
    return arrays


def _epilogue_buffer(leaf: Tensor, v: Value, sizes: tuple, flat: bool) -> np.ndarray | None:
    """The leaf's .grad array shaped for the kernel, or None when it cannot be written
    through (not contiguous, read-only, or replaced by a tensor with history)."""
    g = leaf._grad
    if g is None or g.requires_grad or g._dtype is not v.dtype:
        return None
    a = g._data
    if not (a.flags.c_contiguous and a.flags.writeable) or a.shape != v.shape:
        return None
    g._version_counter.value += 1
    return a.reshape(sizes)


def _run_kernel(
    kernel: Kernel,
    plan: Any,
    fn: Any,
    env: dict,
    epilogue: dict,
    leaves: list,
    pooled: set,
    pool: dict,
    recyclable: frozenset | set = frozenset(),
) -> None:
    space = kernel.shape
    if plan.flat:
        n = int(np.prod(space)) if space else 1
        sizes: tuple[int, ...] = (n,)
        args = []
        for v in plan.inputs:
            a = env[v]
            args.append(a.reshape(-1) if a.size == n else a.reshape(1))
    else:
        sizes = tuple(space) if space else (1,)
        rank = len(sizes)
        args = []
        for v in plan.inputs:
            a = env[v]
            args.append(a.reshape((1,) * (rank - a.ndim) + a.shape) if a.ndim < rank else a)
    out_shape = sizes if plan.flat else (space or (1,))
    outs = []
    late_adds = []
    for v, acc in zip(plan.outputs, plan.accumulate):
        buf = _epilogue_buffer(leaves[epilogue[v]], v, out_shape, plan.flat) if acc else None
        if acc and buf is None:
            # cannot write through: accumulate into zeros, add into .grad afterwards
            buf = np.zeros(out_shape, dtype=v.dtype.np)
            late_adds.append((v, buf))
        if not acc:
            buf = pool.get(v) if v in pooled or v in recyclable else None
            # a buffer that became a .grad last time is reused once nothing else holds it
            # (the user set .grad to None): references are the pool's, ``buf`` and the call's
            if buf is not None and v in recyclable and sys.getrefcount(buf) > 3:
                buf = None
            if buf is None or buf.shape != out_shape:
                buf = np.empty(out_shape, dtype=v.dtype.np)
                if v in pooled or v in recyclable:
                    pool[v] = buf
        assert buf is not None
        outs.append(buf)
    reds = [np.zeros(shape, dtype=np.float64) for shape in plan.reduced_shapes]
    fn(*sizes, *args, *outs, *reds)
    for v, o in zip(plan.outputs, outs):
        env[v] = o.reshape(v.shape)
    for v, buf in late_adds:
        _engine._store_grad(leaves[epilogue[v]], Tensor._make(buf.reshape(v.shape)), False)
    for v, r in zip(plan.reductions, reds):
        env[v] = r.astype(v.dtype.np).reshape(v.shape)


def _cuda_extern(v: Value, arrays: list, attrs: dict) -> Any:
    """An extern step of a CUDA program: the primitive's eager CUDA kernel."""
    from fusegrad.cuda.ops import run

    return run(REGISTRY[v.op], arrays, attrs)


def _run_cuda_kernel(
    kernel: Kernel, compiled: Any, env: dict, epilogue: dict[Value, int], leaves: list
) -> None:
    """Launch a fused kernel of a CUDA program (``numba_cuda.run_kernel``); ``.grad +=``
    epilogues write straight into the leaves' existing device ``.grad`` arrays."""
    from fusegrad.cuda.generated import wrap

    from .codegen import numba_cuda

    plan = compiled.plan
    grads = {}
    late = []  # a .grad the kernel cannot write through (read-only view, other dtype)
    for v in plan.accumulate:
        grad = leaves[epilogue[v]]._grad
        if grad._data.writeable and grad._dtype is v.dtype:
            grads[v] = grad._data.kernel_array()
            grad._version_counter.value += 1
        else:
            late.append(v)
    inputs = {}
    for v in kernel.inputs:
        a = env[v]
        if type(a) is np.ndarray:  # a saved Python scalar (0-d): uploaded once, then cached
            from fusegrad.cuda.ops import device_scalar

            a = device_scalar(a)
        inputs[v] = a.kernel_array()
    results = numba_cuda.run_kernel(compiled, inputs, grads)
    for v, out in results.items():
        if v not in plan.accumulate:
            env[v] = wrap(out, v.shape)
    for v in late:  # the launcher added into zeros: accumulate as the engine does
        _engine._store_grad(leaves[epilogue[v]], Tensor._make(wrap(results[v], v.shape)), False)
