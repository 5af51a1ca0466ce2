"""``fusegrad.cuda``: CUDA devices through numba-cuda (the optional ``cuda`` extra).

numba-cuda is imported only when something asks for CUDA (``is_available()``, a ``"cuda"``
device), never when fusegrad is imported: importing it is slow, and numba's CUDA *simulator*
(``NUMBA_ENABLE_CUDASIM=1``) must be chosen before numba is first imported.  Under the simulator
``is_available()`` is true and CUDA tensors live in host memory behind numba's simulated device
arrays, so everything here (and the generated kernels) runs without a GPU, slowly.

Storage of a CUDA tensor is a ``CudaArray`` (``fusegrad.cuda.array``); the eager CUDA kernel of
every primitive is generated from the compiler's per-primitive lowering (``fusegrad.cuda.ops``).
The question "is there a GPU" is asked once, by ``fusegrad.device.cuda_probe`` (below this
package: ``as_device`` needs it too).  The package sits below ``Tensor`` (its storage type lives
here) and below the op surface: nothing in it imports ``fusegrad.ops``.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..device import cuda_probe as _probe
from ..random import manual_seed as _manual_seed

__all__ = [
    "is_available",
    "device_count",
    "current_device",
    "get_device_name",
    "synchronize",
    "is_simulator",
    "manual_seed",
    "manual_seed_all",
]


def numba_cuda() -> Any:
    """The ``numba.cuda`` module (CUDA must be available)."""
    mod, reason = _probe()
    if mod is None:
        raise RuntimeError(f"CUDA is not available: {reason}")
    return mod


def is_available() -> bool:
    return _probe()[0] is not None


def unavailable_reason() -> str:
    return _probe()[1] or "available"


def is_simulator() -> bool:
    """True when numba's CUDA simulator stands in for a GPU (``NUMBA_ENABLE_CUDASIM=1``)."""
    if not is_available():
        return False
    from numba import config  # (loaded by the probe already)

    return bool(config.ENABLE_CUDASIM)


def device_count() -> int:
    if not is_available():
        return 0
    return len(numba_cuda().gpus)


def current_device() -> int:
    numba_cuda()
    return 0


def get_device_name(device: Any = None) -> str:
    cuda = numba_cuda()
    if is_simulator():
        return "numba CUDA simulator"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def synchronize(device: Any = None) -> None:
    """Wait for every queued kernel and copy on the device (timing needs this)."""
    numba_cuda().synchronize()


def manual_seed(seed: int) -> None:
    """CUDA tensors draw from the host generator (and are copied), so one seed covers both."""
    _manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator: there is one (the host's), so ``manual_seed``."""
    _manual_seed(seed)


def __getattr__(name: str) -> Any:
    # ``fusegrad.cuda.amp`` (``GradScaler``, ``autocast``): made by ``fusegrad.amp``, which
    # sits above the op surface and so is loaded on first use, not imported by this package
    if name == "amp":
        return importlib.import_module("fusegrad.amp").cuda_amp
    if name.endswith("Tensor"):  # FloatTensor, LongTensor, ...: the legacy CUDA tensor types
        types = importlib.import_module("fusegrad.tensor_types").CUDA_TYPES
        if name in types:
            return types[name]
    raise AttributeError(f"module 'fusegrad.cuda' has no attribute {name!r}")
