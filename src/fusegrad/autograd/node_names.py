"""PyTorch's names for backward nodes (``grad_fn.name()``, ``grad_fn=<...>`` when printing).

A primitive's node is named after PyTorch's node for the same call: most primitives share
PyTorch's op name (``mul`` -> ``MulBackward0``); the rest are in ``PRIMITIVE_NAMES``, as a
name or as a function of the node (its ``attrs`` and input shapes) where PyTorch's overloads
give different names (``x.sum()`` -> ``SumBackward0``, ``x.sum(1)`` -> ``SumBackward1``).
A composite (``relu``, ``softmax``, ``cross_entropy``, ...) ends in the node of its last
primitive; it names that node after PyTorch's (``@torch_node_name("ReluBackward0")`` or
``name_node`` inside the function), so printing ``grad_fn`` shows what a PyTorch user expects.
Where fusegrad's graph differs from PyTorch's beyond the names, docs/node_names.md says how.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from .graph_base import _sequence


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"_+", name) if part)


def _by_dim(base: str) -> Callable[[Any], str]:
    """``<base>Backward0`` over all elements, ``<base>Backward1`` over given dims (PyTorch's
    overload order for sum, prod)."""
    return lambda node: f"{base}Backward{0 if node.attrs.get('dim') is None else 1}"


def _getitem(node: Any) -> str:
    """PyTorch's indexing applies select / slice / unsqueeze per index left to right (a full
    ``:`` adds nothing) and advanced indexing last: the node is that of the last step."""
    kinds = [k for k in node.attrs["key"]]
    if any(k[0] == "t" for k in kinds):
        return "IndexBackward0"
    last = None
    for k in kinds:
        if k[0] == "i":
            last = "SelectBackward0"
        elif k[0] == "n":
            last = "UnsqueezeBackward0"
        elif k[0] == "s" and k[1:] != (None, None, 1):
            last = "SliceBackward0"
    if last is None:  # only full slices and ellipses: x[:] is a slice, x[...], x[:, :] aliases
        return "SliceBackward0" if kinds == [("s", None, None, 1)] else "AliasBackward0"
    return last


def _matmul(node: Any) -> str:
    """The primitive takes operands of rank >= 2 (``matmul`` unsqueezes 1-D ones and names its
    result itself): 2-D @ 2-D is PyTorch's mm; batched products end in a reshape there."""
    a, b = node.input_shapes
    return "MmBackward0" if len(a) == 2 and len(b) == 2 else "UnsafeViewBackward0"


def _pow(node: Any) -> str:
    """PyTorch's overloads: pow(Tensor, Scalar) 0, pow(Tensor, Tensor) 1, pow(Scalar, Tensor) 2.
    A number operand arrives as a 0-d input without grad (a 0-d tensor that does not require
    grad reads as a number too)."""
    (base, exponent), (base_grad, exponent_grad) = node.input_shapes, node.needs_input_grad
    if exponent == () and not exponent_grad:
        return "PowBackward0"
    if base == () and not base_grad:
        return "PowBackward2"
    return "PowBackward1"


PRIMITIVE_NAMES: dict[str, str | Callable[[Any], str]] = {
    "sum": _by_dim("Sum"),
    "prod": _by_dim("Prod"),
    "getitem": _getitem,
    "matmul": _matmul,
    "pow": _pow,
    "reshape": "ViewBackward0",  # (a reshape that copies is named by ``reshape``)
    "broadcast_to": "ExpandBackward0",
    "cast": "ToCopyBackward0",
    "to_device": "ToCopyBackward0",
    "pad": "ConstantPadNdBackward0",
    "log1p": "Log1PBackward0",
    "trigamma": "PolygammaBackward0",
    # PyTorch takes .real / .imag as a select of view_as_real
    "real": "SelectBackward0",
    "imag": "SelectBackward0",
    "fft_c2c": "FftC2CBackward0",
    "fft_r2c": "FftR2CBackward0",
    "fft_c2r": "FftC2RBackward0",
    "linalg_solve": "LinalgSolveExBackward0",
    "linalg_solve_triangular": "LinalgSolveTriangularBackward0",
    "linalg_cholesky": "LinalgCholeskyExBackward0",
    "linalg_lu_factor": "LinalgLuFactorExBackward0",
    "linalg_det": "LinalgDetBackward0",
    "linalg_logabsdet": "LinalgSlogdetBackward0",
    "linalg_eigh_values": "LinalgEighBackward0",
    "linalg_eigh_vectors": "LinalgEighBackward0",
    "linalg_eig_values": "LinalgEigBackward0",
    "linalg_eig_vectors": "LinalgEigBackward0",
    "linalg_svd_u": "LinalgSvdBackward0",
    "linalg_svd_s": "LinalgSvdBackward0",
    "linalg_svd_vh": "LinalgSvdBackward0",
    "linalg_qr_q": "LinalgQrBackward0",
    "linalg_qr_r": "LinalgQrBackward0",
    "linalg_pinv": "LinalgPinvBackward0",
    "linalg_matrix_exp": "LinalgMatrixExpBackward0",
}


def primitive_node_name(node: Any) -> str:
    """The name of a primitive's node (``OpNode.name()`` when no composite renamed it)."""
    prim = node._prim.name
    entry = PRIMITIVE_NAMES.get(prim)
    if entry is None:
        return f"{_camel(prim)}Backward0"
    return entry if isinstance(entry, str) else entry(node)


def name_node(out: Any, name: str) -> Any:
    """Name ``out``'s node ``name`` (PyTorch's); ``out`` must be a tensor the calling composite
    made (its ``grad_fn`` created by this call).  Returns ``out``."""
    node = getattr(out, "grad_fn", None)
    if node is not None and hasattr(node, "_prim"):  # a primitive's node (not a Function's)
        node._name = name
    return out


def _name_of_call(name: Callable[..., str | None], args: tuple, kwargs: dict) -> str | None:
    """``name(*args, **kwargs)``; a call it cannot read keeps the primitive's name (naming a
    node must never fail the op, which has already run)."""
    try:
        return name(*args, **kwargs)
    except Exception:
        return None


def torch_node_name(name: str | Callable[..., str | None]) -> Callable[[Callable], Callable]:
    """Decorator for a composite returning one tensor, or a (values, indices) tuple: the
    result's (the values') node reads ``name`` (or ``name(*args, **kwargs)`` of the call, for
    composites whose PyTorch name depends on the arguments), when that node was made by the
    call (a composite that returns its input, or a tensor made before, renames nothing)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def composite(*args: Any, **kwargs: Any) -> Any:
            mark = next(_sequence)  # nodes made by this call have larger sequence numbers
            out = fn(*args, **kwargs)
            node = getattr(out[0] if isinstance(out, tuple) else out, "grad_fn", None)
            if node is not None and hasattr(node, "_prim") and node._seq > mark:
                new = name if isinstance(name, str) else _name_of_call(name, args, kwargs)
                if new is not None:  # (None: no PyTorch name for this call)
                    node._name = new
            return out

        return composite

    return decorate
