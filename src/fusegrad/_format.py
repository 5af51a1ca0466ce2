"""PyTorch-like printing: ``tensor([1., 2.], requires_grad=True)``, ``grad_fn=<MulBackward0>``.

The layout follows ``torch/_tensor_str.py`` so that printed tensors look the same as in PyTorch:
one formatter per tensor (two for complex ones: real and imaginary parts) decides between
integer-valued (``1.``), fixed (``1.5000``) and scientific (``1.0000e-05``) notation from the
nonzero finite values, every element is padded to the widest one, lines wrap at 80 columns,
and tensors with more than 1000 elements are summarised with 3 edge items per dimension.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dtypes as _dt


class _PrintOptions:
    """What ``fusegrad.set_printoptions`` sets (PyTorch's defaults); ``sci_mode`` None lets
    each tensor's values choose."""

    def __init__(self) -> None:
        self.precision = 4
        self.threshold: float = 1000
        self.edgeitems = 3
        self.linewidth = 80
        self.sci_mode: bool | None = None


OPTIONS = _PrintOptions()

_PROFILES = {
    "default": {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80},
    "short": {"precision": 2, "threshold": 1000, "edgeitems": 2, "linewidth": 80},
    "full": {"precision": 4, "threshold": math.inf, "edgeitems": 3, "linewidth": 80},
}


def set_printoptions(
    precision: int | None = None,
    threshold: float | None = None,
    edgeitems: int | None = None,
    linewidth: int | None = None,
    profile: str | None = None,
    sci_mode: bool | None = None,
) -> None:
    """PyTorch's ``set_printoptions``: a ``profile`` ("default", "short", "full") first, then
    the options given; ``sci_mode`` is always set (None: chosen from the values)."""
    if profile is not None:
        if profile not in _PROFILES:
            raise ValueError(f"unknown profile {profile!r}: expected one of {sorted(_PROFILES)}")
        for name, value in _PROFILES[profile].items():
            setattr(OPTIONS, name, value)
    for name, value in (
        ("precision", precision),
        ("threshold", threshold),
        ("edgeitems", edgeitems),
        ("linewidth", linewidth),
    ):
        if value is not None:
            setattr(OPTIONS, name, value)
    OPTIONS.sci_mode = sci_mode


class _Formatter:
    """Chooses the notation and the common element width for one tensor (its summary)."""

    def __init__(self, arr: np.ndarray) -> None:
        self.floating = arr.dtype.kind == "f"
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = arr.reshape(-1)
        if not self.floating:
            for v in flat.tolist():
                self.max_width = max(self.max_width, len(f"{v}"))
            return
        values = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64)
        if values.size == 0:
            return
        absval = np.abs(values)
        vmin, vmax = float(absval.min()), float(absval.max())
        self.int_mode = bool(np.all(values == np.ceil(values)))
        if self.int_mode:
            self.sci_mode = vmax / vmin > 1000.0 or vmax > 1.0e8
        else:
            self.sci_mode = vmax / vmin > 1000.0 or vmax > 1.0e8 or vmin < 1.0e-4
        if OPTIONS.sci_mode is not None:  # set_printoptions(sci_mode=...) overrides the choice
            self.sci_mode = OPTIONS.sci_mode
        if self.sci_mode:
            self.max_width = max(len(f"{v:.{OPTIONS.precision}e}") for v in values.tolist())
        elif self.int_mode:
            self.max_width = max(len(f"{v:.0f}") + 1 for v in values.tolist())
        else:
            self.max_width = max(len(f"{v:.{OPTIONS.precision}f}") for v in values.tolist())

    def width(self) -> int:
        return self.max_width

    def format(self, value: Any) -> str:
        if self.floating:
            if self.sci_mode:
                text = f"{value:{self.max_width}.{OPTIONS.precision}e}"
            elif self.int_mode:
                text = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    text += "."
            else:
                text = f"{value:.{OPTIONS.precision}f}"
        else:
            text = f"{value}"
        return (self.max_width - len(text)) * " " + text


class _ComplexFormatter:
    """PyTorch's layout of complex elements: the real parts padded to their common width, the
    imaginary parts (formatted on their own) signed and followed by ``j``."""

    def __init__(self, arr: np.ndarray) -> None:
        self.real = _Formatter(arr.real)
        self.imag = _Formatter(arr.imag)

    def width(self) -> int:
        return self.real.width() + self.imag.width() + 1  # (+ the "j")

    def format(self, value: Any) -> str:
        value = complex(value)
        real_str = self.real.format(value.real)
        imag_str = (self.imag.format(value.imag) + "j").lstrip()
        if imag_str[0] in "+-":
            return real_str + imag_str
        return real_str + "+" + imag_str


def _summarized(arr: np.ndarray) -> np.ndarray:
    """The elements that will be shown (edge items of every dimension)."""
    if arr.ndim == 0:
        return arr
    if arr.ndim == 1:
        if arr.shape[0] > 2 * OPTIONS.edgeitems:
            return np.concatenate((arr[: OPTIONS.edgeitems], arr[-OPTIONS.edgeitems :]))
        return arr
    if arr.shape[0] > 2 * OPTIONS.edgeitems:
        rows = list(range(OPTIONS.edgeitems)) + list(
            range(arr.shape[0] - OPTIONS.edgeitems, arr.shape[0])
        )
    else:
        rows = list(range(arr.shape[0]))
    return np.stack([_summarized(arr[i]) for i in rows])


def _vector_str(arr: np.ndarray, indent: int, summarize: bool, fmt: Any) -> str:
    per_line = max(1, (OPTIONS.linewidth - indent) // (fmt.width() + 2))
    if summarize and arr.shape[0] > 2 * OPTIONS.edgeitems:
        data = (
            [fmt.format(v) for v in arr[: OPTIONS.edgeitems].tolist()]
            + [" ..."]
            + [fmt.format(v) for v in arr[-OPTIONS.edgeitems :].tolist()]
        )
    else:
        data = [fmt.format(v) for v in arr.tolist()]
    lines = [", ".join(data[i : i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _tensor_str(arr: np.ndarray, indent: int, summarize: bool, fmt: Any) -> str:
    if arr.ndim == 0:
        return fmt.format(arr.item())
    if arr.ndim == 1:
        return _vector_str(arr, indent, summarize, fmt)
    n = arr.shape[0]
    if summarize and n > 2 * OPTIONS.edgeitems:
        slices = (
            [_tensor_str(arr[i], indent + 1, summarize, fmt) for i in range(OPTIONS.edgeitems)]
            + ["..."]
            + [
                _tensor_str(arr[i], indent + 1, summarize, fmt)
                for i in range(n - OPTIONS.edgeitems, n)
            ]
        )
    else:
        slices = [_tensor_str(arr[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (arr.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _add_suffixes(body: str, suffixes: list[str], indent: int) -> str:
    parts = [body]
    last_line_len = len(body) - body.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > OPTIONS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def format_tensor(t: Any) -> str:
    arr = t._data
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if hasattr(arr, "to_host"):  # a CUDA tensor: print a host copy, say where it lives
        suffixes.append(f"device='{arr.device}'")
        arr = arr.to_host()
    dtype_suffix = f"dtype=fusegrad.{t.dtype.name}"
    if arr.dtype.kind == "V":  # bfloat16 (ml_dtypes): printed from float32, exact for it
        arr = arr.astype(np.float32)
    if arr.size == 0:
        # like numpy, the shape is shown unless it is (0,); an empty tensor shows any dtype
        # but the default float one, since there are no elements to infer it from
        if arr.ndim != 1:
            suffixes.append(f"size={tuple(arr.shape)}")
        if t.dtype is not _dt.get_default_dtype():
            suffixes.append(dtype_suffix)
        body = "[]"
    else:
        default = (_dt.get_default_dtype(), _dt.get_default_complex_dtype(), _dt.int64, _dt.bool_)
        if t.dtype not in default:
            suffixes.append(dtype_suffix)
        summarize = arr.size > OPTIONS.threshold
        shown = _summarized(arr) if summarize else arr
        fmt = _ComplexFormatter(shown) if arr.dtype.kind == "c" else _Formatter(shown)
        body = _tensor_str(arr, indent, summarize, fmt)
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, indent)
