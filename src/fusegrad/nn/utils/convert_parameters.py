"""``parameters_to_vector`` / ``vector_to_parameters``, as ``torch.nn.utils``."""

from __future__ import annotations

from collections.abc import Iterable

from ...ops import cat
from ...tensor import Tensor


def _check_device(param: Tensor, device: object | None) -> object:
    if device is not None and param.device != device:
        raise TypeError(
            "Found two parameters on different devices, this is currently not supported "
            f"({device} and {param.device})"
        )
    return param.device


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """The parameters flattened and concatenated into one vector (differentiable)."""
    device = None
    flat = []
    for p in parameters:
        device = _check_device(p, device)
        flat.append(p.reshape(-1))
    return cat(flat)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Give each parameter its slice of ``vec`` as its data (``param.data = ...``, sharing
    ``vec``'s storage as in PyTorch)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    device = None
    pointer = 0
    for p in parameters:
        device = _check_device(p, device)
        n = p.numel()
        p.data = vec[pointer : pointer + n].view_as(p).data
        pointer += n
