"""``fusegrad.nn.utils``: gradient clipping, parameters as one vector, and ``rnn`` (padded and
packed sequences), named as in ``torch.nn.utils``.

Everything here is written in the op surface (in-place tensor methods under ``no_grad`` for the
clipping), so a compiled whole step records it like an optimizer's update.
"""

from __future__ import annotations

from . import rnn
from .clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm
from .convert_parameters import parameters_to_vector, vector_to_parameters

__all__ = [
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grads_with_norm_",
    "get_total_norm",
    "parameters_to_vector",
    "rnn",
    "vector_to_parameters",
]
