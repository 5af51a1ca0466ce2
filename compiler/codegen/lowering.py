"""THE lowering table: how the compiler computes each primitive (DESIGN.md contract 1).

Every primitive of the op registry has exactly one entry, of one of three kinds:

* ``EXPRESSIONS[name]``: a scalar expression template for elementwise primitives, fused into
  generated loops.  ``{0}``, ``{1}``, ... are the operands' scalar expressions, ``{dtype}`` the
  result's numpy dtype name; ``MATH`` names the math functions whose float32 form has a
  vectorisable helper (``fastmath``) and whose float64 form is libm (``math.*``);
  ``TARGET_FUNCTIONS`` names the functions each emitter spells for its target
  (``common.Spelling``).
* ``FUSED_REDUCTIONS``: reductions that fuse as a kernel epilogue (sum over broadcast dims).
* ``EXTERNS``: primitives computed by their eager kernel between fused loops (matmul, indexing,
  movement that changes the iteration space, ...): fusion barriers.

A test checks that the three kinds together cover the registry exactly.
"""

from __future__ import annotations

EXPRESSIONS: dict[str, str] = {
    "neg": "(-{0})",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "pow": "{pow}({0}, {1})",
    "maximum": "_maximum({0}, {1})",
    "minimum": "_minimum({0}, {1})",
    "reciprocal": "({one} / {0})",
    "abs": "abs({0})",
    "sign": "_sign({0})",
    "exp": "{exp}({0})",
    "expm1": "{expm1}({0})",
    "log": "{log}({0})",
    "log1p": "{log1p}({0})",
    "sin": "{sin}({0})",
    "cos": "{cos}({0})",
    "tanh": "{tanh}({0})",
    "sigmoid": "{sigmoid}({0})",
    "erf": "{erf}({0})",
    "sqrt": "{sqrt}({0})",
    "floor": "{floor}({0})",
    "ceil": "{ceil}({0})",
    "trunc": "{trunc}({0})",
    "clone": "{0}",
    "where": "({1} if {0} else {2})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "logical_and": "(bool({0}) and bool({1}))",
    "logical_or": "(bool({0}) or bool({1}))",
    "logical_xor": "(bool({0}) != bool({1}))",
    "logical_not": "(not {0})",
    "isnan": "({0} != {0})",
    "isinf": "math.isinf({0})",
    "cast": "_cast_{dtype}({0})",
}

# primitives whose expression uses a math function with a float32 fast helper
MATH = ("exp", "expm1", "log", "log1p", "sin", "cos", "tanh", "sigmoid", "erf")

# functions each target spells its own way, with one meaning: numpy's scalar ufuncs on the CPU
# (``np.sqrt``, ...), libdevice through ``math`` on CUDA, where numpy's ufuncs are not available
TARGET_FUNCTIONS = ("pow", "sqrt", "floor", "ceil", "trunc")

FUSED_REDUCTIONS = frozenset({"sum_to", "sum"})

EXTERNS = frozenset(
    {
        "round",
        "remainder",
        "floor_divide",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "amax",
        "amin",
        "prod",
        "argmax",
        "argmin",
        "all",
        "any",
        "cumsum",
        "reshape",
        "permute",
        "broadcast_to",
        "flip",
        "cat",
        "pad",
        "diagonal",
        "getitem",
        "index_put",
        "index_add_at",
        "gather",
        "scatter",
        "scatter_add",
        "matmul",
        "to_device",  # a host <-> device copy
    }
)
# ``broadcast_to`` is also fused (as a broadcasting read) when its consumer is in a kernel;
# standing alone it is an extern (a numpy view).
# ``sum``/``sum_to`` over integer values and reductions that cannot fuse run as externs too.


def kind_of(name: str) -> str:
    if name in EXPRESSIONS:
        return "expression"
    if name in FUSED_REDUCTIONS:
        return "reduction"
    if name in EXTERNS:
        return "extern"
    raise KeyError(f"primitive {name!r} has no lowering")
