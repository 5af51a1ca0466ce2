"""THE lowering table: how the compiler computes each primitive (docs/ARCHITECTURE.md, contract 1).

Every primitive of the op registry has exactly one entry, of one of three kinds:

* ``EXPRESSIONS[name]``: the scalar expression template of an elementwise primitive, fused into
  generated loops.  It is read from the primitive's record (``Primitive.lowering``, declared
  with the primitive in ``fusegrad.ops``: the eager CUDA kernels need it too, and ``src/`` never
  imports the compiler), not written here.  ``FUNCTIONS`` are the scalar functions those
  templates call (``ScalarFunction``: a libm name and the one Python source); each target spells
  them (``numba_cpu``, ``numba_cuda``, ``interpreter``, through ``common.expression``).
* ``FUSED_REDUCTIONS``: reductions that fuse as a kernel epilogue (sum over broadcast dims).
* ``EXTERNS``: primitives computed by their eager kernel between fused loops (matmul, indexing,
  movement that changes the iteration space, ...): fusion barriers.

A test checks that the three kinds together cover the registry exactly.
"""

from __future__ import annotations

import hashlib
import inspect
from functools import cache

from fusegrad.ops import decompositions as _decompositions
from fusegrad.ops.registry import REGISTRY, ScalarFunction
from fusegrad.ops.special_functions import SCIPY_KERNELS

EXPRESSIONS: dict[str, str] = {
    name: prim.lowering.expression for name, prim in REGISTRY.items() if prim.lowering is not None
}


def _functions() -> dict[str, ScalarFunction]:
    out: dict[str, ScalarFunction] = {}
    for name, prim in REGISTRY.items():
        for fn in prim.lowering.functions if prim.lowering is not None else ():
            if out.setdefault(fn.name, fn) != fn:  # one meaning per name
                raise ValueError(f"{name}: scalar function {fn.name!r} declared twice, differently")
    return out


FUNCTIONS: dict[str, ScalarFunction] = _functions()

# the functions that compiled code calls as compiled Python (no C library equivalent): an
# inlined numba function on the CPU, a device function on CUDA, both of ``python`` itself
HELPER_FUNCTIONS: dict[str, ScalarFunction] = {
    name: fn for name, fn in FUNCTIONS.items() if fn.libm is None
}


def helper_name(fn: ScalarFunction) -> str:
    """The name under which generated modules call a compiled helper (``_digamma``)."""
    return f"_{fn.name}"


@cache
def helpers_digest() -> str:
    """A digest of the source files that define the compiled helpers.  They are inlined into
    generated code, and numba's disk cache of a caller does not notice an inlined callee
    change, so emitters put this digest in the name of every module that calls them."""
    files = sorted({inspect.getsourcefile(fn.python) or "" for fn in HELPER_FUNCTIONS.values()})
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()[:16]


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
        "argsort",  # sort/topk/kthvalue/median's indices (their values are a gather)
        "attention",  # scaled_dot_product_attention's fused CPU kernel (numba)
        "attention_backward",  # its gradients (q, k, v stacked)
        "rnn_sequence",  # nn.LSTM / GRU / RNN: one layer and direction's fused CPU kernel (numba)
        "rnn_sequence_backward",  # its gradients (backpropagation through time), flat
        "embedding",  # F.embedding's lookup (numpy take)
        "embedding_backward",  # its scatter-add backward (fused CPU kernel, numba)
        "softmax",  # softmax's eager kernel (numpy)
        "softmax_backward",  # its gradient
        "log_softmax",  # log_softmax / cross_entropy's first half (numpy)
        "log_softmax_backward",  # its gradient
        "nll_loss",  # nll_loss / cross_entropy's second half (numpy)
        "nll_loss_backward",  # its input's gradient, a scatter of the targets' weights
        "resample",  # interpolate's nearest and linear modes (fused CPU kernel, numba)
        "resample_backward",  # their input's gradient
        "norm_stats",  # batch / instance / group / layer norm: statistics (fused CPU kernel, numba)
        "norm",  # their normalisation and affine map by given statistics
        "norm_backward",  # their input's, weight's and bias's gradients, flat
        "convolution",  # conv / conv_transpose 1-3d: im2col + BLAS (fusegrad.ops.conv_kernels)
        "convolution_backward_input",  # its input's gradient (W^T g, then col2im)
        "convolution_backward_weight",  # its weight's gradient (g times the columns)
        "avg_pool",  # average pooling 1-3d, fixed or adaptive windows: a loop kernel (numba)
        "avg_pool_backward",  # its input's gradient
        "pool_index",  # max pooling's positions of the maxima (a loop kernel)
        "pool_take",  # max pooling's values: the input at those positions
        "pool_scatter",  # their transpose, max pooling's input gradient
        "cummax_index",  # cummax/cummin's indices (their values are a gather)
        "mode_index",  # mode's index (its value is a gather)
        "searchsorted",  # searchsorted/bucketize
        "histc",
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
        # special functions computed by scipy.special (fusegrad.ops.special_functions)
        *SCIPY_KERNELS,
    }
)
# the mathematical surface's primitives, computed by their eager kernels between fused loops:
# complex numbers (ops/complex.py; never compiled in fact, since a graph holding a complex value
# runs eagerly, but each still has its one lowering), fusegrad.fft (ops/spectral.py) and
# fusegrad.linalg (ops/decompositions.py: LAPACK through numpy)
MATH_EXTERNS = frozenset(
    "conj_physical real imag complex view_as_real view_as_complex fft_c2c fft_r2c fft_c2r".split()
    + _decompositions.NAMES
)
EXTERNS = EXTERNS | MATH_EXTERNS
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
