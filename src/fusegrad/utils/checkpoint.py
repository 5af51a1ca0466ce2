"""Activation checkpointing: ``checkpoint(fn, *args, use_reentrant=...)`` and
``checkpoint_sequential``, as in ``torch.utils.checkpoint``.

Checkpointing trades compute for memory: the tensors that ``fn``'s ops save for backward are not
kept; backward runs ``fn`` again (with the RNG state of the forward restored, so dropout draws
the same mask) and uses the recomputed values.  Gradients equal those without checkpointing.

Two variants, chosen by ``use_reentrant``:

* **reentrant** (``CheckpointFunction``): a custom Function whose forward runs ``fn`` under
  no_grad (nothing is recorded, so nothing is saved) and whose backward re-runs ``fn`` with grad
  on detached inputs and calls ``backward()`` on the result *inside* the outer backward.  Needs
  an input that requires grad (else the output does not), cannot serve ``grad()`` or
  ``backward(inputs=...)`` and does not support keyword arguments.
* **non-reentrant**: ``fn`` runs normally under ``saved_tensors_hooks`` whose pack hook keeps a
  small holder instead of each tensor.  The first unpack during a backward call re-runs ``fn``
  under a second pair of hooks that hands the recomputed tensors to their holders, then serves
  them (each one once: it is dropped as it is unpacked).  The graph is the ordinary one, so
  ``grad()``, ``backward(inputs=...)``, keyword arguments, nesting and double backward work.
  Recomputation stops as soon as every needed tensor is back (``early_stop``); a recomputation
  that saves a different number of tensors, or tensors of another shape / dtype / device,
  raises ``CheckpointError`` (``determinism_check="default"``; ``"none"`` turns it off).

``use_reentrant=None`` warns (PyTorch 2.x) and uses the reentrant variant.

Both variants also record ``fn``'s forward (``autograd.recording``: its primitive calls, and
where each saved tensor comes from in them), so that compiled backward can recompute without
the Python: the recording's ops become part of the backward program.  Eager backward never
reads the recording.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..autograd import engine, grad_mode, tracer
from ..autograd.api import backward
from ..autograd.function import Function, FunctionCtx
from ..autograd.graph import saved_tensors_hooks
from ..autograd.node import SavedTensor
from ..autograd.recording import Recording, RegionRecorder
from ..errors import AutogradError
from ..ops.creation import get_rng_state, set_rng_state
from ..tensor import Tensor

__all__ = [
    "CheckpointError",
    "CheckpointFunction",
    "check_backward_validity",
    "checkpoint",
    "checkpoint_sequential",
    "detach_variable",
    "noop_context_fn",
    "set_checkpoint_early_stop",
]


class CheckpointError(AutogradError):
    """The recomputation did not reproduce the forward pass (a RuntimeError)."""


def noop_context_fn() -> tuple[
    contextlib.AbstractContextManager, contextlib.AbstractContextManager
]:
    return contextlib.nullcontext(), contextlib.nullcontext()


def detach_variable(inputs: tuple) -> tuple:
    """Each tensor detached, keeping its ``requires_grad`` (a fresh leaf for the re-run)."""
    if not isinstance(inputs, tuple):
        raise RuntimeError(  # noqa: TRY004  (PyTorch raises RuntimeError here)
            "Only tuple of tensors is supported. Got Unsupported input type: "
            f"{type(inputs).__name__}"
        )
    out = []
    for inp in inputs:
        if not isinstance(inp, Tensor):
            out.append(inp)
            continue
        x = inp.detach()
        x.requires_grad = inp.requires_grad
        out.append(x)
    return tuple(out)


def check_backward_validity(inputs: Iterable[Any]) -> None:
    if not any(inp.requires_grad for inp in inputs if isinstance(inp, Tensor)):
        warnings.warn(
            "None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2
        )


@contextlib.contextmanager
def _fork_rng(enabled: bool) -> Iterator[None]:
    """Restore the default generator's state on exit: a recomputation that replays the
    forward's random draws must not shift the stream the rest of the program sees."""
    if not enabled:
        yield
        return
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


# ---- reentrant ---------------------------------------------------------------------------------


class CheckpointFunction(Function):
    """The reentrant variant: backward re-runs ``run_function`` and calls backward inside."""

    @staticmethod
    def forward(ctx: FunctionCtx, run_function: Callable, preserve_rng_state: bool, *args: Any):
        check_backward_validity(args)
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        if preserve_rng_state:
            ctx.fwd_cpu_state = get_rng_state()
        # non-tensor arguments stay in ctx; tensors are saved (version-checked) and put back
        ctx.inputs = []
        ctx.tensor_indices = []
        tensor_inputs = []
        for i, arg in enumerate(args):
            if isinstance(arg, Tensor):
                tensor_inputs.append(arg)
                ctx.tensor_indices.append(i)
                ctx.inputs.append(None)
            else:
                ctx.inputs.append(arg)
        ctx.save_for_backward(*tensor_inputs)
        # what backward recomputes, for compiled backward (``autograd.recording``)
        ctx.recording = rec = Recording([])
        recorder = RegionRecorder(rec, tensor_inputs, tracer.current(), preserve_rng_state)
        with grad_mode.no_grad(), tracer.tracing(recorder):
            outputs = run_function(*args)
        rec.finish(outputs if isinstance(outputs, tuple) else (outputs,))
        return outputs

    @staticmethod
    def backward(ctx: FunctionCtx, *grad_outputs: Any) -> tuple:
        if not engine.is_checkpoint_valid():
            raise AutogradError(
                "When use_reentrant=True, fusegrad.utils.checkpoint is incompatible with .grad() "
                "or passing an `inputs` parameter to .backward(). To resolve this error, you can "
                "either set use_reentrant=False, or call .backward() without passing the "
                "`inputs` argument."
            )
        inputs = list(ctx.inputs)
        for i, tensor in zip(ctx.tensor_indices, ctx.saved_tensors):
            inputs[i] = tensor
        with _fork_rng(ctx.preserve_rng_state):
            if ctx.preserve_rng_state:
                set_rng_state(ctx.fwd_cpu_state)
            detached_inputs = detach_variable(tuple(inputs))
            with grad_mode.enable_grad():
                outputs = ctx.run_function(*detached_inputs)
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        outputs_with_grad = []
        grads_with_output = []
        for out, g in zip(outputs, grad_outputs):
            if isinstance(out, Tensor) and out.requires_grad:
                outputs_with_grad.append(out)
                grads_with_output.append(g)
        if not outputs_with_grad:
            raise AutogradError(
                "none of output has requires_grad=True, this checkpoint() is not necessary"
            )
        # the reentrant call: parameters used inside ``run_function`` get their .grad here
        backward(outputs_with_grad, grads_with_output)
        grads = tuple(inp.grad if isinstance(inp, Tensor) else None for inp in detached_inputs)
        return (None, None, *grads)


# ---- non-reentrant -----------------------------------------------------------------------------

_enable_checkpoint_early_stop: bool | None = None


@contextlib.contextmanager
def set_checkpoint_early_stop(enable: bool) -> Iterator[None]:
    """Override ``early_stop`` for the checkpoints whose forward runs inside."""
    global _enable_checkpoint_early_stop
    previous = _enable_checkpoint_early_stop
    _enable_checkpoint_early_stop = enable
    try:
        yield
    finally:
        _enable_checkpoint_early_stop = previous


class _Handle:
    """Key of one recomputed tensor (weakly referenced: dropping it frees the tensor)."""

    __slots__ = ("__weakref__",)


class _Holder:
    """What the pack hook stores for one saved tensor: per backward call (graph task id), the
    handle of its recomputed value, set to None once it has been unpacked; and where it comes
    from in the recording of the function's forward (``recording``, ``ref``)."""

    __slots__ = ("__weakref__", "handles", "recording", "ref")

    def __init__(self, recording: Recording) -> None:
        self.handles: dict[int, _Handle | None] = {}
        # what recomputes it without the Python (``autograd.recording``: compiled backward)
        self.recording = recording
        self.ref: tuple | None = None


class _StopRecomputation(Exception):
    """Raised inside the recomputation once every needed tensor is back (early stop)."""


def _default_metadata(x: Tensor) -> dict:
    return {"shape": tuple(x.shape), "dtype": x.dtype, "device": x.device}


def _debug_metadata(x: Tensor) -> dict:
    meta = _default_metadata(x)
    meta["grad_fn"] = x.grad_fn.name() if x.grad_fn is not None else None
    return meta


_determinism_checks: dict[str, Callable[[Tensor], Any]] = {
    "default": _default_metadata,
    "none": lambda _x: None,
}

_temporary_task_ids = itertools.count(-2, -1)  # unpack outside backward: a fresh id each time


class _CheckpointFrame:
    """Everything one non-reentrant checkpoint call needs to recompute its saved tensors."""

    def __init__(
        self, recompute_fn: Callable, early_stop: bool, metadata_fn: Callable, debug: bool
    ) -> None:
        self.recompute_fn = recompute_fn
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.debug = debug
        self.saved_args: list = []
        self.weak_holders: list[weakref.ref] = []
        self.x_metadatas: list = []
        # per graph task id; the weak keys let unpacked (or freed) tensors go at once
        self.recomputed: defaultdict[int, weakref.WeakKeyDictionary] = defaultdict(
            weakref.WeakKeyDictionary
        )
        self.recomp_counter: defaultdict[int, int] = defaultdict(int)
        self.is_recomputed: defaultdict[int, bool] = defaultdict(bool)
        self.recomputed_metadatas: defaultdict[int, list] = defaultdict(list)
        self.forward_completed = False
        self.ignore_saved_mismatch = False
        self.recording = Recording([])

    def save_inputs(self, args: tuple) -> None:
        # SavedTensor: version-checked, and packed by an enclosing checkpoint's hooks (the
        # inputs of an inner checkpoint are tensors its parent saved)
        self.saved_args = [SavedTensor(a) if isinstance(a, Tensor) else a for a in args]
        self.recording = Recording([a for a in self.saved_args if isinstance(a, SavedTensor)])

    def get_inputs(self) -> list:
        return [a.unpack(None) if isinstance(a, SavedTensor) else a for a in self.saved_args]

    def check_recomputed_tensors_match(self, gid: int) -> None:
        if self.ignore_saved_mismatch:
            return
        if len(self.weak_holders) != self.recomp_counter[gid]:
            raise CheckpointError(
                "fusegrad.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {len(self.weak_holders)}\n"
                f"Number of tensors saved during recomputation: {self.recomp_counter[gid]}"
                f"{self._debug_listing(gid)}"
            )
        mismatched = []
        for idx, weak_holder in enumerate(self.weak_holders):
            holder = weak_holder()
            if holder is None:  # already used by an earlier backward that freed it
                continue
            recomputed = self.recomputed[gid][holder.handles[gid]]
            saved_meta = self.x_metadatas[idx]
            new_meta = self.metadata_fn(recomputed)
            if saved_meta != new_meta:
                mismatched.append(
                    f"tensor at position {idx}:\nsaved metadata: {saved_meta}\n"
                    f"recomputed metadata: {new_meta}\n"
                )
        if mismatched:
            raise CheckpointError(
                "fusegrad.utils.checkpoint: Recomputed values for the following tensors have "
                "different metadata than during the forward pass.\n" + "".join(mismatched)
            )

    def _debug_listing(self, gid: int) -> str:
        if not self.debug:
            return (
                ".\nTip: pass debug=True to checkpoint(...) to list the tensors saved in each pass."
            )
        forward = "\n".join(f"  {i}: {m}" for i, m in enumerate(self.x_metadatas))
        again = "\n".join(f"  {i}: {m}" for i, m in enumerate(self.recomputed_metadatas[gid]))
        return (
            f"\nTensors saved during the original forward:\n{forward}\n"
            f"Tensors saved during recomputation:\n{again}"
        )


class _recomputation_hook(saved_tensors_hooks):
    """Active while ``fn`` re-runs: hand each saved tensor to the holder at the same position."""

    def __init__(self, frame_ref: weakref.ref, gid: int) -> None:
        def pack_hook(x: Tensor) -> Tensor:
            x = x.detach() if x.requires_grad else x
            frame = frame_ref()
            if frame is None:
                raise AssertionError("checkpoint: the frame was freed during recomputation")
            index = frame.recomp_counter[gid]
            frame.recomp_counter[gid] += 1
            if frame.debug:
                frame.recomputed_metadatas[gid].append(frame.metadata_fn(x))
            if index >= len(frame.weak_holders):
                if not frame.forward_completed:
                    # a backward inside fn's own forward (early stop off): not a mismatch
                    frame.ignore_saved_mismatch = True
                    return x
                raise CheckpointError(
                    "fusegrad.utils.checkpoint: trying to save more tensors during "
                    "recomputation than during the original forward pass."
                )
            holder = frame.weak_holders[index]()
            # a holder already freed (its node ran in an earlier backward) needs nothing
            if holder is not None:
                handle = _Handle()
                holder.handles[gid] = handle
                frame.recomputed[gid][handle] = x
            if frame.early_stop and frame.recomp_counter[gid] == len(frame.weak_holders):
                raise _StopRecomputation
            return x  # the recomputed graph may itself be differentiated (grad inside fn)

        def unpack_hook(x: Tensor) -> Tensor:
            return x

        super().__init__(pack_hook, unpack_hook)


class _checkpoint_hook(saved_tensors_hooks):
    """Active during ``fn``'s forward: keep a holder, not the tensor."""

    def __init__(self, frame: _CheckpointFrame) -> None:
        def pack_hook(x: Tensor) -> _Holder:
            holder = _Holder(frame.recording)
            frame.recording.hold(holder, x)
            frame.weak_holders.append(weakref.ref(holder))
            if frame.metadata_fn is not None:
                frame.x_metadatas.append(frame.metadata_fn(x))
            return holder

        def unpack_hook(holder: _Holder) -> Tensor:
            gid = engine.current_graph_task_id()
            if gid == -1:
                gid = next(_temporary_task_ids)  # e.g. ``grad_fn._saved_self`` outside backward
            if not frame.is_recomputed[gid]:
                args = frame.get_inputs()
                try:
                    with _recomputation_hook(weakref.ref(frame), gid), grad_mode.enable_grad():
                        frame.recompute_fn(*args)
                except _StopRecomputation:
                    pass
                frame.is_recomputed[gid] = True
                frame.check_recomputed_tensors_match(gid)
            if gid not in holder.handles:
                raise CheckpointError(
                    "fusegrad.utils.checkpoint: a saved tensor was not recomputed (it was "
                    "saved during the forward, but the recomputation never reached it)."
                )
            handle = holder.handles[gid]
            if handle is None:
                raise CheckpointError(
                    "fusegrad.utils.checkpoint: Unpack is being triggered for a tensor that was "
                    "already unpacked once. If you are calling ctx.saved_tensors in backward, "
                    "make sure to do so only once. Otherwise please open an issue with details "
                    "on your use case."
                )
            value = frame.recomputed[gid][handle]
            holder.handles[gid] = None  # recomputed tensors live only until used (PyTorch)
            return value

        super().__init__(pack_hook, unpack_hook)


def _checkpoint_without_reentrant(
    fn: Callable,
    preserve_rng_state: bool,
    context_fn: Callable,
    determinism_check: str,
    debug: bool,
    early_stop: bool,
    args: tuple,
    kwargs: dict,
) -> Any:
    if determinism_check not in _determinism_checks:
        raise ValueError(
            f"determinism_check should be one of {list(_determinism_checks)}, but got "
            f"{determinism_check}"
        )
    metadata_fn = _determinism_checks[determinism_check]
    if debug and determinism_check == "default":
        metadata_fn = _debug_metadata
    forward_context, recompute_context = context_fn()
    fwd_rng_state = get_rng_state() if preserve_rng_state else None

    def recompute_fn(*inputs: Any) -> None:
        with _fork_rng(preserve_rng_state):
            if preserve_rng_state:
                set_rng_state(fwd_rng_state)
            with recompute_context:
                fn(*inputs, **kwargs)

    if _enable_checkpoint_early_stop is not None:
        early_stop = _enable_checkpoint_early_stop
    frame = _CheckpointFrame(recompute_fn, early_stop, metadata_fn, debug)
    if not grad_mode.is_grad_enabled():
        return fn(*args, **kwargs)  # nothing will be saved: plain call
    frame.save_inputs(args)
    rec = frame.recording
    if context_fn is not noop_context_fn:
        rec.stop("it has a context_fn (the recomputation runs under contexts of its own)")
    recorder = RegionRecorder(
        rec, [a for a in args if isinstance(a, Tensor)], tracer.current(), preserve_rng_state
    )
    with _checkpoint_hook(frame), forward_context, tracer.tracing(recorder):
        result = fn(*args, **kwargs)
    rec.finish()
    frame.forward_completed = True
    return result


# ---- public API --------------------------------------------------------------------------------


def checkpoint(
    function: Callable,
    *args: Any,
    use_reentrant: bool | None = None,
    context_fn: Callable = noop_context_fn,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """``function(*args, **kwargs)`` without keeping its activations; backward recomputes them.

    ``preserve_rng_state=True`` (a keyword) replays the default generator's state, so random
    ops (dropout) draw the same values in the recomputation.  ``context_fn`` returns two context
    managers for the forward and the recomputation (non-reentrant only)."""
    if use_reentrant is None:
        warnings.warn(
            "fusegrad.utils.checkpoint: the use_reentrant parameter should be passed "
            "explicitly. use_reentrant=False is recommended, but if you need to preserve the "
            "current default behavior, you can pass use_reentrant=True. Refer to docs for more "
            "details on the differences between the two variants.",
            stacklevel=2,
        )
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant:
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError(
                "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
            )
        return CheckpointFunction.apply(function, preserve, *args)
    return _checkpoint_without_reentrant(
        function, preserve, context_fn, determinism_check, debug, early_stop, args, kwargs
    )


def checkpoint_sequential(
    functions: Any, segments: int, input: Tensor, use_reentrant: bool | None = None, **kwargs: Any
) -> Any:
    """Run ``functions`` (a Sequential or a list of callables) in order, checkpointing
    ``segments`` - 1 equal chunks; the last chunk runs normally (its backward comes first)."""
    if use_reentrant is None:
        warnings.warn(
            "fusegrad.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter "
            "should be passed explicitly. use_reentrant=False is recommended, but if you need "
            "to preserve the current default behavior, you can pass use_reentrant=True. Refer "
            "to docs for more details on the differences between the two variants.",
            stacklevel=2,
        )
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start: int, end: int, functions: list) -> Callable:
        def forward(x: Any) -> Any:
            for j in range(start, end + 1):
                x = functions[j](x)
            return x

        return forward

    if hasattr(functions, "children") and callable(functions.children):
        functions = list(functions.children())
    else:
        functions = list(functions)
    if segments < 1:
        raise ValueError(f"checkpoint_sequential: segments must be >= 1, got {segments}")
    segment_size = len(functions) // segments
    end = -1
    if segment_size > 0:
        for start in range(0, segment_size * (segments - 1), segment_size):
            end = start + segment_size - 1
            input = checkpoint(
                run_function(start, end, functions),
                input,
                use_reentrant=use_reentrant,
                preserve_rng_state=preserve,
            )
    return run_function(end + 1, len(functions) - 1, functions)(input)
