"""CUDA kernels of the recurrent layers' primitives (``rnn_sequence``,
``rnn_sequence_backward``): the device forms of ``ops/recurrent_kernels.py`` for LSTM (with
or without a projection), GRU, RNN_TANH and RNN_RELU, padded or packed sequences, float32 and
float64.

The host walks the time steps (their row ranges are known on the host: a padded sequence's
steps have N rows each, a packed one's ``batch_sizes[t]``, longest first); per step the state's
product ``h W_hh^T`` is one device matmul (``cuda/matmul.py``) and the gates one kernel, one
thread per (row, hidden unit), which writes the packed values the backward reads (the same
flat layout as the CPU kernels': every row's output h first, then every row's saved state,
LSTM ``c, i, f, g, o``, GRU ``r, z, n, hn``, RNN nothing).  The
backward walks the steps the other way: one kernel per step for the gates' gradients, one
matmul for the state's gradient to the step before; then ``dW_hh`` is one product of the
gates' gradients by the states each step read, ``db_hh`` a column sum (in float64), and an
LSTM's ``dW_hr`` one more product.  The formulas are the CPU kernels', term for term;
transcendental functions are the device's (the CPU's float32 ones are the compiler's
approximations), so float32 results agree to a few units in the last place.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from . import is_simulator
from .array import CudaArray, contiguous, copy_into, empty, probe_view
from .kernels import build, fill, launch_config
from .matmul import matmul

# how many hidden-size columns a row's saved state has (``ops/recurrent_kernels.STATE_WIDTH``)
STATE_WIDTH = {"LSTM": 5, "GRU": 4, "RNN_TANH": 0, "RNN_RELU": 0}

_SOURCE = """
@cuda.jit(device=True, inline="always")
def sigmoid(x):
    e = exp(-abs(x))
    return (1.0 if x >= 0 else e) / (1.0 + e)


@cuda.jit
def lstm_step(pre, x, first, b, bi, c, m, h, out_h, out, direct, n):
    hidden = c.shape[1]
    gi = hidden
    gf = 2 * hidden
    gg = 3 * hidden
    go = 4 * hidden
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // hidden
        j = i % hidden
        row = first + r
        ig = sigmoid((x[row, j] + bi[j]) + (pre[r, j] + b[j]))
        k = hidden + j
        fg = sigmoid((x[row, k] + bi[k]) + (pre[r, k] + b[k]))
        k = 2 * hidden + j
        cg = tanh((x[row, k] + bi[k]) + (pre[r, k] + b[k]))
        k = 3 * hidden + j
        og = sigmoid((x[row, k] + bi[k]) + (pre[r, k] + b[k]))
        out[row, gi + j] = ig
        out[row, gf + j] = fg
        out[row, gg + j] = cg
        out[row, go + j] = og
        cn = out[row, gf + j] * c[r, j] + out[row, gi + j] * out[row, gg + j]
        c[r, j] = cn
        out[row, j] = cn
        mn = out[row, go + j] * tanh(c[r, j])
        if direct:
            h[r, j] = mn
            out_h[row, j] = h[r, j]
        else:
            m[r, j] = mn


@cuda.jit
def gru_step(pre, x, first, b, bi, h, out_h, out, n):
    hidden = h.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // hidden
        j = i % hidden
        row = first + r
        rg = sigmoid((x[row, j] + bi[j]) + (pre[r, j] + b[j]))
        k = hidden + j
        z = sigmoid((x[row, k] + bi[k]) + (pre[r, k] + b[k]))
        hn = pre[r, 2 * hidden + j] + b[2 * hidden + j]
        out[row, j] = rg
        out[row, hidden + j] = z
        out[row, 3 * hidden + j] = hn
        k = 2 * hidden + j
        new = tanh((x[row, k] + bi[k]) + out[row, j] * out[row, 3 * hidden + j])
        out[row, 2 * hidden + j] = new
        new = out[row, 2 * hidden + j]
        h[r, j] = new + out[row, hidden + j] * (h[r, j] - new)
        out_h[row, j] = h[r, j]


@cuda.jit
def rnn_step(pre, x, first, b, bi, relu, zero, h, out, n):
    hidden = h.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // hidden
        j = i % hidden
        row = first + r
        v = (x[row, j] + bi[j]) + (pre[r, j] + b[j])
        if relu:
            if not (v > zero or v != v):
                v = zero
        else:
            v = tanh(v)
        h[r, j] = v
        out[row, j] = h[r, j]


@cuda.jit
def copy_rows(dst, dst_first, src, src_first, n):
    width = src.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[dst_first + i // width, i % width] = src[src_first + i // width, i % width]


@cuda.jit
def add_rows(dst, a, b, n):
    width = dst.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[i // width, i % width] = a[i // width, i % width] + b[i // width, i % width]


@cuda.jit
def state_grad(g, first, dh, dht, n):
    size = dht.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // size
        j = i % size
        dht[r, j] = g[first + r, j] + dh[r, j]


@cuda.jit
def lstm_back(g, out, first, prev_first, prev_rows, c0, dm, dc, proj, ms, dx, one, n):
    hidden = c0.shape[1]
    gi = hidden
    gf = 2 * hidden
    gg = 3 * hidden
    go = 4 * hidden
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // hidden
        j = i % hidden
        row = first + r
        if r < prev_rows:
            c_prev = out[prev_first + r, j]
        else:
            c_prev = c0[r, j]
        tc = tanh(out[row, j])
        if proj:
            ms[row, j] = out[row, go + j] * tc
        dcv = g[row, j] + dc[r, j] + dm[r, j] * out[row, go + j] * (one - tc * tc)
        ig = out[row, gi + j]
        dx[row, j] = (dcv * out[row, gg + j] + g[row, gi + j]) * ig * (one - ig)
        fg = out[row, gf + j]
        dx[row, hidden + j] = (dcv * c_prev + g[row, gf + j]) * fg * (one - fg)
        cg = out[row, gg + j]
        dx[row, 2 * hidden + j] = (dcv * out[row, gi + j] + g[row, gg + j]) * (one - cg * cg)
        og = out[row, go + j]
        dx[row, 3 * hidden + j] = (dm[r, j] * tc + g[row, go + j]) * og * (one - og)
        dc[r, j] = dcv * out[row, gf + j]


@cuda.jit
def gru_back(g_h, g, out_h, out, first, prev_first, prev_rows, h0, dh, dx, dhg, direct, one, n):
    hidden = h0.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // hidden
        j = i % hidden
        row = first + r
        if r < prev_rows:
            h_prev = out_h[prev_first + r, j]
        else:
            h_prev = h0[r, j]
        dhv = g_h[row, j] + dh[r, j]
        z = out[row, hidden + j]
        new = out[row, 2 * hidden + j]
        dx[row, 2 * hidden + j] = (dhv * (one - z) + g[row, 2 * hidden + j]) * (one - new * new)
        dx[row, hidden + j] = (dhv * (h_prev - new) + g[row, hidden + j]) * z * (one - z)
        rg = out[row, j]
        dr = (dx[row, 2 * hidden + j] * out[row, 3 * hidden + j] + g[row, j])
        dx[row, j] = dr * rg * (one - rg)
        dhg[row, j] = dx[row, j]
        dhg[row, hidden + j] = dx[row, hidden + j]
        dhg[row, 2 * hidden + j] = dx[row, 2 * hidden + j] * rg + g[row, 3 * hidden + j]
        direct[r, j] = dhv * z


@cuda.jit
def rnn_back(g, out, first, relu, dh, dx, one, zero, n):
    hidden = dh.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // hidden
        j = i % hidden
        row = first + r
        if relu:
            dx[row, j] = g[row, j] + dh[r, j] if out[row, j] > zero else zero
        else:
            dx[row, j] = (g[row, j] + dh[r, j]) * (one - out[row, j] * out[row, j])


@cuda.jit
def column_sum(a, out, n):
    for j in range(cuda.grid(1), n, cuda.gridsize(1)):
        total = 0.0
        for r in range(a.shape[0]):
            total += a[r, j]
        out[j] = total
"""


@functools.cache
def _kernel(name: str) -> Any:
    sim = is_simulator()
    names = {"exp": np.exp if sim else math.exp, "tanh": np.tanh if sim else math.tanh}
    return build(_SOURCE, name, f"recurrent {name}", **names)


def _launch(name: str, n: int, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        _kernel(name)[blocks, threads](*args, n)


def _steps(rows_total: int, batch: int, batch_sizes: Any) -> tuple[list, list]:
    """Each step's first row and row count (see ``ops/recurrent_kernels._steps``)."""
    if batch_sizes is None:
        steps = rows_total // batch if batch else 0
        return [t * batch for t in range(steps)], [batch] * steps
    sizes = [int(s) for s in batch_sizes]
    offsets = [0] * len(sizes)
    for t in range(1, len(sizes)):
        offsets[t] = offsets[t - 1] + sizes[t - 1]
    return offsets, sizes


def _rows(a: CudaArray, first: int, count: int) -> CudaArray:
    return probe_view(a, lambda p: p[first : first + count])


def _t(a: CudaArray) -> CudaArray:
    return probe_view(a, lambda p: p.T)


def _packed_parts(
    packed: CudaArray, rows: int, size: int, state: int
) -> tuple[CudaArray, CudaArray | None]:
    """The outputs h (rows, size) and saved states (rows, state; None for an RNN's none) of a
    flat packed result or its gradient (``ops/recurrent_kernels.packed_parts``)."""
    outputs = _rows(packed, 0, rows * size).reshape((rows, size))
    states = _rows(packed, rows * size, rows * state).reshape((rows, state)) if state else None
    return outputs, states


def _typed(value: float, dtype: np.dtype) -> Any:
    return np.array(value, dtype)[()]


def rnn_sequence(x_gates, w_hh, h0, *state, mode, reverse, bias, input_bias, proj, batch_sizes):  # type: ignore[no-untyped-def]
    """The packed values of one layer and direction, flat
    (``ops/recurrent_kernels.rnn_forward``)."""
    lstm = mode == "LSTM"
    c0 = state[0] if lstm else None
    w_hr = state[1] if proj else None
    dtype = np.dtype(x_gates.dtype)
    gate_size, size = w_hh.shape
    batch = h0.shape[0]
    flat = contiguous(x_gates).reshape((-1, x_gates.shape[-1]))
    rows_total = flat.shape[0]
    offsets, sizes = _steps(rows_total, batch, batch_sizes)
    biases = []  # b_hh, then b_ih (the input projection's, added to x_gates here)
    for given, k in ((bias, -2 if input_bias else -1), (input_bias, -1)):
        if given:
            biases.append(contiguous(state[k]))
        else:
            biases.append(empty((gate_size,), dtype))
            fill(biases[-1], 0)
    b, bi = biases
    w_hh_t = _t(w_hh)
    h = contiguous(h0, force=True)
    hidden = c0.shape[1] if lstm else size
    width = STATE_WIDTH[mode] * hidden  # (the saved state's columns per row)
    packed = empty((rows_total * (size + width),), dtype)
    out_h, out = _packed_parts(packed, rows_total, size, width)
    if lstm:
        c = contiguous(c0, force=True)
        m = empty((batch, hidden), dtype)
        w_hr_t = None if w_hr is None else _t(w_hr)
    steps = len(sizes)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        rows, first = sizes[t], offsets[t]
        if not rows:
            continue
        pre = contiguous(matmul(_rows(h, 0, rows), w_hh_t))
        n = rows * hidden
        x, bk, oh = flat.kernel_array(), b.kernel_array(), out_h.kernel_array()
        bik = bi.kernel_array()
        if lstm:
            direct = w_hr is None
            _launch("lstm_step", n, pre.kernel_array(), x, first, bk, bik, c.kernel_array(),
                    m.kernel_array(), h.kernel_array(), oh, out.kernel_array(), direct)  # fmt: skip
            if not direct:
                hp = contiguous(matmul(_rows(m, 0, rows), w_hr_t))
                copy_into(_rows(h, 0, rows), hp)
                _launch("copy_rows", rows * size, oh, first, hp.kernel_array(), 0)
        elif mode == "GRU":
            _launch("gru_step", n, pre.kernel_array(), x, first, bk, bik, h.kernel_array(), oh,
                    out.kernel_array())  # fmt: skip
        else:
            _launch("rnn_step", n, pre.kernel_array(), x, first, bk, bik, mode == "RNN_RELU",
                    _typed(0, dtype), h.kernel_array(), oh)  # fmt: skip
    return packed


def _previous_states(outputs: CudaArray, h0: CudaArray, offsets: list, sizes: list,
                     reverse: bool) -> CudaArray:  # fmt: skip
    """(rows, P): the state each row's step read (``recurrent_kernels._previous_states``)."""
    before = empty(tuple(outputs.shape), outputs.dtype)
    steps = len(sizes)
    o, h, d = outputs.kernel_array(), h0.kernel_array(), before.kernel_array()
    width = outputs.shape[1]
    for t in range(steps):
        start, rows = offsets[t], sizes[t]
        if reverse:
            cont = sizes[t + 1] if t + 1 < steps else 0
            nxt = offsets[t + 1] if t + 1 < steps else 0
            _launch("copy_rows", cont * width, d, start, o, nxt)
            if rows > cont:
                tail = _rows(h0, cont, rows - cont)
                _launch("copy_rows", (rows - cont) * width, d, start + cont,
                        tail.kernel_array(), 0)  # fmt: skip
        elif t == 0:
            _launch("copy_rows", rows * width, d, start, h, 0)
        else:
            _launch("copy_rows", rows * width, d, start, o, offsets[t - 1])
    return before


def rnn_sequence_backward(
    g_h, g_s, out_h, out_s, w_hh, h0, *state, mode, reverse, proj, batch_sizes
):  # type: ignore[no-untyped-def]
    """The gradients of ``rnn_sequence`` for the two parts of its result's gradient (``g_h``,
    ``g_s``; ``out_h``, ``out_s`` the result's), flat: x_gates, h0, c0 (LSTM), w_hh, w_hr
    (``proj``), b_hh (``ops/recurrent_kernels.rnn_backward``)."""
    lstm = mode == "LSTM"
    c0 = contiguous(state[0]) if lstm else None
    w_hr = contiguous(state[1]) if proj else None
    dtype = np.dtype(out_h.dtype)
    gate_size, size = w_hh.shape
    batch = h0.shape[0]
    hidden = size if c0 is None else c0.shape[1]
    rows_total = out_h.shape[0]
    g_h, out_h = contiguous(g_h), contiguous(out_h)
    g_s = contiguous(g_s) if mode in ("LSTM", "GRU") else None  # (an RNN's: no columns)
    out_s = contiguous(out_s) if mode in ("LSTM", "GRU") else None
    offsets, sizes = _steps(rows_total, batch, batch_sizes)
    parts = [rows_total * gate_size, batch * size, batch * hidden if lstm else 0]
    parts += [gate_size * size, size * hidden if proj else 0, gate_size]
    flat = empty((sum(parts),), dtype)
    bounds = [0]
    for p in parts:
        bounds.append(bounds[-1] + p)

    def seg(k: int, shape: tuple) -> CudaArray:
        return _rows(flat, bounds[k], parts[k]).reshape(shape)

    dx_gates = seg(0, (rows_total, gate_size))
    dh = seg(1, (batch, size))
    fill(dh, 0)
    dh_gates = empty((rows_total, gate_size), dtype) if mode == "GRU" else dx_gates
    h0 = contiguous(h0)
    w_hh = contiguous(w_hh)
    one, zero = _typed(1, dtype), _typed(0, dtype)
    ghk, ohk, dxk = g_h.kernel_array(), out_h.kernel_array(), dx_gates.kernel_array()
    gsk = None if g_s is None else g_s.kernel_array()
    osk = None if out_s is None else out_s.kernel_array()
    if lstm:
        dc = seg(2, (batch, hidden))
        fill(dc, 0)
        dhs = empty((rows_total, size) if proj else (1, 1), dtype)
        ms = empty((rows_total, hidden) if proj else (1, 1), dtype)
        dh_step = empty((batch, size), dtype)
    elif mode == "GRU":
        direct = empty((batch, hidden), dtype)
    steps = len(sizes)
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        rows, first = sizes[t], offsets[t]
        if not rows:
            continue
        if reverse:
            prev_rows = sizes[t + 1] if t + 1 < steps else 0
            prev_first = offsets[t + 1] if t + 1 < steps else 0
        else:
            prev_rows = rows if t > 0 else 0
            prev_first = offsets[t - 1] if t > 0 else 0
        n = rows * hidden
        if lstm:
            dht = _rows(dh_step, 0, rows) if not proj else _rows(dhs, first, rows)
            _launch("state_grad", rows * size, ghk, first, dh.kernel_array(), dht.kernel_array())
            dm = contiguous(matmul(dht, w_hr)) if proj else dht
            _launch("lstm_back", n, gsk, osk, first, prev_first, prev_rows, c0.kernel_array(),
                    dm.kernel_array(), dc.kernel_array(), bool(proj), ms.kernel_array(),
                    dxk, one)  # fmt: skip
            copy_into(_rows(dh, 0, rows), matmul(_rows(dx_gates, first, rows), w_hh))
        elif mode == "GRU":
            _launch("gru_back", n, ghk, gsk, ohk, osk, first, prev_first, prev_rows,
                    h0.kernel_array(), dh.kernel_array(), dxk, dh_gates.kernel_array(),
                    direct.kernel_array(), one)  # fmt: skip
            product = contiguous(matmul(_rows(dh_gates, first, rows), w_hh))
            _launch("add_rows", rows * size, _rows(dh, 0, rows).kernel_array(),
                    product.kernel_array(), _rows(direct, 0, rows).kernel_array())  # fmt: skip
        else:
            _launch("rnn_back", n, ghk, ohk, first, mode == "RNN_RELU", dh.kernel_array(), dxk,
                    one, zero)  # fmt: skip
            copy_into(_rows(dh, 0, rows), matmul(_rows(dx_gates, first, rows), w_hh))
    if proj:
        copy_into(seg(4, (size, hidden)), matmul(_t(dhs), ms))
    states = _previous_states(out_h, h0, offsets, sizes, bool(reverse))
    copy_into(seg(3, (gate_size, size)), matmul(_t(dh_gates), states))
    _launch("column_sum", gate_size, dh_gates.kernel_array(), seg(5, (gate_size,)).kernel_array())
    return flat
