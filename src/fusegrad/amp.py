"""``fusegrad.amp``: PyTorch's mixed-precision API, ``autocast`` and ``GradScaler``, so that
scripts written for ``torch.amp`` / ``torch.cuda.amp`` run unchanged.

``GradScaler`` behaves as ``torch.amp.GradScaler``:

* ``GradScaler("cpu")`` scales for real, as PyTorch's CPU scaler does: ``scale(loss)`` is
  ``loss * scale`` (2**16 at first), ``unscale_(opt)`` divides the gradients in place and notes
  whether any is inf/NaN, ``step(opt)`` unscales if that was not done and calls ``opt.step()``
  unless a gradient was not finite, ``update()`` halves the scale after such a step and doubles
  it after ``growth_interval`` good ones.  With float32 gradients this changes nothing but
  rounding; checking finiteness reads the gradients on the host, so inside a compiled step the
  step runs eagerly from there.
* ``GradScaler()`` / ``GradScaler("cuda")`` without CUDA, and any ``enabled=False`` scaler, is
  off (PyTorch warns and disables the CUDA one the same way): ``scale`` returns its argument,
  ``step`` calls ``optimizer.step()``, ``update``/``unscale_`` do nothing, ``get_scale()`` is
  1.0 and ``state_dict()`` is empty.

``autocast(device_type, dtype=None, enabled=True, cache_enabled=None)`` (also
``fusegrad.autocast``, a context manager and a decorator) is accepted with PyTorch's checks and
warnings -- CPU autocast supports bfloat16 (its default) and float16 and disables itself for
other dtypes; CUDA autocast disables itself without CUDA -- and ``is_autocast_enabled`` /
``get_autocast_dtype`` report the state.  **It casts nothing**: ops inside run in their inputs'
dtypes, where PyTorch would run matmul, linear and convolutions in the lower precision.  Results
are therefore as accurate as without autocast (closer to float32 than PyTorch's).
"""

from __future__ import annotations

import functools
import threading
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import cuda as _cuda
from . import dtypes as _dt
from .autograd.grad_mode import no_grad
from .ops import isfinite
from .tensor import Tensor

__all__ = [
    "GradScaler",
    "autocast",
    "custom_bwd",
    "custom_fwd",
    "get_autocast_dtype",
    "is_autocast_available",
    "is_autocast_enabled",
]

# the device types PyTorch's autocast accepts (its error lists them)
_DEVICE_TYPES = (
    "cpu, cuda, ipu, xpu, mkldnn, opengl, opencl, ideep, hip, ve, fpga, maia, xla, lazy, vulkan, "
    "mps, meta, hpu, mtia, privateuseone"
).split(", ")
_DEFAULT_DTYPES = {"cpu": "bfloat16", "cuda": "float16"}
_CPU_DTYPES = ("bfloat16", "float16")


class _AutocastState(threading.local):
    def __init__(self) -> None:
        self.enabled: dict[str, bool] = {}
        self.dtype: dict[str, Any] = {}


_state = _AutocastState()


def _dtype_named(name: str) -> Any:
    """fusegrad's dtype of that name where it has one (else the name itself)."""
    try:
        return _dt.as_dtype(name)
    except TypeError:
        return name


def _name_of(dtype: Any) -> str:
    return getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1]


def is_autocast_available(device_type: str) -> bool:
    """Whether ``autocast`` accepts ``device_type`` (it casts nothing anywhere, see above)."""
    return device_type in ("cpu", "cuda")


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether an enabled ``autocast`` block for ``device_type`` (PyTorch's default, without
    an argument: "cuda") is active on this thread."""
    return _state.enabled.get(device_type or "cuda", False)


def get_autocast_dtype(device_type: str) -> Any:
    """The dtype autocast for ``device_type`` names (bfloat16 on the CPU, float16 on CUDA by
    default)."""
    if device_type in _state.dtype:
        return _state.dtype[device_type]
    return _dtype_named(_DEFAULT_DTYPES.get(device_type, "float16"))


class autocast:  # noqa: N801 - PyTorch's name
    """PyTorch's ``autocast`` context manager / decorator: its checks, warnings and state, no
    casting (see the module docstring)."""

    def __init__(
        self,
        device_type: str,
        dtype: Any = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if not isinstance(device_type, str):
            raise ValueError(
                f"Expected `device_type` of type `str`, got: `{type(device_type).__name__}`"
            )
        if device_type not in _DEVICE_TYPES:
            raise RuntimeError(
                f"Expected one of {', '.join(_DEVICE_TYPES)} device type at start of device "
                f"string: {device_type}"
            )
        self.device = device_type
        self.fast_dtype = get_autocast_dtype(device_type) if dtype is None else dtype
        self._cache_enabled = cache_enabled
        self._enabled = bool(enabled)
        if self._enabled and device_type == "cpu" and _name_of(self.fast_dtype) not in _CPU_DTYPES:
            warnings.warn(
                "In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                "CPU Autocast only supports dtypes of fusegrad.bfloat16, fusegrad.float16 "
                "currently.",
                UserWarning,
                stacklevel=2,
            )
            self._enabled = False
        elif self._enabled and device_type == "cuda" and not _cuda.is_available():
            warnings.warn(
                "CUDA is not available or torch_xla is imported. Disabling autocast.",
                UserWarning,
                stacklevel=2,
            )
            self._enabled = False
        self._saved: list[tuple[bool | None, Any]] = []

    def __enter__(self) -> autocast:
        d = self.device
        self._saved.append((_state.enabled.get(d), _state.dtype.get(d)))
        _state.enabled[d] = self._enabled
        if self._enabled:
            _state.dtype[d] = self.fast_dtype
        return self

    def __exit__(self, *exc: object) -> None:
        enabled, dtype = self._saved.pop()
        d = self.device
        for table, value in ((_state.enabled, enabled), (_state.dtype, dtype)):
            if value is None:
                table.pop(d, None)
            else:
                table[d] = value

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return run


def custom_fwd(
    fwd: Callable[..., Any] | None = None, *, device_type: str = "cuda", cast_inputs: Any = None
) -> Any:
    """PyTorch's decorator for a custom Function's ``forward`` under autocast: ``fwd`` itself
    (autocast casts nothing here, so there is nothing to undo)."""
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)
    return fwd


def custom_bwd(bwd: Callable[..., Any] | None = None, *, device_type: str = "cuda") -> Any:
    """PyTorch's decorator for a custom Function's ``backward``: ``bwd`` itself."""
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)
    return bwd


def _f32(value: Any) -> float:
    """``value`` rounded to float32: PyTorch keeps the scale in a float32 tensor."""
    return float(np.float32(float(value)))


class GradScaler:
    """``torch.amp.GradScaler``: loss scaling with inf/NaN step skipping (see the module
    docstring for when it is on)."""

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        self._device = str(device)
        if enabled and self._device.startswith("cuda") and not _cuda.is_available():
            warnings.warn(
                "fusegrad.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                UserWarning,
                stacklevel=2,
            )
            enabled = False
        self._enabled = bool(enabled)
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
        self._scale = _f32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        # per optimizer (by id) since the last update(): "unscaled" / "stepped", found_inf
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # ---- scaling -------------------------------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor or nested lists/tuples of them) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def _optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": "ready"})

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and note whether any is
        inf or NaN (read on the host)."""
        if not self._enabled:
            return
        state = self._optimizer_state(optimizer)
        if state["stage"] == "unscaled":
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] == "stepped":
            raise RuntimeError("unscale_() is being called after step().")
        inverse = _f32(1.0 / self._scale)  # (PyTorch: the float32 reciprocal)
        found_inf = False
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g.dtype.name == "float16":
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    g.mul_(inverse)
                    if not found_inf and not bool(isfinite(g).all()):
                        found_inf = True
        state["found_inf"] = found_inf
        state["stage"] = "unscaled"

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(*args, **kwargs)`` on unscaled gradients, skipped (returning None)
        when one of them was inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._optimizer_state(optimizer)
        if state["stage"] == "stepped":
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == "ready":
            self.unscale_(optimizer)
        result = None
        if not state["found_inf"]:
            result = optimizer.step(*args, **kwargs)
        state["stage"] = "stepped"
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Back off the scale after a skipped step, grow it after ``growth_interval`` good
        ones (or set ``new_scale``); forget this iteration's unscale/step records."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _f32(new_scale)
        else:
            found = [s["found_inf"] for s in self._per_optimizer.values() if "found_inf" in s]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale = _f32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale = _f32(self._scale * self._growth_factor)
                    self._growth_tracker = 0
        self._per_optimizer.clear()

    # ---- queries and state ---------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def state_dict(self) -> dict[str, Any]:
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled "
                "instance of GradScaler."
            )
        self._scale = _f32(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])


# ---- ``fusegrad.cuda.amp`` (PyTorch's deprecated spellings) ------------------------------------


class _CudaGradScaler(GradScaler):
    """``fusegrad.cuda.amp.GradScaler(...)``: ``GradScaler("cuda", ...)``, with PyTorch's
    deprecation warning."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        warnings.warn(
            "`fusegrad.cuda.amp.GradScaler(args...)` is deprecated. Please use "
            "`fusegrad.amp.GradScaler('cuda', args...)` instead.",
            FutureWarning,
            stacklevel=2,
        )
        super().__init__(
            "cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled
        )


class _CudaAutocast(autocast):
    """``fusegrad.cuda.amp.autocast(...)``: ``autocast("cuda", ...)``, with PyTorch's
    deprecation warning."""

    def __init__(self, enabled: bool = True, dtype: Any = None, cache_enabled: bool = True) -> None:
        warnings.warn(
            "`fusegrad.cuda.amp.autocast(args...)` is deprecated. Please use "
            "`fusegrad.amp.autocast('cuda', args...)` instead.",
            FutureWarning,
            stacklevel=2,
        )
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


_CudaGradScaler.__name__ = _CudaGradScaler.__qualname__ = "GradScaler"
_CudaAutocast.__name__ = _CudaAutocast.__qualname__ = "autocast"

cuda_amp = types.ModuleType(
    "fusegrad.cuda.amp", "PyTorch's torch.cuda.amp spellings of fusegrad.amp (deprecated there)."
)
cuda_amp.GradScaler = _CudaGradScaler  # type: ignore[attr-defined]
cuda_amp.autocast = _CudaAutocast  # type: ignore[attr-defined]
cuda_amp.custom_fwd = custom_fwd  # type: ignore[attr-defined]
cuda_amp.custom_bwd = custom_bwd  # type: ignore[attr-defined]
