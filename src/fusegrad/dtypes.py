"""dtypes and PyTorch type promotion.

fusegrad has eleven dtypes (float32 default, float64, float16, int64, int32, int16, int8, uint8,
bool, complex64, complex128), each a thin record around a numpy dtype, and a twelfth, bfloat16,
when the optional ``ml_dtypes`` package is installed (numpy has no bfloat16; ``ml_dtypes`` adds
it with numpy's arithmetic), imported on bfloat16's first use, not with fusegrad
(``_LazyNumpyDtype``). float16 and bfloat16 are storage and eager-compute dtypes: numpy
computes each elementwise op on them in float32 and rounds (as PyTorch's CPU kernels do), but
reductions accumulate in the narrow type where numpy does (PyTorch accumulates in float32), and
compiled programs do not take them (numba has no CPU half type): a backward or whole step that
meets one runs eagerly, with that reason. The small integers (int16, int8, uint8) are eager only
too (``SMALL_INT``): generated code casts only to 32- and 64-bit types.

``result_type`` implements PyTorch's promotion: operands are ranked by category (bool < integer
< floating < complex); uint8 with a signed integer gives the smallest signed type that holds
both (``uint8 + int8`` is int16); within the highest category present, dimensioned tensors win
over 0-d tensors, which win over Python scalars ("wrapped numbers"). A Python scalar never
upcasts a tensor of its own category (``float32 * 2.0`` stays float32); a scalar of a higher
category gives the default dtype of that category (``int_tensor * 2.5`` is float32). A complex
operand that wins over a floating one keeps that one's precision (``float64 * 1j`` is
complex128). docs/complex.md describes the complex dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec as _find_spec

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class dtype:  # noqa: N801 - torch-style lowercase name
    # eq=False: the dtypes are singletons, so identity is equality, and hashing by
    # identity is fast (dtypes are hashed in every compiled backward's cache key)
    name: str
    np: np.dtype
    category: int  # 0 bool, 1 integer, 2 floating, 3 complex
    itemsize: int

    @property
    def is_floating_point(self) -> bool:
        return self.category == 2

    @property
    def is_complex(self) -> bool:
        return self.category == 3

    def to_real(self) -> dtype:
        """The dtype of a complex dtype's real and imaginary parts (itself for the others)."""
        return _REAL_OF.get(self, self)

    def to_complex(self) -> dtype:
        """The complex dtype whose parts have this floating dtype (itself for complex ones);
        float16 and bfloat16 give complex64 (fusegrad has no complex32)."""
        if self.category == 3:
            return self
        if self.category != 2:
            raise TypeError(f"to_complex: expected a floating point dtype, got {self.name}")
        return complex128 if self.itemsize == 8 else complex64

    @property
    def is_signed(self) -> bool:
        return self.category != 0 and self.np.kind != "u"

    def __repr__(self) -> str:
        return f"fusegrad.{self.name}"

    def __reduce__(self) -> tuple:
        # unpickling gives back the singleton, keeping identity comparisons valid
        return (as_dtype, (self.name,))


bool_ = dtype("bool", np.dtype(np.bool_), 0, 1)
# the small integers (images, masks, quantised data): eager only, like the half dtypes
uint8 = dtype("uint8", np.dtype(np.uint8), 1, 1)
int8 = dtype("int8", np.dtype(np.int8), 1, 1)
int16 = dtype("int16", np.dtype(np.int16), 1, 2)
int32 = dtype("int32", np.dtype(np.int32), 1, 4)
int64 = dtype("int64", np.dtype(np.int64), 1, 8)
float32 = dtype("float32", np.dtype(np.float32), 2, 4)
float64 = dtype("float64", np.dtype(np.float64), 2, 8)

float16 = dtype("float16", np.dtype(np.float16), 2, 2)
# complex: a real and an imaginary part of float32 / float64 (numpy's layout, as PyTorch's)
complex64 = dtype("complex64", np.dtype(np.complex64), 3, 8)
complex128 = dtype("complex128", np.dtype(np.complex128), 3, 16)
_REAL_OF = {complex64: float32, complex128: float64}


class _LazyNumpyDtype(dtype):
    """A dtype whose numpy dtype comes from an optional package, imported on the first read of
    ``.np`` rather than with fusegrad: ml_dtypes' extension takes about half a second to import,
    which every process (the user's and each compile worker) would otherwise pay at start-up
    whether or not it ever meets a bfloat16 value. The object is the dtype singleton from the
    start (identity comparisons stay valid); only ``.np`` waits. The tables keyed by numpy dtype
    (``_BY_NP``, and ``tensor.py``'s) do not hold it until then: an array can only carry its
    numpy dtype once the package has been imported, and a lookup that misses resolves it
    (``as_dtype``), after which it joins ``_BY_NP``."""

    __slots__ = ()

    def __init__(self, name: str, category: int, itemsize: int) -> None:
        # (the frozen dataclass's __init__ would assign ``np`` through the property below)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "category", category)
        object.__setattr__(self, "itemsize", itemsize)
        _NP_SLOT.__set__(self, None)

    @property
    def np(self) -> np.dtype:
        npd = _NP_SLOT.__get__(self, dtype)
        if npd is None:
            npd = _resolve(self)
        return npd


_NP_SLOT = dtype.__dict__["np"]  # the slot under ``dtype.np`` (the property above shadows it)


def _resolve(d: _LazyNumpyDtype) -> np.dtype:
    """Import the package behind ``d`` (only bfloat16 has one: ml_dtypes), store its numpy
    dtype in ``d`` and in ``_BY_NP``, and return it."""
    import ml_dtypes  # (installed: checked by find_spec when ``d`` was made)

    npd = np.dtype(getattr(ml_dtypes, d.name))
    _NP_SLOT.__set__(d, npd)  # (two threads resolving at once store the same object)
    _BY_NP[npd] = d
    return npd


# bfloat16: only with the optional ml_dtypes package (numpy has none), imported on first use
bfloat16: dtype | None = (
    _LazyNumpyDtype("bfloat16", 2, 2) if _find_spec("ml_dtypes") is not None else None
)

ALL = (bool_, int32, int64, float32, float64, float16, complex64, complex128) + (
    (bfloat16,) if bfloat16 else ()
)
COMPLEX = (complex64, complex128)
ALL += (uint8, int8, int16)
# the half dtypes: eager only (compiled programs fall back, see the module docstring)
HALF = tuple(d for d in (float16, bfloat16) if d is not None)
# the small integers: eager only too (generated code casts only to 32- and 64-bit types)
SMALL_INT = (uint8, int8, int16)
# numpy dtype -> fusegrad dtype; bfloat16 joins when ml_dtypes is imported (``_resolve``)
_BY_NP = {d.np: d for d in ALL if not isinstance(d, _LazyNumpyDtype)}
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"float": float32, "double": float64, "long": int64, "int": int32, "half": float16})
_BY_NAME.update({"cfloat": complex64, "cdouble": complex128})
_BY_NAME.update({"short": int16})

_default_float = float32


def get_default_dtype() -> dtype:
    return _default_float


def get_default_complex_dtype() -> dtype:
    """complex128 when the default float dtype is float64, else complex64 (PyTorch's rule)."""
    return complex128 if _default_float is float64 else complex64


def set_default_dtype(d: dtype) -> None:
    global _default_float
    d = as_dtype(d)
    if not d.is_floating_point:
        raise TypeError(f"set_default_dtype: only floating dtypes are allowed, got {d}")
    _default_float = d


def as_dtype(d: object) -> dtype:
    """Turn a fusegrad dtype, numpy dtype, Python type or name into a fusegrad dtype."""
    if isinstance(d, dtype):
        return d
    if d is float:
        return _default_float
    if d is int:
        return int64
    if d is bool:
        return bool_
    if d is complex:
        return get_default_complex_dtype()
    if isinstance(d, str) and d in _BY_NAME:
        return _BY_NAME[d]
    try:
        npd = np.dtype(d)  # type: ignore[call-overload]
    except TypeError:
        npd = None
    if npd is not None and npd in _BY_NP:
        return _BY_NP[npd]
    if d == "bfloat16" or (npd is not None and npd.name == "bfloat16"):
        if bfloat16 is None:
            raise TypeError("bfloat16 needs the optional ml_dtypes package (pip install ml_dtypes)")
        if npd == bfloat16.np:  # (ml_dtypes is imported already: something made ``npd``)
            return bfloat16
    if npd is not None:
        # numpy dtypes fusegrad does not store: map to the nearest of its category
        if npd.kind == "f":
            return float64 if npd.itemsize > 4 else float32
        if npd.kind in "iu":  # uint16, uint32, uint64: the signed type that holds them
            return int64 if npd.itemsize >= 4 else int32
        if npd.kind == "c":
            return complex128 if npd.itemsize > 8 else complex64
    raise TypeError(f"unsupported dtype {d!r}; expected one of {', '.join(x.name for x in ALL)}")


def from_numpy_dtype(npd: np.dtype) -> dtype:
    return _BY_NP.get(npd) or as_dtype(npd)


def is_stored(npd: np.dtype) -> bool:
    """Whether ``npd`` is the numpy dtype of one of fusegrad's dtypes (bfloat16 included, without
    importing ml_dtypes for a dtype that cannot be its)."""
    if npd in _BY_NP:
        return True
    return bfloat16 is not None and npd.name == "bfloat16" and npd == bfloat16.np


def _scalar_category(x: object) -> int:
    if isinstance(x, (bool, np.bool_)):
        return 0
    if isinstance(x, (int, np.integer)):
        return 1
    if isinstance(x, (float, np.floating)):
        return 2
    if isinstance(x, (complex, np.complexfloating)):
        return 3
    raise TypeError(f"unsupported scalar type {type(x).__name__}")


def _default_for(category: int) -> dtype:
    return (bool_, int64, _default_float, get_default_complex_dtype())[category]


def _promote_pair(a: dtype, b: dtype) -> dtype:
    if a is b:
        return a
    if a.category == 3 or b.category == 3:
        # complex with anything: complex, wide enough for both parts (complex64 with float64
        # is complex128); complex with an integer or bool keeps its own precision
        ra = a.to_real() if a.category >= 2 else None
        rb = b.to_real() if b.category >= 2 else None
        if ra is None or rb is None:
            return a if a.category == 3 else b
        return _promote_pair(ra, rb).to_complex()
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 1 and (a is uint8 or b is uint8):
        # uint8 with a signed integer: the smallest signed type holding both (uint8 + int8 is
        # int16, uint8 + int16 int16, ...), as in PyTorch
        signed = b if a is uint8 else a
        return int16 if signed.itemsize == 1 else signed
    if a.itemsize == b.itemsize == 2:
        return float32  # float16 with bfloat16: neither holds the other (PyTorch: float32)
    return a if a.itemsize >= b.itemsize else b


def _combine(higher: dtype | None, lower: dtype | None) -> dtype | None:
    """The result of operands of a higher priority class (dimensioned tensors over 0-d ones,
    0-d ones over scalars) with those of a lower one (PyTorch's ``combine_categories``): the
    lower class only matters when its category is above the higher's, and a complex lower
    class meeting a floating higher one keeps the higher one's precision."""
    if higher is None:
        return lower
    if lower is None or higher.category == 3:
        return higher
    if lower.category == 3:
        return higher.to_complex() if higher.category == 2 else lower
    if higher.category == 2:
        return higher
    if higher is bool_ or lower.category == 2:
        return _promote_pair(higher, lower)
    return higher


def result_type(*operands: object) -> dtype:
    """PyTorch promotion over tensors (anything with ``.dtype`` and ``.ndim``) and scalars."""
    dim_t: dtype | None = None
    zero_t: dtype | None = None
    wrapped_t: dtype | None = None  # the wrapped numbers' own dtypes
    weak: dtype | None = None  # scalars and wrapped numbers, as their category's default
    for x in operands:
        d = getattr(x, "dtype", None)
        if isinstance(d, dtype):
            if getattr(x, "_wrapped_number", False):
                wrapped_t = d if wrapped_t is None else _promote_pair(wrapped_t, d)
                s = _default_for(d.category)
                weak = s if weak is None else _promote_pair(weak, s)
            elif x.ndim == 0:  # type: ignore[attr-defined]
                zero_t = d if zero_t is None else _promote_pair(zero_t, d)
            else:
                dim_t = d if dim_t is None else _promote_pair(dim_t, d)
        else:
            s = _default_for(_scalar_category(x))
            weak = s if weak is None else _promote_pair(weak, s)
    if dim_t is None and zero_t is None:
        if weak is None:
            raise TypeError("result_type: no operands")
        if wrapped_t is not None and wrapped_t.category >= weak.category:
            # only weak operands, one of them an already-typed wrapped number (a scalar a
            # primitive saved, e.g. pow's exponent inside its derivative rule): keep its
            # precision
            return wrapped_t
        return weak
    result = _combine(dim_t, _combine(zero_t, weak))
    assert result is not None
    return result
