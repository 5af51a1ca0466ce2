"""Fused CPU kernels of one recurrent layer in one direction over a whole sequence (the
``rnn_sequence`` and ``rnn_sequence_backward`` primitives of ``ops/primitives.py``), as
PyTorch's fused LSTM / GRU / RNN kernels: the time loop runs in native code.

The input projection ``x_gates = x @ W_ih^T`` of every time step is computed before, by one
ordinary matmul (``ops/recurrent.py``); the kernels take it, add its bias ``b_ih`` as they read
it, and run the recurrence.  They
work on rows: a padded (T, N, G H) sequence is T steps of N rows, a PackedSequence's data has
``batch_sizes[t]`` rows at step t (the sequences still running, longest first), and a row not
running at a step keeps its state.  Per step ``t`` (``reverse``: from the last step to the
first) the forward computes ``h @ W_hh^T`` with one BLAS call (numpy's own BLAS, called by
name: ``_gemm`` below), adds ``b_hh`` and ``x_gates[t] + b_ih``, applies the gates and
writes, per row, the output h and the values the backward needs.  The result of
``rnn_sequence`` is one flat buffer of two parts (``packed_parts``): first every row's output h
(rows, P), contiguous, so that what reads the layer's output (dropout, the next layer's input
projection, a decoder) reads it where it is, without a copy; then every row's saved state
(rows, S H):

* ``RNN_TANH`` / ``RNN_RELU``: nothing (S = 0: the activation's derivative comes from h);
* ``LSTM``: ``c, i, f, g, o`` (S = 5: the cell state and the activated gates; with a
  projection ``h = (o tanh c) W_hr^T`` has P columns, one more BLAS call per step, else P = H);
* ``GRU``: ``r, z, n, hn`` (S = 4: the gates and ``hn = h W_hn^T + b_hn``, the term ``r``
  multiplies).

The backward (backpropagation through time) walks the steps in the other order with the
gradients of the state (``dh``, and ``dc`` for the LSTM), adds the incoming gradient of every
packed column (also of the gate columns, so that the kernel is the derivative of the whole
packed output: the rule's op-surface form relies on it for double backward), and writes the
gradient of ``x_gates`` per row; ``dh`` flows to the previous step through one BLAS call
(``dgates @ W_hh``).  The weight gradients ``dW_hh = sum_t dgates_t^T h_{t-1}`` (and an LSTM's
``dW_hr``) and ``db_hh`` are one matmul and one sum over all rows afterwards (numpy, in
``rnn_backward``).

Loops run over contiguous rows; float32 transcendental functions use the compiler's
vectorisable helpers (numba has no SVML), float64 ones libm's.  The kernels are compiled on
first use with ``cache=True``; this module (and numba with it) is imported by the primitives'
kernels on their first call, never when fusegrad is imported.
"""

from __future__ import annotations

import ctypes

import llvmlite.binding
import numba  # imported on first use only (by the recurrent primitives' kernels)
import numpy as np
from numba.core import cgutils
from numba.extending import intrinsic, overload

from fusegrad.compiler.codegen.fastmath import fast_sigmoid_f32, fast_tanh_f32

from .._numba_cache import fast_loading

# how many hidden-size columns a row's saved state has, beside its output h (module docstring)
STATE_WIDTH = {"LSTM": 5, "GRU": 4, "RNN_TANH": 0, "RNN_RELU": 0}


def packed_parts(
    packed: np.ndarray, rows: int, size: int, state: int
) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of ``rnn_sequence``'s flat result (or of its gradient), as views: the
    outputs h (rows, ``size``) and the saved states (rows, ``state``)."""
    return (
        packed[: rows * size].reshape(rows, size),
        packed[rows * size : rows * (size + state)].reshape(rows, state),
    )


def _tanh(x):  # type: ignore[no-untyped-def]
    """tanh in the kernels: float32 through the compiler's vectorisable helper, float64 libm's."""
    return np.tanh(x)


@overload(_tanh)
def _tanh_overload(x):  # type: ignore[no-untyped-def]
    if x == numba.types.float32:
        return lambda x: fast_tanh_f32(x)
    return lambda x: np.tanh(x)


def _sigmoid(x):  # type: ignore[no-untyped-def]
    """1 / (1 + exp(-x)) without overflow, the formula of the ``sigmoid`` primitive."""
    e = np.exp(-abs(x))
    return (1.0 if x >= 0 else e) / (1.0 + e)


@overload(_sigmoid)
def _sigmoid_overload(x):  # type: ignore[no-untyped-def]
    if x == numba.types.float32:
        return lambda x: fast_sigmoid_f32(x)

    def sigmoid64(x):  # type: ignore[no-untyped-def]
        e = np.exp(-abs(x))
        return (1.0 if x >= 0 else e) / (1.0 + e)

    return sigmoid64


# ---- the per-step products: numpy's own BLAS, called from the kernels --------------------
#
# numba's ``np.dot`` calls scipy's BLAS (``scipy.linalg.cython_blas``): in the wheels a second
# OpenBLAS, older than numpy's and left on its own kernel choice.  The recurrences' products are
# small (one step's rows, 20 x 200 by 800 in pytorch/examples' word language model) and there
# numpy's OpenBLAS ran 1.5x faster (35 such products: 2.5 ms against 3.7 ms, one thread, on this
# project's Zen 4 machine; ``benchmarks/recurrent.py`` times the layers).  So the kernels call
# numpy's ``cblas_sgemm`` / ``cblas_dgemm`` by name: ``_bind_cblas`` finds them behind numpy's
# extension module (``_numpy_blas``) and registers their addresses with LLVM under names of our
# own, and ``_gemm`` emits the call.  Which interface was found -- 64-bit integers (numpy's
# ILP64 OpenBLAS), 32-bit ones (another CBLAS) or none (then ``np.dot``) -- reaches the kernels
# as the type of their ``blas`` argument (``BLAS``: an int64, an int32 or None), so that each
# choice compiles, and is cached on disk, as its own signature and a cached kernel never names
# a symbol this process did not register.

_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS = 101, 111
_CBLAS_NAMES = {  # our symbol's integer width -> numpy's BLAS's names for it, in order of search
    64: ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_", "cblas_{}gemm_64"),
    32: ("scipy_cblas_{}gemm", "cblas_{}gemm"),
}


def _numpy_blas() -> ctypes.CDLL | None:
    """numpy's extension module as a ctypes library: already loaded, so the same one, and its
    symbol lookup searches what it links (numpy's BLAS); None where it cannot be opened."""
    try:
        from numpy._core import _multiarray_umath as numpy_core  # numpy 2
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core import _multiarray_umath as numpy_core  # type: ignore[no-redef]
    try:
        return ctypes.CDLL(numpy_core.__file__)
    except OSError:  # pragma: no cover - a platform without dlopen of extension modules
        return None


def _bind_cblas(
    lib: ctypes.CDLL | None, widths: tuple[int, ...] = (64, 32)
) -> np.int64 | np.int32 | None:
    """Register ``lib``'s ``cblas_sgemm`` and ``cblas_dgemm`` (the first pair found of
    ``_CBLAS_NAMES``, integer ``widths`` in that order) as ``fusegrad_rnn_cblas_{s,d}gemm
    {64,32}`` and return the kernels' ``blas`` argument: ``np.int64(0)`` for a CBLAS with
    64-bit integers, ``np.int32(0)`` for 32-bit ones, None where ``lib`` exports neither pair
    (the kernels then use numba's ``np.dot``)."""
    if lib is None:
        return None
    for width in widths:
        for pattern in _CBLAS_NAMES[width]:
            functions = [getattr(lib, pattern.format(kind), None) for kind in "sd"]
            if all(f is not None for f in functions):
                for kind, function in zip("sd", functions):
                    address = ctypes.cast(function, ctypes.c_void_p).value
                    llvmlite.binding.add_symbol(f"fusegrad_rnn_cblas_{kind}gemm{width}", address)
                return np.int64(0) if width == 64 else np.int32(0)
    return None


BLAS = _bind_cblas(_numpy_blas())


def _cblas_gemm(kind: str, width: int) -> numba.types.ExternalFunction:
    """``cblas_?gemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)``."""
    t = numba.types
    integer = t.int64 if width == 64 else t.int32
    real = t.float32 if kind == "s" else t.float64
    pointer = t.voidptr
    signature = t.void(
        t.int32, t.int32, t.int32, integer, integer, integer, real, pointer, integer, pointer,
        integer, real, pointer, integer,
    )  # fmt: skip
    return t.ExternalFunction(f"fusegrad_rnn_cblas_{kind}gemm{width}", signature)


_CBLAS = {(kind, width): _cblas_gemm(kind, width) for kind in "sd" for width in (64, 32)}


@intrinsic
def _address(typingctx, array):  # type: ignore[no-untyped-def]
    """An array's data as a ``void *`` (what the CBLAS functions take)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.bitcast(data, cgutils.voidptr_t)

    return numba.types.voidptr(array), codegen


def _gemm(a, b, out, blas):  # type: ignore[no-untyped-def]
    """``out = a @ b`` for 2-D arrays of one float dtype (``np.dot(a, b, out)``)."""
    np.dot(a, b, out)


@overload(_gemm)
def _gemm_overload(a, b, out, blas):  # type: ignore[no-untyped-def]
    t = numba.types
    arrays = (a, b, out)
    width = {t.int64: 64, t.int32: 32}.get(blas)
    if width is None or any(x.layout != "C" or x.ndim != 2 for x in arrays):
        return lambda a, b, out, blas: np.dot(a, b, out)  # (a non-contiguous view: numba's)
    kind = "s" if a.dtype == t.float32 else "d"
    gemm = _CBLAS[kind, width]
    integer = np.int64 if width == 64 else np.int32
    real = np.float32 if kind == "s" else np.float64

    def cblas(a, b, out, blas):  # type: ignore[no-untyped-def]
        rows, inner = a.shape
        columns = b.shape[1]
        if a.shape[1] != b.shape[0] or out.shape[0] != rows or out.shape[1] != columns:
            raise ValueError("rnn kernels: mismatched shapes of a product")
        if rows == 0 or columns == 0:
            return
        if inner == 0:
            out[:] = 0
            return
        # C-contiguous rows: each leading dimension is the row's length
        gemm(
            _CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_NO_TRANS,
            integer(rows), integer(columns), integer(inner), real(1.0),
            _address(a), integer(inner), _address(b), integer(columns), real(0.0),
            _address(out), integer(columns),
        )  # fmt: skip

    return cblas


# Loop structure: each step's elementwise work is a series of short loops over one row of H,
# each reading some arrays and writing another (or the same one in a later loop).  One loop
# doing everything (six stores, a dozen loads, two transcendentals) did not vectorise -- LLVM
# gives up on the possible aliasing of a row read and written at other offsets -- and ran 5x
# slower (measured: 124 vs 24 us per LSTM step of 20 x 200).

_JIT = {"cache": True, "fastmath": {"contract"}, "error_model": "numpy"}


@numba.njit(**_JIT)
def _lstm_forward(
    x_gates, offsets, sizes, w_hh_t, b_hh, b_ih, h0, c0, w_hr_t, reverse, out_h, out_s, blas
):  # type: ignore[no-untyped-def]
    """The LSTM's steps: h (P) into ``out_h``, c, i, f, g, o (H each) into ``out_s``; P = H
    without a projection (``w_hr_t`` None: numba compiles that case apart, its branches
    pruned), else h = (o tanh c) W_hr^T (one more BLAS call per step)."""
    steps = sizes.shape[0]
    batch, hidden = c0.shape
    gate_size = x_gates.shape[1]
    size = hidden if w_hr_t is None else h0.shape[1]  # (the same size: LLVM sees it)
    h = h0.copy()
    c = c0.copy()
    m = h if w_hr_t is None else np.empty((batch, hidden), x_gates.dtype)  # o tanh(c)
    pre = np.empty((batch, gate_size), x_gates.dtype)
    gi, gf, gg, go = hidden, 2 * hidden, 3 * hidden, 4 * hidden
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        rows, first_row = sizes[t], offsets[t]
        _gemm(h[:rows], w_hh_t, pre[:rows], blas)
        for n in range(rows):
            p, x, o = pre[n], x_gates[first_row + n], out_s[first_row + n]
            cn, mn = c[n], m[n]
            for j in range(gate_size):
                p[j] = (x[j] + b_ih[j]) + (p[j] + b_hh[j])
            for j in range(hidden):
                o[gi + j] = _sigmoid(p[j])
            for j in range(hidden):
                o[gf + j] = _sigmoid(p[hidden + j])
            for j in range(hidden):
                o[gg + j] = _tanh(p[2 * hidden + j])
            for j in range(hidden):
                o[go + j] = _sigmoid(p[3 * hidden + j])
            for j in range(hidden):
                cn[j] = o[gf + j] * cn[j] + o[gi + j] * o[gg + j]
            for j in range(hidden):
                mn[j] = o[go + j] * _tanh(cn[j])
            for j in range(hidden):
                o[j] = cn[j]
            if w_hr_t is None:
                oh = out_h[first_row + n]
                for j in range(hidden):
                    oh[j] = mn[j]
        if w_hr_t is not None:
            _gemm(m[:rows], w_hr_t, h[:rows], blas)
            for n in range(rows):
                oh, hn = out_h[first_row + n], h[n]
                for j in range(size):
                    oh[j] = hn[j]


@numba.njit(**_JIT)
def _gru_forward(x_gates, offsets, sizes, w_hh_t, b_hh, b_ih, h0, reverse, out_h, out_s, blas):  # type: ignore[no-untyped-def]
    steps = sizes.shape[0]
    batch, hidden = h0.shape
    gate_size = x_gates.shape[1]
    h = h0.copy()
    pre = np.empty((batch, gate_size), x_gates.dtype)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        rows, first_row = sizes[t], offsets[t]
        _gemm(h[:rows], w_hh_t, pre[:rows], blas)
        for n in range(rows):
            p, x, o, hn = pre[n], x_gates[first_row + n], out_s[first_row + n], h[n]
            for j in range(gate_size):
                p[j] = p[j] + b_hh[j]
            for j in range(hidden):
                o[j] = _sigmoid((x[j] + b_ih[j]) + p[j])  # r
            for j in range(hidden):
                o[hidden + j] = _sigmoid((x[hidden + j] + b_ih[hidden + j]) + p[hidden + j])  # z
            for j in range(hidden):
                o[3 * hidden + j] = p[2 * hidden + j]  # hn = h W_hn^T + b_hn
            for j in range(hidden):
                p[j] = (x[2 * hidden + j] + b_ih[2 * hidden + j]) + o[j] * p[2 * hidden + j]
            for j in range(hidden):
                o[2 * hidden + j] = _tanh(p[j])  # n
            for j in range(hidden):
                new = o[2 * hidden + j]
                hn[j] = new + o[hidden + j] * (hn[j] - new)  # (1 - z) n + z h
            oh = out_h[first_row + n]
            for j in range(hidden):
                oh[j] = hn[j]


@numba.njit(**_JIT)
def _rnn_forward(relu, x_gates, offsets, sizes, w_hh_t, b_hh, b_ih, h0, reverse, out_h, zero, blas):  # type: ignore[no-untyped-def]
    steps = sizes.shape[0]
    batch, hidden = h0.shape
    h = h0.copy()
    pre = np.empty((batch, hidden), x_gates.dtype)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        rows, first_row = sizes[t], offsets[t]
        _gemm(h[:rows], w_hh_t, pre[:rows], blas)
        for n in range(rows):
            p, x, hn = pre[n], x_gates[first_row + n], h[n]
            if relu:
                for j in range(hidden):
                    v = (x[j] + b_ih[j]) + (p[j] + b_hh[j])
                    hn[j] = v if v > zero or v != v else zero  # (NaN stays NaN)
            else:
                for j in range(hidden):
                    hn[j] = _tanh((x[j] + b_ih[j]) + (p[j] + b_hh[j]))
            o = out_h[first_row + n]
            for j in range(hidden):
                o[j] = hn[j]


@numba.njit(**_JIT)
def _previous_row(offsets, sizes, t, n, reverse):  # type: ignore[no-untyped-def]
    """The row of the step that row ``n`` of step ``t`` continues (its state's step), or -1
    where that step reads the initial state: the first step of its direction, or, backwards
    over packed sequences, the last step of a sequence shorter than others."""
    if reverse:
        if t == sizes.shape[0] - 1 or n >= sizes[t + 1]:
            return -1
        return offsets[t + 1] + n
    return -1 if t == 0 else offsets[t - 1] + n


@numba.njit(**_JIT)
def _lstm_backward(
    g_h, g_s, out_s, offsets, sizes, w_hh, c0, w_hr, reverse, dx_gates, dh, dc, dhs, ms, one, blas
):  # type: ignore[no-untyped-def]
    """``g_h``, ``g_s``: the gradients of the outputs h and of the saved states ``out_s``.
    ``dh``, ``dc``: zeros in, the gradients of h0 and c0 out.  With a projection (``w_hr``
    not None), ``dhs`` and ``ms`` receive each row's gradient of h and its ``m = o tanh c``
    (for ``dW_hr``)."""
    steps = sizes.shape[0]
    batch, hidden = c0.shape
    size = hidden if w_hr is None else dh.shape[1]  # (the same size: LLVM sees it)
    gi, gf, gg, go = hidden, 2 * hidden, 3 * hidden, 4 * hidden
    dtype = out_s.dtype
    tc = np.empty(hidden, dtype)
    dcv = np.empty(hidden, dtype)
    dh_step = np.empty((batch, size), dtype)
    dm = dh_step if w_hr is None else np.empty((batch, hidden), dtype)  # d(o tanh c)
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        rows, first_row = sizes[t], offsets[t]
        dht = dh_step[:rows] if w_hr is None else dhs[first_row : first_row + rows]
        for n in range(rows):
            gt, dhn, dn = g_h[first_row + n], dh[n], dht[n]
            for j in range(size):
                dn[j] = gt[j] + dhn[j]
        if w_hr is not None:
            _gemm(dht, w_hr, dm[:rows], blas)
        for n in range(rows):
            row = first_row + n
            gt, o, dx, dmn, dcn = g_s[row], out_s[row], dx_gates[row], dm[n], dc[n]
            before = _previous_row(offsets, sizes, t, n, reverse)
            c_prev = c0[n] if before < 0 else out_s[before, :hidden]
            for j in range(hidden):
                tc[j] = _tanh(o[j])
            if w_hr is not None:
                mt = ms[row]
                for j in range(hidden):
                    mt[j] = o[go + j] * tc[j]
            for j in range(hidden):
                dcv[j] = gt[j] + dcn[j] + dmn[j] * o[go + j] * (one - tc[j] * tc[j])
            for j in range(hidden):
                i = o[gi + j]
                dx[j] = (dcv[j] * o[gg + j] + gt[gi + j]) * i * (one - i)
            for j in range(hidden):
                f = o[gf + j]
                dx[hidden + j] = (dcv[j] * c_prev[j] + gt[gf + j]) * f * (one - f)
            for j in range(hidden):
                gc = o[gg + j]
                dx[2 * hidden + j] = (dcv[j] * o[gi + j] + gt[gg + j]) * (one - gc * gc)
            for j in range(hidden):
                og = o[go + j]
                dx[3 * hidden + j] = (dmn[j] * tc[j] + gt[go + j]) * og * (one - og)
            for j in range(hidden):
                dcn[j] = dcv[j] * o[gf + j]
        # the state's gradient for the step before: through h W_hh^T (one BLAS call)
        _gemm(dx_gates[first_row : first_row + rows], w_hh, dh[:rows], blas)


@numba.njit(**_JIT)
def _gru_backward(
    g_h, g_s, out_h, out_s, offsets, sizes, w_hh, h0, reverse, dx_gates, dh_gates, dh, one, blas
):  # type: ignore[no-untyped-def]
    """``dh``: zeros in, the gradient of h0 out; ``dh_gates``: the gradient of
    ``h W_hh^T + b_hh`` per step (``dx_gates``'s but for the n gate: ``dn r``)."""
    steps = sizes.shape[0]
    batch, hidden = h0.shape
    dhv = np.empty(hidden, out_s.dtype)
    direct = np.empty((batch, hidden), out_s.dtype)  # z dh, straight to h_{t-1}
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        rows, first_row = sizes[t], offsets[t]
        for n in range(rows):
            row = first_row + n
            gh, gt, o = g_h[row], g_s[row], out_s[row]
            dx, dhg, dhn = dx_gates[row], dh_gates[row], dh[n]
            before = _previous_row(offsets, sizes, t, n, reverse)
            h_prev = h0[n] if before < 0 else out_h[before]
            for j in range(hidden):
                dhv[j] = gh[j] + dhn[j]
            for j in range(hidden):  # dn_pre = (dh (1 - z) + g_n) (1 - n^2)
                z, new = o[hidden + j], o[2 * hidden + j]
                dx[2 * hidden + j] = (dhv[j] * (one - z) + gt[2 * hidden + j]) * (one - new * new)
            for j in range(hidden):  # dz_pre
                z, new = o[hidden + j], o[2 * hidden + j]
                dx[hidden + j] = (dhv[j] * (h_prev[j] - new) + gt[hidden + j]) * z * (one - z)
            for j in range(hidden):  # dr_pre
                r = o[j]
                dx[j] = (dx[2 * hidden + j] * o[3 * hidden + j] + gt[j]) * r * (one - r)
            for j in range(hidden):
                dhg[j] = dx[j]
                dhg[hidden + j] = dx[hidden + j]
            for j in range(hidden):  # d hn
                dhg[2 * hidden + j] = dx[2 * hidden + j] * o[j] + gt[3 * hidden + j]
            for j in range(hidden):
                direct[n, j] = dhv[j] * o[hidden + j]
        _gemm(dh_gates[first_row : first_row + rows], w_hh, dh[:rows], blas)
        dh[:rows] += direct[:rows]


@numba.njit(**_JIT)
def _rnn_backward(relu, g_h, out_h, offsets, sizes, w_hh, reverse, dx_gates, dh, one, zero, blas):  # type: ignore[no-untyped-def]
    steps = sizes.shape[0]
    hidden = dh.shape[1]
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        rows, first_row = sizes[t], offsets[t]
        for n in range(rows):
            row = first_row + n
            gt, o, dx, dhn = g_h[row], out_h[row], dx_gates[row], dh[n]
            if relu:
                for j in range(hidden):
                    dx[j] = gt[j] + dhn[j] if o[j] > zero else zero
            else:
                for j in range(hidden):
                    dx[j] = (gt[j] + dhn[j]) * (one - o[j] * o[j])
        _gemm(dx_gates[first_row : first_row + rows], w_hh, dh[:rows], blas)


def _check(name: str, mode: str, arrays: dict[str, np.ndarray]) -> np.dtype:
    """The arrays' common float dtype; a TypeError naming the op, shapes and dtypes otherwise."""
    dtypes = {a.dtype for a in arrays.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (np.float32, np.float64):
        got = ", ".join(f"{k} {tuple(a.shape)} {a.dtype}" for k, a in arrays.items())
        raise TypeError(
            f"{name} ({mode}): expected float32 or float64 arrays of one dtype, got {got}"
        )
    return next(iter(dtypes))


def _steps(shape: tuple, batch: int, batch_sizes: tuple | None) -> tuple[np.ndarray, np.ndarray]:
    """Each step's first row and row count in the flat (rows, width) layout the kernels use:
    a padded (T, N, ...) sequence is T steps of N rows; a packed one (``batch_sizes``) has
    ``batch_sizes[t]`` rows at step t, the sequences still running (longest first)."""
    if batch_sizes is None:
        steps = shape[0]
        return np.arange(steps, dtype=np.int64) * batch, np.full(steps, batch, np.int64)
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    offsets = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return offsets, sizes


def rnn_forward(
    mode: str,
    x_gates: np.ndarray,
    w_hh: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray | None,
    b_hh: np.ndarray | None,
    reverse: bool,
    w_hr: np.ndarray | None = None,
    batch_sizes: tuple | None = None,
    b_ih: np.ndarray | None = None,
) -> np.ndarray:
    """The packed values of one layer and direction (module docstring), flat: the outputs h
    of the rows (T N of a padded sequence, or a packed sequence's rows: ``batch_sizes``), then
    their saved states (``packed_parts``): rows (P + S H) values, P the size of h (H, or an
    LSTM's projection ``w_hr`` (P, H)'s size), S the state width (``STATE_WIDTH``)."""
    arrays = {"x_gates": x_gates, "w_hh": w_hh, "h0": h0}
    if c0 is not None:
        arrays["c0"] = c0
    if w_hr is not None:
        arrays["w_hr"] = w_hr
    if b_hh is not None:
        arrays["b_hh"] = b_hh
    if b_ih is not None:
        arrays["b_ih"] = b_ih
    dtype = _check("rnn_sequence", mode, arrays)
    size = w_hh.shape[1]
    offsets, sizes = _steps(x_gates.shape, h0.shape[0], batch_sizes)
    flat = np.ascontiguousarray(x_gates).reshape(-1, x_gates.shape[-1])
    h0 = np.ascontiguousarray(h0)
    b_hh = np.zeros(w_hh.shape[0], dtype) if b_hh is None else np.ascontiguousarray(b_hh)
    b_ih = np.zeros(w_hh.shape[0], dtype) if b_ih is None else np.ascontiguousarray(b_ih)
    w_hh_t = np.ascontiguousarray(w_hh.T)
    reverse = bool(reverse)
    rows = flat.shape[0]
    hidden = c0.shape[1] if mode == "LSTM" else size
    state = STATE_WIDTH[mode] * hidden
    out = np.empty(rows * (size + state), dtype)
    out_h, out_s = packed_parts(out, rows, size, state)
    if mode == "LSTM":
        c0 = np.ascontiguousarray(c0)
        w_hr_t = None if w_hr is None else np.ascontiguousarray(w_hr.T)
        _lstm_forward(
            flat, offsets, sizes, w_hh_t, b_hh, b_ih, h0, c0, w_hr_t, reverse, out_h, out_s, BLAS
        )
    elif mode == "GRU":
        _gru_forward(flat, offsets, sizes, w_hh_t, b_hh, b_ih, h0, reverse, out_h, out_s, BLAS)
    else:
        relu = mode == "RNN_RELU"
        zero = dtype.type(0)
        _rnn_forward(relu, flat, offsets, sizes, w_hh_t, b_hh, b_ih, h0, reverse, out_h, zero, BLAS)
    return out


def rnn_backward(
    mode: str,
    g_h: np.ndarray,
    g_s: np.ndarray,
    out_h: np.ndarray,
    out_s: np.ndarray,
    w_hh: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray | None,
    reverse: bool,
    w_hr: np.ndarray | None = None,
    batch_sizes: tuple | None = None,
) -> np.ndarray:
    """The gradients of ``rnn_sequence`` for the gradient of its flat packed output
    (``rnn_forward``), both in their two parts (``packed_parts``: ``g_h``, ``g_s`` the
    gradient's, ``out_h``, ``out_s`` the output's), flat and in this order: x_gates (rows,
    G H), h0 (N, P), c0 (N, H; LSTM only), w_hh (G H, P), w_hr (P, H; with a projection
    only), b_hh (G H).  P is H except for a projection."""
    arrays = {"g_h": g_h, "g_s": g_s, "out_h": out_h, "out_s": out_s, "w_hh": w_hh, "h0": h0}
    if c0 is not None:
        arrays["c0"] = c0
    if w_hr is not None:
        arrays["w_hr"] = w_hr
    dtype = _check("rnn_sequence_backward", mode, arrays)
    gate_size, size = w_hh.shape
    batch = h0.shape[0]
    hidden = size if c0 is None else c0.shape[1]
    rows = out_h.shape[0]
    offsets, sizes = _steps((rows // batch if batch else 0,), batch, batch_sizes)
    g_h, g_s = np.ascontiguousarray(g_h), np.ascontiguousarray(g_s)
    out_h, out_s = np.ascontiguousarray(out_h), np.ascontiguousarray(out_s)
    lstm = mode == "LSTM"
    proj = w_hr is not None
    parts = [rows * gate_size, batch * size, batch * hidden if lstm else 0]
    parts += [gate_size * size, size * hidden if proj else 0, gate_size]
    flat = np.empty(sum(parts), dtype)
    bounds = np.cumsum([0] + parts)
    dx_gates = flat[bounds[0] : bounds[1]].reshape(rows, gate_size)
    dh0 = flat[bounds[1] : bounds[2]].reshape(batch, size)
    dc0 = flat[bounds[2] : bounds[3]].reshape(batch, hidden) if lstm else None
    dw_hh = flat[bounds[3] : bounds[4]].reshape(gate_size, size)
    dw_hr = flat[bounds[4] : bounds[5]].reshape(size, hidden) if proj else None
    db_hh = flat[bounds[5] : bounds[6]]
    dh_gates = np.empty_like(dx_gates) if mode == "GRU" else dx_gates
    h0 = np.ascontiguousarray(h0)
    w_hh = np.ascontiguousarray(w_hh)
    reverse = bool(reverse)
    one, zero = dtype.type(1), dtype.type(0)
    dh0[:] = 0
    if dc0 is not None:
        dc0[:] = 0
        c0 = np.ascontiguousarray(c0)
        # with a projection: each step's gradient of h and its o tanh(c), for dW_hr
        dhs = np.empty((rows, size) if proj else (1, 1), dtype)
        ms = np.empty((rows, hidden) if proj else (1, 1), dtype)
        w_hr_c = np.ascontiguousarray(w_hr) if proj else None
        _lstm_backward(
            g_h, g_s, out_s, offsets, sizes, w_hh, c0, w_hr_c, reverse, dx_gates, dh0, dc0,
            dhs, ms, one, BLAS,
        )  # fmt: skip
        if dw_hr is not None:
            np.dot(dhs.T, ms, dw_hr)
    elif mode == "GRU":
        _gru_backward(
            g_h, g_s, out_h, out_s, offsets, sizes, w_hh, h0, reverse, dx_gates, dh_gates, dh0,
            one, BLAS,
        )  # fmt: skip
    else:
        relu = mode == "RNN_RELU"
        _rnn_backward(
            relu, g_h, out_h, offsets, sizes, w_hh, reverse, dx_gates, dh0, one, zero, BLAS
        )
    np.dot(dh_gates.T, _previous_states(out_h, h0, offsets, sizes, reverse), dw_hh)
    db_hh[:] = dh_gates.sum(0)
    return flat


def _previous_states(
    outputs: np.ndarray, h0: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, reverse: bool
) -> np.ndarray:
    """(rows, P): the state each row's step read -- the same sequence's output at the step
    before in its direction, or its initial state where there is none."""
    steps = len(sizes)
    batch = h0.shape[0]
    if int(sizes.min(initial=batch)) == batch:  # padded: whole steps shift by one
        shaped = outputs.reshape(steps, batch, -1)
        before = np.empty_like(shaped)
        if reverse:
            before[-1] = h0
            before[:-1] = shaped[1:]
        else:
            before[0] = h0
            before[1:] = shaped[:-1]
        return before.reshape(outputs.shape)
    before = np.empty_like(outputs)
    for t in range(steps):
        start, rows = int(offsets[t]), int(sizes[t])
        if reverse:
            cont = int(sizes[t + 1]) if t + 1 < steps else 0  # rows that go on to step t + 1
            nxt = int(offsets[t + 1]) if t + 1 < steps else 0
            before[start : start + cont] = outputs[nxt : nxt + cont]
            before[start + cont : start + rows] = h0[cont:rows]
        elif t == 0:
            before[:rows] = h0[:rows]
        else:
            prev = int(offsets[t - 1])
            before[start : start + rows] = outputs[prev : prev + rows]
    return before


fast_loading(globals())  # (loaded from the disk cache without numba's start-up work)
