"""fusegrad: PyTorch-style autograd on numpy whose backward pass compiles.

Public names follow PyTorch: ``fusegrad.tensor``, ``fusegrad.randn``, ``fusegrad.no_grad``,
``fusegrad.autograd.grad``, ``fusegrad.nn``, ``fusegrad.optim`` ...  Importing fusegrad loads
neither numba nor ``fusegrad.compiler``; ``fusegrad.compile`` loads them on first use.

The package is layered: a module imports only from layers below it (or earlier in its own), at
the top of the file, so there is no import cycle at load time.  Imports inside functions are
left for optional or heavy dependencies loaded on first use (numba, numba-cuda, scipy, cupy,
``fusegrad.compiler``), and ``nn``/``optim``/``utils``/``viz``/``distributed``/``compiler`` load
on first use through ``__getattr__`` below.  ``tests/test_imports.py`` checks all of it.

1. basics: ``errors``, ``dtypes``, ``size``, ``_format``, ``_index_key``, ``_blas`` (OpenBLAS's
   kernel set), ``_malloc`` (glibc's thresholds); ``device`` (it asks numba-cuda whether there
   is a GPU); ``random`` (generators); ``fusegrad.cuda`` (CUDA storage, ``CudaArray``, and the
   eager CUDA kernels: ``cuda.ops`` runs a primitive on device arrays); ``storage``
   (device-generic array helpers).
2. autograd state: ``autograd.grad_mode``, ``autograd.tracer``, ``autograd.anomaly``.
3. ``autograd.graph_base``: ``Node``, ``AccumulateGrad``, hook handles (what ``Tensor`` needs).
4. ``tensor``: ``Tensor``.
5. ``autograd.node``: ``OpNode`` and ``SavedTensor``, which make tensors.
6. ``ops.registry``: the primitive records and ``apply``/``run``, the eager dispatch.
7. the op surface: ``ops.primitives`` (kernels), ``ops._util``, ``creation``, ``generated``,
   ``elementwise``, ``views``, ``indexing``, ``shape``, ``reduction``, ``linalg``,
   ``functional``; then ``fusegrad.ops``, which installs the ``Tensor`` methods that run ops.
8. ``autograd.derivatives``: one rule per primitive, written in the op surface (imported here,
   after ``ops``).
9. ``autograd.engine``; ``autograd.api`` (``backward``, ``grad``; it installs
   ``Tensor.backward``), ``autograd.function``, ``autograd.graph``, ``autograd.gradcheck``.
10. ``nn``, ``optim``, ``utils``; ``serialization`` (``save``/``load``, which needs nn's Parameter);
    ``amp`` (``autocast``, ``GradScaler``; also ``cuda.amp``), ``backends`` and ``accelerator``
    (stubs scripts touch); ``runtime`` (``finfo``, constants, thread counts and flags).

A method of a low class that needs a higher layer is installed on the class by that layer: the
op surface's methods and a view's lazy ``grad_fn`` by ``ops._install_methods``,
``Tensor.backward`` by ``autograd.api``.  No module reassigns another's attributes.  The
``fusegrad.autograd`` package spans layers 2 to 9; its ``__init__`` (re-exporting the public
API) sits at the top of them and is imported first, below, so that it is already running when
``tensor`` imports ``autograd.grad_mode``.
"""

from __future__ import annotations

import importlib
from typing import Any

# ``autograd`` first: its __init__ is the top of the autograd layers (see the docstring); ``ops``
# (the op surface, which installs the Tensor methods that run ops) is loaded by it already
from . import (
    _blas,
    _malloc,
    autograd,
    ops,
    sparse,  # noqa: E402  (COO tensors; installs Tensor.to_sparse and friends)
)
from . import dtypes as _dtypes
from .autograd import derivatives as _derivatives  # the rule table, above the op surface
from .autograd import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from .autograd import jvps as _jvps  # the forward-mode rule table, beside it
from .device import device, get_default_device, set_default_device
from .dtypes import bool_ as bool  # noqa: A001  (torch-style name)
from .dtypes import (
    complex64,
    complex128,
    dtype,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    set_default_dtype,
    uint8,
)
from .errors import AutogradError, DTypeError, FusegradError, IndexOutOfRange, ShapeError
from .layouts import (  # noqa: E402
    channels_last,
    channels_last_3d,
    contiguous_format,
    layout,
    memory_format,
    preserve_format,
    sparse_coo,
    strided,
)
from .ops import *  # noqa: F401,F403,E402
from .ops import (  # noqa: E402
    Generator,
    abs,
    add,
    all,
    amax,
    amin,
    any,
    arange,
    argmax,
    argmin,
    as_tensor,
    bmm,
    broadcast_tensors,
    broadcast_to,
    cat,
    chunk,
    clamp,
    clip,
    clone,
    concat,
    cos,
    cumsum,
    default_generator,
    diag,
    diagonal,
    div,
    dot,
    einsum,
    empty,
    empty_like,
    eq,
    erf,
    exp,
    exp2,
    expm1,
    eye,
    flatten,
    flip,
    floor,
    from_numpy,
    full,
    full_like,
    gather,
    ge,
    get_rng_state,
    gt,
    index_select,
    isfinite,
    isinf,
    isnan,
    le,
    lerp,
    linspace,
    log,
    log1p,
    log2,
    log_softmax,
    logsumexp,
    lt,
    manual_seed,
    masked_fill,
    masked_select,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mm,
    mul,
    nan_to_num,
    ne,
    neg,
    norm,
    ones,
    ones_like,
    outer,
    permute,
    pow,
    prod,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    relu,
    reshape,
    roll,
    round,
    rsqrt,
    scatter,
    scatter_add,
    seed,
    set_rng_state,
    sigmoid,
    sign,
    sin,
    softmax,
    split,
    sqrt,
    square,
    squeeze,
    stack,
    std,
    sub,
    sum,
    take_along_dim,
    tan,
    tanh,
    tensor,
    tile,
    transpose,
    tril,
    triu,
    trunc,
    unbind,
    unsqueeze,
    var,
    where,
    zeros,
    zeros_like,
)
from .ops.composites import range  # noqa: A004,E402  (torch.range; not in ops' __all__)

# ``from .ops import *`` brought the op surface's module ``ops.linalg`` (matmul, einsum, ...) in
# under the name of the ``fusegrad.linalg`` package, which loads on first use instead
globals().pop("linalg", None)
from .runtime import *  # noqa: F401,F403,E402  (constants, dtype queries, settings)
from .size import Size
from .sparse import mm as spmm  # noqa: E402
from .sparse import sparse_coo_tensor  # noqa: E402
from .tensor import Tensor
from .tensor_types import *  # noqa: F401,F403,E402  (FloatTensor, LongTensor, ...)

float = float32  # noqa: A001
double = float64
half = float16
if _dtypes.bfloat16 is not None:  # (with the optional ml_dtypes package)
    bfloat16 = _dtypes.bfloat16
long = int64
int = int32  # noqa: A001
cfloat = complex64
cdouble = complex128
short = int16

__version__ = "0.1.0"


def is_tensor(obj: object) -> bool:
    return isinstance(obj, Tensor)


def numel(input: Tensor) -> int:
    return input.numel()


def get_device(input: Tensor) -> int:
    """The tensor's CUDA device index, or -1 for a CPU tensor."""
    return input.get_device()


# nn.functional's functions that PyTorch also has at top level with the same signature (the
# others there, such as batch_norm or kl_div, take different arguments and are not mirrored)
_FUNCTIONAL_AT_TOP_LEVEL = frozenset(
    "selu celu threshold prelu rrelu hardshrink pixel_shuffle pixel_unshuffle conv1d "
    "conv_transpose1d conv_transpose2d alpha_dropout feature_alpha_dropout pairwise_distance "
    "cosine_similarity bilinear rms_norm adaptive_avg_pool1d adaptive_max_pool1d avg_pool1d "
    "max_pool1d max_pool1d_with_indices channel_shuffle conv3d conv_transpose3d max_pool3d "
    "max_pool2d".split()
)


# subpackages loaded on first use (``fusegrad.nn``, ``fusegrad.fft``, ...)
_SUBPACKAGES = frozenset(
    "nn optim utils viz distributed amp backends accelerator fft linalg onnx special "
    "distributions func".split()
)


def __getattr__(name: str) -> Any:
    # Heavy or optional subpackages load on first use, keeping ``import fusegrad`` light.
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    if name in ("ModuleDict", "ParameterDict"):  # (torch 2.13 exposes them at top level too)
        return getattr(importlib.import_module(".nn", __name__), name)
    if name == "GradScaler":
        return importlib.import_module(".amp", __name__).GradScaler
    if name in ("autocast", "is_autocast_enabled", "get_autocast_dtype"):
        return getattr(importlib.import_module(".amp", __name__), name)
    if name in ("save", "load", "serialization"):  # (it needs nn's Parameter: on first use)
        module = importlib.import_module(".serialization", __name__)
        return module if name == "serialization" else getattr(module, name)
    if name == "vmap":  # torch.vmap is torch.func.vmap
        return importlib.import_module(".func", __name__).vmap
    if name in _FUNCTIONAL_AT_TOP_LEVEL:  # torch.selu, torch.conv1d, ...: nn.functional's
        return getattr(importlib.import_module(".nn.functional", __name__), name)
    if name == "bfloat16":
        raise AttributeError(
            "fusegrad.bfloat16 needs the optional ml_dtypes package (pip install ml_dtypes)"
        )
    if name == "compile":
        from .compiler import compile as _compile  # the compiler, and numba with it: on first use

        return _compile
    if name == "compiler":
        return importlib.import_module(".compiler", __name__)
    raise AttributeError(f"module 'fusegrad' has no attribute {name!r}")


# OpenBLAS's kernel set, chosen again where its own choice is slow on this CPU (``_blas``)
_blas.tune()
# glibc's thresholds raised, so that a step's arrays reuse freed memory (``_malloc``)
_malloc.tune()
