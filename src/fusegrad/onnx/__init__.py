"""``fusegrad.onnx``: importable, as scripts import ``torch.onnx`` at the top, but fusegrad
does not export ONNX graphs: ``export`` raises ``NotImplementedError`` saying so, and how to
export from PyTorch instead (its modules take the same state dict, as numpy arrays).
``is_in_onnx_export`` is False: no export ever runs."""

from __future__ import annotations

from typing import Any

__all__ = ["export", "is_in_onnx_export"]


def is_in_onnx_export() -> bool:
    """Whether an ONNX export is running: never, in fusegrad."""
    return False


def export(model: Any, args: Any = (), f: Any = None, *rest: Any, **kwargs: Any) -> Any:
    """Refused: fusegrad has no ONNX exporter (see the module docstring)."""
    raise NotImplementedError(
        "fusegrad.onnx.export: fusegrad does not export ONNX graphs. Build the same model in "
        "PyTorch, load fusegrad's weights into it ({name: torch.from_numpy(t.detach().numpy()) "
        "for name, t in model.state_dict().items()}) and export it with torch.onnx.export."
    )
