"""``fusegrad.optim``: optimizers with PyTorch's names, options and state-dict format.

``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad``, ``Adadelta``, ``Adamax``, ``NAdam``,
``RAdam``, ``Rprop``, ``ASGD`` and ``LBFGS`` update parameters in place under ``no_grad`` (parameter
objects keep their identity);
``Optimizer`` is the base class for writing others; ``lr_scheduler`` holds the learning-rate
schedules.
"""

from __future__ import annotations

from . import lr_scheduler, swa_utils
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .adamax import Adamax
from .asgd import ASGD
from .lbfgs import LBFGS
from .more import Adafactor, Muon, SparseAdam
from .nadam import NAdam
from .optimizer import Optimizer, OptimizerError
from .radam import RAdam
from .rmsprop import RMSprop
from .rprop import Rprop
from .sgd import SGD

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Adamax",
    "NAdam",
    "LBFGS",
    "ASGD",
    "RAdam",
    "Rprop",
    "Adafactor",
    "Muon",
    "SparseAdam",
    "Optimizer",
    "OptimizerError",
    "lr_scheduler",
    "swa_utils",
]
