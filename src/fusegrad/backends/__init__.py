"""``fusegrad.backends``: the switches PyTorch scripts set on ``torch.backends``, accepted and
stored so that such scripts run unchanged.  None of them changes what fusegrad computes:
fusegrad has no cuDNN, no TF32 and no MPS (its numerics are float32/float64 on numpy, numba and
numba-cuda; docs/ARCHITECTURE.md).  ``cudnn.is_available()`` and ``mps.is_available()`` say False.

``fusegrad.backends.cudnn.benchmark = True``, ``backends.cudnn.deterministic = True``,
``backends.cuda.matmul.allow_tf32 = True``, ``backends.cudnn.allow_tf32 = True`` are plain
attribute writes, read back as written.
"""

from __future__ import annotations

from . import cpu, cuda, cudnn, mps

__all__ = ["cpu", "cuda", "cudnn", "mps"]
