"""Custom autograd Functions inside a compiled backward: what their ``backward`` may depend on.

A custom Function's ``backward`` is Python written by the user.  The capture runs it once on
symbolic values (like a derivative rule, ``capture.Capture``) and the program replays the ops it
recorded.  That is only right if everything else the Python code depends on is the same at the
next call, and if running it had no effect beyond its ops.  So the walk's key holds, per
Function node (``function_key``):

* the class and its ``backward`` function (by identity);
* the ctx's attributes (``ctx.scale = 2.0``): numbers, strings, None, dtypes and tuples of them
  by value; tensors become program inputs, read at their current values each call
  (``CtxTensor``; eager mode does not version-check them either);
* what the code reads from module globals and closures (``LOAD_GLOBAL``/``LOAD_DEREF``, found in
  the bytecode of ``backward``, its nested functions, and the user functions it names, to a
  depth): plain values by value, modules of a short list (fusegrad's, ``math``, ``operator``) and
  classes and functions by identity (a user class with its plain class attributes), builtins of
  a list of pure ones.

Anything else it reads (a global list, an object, numpy, ``print``, another module) makes the
node *untraceable*: the backward runs eagerly, with the reason, never assumed harmless.  What
the capture detects while the code runs (``capture.Capture``, through the tracer's
notifications) also sends it back to eager: reading tensor values (``.item()``, ``.numpy()``,
Python branching on values), random draws, in-place writes, writes to the ctx, a tensor that is
neither an input of the backward nor made inside it, and any error raised on symbolic values.
"""

from __future__ import annotations

import builtins
import dis
import types
from typing import TYPE_CHECKING, Any

from fusegrad import dtypes as _dt
from fusegrad.size import Size
from fusegrad.tensor import Tensor

if TYPE_CHECKING:
    from fusegrad.autograd.function import FunctionCtx

# ctx attributes the Function machinery itself keeps in ``__dict__``
CTX_INTERNAL = frozenset({"_forward_saved", "_in_jvp"})

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_MODULES = frozenset({"math", "operator", "cmath"})
# builtins a backward may name: no side effects, results fixed by their arguments
_PURE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "bool", "callable", "divmod", "enumerate", "filter", "float",
        "frozenset", "getattr", "hasattr", "int", "isinstance", "issubclass", "iter", "len",
        "list", "map", "max", "min", "next", "pow", "range", "repr", "reversed", "round",
        "slice", "sorted", "str", "sum", "tuple", "type", "zip", "dict", "set", "super",
        "NotImplemented", "None", "True", "False", "Ellipsis", "object", "complex", "format",
    }
)  # fmt: skip
_MAX_DEPTH = 4  # user functions followed through globals (a deeper chain is untraceable)


class Untraceable(Exception):
    """Why a Function node's backward cannot be traced (its message is the reason)."""


class CtxTensor:
    """A tensor kept as a ctx attribute (``ctx.w = w``, not ``save_for_backward``): a program
    input like a saved tensor (it stands in the walk's saved list), read at its current
    version, as eager mode reads it."""

    __slots__ = ("_counter", "_tensor")
    _data = None
    _unpack_hook = None
    _producer = None
    _output_nr = 0
    _is_output = False

    def __init__(self, t: Tensor) -> None:
        self._tensor = t
        self._counter = t._version_counter

    @property
    def _version(self) -> int:  # (never stale: eager does not check ctx attributes)
        return self._counter.value

    def unpack(self, node: Any) -> Tensor:
        return self._tensor


def python_key(value: Any) -> Any:
    """``value`` as part of a cache key, compared by value; raises ``TypeError`` for values that
    are not plain (numbers, strings, None, dtypes, ``Size``, tuples of them)."""
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is tuple or kind is Size:
        return (kind, tuple(python_key(v) for v in value))
    if isinstance(value, _dt.dtype):
        return value
    if isinstance(value, (int, float)) and type(value).__module__ == "numpy":
        return (kind, value)  # numpy scalars
    raise TypeError(kind.__name__)


def _global_names(code: types.CodeType, cache: dict = {}) -> tuple:  # noqa: B006 (memo)
    """The global names ``code`` (and the functions nested in it) loads."""
    names = cache.get(code)
    if names is None:
        found: list[str] = []
        stack = [code]
        while stack:
            c = stack.pop()
            for ins in dis.get_instructions(c):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    found.append(ins.argval)
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        names = cache[code] = tuple(dict.fromkeys(found))
    return names


def _ours(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "fusegrad" or module.startswith("fusegrad.")


def _value_key(name: str, value: Any, depth: int, seen: set) -> Any:
    """A global or closure value read by a backward, as part of the key (see module doc)."""
    try:
        return python_key(value)
    except TypeError:
        pass
    if isinstance(value, types.ModuleType):
        if value.__name__ in _MODULES or value.__name__.split(".")[0] == "fusegrad":
            return value
        raise Untraceable(f"reads module {value.__name__!r} (calls there are not traced)")
    if isinstance(value, Tensor):
        raise Untraceable(f"reads the tensor {name!r} from outside its ctx and gradients")
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        if _ours(value):
            return value
        return (value, function_globals_key(value, depth + 1, seen))
    if isinstance(value, types.BuiltinFunctionType):
        owner = getattr(value, "__module__", None)
        if owner in _MODULES or (owner == "builtins" and value.__name__ in _PURE_BUILTINS):
            return value
        raise Untraceable(f"calls {name!r} (a builtin with effects or outside the op surface)")
    if isinstance(value, type):
        if _ours(value) or value.__module__ == "builtins" or issubclass(value, BaseException):
            return value
        return (value, _class_key(value, depth, seen))
    raise Untraceable(f"reads {name!r}, a {type(value).__name__} (its state is not in the key)")


def _class_key(cls: type, depth: int, seen: set) -> tuple:
    items = []
    for k, v in vars(cls).items():
        if k.startswith("__") or k in ("forward", "backward", "setup_context", "jvp", "vjp"):
            continue
        try:
            items.append((k, python_key(v)))
        except TypeError:
            if isinstance(v, (staticmethod, classmethod, types.FunctionType, type)):
                items.append((k, _value_key(f"{cls.__name__}.{k}", v, depth, seen)))
            elif not isinstance(v, (property, types.MemberDescriptorType)):
                # a list, dict or object on the class: state the backward may read or change
                raise Untraceable(
                    f"reads the class {cls.__name__}, whose attribute {k!r} is a "
                    f"{type(v).__name__} (its state is not in the key)"
                ) from None
    return tuple(items)


def function_globals_key(fn: Any, depth: int = 0, seen: set | None = None) -> tuple:
    """What ``fn`` reads from its globals and closure, keyed (raises ``Untraceable``)."""
    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType):
        raise Untraceable(f"its backward is a {type(fn).__name__}, not a Python function")
    if _ours(fn) and depth > 0:
        return ()
    if depth > _MAX_DEPTH:
        raise Untraceable("calls user functions nested too deeply to key")
    seen = set() if seen is None else seen
    if fn in seen:
        return ("recursive",)
    seen.add(fn)
    code = fn.__code__
    scope = fn.__globals__
    items: list = []
    for name in _global_names(code):
        if name in scope:
            items.append((name, _value_key(name, scope[name], depth, seen)))
        elif name not in _PURE_BUILTINS:
            value = getattr(builtins, name, None)
            if isinstance(value, type) and issubclass(value, BaseException):
                continue  # (raising is fine: eager mode raises it too)
            if value is not None:
                raise Untraceable(
                    f"calls the builtin {name!r} (effects or values outside the op surface)"
                )
            raise Untraceable(f"reads the undefined global {name!r}")
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        items.append((name, _value_key(name, value, depth, seen)))
    return tuple(items)


def reads_plain_values(key: Any) -> bool:
    """Whether a ``function_globals_key`` holds plain values (numbers, strings, tuples: state a
    caller may change between calls), not only modules, classes and functions by identity."""
    if isinstance(key, tuple):
        if len(key) == 2 and isinstance(key[0], type) and key[0] in (*_PLAIN, tuple, Size):
            return True
        return any(reads_plain_values(k) for k in key)
    return False


def ctx_attribute_key(name: str, value: Any) -> Any:
    try:
        return python_key(value)
    except TypeError:
        raise Untraceable(
            f"ctx.{name} is a {type(value).__name__} (compiled backward keys numbers, strings, "
            "None, dtypes, tuples of them and tensors)"
        ) from None


class TracedCtx:
    """What a traced ``backward`` gets as ``ctx``: the node's flags and plain attributes, its
    saved tensors and tensor attributes as symbolic values (``capture.Capture``)."""

    __slots__ = ("_attrs", "_capture", "_node")

    def __init__(self, capture: Any, node: Any, tensors: dict) -> None:
        object.__setattr__(self, "_capture", capture)
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_attrs", tensors)

    @property
    def saved_tensors(self) -> tuple:
        node = self._node
        if node._saved is None:
            return ()
        return tuple(None if s is None else self._capture.unpack(s, node) for s in node._saved)

    @property
    def needs_input_grad(self) -> tuple:
        return self._node.needs_input_grad

    @property
    def materialize_grads(self) -> bool:
        return self._node.materialize_grads

    def name(self) -> str:
        return self._node.name()

    def __getattr__(self, name: str) -> Any:
        obj = self._attrs.get(name)
        if obj is not None:
            return self._capture.unpack(obj, self._node)
        try:
            return self._node.__dict__[name]
        except KeyError:
            pass
        raise Untraceable(f"its backward used ctx.{name}, which compiled backward does not offer")

    def __setattr__(self, name: str, value: Any) -> None:
        raise Untraceable(f"its backward sets ctx.{name} (Python state a replay would not set)")


def return_sources(fn: Any, cache: dict = {}) -> dict:  # noqa: B006 (memo)
    """What a custom ``backward`` returns at each position, read from its bytecode where every
    ``return`` agrees: None (a literal None, ``return g * 2, None``) or the index of the
    gradient argument it passes through unchanged (``return g``: None when that gradient is).
    An opaque step of ``fn`` is built to take no gradient where it gets None
    (``capture.Capture._opaque_function``).  A return that cannot be read this way (a tuple
    built elsewhere, a call) leaves every position open."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    found = cache.get(code)
    if found is not None:
        return found
    instrs = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]
    # the gradient arguments (after ctx), unless the code assigns to them
    stored = {i.argval for i in instrs if i.opname in ("STORE_FAST", "DELETE_FAST")}
    params = {
        name: k - 1
        for k, name in enumerate(code.co_varnames[: code.co_argcount])
        if k > 0 and name not in stored
    }

    def source(item: Any) -> Any:
        if item.opname == "LOAD_CONST" and item.argval is None:
            return "none"
        if item.opname == "LOAD_FAST" and item.argval in params:
            return params[item.argval]
        return "other"

    result: dict | None = None
    for k, ins in enumerate(instrs):
        if ins.opname != "RETURN_VALUE":
            continue
        here: dict = {}
        prev = instrs[k - 1] if k else None
        if prev is not None and prev.opname == "LOAD_CONST" and isinstance(prev.argval, tuple):
            here = {j: "none" for j, item in enumerate(prev.argval) if item is None}
        elif prev is not None and prev.opname == "BUILD_TUPLE":
            n = prev.argval
            # the items, last first, while each is one instruction (a name or a constant)
            for j in range(n - 1, -1, -1):
                at = k - 2 - (n - 1 - j)
                if at < 0 or instrs[at].opname not in ("LOAD_CONST", "LOAD_FAST"):
                    break
                here[j] = source(instrs[at])
        elif prev is not None and prev.opname in ("LOAD_CONST", "LOAD_FAST"):
            here = {0: source(prev)}  # (a single gradient, not in a tuple)
        here = {j: v for j, v in here.items() if v != "other"}
        result = here if result is None else {j: v for j, v in result.items() if here.get(j) == v}
    found = cache[code] = {j: (None if v == "none" else v) for j, v in (result or {}).items()}
    return found


# custom Function class -> (input positions its ``backward`` returned None for although the
# program expected a gradient, positions it returned a gradient for although the program
# expected None), found when opaque steps ran (``program._function_output``): the walk keys them
NONE_GRADIENTS: dict[type, tuple[frozenset, frozenset]] = {}


def learn_gradient(cls: type, index: int, returned: bool) -> None:
    """Record that ``cls.backward`` returned a gradient (or None) at ``index`` against what the
    program was built for."""
    none, some = NONE_GRADIENTS.get(cls, (frozenset(), frozenset()))
    if returned:
        NONE_GRADIENTS[cls] = (none - {index}, some | {index})
    else:
        NONE_GRADIENTS[cls] = (none | {index}, some - {index})


def none_gradients(node: FunctionCtx, layout: tuple) -> frozenset:
    """The input positions an opaque step of ``node``'s ``backward`` is built to take no
    gradient from, given which gradients it gets (``layout``): those where every ``return`` has
    a literal None or passes on a gradient it gets as None (``functions.return_sources``), or,
    once one has run, those found at run time (``NONE_GRADIENTS``)."""
    none = set()
    for j, source in return_sources(node._cls.backward).items():
        if source is None or (
            not node.materialize_grads and source < len(layout) and not layout[source]
        ):
            none.add(j)
    learned, some = NONE_GRADIENTS.get(node._cls, (frozenset(), frozenset()))
    return frozenset((none | learned) - some)
