"""``fusegrad.optim``: optimizers with PyTorch's names, options and state-dict format.

``SGD``, ``Adam`` and ``AdamW`` update parameters in place under ``no_grad`` (parameter objects
keep their identity); ``Optimizer`` is the base class for writing others; ``lr_scheduler``
holds the learning-rate schedules.
"""

from __future__ import annotations

from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer, OptimizerError
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "OptimizerError", "lr_scheduler"]
