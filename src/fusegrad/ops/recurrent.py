"""The op surface of the fused recurrent layers: ``rnn_layer`` runs one LSTM / GRU / RNN layer
in one direction over a whole sequence as one matmul (the input projection of every step) and
one ``rnn_sequence`` primitive (the recurrence, a numba kernel: ``recurrent_kernels``), and
``rnn_sequence_grads`` is that primitive's backward written in the op surface, which its
derivative rule uses where a graph of the gradient is wanted (``create_graph``) so that it
differentiates again.

``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` call ``rnn_layer`` (``nn/rnn.py`` says when).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..autograd.tracer import notify_created
from ..tensor import Tensor
from ._util import P, apply
from .creation import zeros_like
from .generated import tanh
from .indexing import index_select
from .linalg import linear
from .shape import cat, stack

__all__ = ["rnn_layer", "rnn_sequence", "rnn_sequence_grads"]

# how many hidden-size columns a row's saved state has in ``rnn_sequence``'s result, beside its
# output h (``ops/primitives.py``, ``recurrent_kernels.STATE_WIDTH``)
STATE_WIDTH = {"LSTM": 5, "GRU": 4, "RNN_TANH": 0, "RNN_RELU": 0}


def packed_parts(packed: Tensor, lead: tuple, size: int, state: int) -> tuple[Tensor, Tensor]:
    """The two parts of ``rnn_sequence``'s flat result (or of its gradient) as views of it: the
    outputs h (``lead`` + (size,)) and the saved states (``lead`` + (state,)); ``lead`` is
    (T, N) or a packed sequence's (rows,)."""
    rows = 1
    for d in lead:
        rows = rows * d
    outputs = packed.narrow(0, 0, rows * size).reshape(*lead, size)
    states = packed.narrow(0, rows * size, rows * state).reshape(*lead, state)
    return outputs, states


def rnn_sequence(
    mode: str,
    x_gates: Tensor,
    w_hh: Tensor,
    h0: Tensor,
    c0: Tensor | None,
    b_hh: Tensor | None,
    reverse: bool,
    w_hr: Tensor | None = None,
    batch_sizes: tuple[int, ...] | None = None,
    b_ih: Tensor | None = None,
) -> Tensor:
    """The ``rnn_sequence`` primitive: the packed values of the recurrence, flat (the outputs
    h, then the saved states: see ``ops/primitives.py``); ``c0`` and ``w_hr`` (a projection)
    for the LSTM only, ``b_hh`` and ``b_ih`` (the input projection's bias, added here rather
    than to ``x_gates``) optional; ``batch_sizes``: ``x_gates`` holds a PackedSequence's
    rows."""
    state = [c0] if mode == "LSTM" else []
    state += ([] if w_hr is None else [w_hr]) + ([] if b_hh is None else [b_hh])
    state += [] if b_ih is None else [b_ih]
    attrs = {
        "mode": mode,
        "reverse": bool(reverse),
        "bias": b_hh is not None,
        "input_bias": b_ih is not None,
        "proj": w_hr is not None,
        "batch_sizes": None if batch_sizes is None else tuple(int(b) for b in batch_sizes),
    }
    return apply(P["rnn_sequence"], (x_gates, w_hh, h0, *state), attrs)


def _last_rows(batch_sizes: Sequence[int], reverse: bool) -> np.ndarray:
    """The packed row of each sequence's final state: its last step's row (forwards), its
    first step's (backwards)."""
    sizes = np.asarray(batch_sizes, np.int64)
    sequences = np.arange(sizes[0], dtype=np.int64)
    if reverse:
        return sequences
    offsets = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)
    lengths = (sizes[:, None] > sequences[None, :]).sum(0)
    return offsets[lengths - 1] + sequences


def rnn_layer(
    mode: str,
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
    h0: Tensor,
    c0: Tensor | None,
    reverse: bool,
    w_hr: Tensor | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One layer in one direction over ``x`` (T, N, in): ``(output (T, N, P), h_n (N, P),
    c_n (N, H))``, ``c_n`` None except for the LSTM; P is H except for an LSTM's projection
    ``w_hr`` (P, H).  With ``batch_sizes``, ``x`` is a PackedSequence's data (rows, in) and the
    output its packed rows (rows, P); each sequence's final state is its own last step's."""
    size = w_hh.shape[1]
    # the input projection without its bias: the kernel adds b_ih as it reads x_gates (the
    # same sums, in the same order), which saves a pass over the (T N, G H) product forwards
    # and a sum over its rows backwards (the bias's gradient: the rule's, from the kernel's)
    if batch_sizes is None:
        steps, batch = x.shape[0], x.shape[1]
        # the input projection as one 2-D product: numpy's matmul of a (T, N, in) stack runs
        # one product per time step (2.4x slower measured at 35 x 20 x 200 by 800), and the
        # weight's gradient of a stacked product is a stack of products summed afterwards
        x_rows = x.reshape(steps * batch, x.shape[2])
        x_gates = linear(x_rows, w_ih).reshape(steps, batch, w_ih.shape[0])
    else:
        x_gates = linear(x, w_ih)
    packed = rnn_sequence(mode, x_gates, w_hh, h0, c0, b_hh, reverse, w_hr, batch_sizes, b_ih=b_ih)
    # the outputs h are the flat result's first part, contiguous: what reads them (dropout,
    # the next layer's input projection) reads them in place
    lead = tuple(x_gates.shape[:-1])
    rows = 1
    for d in lead:
        rows = rows * d
    output = packed.narrow(0, 0, rows * size).reshape(*lead, size)
    cells = None  # an LSTM's cell states: the first H columns of its saved states
    if mode == "LSTM" and c0 is not None:
        hidden = c0.shape[1]
        states = packed.narrow(0, rows * size, rows * 5 * hidden).reshape(*lead, 5 * hidden)
        cells = states.narrow(-1, 0, hidden)
    if batch_sizes is not None:
        index = notify_created(Tensor._make(_last_rows(batch_sizes, reverse)))
        h_n = index_select(output, 0, index)
        c_n = index_select(cells, 0, index) if cells is not None else None
    else:
        last = 0 if reverse else output.shape[0] - 1
        h_n = output[last]
        c_n = cells[last] if cells is not None else None
    return output, h_n, c_n


def rnn_sequence_grads(
    mode: str,
    reverse: bool,
    g: Tensor,
    out: Tensor,
    w_hh: Tensor,
    h0: Tensor,
    c0: Tensor | None,
    w_hr: Tensor | None = None,
    batch_sizes: Sequence[int] | None = None,
    lead: tuple | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor | None, Tensor]:
    """The gradients of ``rnn_sequence`` -- ``(x_gates, h0, c0 (LSTM, else None), w_hh,
    w_hr (a projection, else None), b_hh)`` -- for the gradient ``g`` of its flat packed
    output ``out``, in the op surface: the same backpropagation through time as the kernel
    (``recurrent_kernels``), one step at a time, differentiable again.  Every packed value's
    gradient counts, the saved gates' included.  ``lead``: the rows' shape, ``x_gates``'s but
    its last size ((T, N), or a packed sequence's (rows,)); found from ``out``'s size if None
    (not for a padded batch of none)."""
    gate_size, size = w_hh.shape[0], w_hh.shape[1]
    hidden = c0.shape[1] if mode == "LSTM" and c0 is not None else size
    batch = h0.shape[0]
    state = STATE_WIDTH[mode] * hidden
    if lead is None:
        total = out.shape[0] // (size + state)
        lead = (total,) if batch_sizes is not None else (total // batch, batch)
    g_h, g_s = packed_parts(g, lead, size, state)
    out_h, out_s = packed_parts(out, lead, size, state)
    if batch_sizes is None:
        steps = lead[0]
        sizes = [batch] * steps
        offsets: list[int] = []
    else:
        sizes = [int(b) for b in batch_sizes]
        steps = len(sizes)
        offsets = [0]
        for b in sizes[:-1]:
            offsets.append(offsets[-1] + b)

    def at(a: Tensor, t: int) -> Tensor:
        """Step t's rows of a (T, N, ...) or packed (rows, ...) tensor."""
        return a[t] if batch_sizes is None else a.narrow(0, offsets[t], sizes[t])

    def before(a: Tensor, initial: Tensor, t: int) -> Tensor:
        """The state step t's rows read: the step before in the direction's order, or the
        initial state (rows of a sequence that starts at step t)."""
        rows = sizes[t]
        if not reverse:
            return initial.narrow(0, 0, rows) if t == 0 else at(a, t - 1).narrow(0, 0, rows)
        going_on = sizes[t + 1] if t + 1 < steps else 0
        if going_on == 0:
            return initial.narrow(0, 0, rows)
        previous = at(a, t + 1)
        if going_on == rows:
            return previous
        return cat([previous, initial.narrow(0, going_on, rows - going_on)], 0)

    def update(state: Tensor, rows_new: Tensor, rows: int) -> Tensor:
        return (
            rows_new if rows == batch else cat([rows_new, state.narrow(0, rows, batch - rows)], 0)
        )

    def col(a: Tensor, start: int) -> Tensor:
        return a.narrow(-1, start, hidden)

    dh = zeros_like(h0)
    dc = None if c0 is None else zeros_like(c0)
    dw_hr = None
    dx: list[Tensor] = [None] * steps  # type: ignore[list-item]
    dhg: list[Tensor] = [None] * steps  # type: ignore[list-item]
    h_prev: list[Tensor] = [None] * steps  # type: ignore[list-item]
    for t in range(steps) if reverse else range(steps - 1, -1, -1):
        rows = sizes[t]
        gt, o = at(g_s, t), at(out_s, t)
        h_prev[t] = before(out_h, h0, t)
        dh_rows = dh if rows == batch else dh.narrow(0, 0, rows)
        dhv = at(g_h, t) + dh_rows
        if mode == "LSTM":
            cell, i, f, gc, go = (col(o, k * hidden) for k in range(5))
            c_prev = before(col(out_s, 0), c0, t)
            dc_rows = dc if rows == batch else dc.narrow(0, 0, rows)  # type: ignore[union-attr]
            tc = tanh(cell)
            dm = dhv
            if w_hr is not None:  # h = (o tanh c) W_hr^T
                dm = dhv @ w_hr
                step_w_hr = dhv.mT @ (go * tc)
                dw_hr = step_w_hr if dw_hr is None else dw_hr + step_w_hr
            dcv = col(gt, 0) + dc_rows + dm * go * (1.0 - tc * tc)
            di = dcv * gc + col(gt, hidden)
            df = dcv * c_prev + col(gt, 2 * hidden)
            dg = dcv * i + col(gt, 3 * hidden)
            do = dm * tc + col(gt, 4 * hidden)
            pre = [
                di * i * (1.0 - i),
                df * f * (1.0 - f),
                dg * (1.0 - gc * gc),
                do * go * (1.0 - go),
            ]
            dx[t] = dhg[t] = cat(pre, -1)
            dc = update(dc, dcv * f, rows)  # type: ignore[arg-type]
            dh = update(dh, dx[t] @ w_hh, rows)
        elif mode == "GRU":
            r, z, new, hn = (col(o, k * hidden) for k in range(4))
            dz = dhv * (h_prev[t] - new) + col(gt, hidden)
            dnew = dhv * (1.0 - z) + col(gt, 2 * hidden)
            dn_pre = dnew * (1.0 - new * new)
            dr = dn_pre * hn + col(gt, 0)
            dhn = dn_pre * r + col(gt, 3 * hidden)
            dr_pre, dz_pre = dr * r * (1.0 - r), dz * z * (1.0 - z)
            dx[t] = cat([dr_pre, dz_pre, dn_pre], -1)
            dhg[t] = cat([dr_pre, dz_pre, dhn], -1)
            dh = update(dh, dhv * z + dhg[t] @ w_hh, rows)
        else:
            value = at(out_h, t)
            if mode == "RNN_TANH":
                dx[t] = dhv * (1.0 - value * value)
            else:
                dx[t] = dhv * (value > 0).to(value.dtype)
            dhg[t] = dx[t]
            dh = update(dh, dx[t] @ w_hh, rows)
    if batch_sizes is None:
        d_x, d_gates, states = stack(dx, 0), stack(dhg, 0), stack(h_prev, 0)
        total = steps * batch
        d_gates, states = d_gates.reshape(total, gate_size), states.reshape(total, size)
    else:
        d_x, d_gates, states = cat(dx, 0), cat(dhg, 0), cat(h_prev, 0)
    dw_hh = d_gates.mT @ states
    db_hh = d_gates.sum(0)
    return d_x, dh, (dc if mode == "LSTM" else None), dw_hh, dw_hr, db_hh
