"""PyTorch-like printing: ``tensor([1., 2.], requires_grad=True)``, ``grad_fn=<MulBackward0>``."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as _dt


def _float_formatter(arr: np.ndarray) -> Any:
    finite = arr[np.isfinite(arr)]
    if finite.size == 0:
        return lambda v: _special(v) or f"{v:.4f}"
    amax = float(np.abs(finite).max())
    amin = float(np.abs(finite[finite != 0]).min()) if np.any(finite != 0) else 0.0
    ints = bool(np.all(finite == np.round(finite)))
    if ints and amax < 1e8:
        return lambda v: _special(v) or f"{v:.0f}."
    if amax >= 1e8 or (amin != 0 and amin < 1e-4) or (amin != 0 and amax / amin > 1e3 and amax > 1e4):
        return lambda v: _special(v) or f"{v:.4e}"
    return lambda v: _special(v) or f"{v:.4f}"


def _special(v: float) -> str | None:
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def format_tensor(t: Any) -> str:
    arr = t._data
    prefix = "tensor("
    if arr.dtype.kind == "f":
        fmt = _float_formatter(arr) if arr.size else (lambda v: f"{v:.4f}")
        body = np.array2string(
            arr, separator=", ", prefix=prefix, formatter={"float_kind": fmt}, threshold=1000,
            edgeitems=3, max_line_width=80,
        )
    elif arr.dtype.kind == "b":
        body = np.array2string(
            arr, separator=", ", prefix=prefix, threshold=1000,
            formatter={"bool": lambda v: "True" if v else "False"},
        )
    else:
        body = np.array2string(arr, separator=", ", prefix=prefix, threshold=1000)
    if arr.size == 0 and arr.ndim > 1:
        body = "[]"
    extras = []
    if arr.size == 0 and arr.ndim != 1:
        extras.append(f"size={tuple(arr.shape)}")
    default = {_dt.get_default_dtype(), _dt.int64, _dt.bool_}
    if t.dtype not in default:
        extras.append(f"dtype=fusegrad.{t.dtype.name}")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    return prefix + body + "".join(", " + e for e in extras) + ")"
