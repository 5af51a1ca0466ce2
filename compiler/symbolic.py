"""Symbolic sizes: what makes a captured backward graph valid for every batch size.

Where this sits: ``capture.walk`` replaces every size of a backward graph (the shapes of roots,
saved tensors, leaves and forward inputs, and the size-carrying attributes of primitives) by a
*symbol*, numbered in order of first appearance, and collects the values as the call's size
vector; the cache key holds only the symbols (and the literal sizes 0 and 1, which decide
broadcasting), so a new batch size gives the same key.  ``capture.Capture`` then runs the
derivative rules on values whose sizes are ``SymInt``s, and every IR shape and size attribute is
an expression over the symbols (``Sym``); ``program.Program`` evaluates them for each size vector
it runs with.

Equal sizes share one symbol (PyTorch calls this duck sizing): ``x + y`` of two ``(128,)``
tensors needs no proof that the sizes agree, and the key records which sizes were equal, so a
call in which they differ (a size coinciding with another by chance, or no longer doing so) has
another key.  Symbols stand for sizes of at least 2.

* ``Sym``: a polynomial over symbols with integer coefficients, in a canonical form (hashable,
  compared structurally); a constant is always a plain ``int``, never a ``Sym``.
* ``SymInt``: what derivative rules and the op surface see during a capture.  Arithmetic
  (``+ - *``, exact ``//`` and ``%``) stays symbolic.  A comparison is decided from what is known
  for every size vector of the key -- symbols are at least 2, distinct symbols have distinct
  values -- when that suffices; otherwise it is decided by the capture-time values and recorded
  as a *guard*.  Turning a ``SymInt`` into a Python int (``int()``, ``operator.index``, numpy,
  ``range``) *specialises* it: a guard that it keeps its capture-time value.  So whatever code
  does with a size, the graph it produces is correct for every size vector that satisfies its
  guards; the program checks them on each call (``Guard``) and a call that fails one captures
  again, with the guard's reason logged.
* ``FakeArray``: the storage of a symbolic tensor during a capture: shape, dtype, no data.
  Asking it for data raises ``NeedsData``, and the compiler then captures with concrete sizes
  instead (the key then holds the sizes, as before this module existed).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# ---- Sym: canonical polynomials --------------------------------------------------------------

Terms = tuple[tuple[tuple[int, ...], int], ...]  # ((monomial: sorted symbol ids, coefficient),)


class Sym:
    """A non-constant polynomial over size symbols (see the module docstring)."""

    __slots__ = ("_hash", "terms")

    def __init__(self, terms: Terms) -> None:
        self.terms = terms
        self._hash = hash(terms)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is Sym and other.terms == self.terms

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return format_expr(self)

    def __reduce__(self) -> tuple:
        return (Sym, (self.terms,))


Expr = int | Sym


def symbol(k: int) -> Sym:
    return Sym((((k,), 1),))


def _terms(e: Expr) -> dict[tuple[int, ...], int]:
    if isinstance(e, Sym):
        return dict(e.terms)
    return {(): e} if e else {}


def _make(terms: dict[tuple[int, ...], int]) -> Expr:
    items = tuple(sorted((m, c) for m, c in terms.items() if c))
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    return Sym(items)


def add(a: Expr, b: Expr) -> Expr:
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a + b
    out = _terms(a)
    for m, c in _terms(b).items():
        out[m] = out.get(m, 0) + c
    return _make(out)


def neg(a: Expr) -> Expr:
    if not isinstance(a, Sym):
        return -a
    return Sym(tuple((m, -c) for m, c in a.terms))


def sub(a: Expr, b: Expr) -> Expr:
    return add(a, neg(b))


def mul(a: Expr, b: Expr) -> Expr:
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return a * b
    out: dict[tuple[int, ...], int] = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return _make(out)


def divide_exact(a: Expr, b: Expr) -> Expr | None:
    """``a / b`` when ``b`` is one term (a monomial times a non-zero int) dividing every term of
    ``a`` exactly; None otherwise."""
    tb = _terms(b)
    if len(tb) != 1:
        return None
    ((mb, cb),) = tb.items()
    if cb == 0:
        return None
    out: dict[tuple[int, ...], int] = {}
    for ma, ca in _terms(a).items():
        rest = list(ma)
        for s in mb:
            if s not in rest:
                return None
            rest.remove(s)
        if ca % cb:
            return None
        out[tuple(rest)] = ca // cb
    return _make(out)


def evaluate(e: Any, sizes: Sequence[int]) -> int:
    """The value of ``e`` (an int or a ``Sym``) for the size vector ``sizes``."""
    if type(e) is not Sym:
        return e  # type: ignore[no-any-return]
    total = 0
    for monomial, c in e.terms:
        v = c
        for s in monomial:
            v *= sizes[s]
        total += v
    return total


def bounds(e: Expr) -> tuple[float, float]:
    """Bounds of ``e`` over every size vector (symbols are at least 2), as (low, high)."""
    if not isinstance(e, Sym):
        return (float(e), float(e))
    const = 0
    signs = set()
    at_two = 0
    for monomial, c in e.terms:
        if not monomial:
            const = c
        else:
            signs.add(c > 0)
        at_two += c * 2 ** len(monomial)
    del const
    if signs == {True}:  # increasing in every symbol: smallest with every symbol at 2
        return (float(at_two), float("inf"))
    if signs == {False}:
        return (float("-inf"), float(at_two))
    return (float("-inf"), float("inf"))


def format_expr(e: Any) -> str:
    if type(e) is not Sym:
        return str(e)
    parts = []
    for monomial, c in e.terms:
        name = "*".join(f"s{s}" for s in monomial)
        if not name:
            parts.append(str(c))
        elif c == 1:
            parts.append(name)
        elif c == -1:
            parts.append(f"-{name}")
        else:
            parts.append(f"{c}*{name}")
    text = " + ".join(parts).replace("+ -", "- ")
    return text


def substitute(value: Any, sizes: Sequence[int]) -> Any:
    """``value`` (an attribute: nested tuples/lists of ints, ``Sym``s and other values) with
    every ``Sym`` evaluated for ``sizes``."""
    if type(value) is Sym:
        return evaluate(value, sizes)
    if type(value) is tuple:
        return tuple(substitute(v, sizes) for v in value)
    if type(value) is list:
        return [substitute(v, sizes) for v in value]
    if type(value) is dict:
        return {k: substitute(v, sizes) for k, v in value.items()}
    return value


def has_sym(value: Any) -> bool:
    if type(value) is Sym:
        return True
    if type(value) in (tuple, list):
        return any(has_sym(v) for v in value)
    if type(value) is dict:
        return any(has_sym(v) for v in value.values())
    return False


# ---- guards -----------------------------------------------------------------------------------

# a guard holds when ``expr <relation> 0``
_RELATIONS = {
    "==": lambda v: v == 0,
    "!=": lambda v: v != 0,
    "<": lambda v: v < 0,
    "<=": lambda v: v <= 0,
    ">": lambda v: v > 0,
    ">=": lambda v: v >= 0,
}
_NEGATION = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


@dataclass(frozen=True, slots=True)
class Guard:
    """A fact a captured graph depends on: ``expr <relation> 0`` held at capture time.  ``why``
    says in words where the decision was made (logged when a later call fails it)."""

    expr: Any
    relation: str
    why: str

    def holds(self, sizes: Sequence[int]) -> bool:
        return bool(_RELATIONS[self.relation](evaluate(self.expr, sizes)))

    def describe(self, sizes: Sequence[int] | None = None) -> str:
        text = f"{format_expr(self.expr)} {self.relation} 0"
        if sizes is not None:
            text += f" (now {evaluate(self.expr, sizes)})"
        return f"{text}: {self.why}"


# ---- capture-time values ------------------------------------------------------------------


class NeedsData(Exception):
    """A symbolic capture reached for data or for something only concrete arrays have."""


class ShapeEnv:
    """The symbols of one capture: their capture-time values (``hints``), the guards recorded
    so far, and what the capture is doing (``where``, for guards' reasons)."""

    def __init__(self, hints: Sequence[int]) -> None:
        self.hints = list(hints)
        self.guards: list[Guard] = []
        self._seen: set = set()
        self.where = ""
        self._by_value = {v: k for k, v in enumerate(self.hints)}

    # -- making values --
    def size(self, value: int) -> Any:
        """The capture-time size ``value`` as a ``SymInt`` of its symbol (plain int for 0, 1,
        negatives and values the walk did not see)."""
        k = self._by_value.get(value) if value >= 2 else None
        return value if k is None else SymInt(symbol(k), value, self)

    def shape(self, shape: Iterable[int]) -> tuple:
        return tuple(self.size(int(d)) for d in shape)

    def wrap(self, e: Expr, hint: int) -> Any:
        return e if type(e) is not Sym else SymInt(e, hint, self)

    # -- deciding --
    def decide(self, e: Expr, relation: str, hint_value: int) -> bool:
        """Whether ``e <relation> 0``: statically when it holds (or fails) for every size vector
        of the key, else by ``hint_value`` (the capture-time value of ``e``), recorded as a
        guard."""
        if type(e) is not Sym:
            return bool(_RELATIONS[relation](e))
        static = _static(e, relation)
        if static is not None:
            return static
        result = bool(_RELATIONS[relation](hint_value))
        guard = Guard(e, relation if result else _NEGATION[relation], self.where)
        key = (guard.expr, guard.relation)
        if key not in self._seen:
            self._seen.add(key)
            self.guards.append(guard)
        return result

    def specialise(self, s: SymInt) -> int:
        self.decide(sub(s.expr, s.hint), "==", 0)
        return s.hint


def _static(e: Sym, relation: str) -> bool | None:
    low, high = bounds(e)
    if relation in ("==", "!="):
        nonzero = low > 0 or high < 0 or _distinct_symbols(e)
        if nonzero:
            return relation == "!="
        return None
    if relation in (">", ">="):
        if low > 0 or (relation == ">=" and low >= 0):
            return True
        if high < 0 or (relation == ">" and high <= 0):
            return False
        return None
    if high < 0 or (relation == "<=" and high <= 0):
        return True
    if low > 0 or (relation == "<" and low >= 0):
        return False
    return None


def _distinct_symbols(e: Sym) -> bool:
    """``c * (s_a - s_b)``: non-zero, since distinct symbols have distinct values (the key
    records which sizes are equal)."""
    if len(e.terms) != 2:
        return False
    (ma, ca), (mb, cb) = e.terms
    return len(ma) == len(mb) == 1 and ca == -cb and ma != mb


def _other(o: Any) -> tuple[Expr, int] | None:
    """(expression, capture-time value) of an operand, or None when it is not an integer."""
    if type(o) is SymInt:
        return o.expr, o.hint
    if isinstance(o, (int, np.integer)) and not isinstance(o, bool):
        return int(o), int(o)
    if isinstance(o, bool):
        return int(o), int(o)
    return None


class SymInt:
    """A size during a capture: an expression over symbols and its capture-time value (see the
    module docstring).  Registered as a ``numbers.Integral`` so that the op surface accepts it
    wherever it accepts a size."""

    __slots__ = ("env", "expr", "hint")

    def __init__(self, expr: Expr, hint: int, env: ShapeEnv) -> None:
        self.expr = expr
        self.hint = hint
        self.env = env

    def _binary(self, o: Any, fn: Any, hint_fn: Any) -> Any:
        other = _other(o)
        if other is None:
            return NotImplemented
        e, h = other
        return self.env.wrap(fn(self.expr, e), hint_fn(self.hint, h))

    def __add__(self, o: Any) -> Any:
        return self._binary(o, add, int.__add__)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Any:
        return self._binary(o, sub, int.__sub__)

    def __rsub__(self, o: Any) -> Any:
        return self._binary(o, lambda a, b: sub(b, a), lambda a, b: b - a)

    def __mul__(self, o: Any) -> Any:
        return self._binary(o, mul, int.__mul__)

    __rmul__ = __mul__

    def __neg__(self) -> Any:
        return self.env.wrap(neg(self.expr), -self.hint)

    def __pos__(self) -> SymInt:
        return self

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    def __floordiv__(self, o: Any) -> Any:
        other = _other(o)
        if other is None:
            return NotImplemented
        e, h = other
        exact = divide_exact(self.expr, e)
        if exact is not None:
            return self.env.wrap(exact, self.hint // h)
        return int(self) // (int(o) if type(o) is SymInt else h)

    def __rfloordiv__(self, o: Any) -> Any:
        other = _other(o)
        if other is None:
            return NotImplemented
        e, h = other
        exact = divide_exact(e, self.expr)
        if exact is not None:
            return self.env.wrap(exact, h // self.hint)
        return h // int(self)

    def __mod__(self, o: Any) -> Any:
        other = _other(o)
        if other is None:
            return NotImplemented
        e, h = other
        if divide_exact(self.expr, e) is not None:
            return 0
        return int(self) % (int(o) if type(o) is SymInt else h)

    def __rmod__(self, o: Any) -> Any:
        other = _other(o)
        if other is None:
            return NotImplemented
        e, h = other
        if divide_exact(e, self.expr) is not None:
            return 0
        return h % int(self)

    def __truediv__(self, o: Any) -> float:
        return int(self) / (int(o) if type(o) is SymInt else o)

    def __rtruediv__(self, o: Any) -> float:
        return o / int(self)  # type: ignore[no-any-return]

    def __pow__(self, o: Any) -> Any:
        if type(o) is int and o >= 0:
            out: Any = 1
            for _ in range(o):
                out = out * self
            return out
        return int(self) ** o

    # -- comparisons: decided statically where possible, else guarded --
    def _compare(self, o: Any, relation: str) -> Any:
        other = _other(o)
        if other is None:
            return NotImplemented
        e, h = other
        return self.env.decide(sub(self.expr, e), relation, self.hint - h)

    def __eq__(self, o: object) -> Any:
        return self._compare(o, "==")

    def __ne__(self, o: object) -> Any:
        return self._compare(o, "!=")

    def __lt__(self, o: Any) -> Any:
        return self._compare(o, "<")

    def __le__(self, o: Any) -> Any:
        return self._compare(o, "<=")

    def __gt__(self, o: Any) -> Any:
        return self._compare(o, ">")

    def __ge__(self, o: Any) -> Any:
        return self._compare(o, ">=")

    def __bool__(self) -> bool:
        return self.env.decide(self.expr, "!=", self.hint)

    def __hash__(self) -> int:
        return hash(self.hint)  # equal to the hash of the int it equals

    # -- specialisation: a concrete int from here on --
    def __index__(self) -> int:
        return self.env.specialise(self)

    def __int__(self) -> int:
        return self.env.specialise(self)

    def __float__(self) -> float:
        return float(self.env.specialise(self))

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return np.array(self.env.specialise(self), *args, **kwargs)

    def __trunc__(self) -> SymInt:
        return self

    __floor__ = __ceil__ = __round__ = __trunc__

    def __repr__(self) -> str:
        return f"{format_expr(self.expr)}(={self.hint})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(self.hint, spec) if spec else repr(self)


numbers.Integral.register(SymInt)


def expr_of(value: Any) -> Expr:
    """The expression of a size given as a ``SymInt`` or an integer."""
    if type(value) is SymInt:
        return value.expr
    return int(value)


def to_exprs(value: Any) -> Any:
    """An attribute (or shape) with every ``SymInt`` replaced by its expression (hashable and
    comparable without guards: what IR values hold)."""
    if type(value) is SymInt:
        return value.expr
    if type(value) is tuple:
        return tuple(to_exprs(v) for v in value)
    if type(value) is list:
        return [to_exprs(v) for v in value]
    if type(value) is dict:
        return {k: to_exprs(v) for k, v in value.items()}
    return value


def to_symints(value: Any, env: ShapeEnv) -> Any:
    """The inverse of ``to_exprs`` for one capture: ``Sym``s become ``SymInt``s of ``env``."""
    if type(value) is Sym:
        return SymInt(value, evaluate(value, env.hints), env)
    if type(value) is tuple:
        return tuple(to_symints(v, env) for v in value)
    if type(value) is list:
        return [to_symints(v, env) for v in value]
    return value


class _FakeFlags:
    c_contiguous = True
    f_contiguous = False
    writeable = False


class FakeArray:
    """The storage of a symbolic tensor: ``shape`` (ints and ``SymInt``s), ``dtype``, no data.

    It answers what the op surface asks of a shape (``shape``, ``ndim``, ``size``, ``dtype``,
    ``itemsize``, ``flags``); anything that needs data or memory layout raises ``NeedsData``."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple, dtype: np.dtype) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> Any:
        out: Any = 1
        for d in self.shape:
            out = d * out
        return out

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    flags = _FakeFlags()

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise NeedsData("a symbolic tensor's values were needed")

    def __getattr__(self, name: str) -> Any:
        raise NeedsData(f"a symbolic tensor's array attribute {name!r} was needed")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return int(self.shape[0])

    def __repr__(self) -> str:
        return f"FakeArray({self.shape}, {self.dtype})"


# ---- sizes inside primitive attributes ----------------------------------------------------------


def map_size_attr(name: str, value: Any, f: Any) -> Any:
    """The value of size attribute ``name`` (``Primitive.size_attrs``) with ``f`` applied to each
    size in it: every int of a ``shape`` or ``widths``; the start and stop of slices and the
    ints of an index ``key`` (its steps and tensor positions are not sizes)."""
    if name == "key":
        out: list = []
        for entry in value:
            tag = entry[0]
            if tag == "s":
                start, stop = entry[1], entry[2]
                out.append(
                    (
                        "s",
                        None if start is None else f(start),
                        None if stop is None else f(stop),
                        entry[3],
                    )
                )
            elif tag == "i":
                out.append(("i", f(entry[1])))
            else:
                out.append(entry)
        return tuple(out)
    return _map_ints(value, f)


def _map_ints(value: Any, f: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return (
            type(value)(_map_ints(v, f) for v in value)
            if type(value) is list
            else tuple(_map_ints(v, f) for v in value)
        )
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f(int(value))
    return value
