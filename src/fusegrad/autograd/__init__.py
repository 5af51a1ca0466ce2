"""``fusegrad.autograd``: backward(), grad(), grad modes, gradcheck, anomaly mode, Function.

The package's modules span the layers of fusegrad (see ``fusegrad/__init__.py``): ``grad_mode``,
``tracer``, ``anomaly`` and ``graph_base`` sit below ``Tensor``; ``node`` just above it;
``derivatives``, ``engine``, ``api`` (``backward``/``grad``), ``function``, ``graph`` and
``gradcheck`` above the op surface.  This ``__init__`` is the public face of all of them, the top
of the autograd layers: ``fusegrad`` imports it first, so it is running before any of its low
modules is imported from outside (``tensor.py`` imports ``grad_mode``), and those never read a
name from it.
"""

from __future__ import annotations

from . import forward_ad, function, functional, graph
from . import native as _native  # noqa: F401  (installs conv2d's and the norms' nodes in ops)
from .anomaly import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from .api import backward, grad
from .function import Function
from .grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from .gradcheck import GradcheckError, gradcheck, gradgradcheck

__all__ = [
    "Function",
    "GradcheckError",
    "backward",
    "detect_anomaly",
    "enable_grad",
    "forward_ad",
    "functional",
    "grad",
    "gradcheck",
    "gradgradcheck",
    "inference_mode",
    "is_anomaly_enabled",
    "is_grad_enabled",
    "is_inference_mode_enabled",
    "no_grad",
    "set_detect_anomaly",
    "set_grad_enabled",
]
