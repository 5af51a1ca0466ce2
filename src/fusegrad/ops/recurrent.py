"""The op surface of the fused recurrent layers: ``rnn_layer`` runs one LSTM / GRU / RNN layer
in one direction over a whole sequence as one matmul (the input projection of every step) and
one ``rnn_sequence`` primitive (the recurrence, a numba kernel: ``recurrent_kernels``), and
``rnn_sequence_grads`` is that primitive's backward written in the op surface, which its
derivative rule uses where a graph of the gradient is wanted (``create_graph``) so that it
differentiates again.

``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` call ``rnn_layer`` (``nn/rnn.py`` says when).
"""

from __future__ import annotations

from ..tensor import Tensor
from ._util import P, apply
from .creation import zeros_like
from .generated import tanh
from .linalg import linear
from .shape import cat, stack

__all__ = ["rnn_layer", "rnn_sequence", "rnn_sequence_grads"]

PACKED_WIDTH = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 6, "GRU": 5}


def rnn_sequence(
    mode: str,
    x_gates: Tensor,
    w_hh: Tensor,
    h0: Tensor,
    c0: Tensor | None,
    b_hh: Tensor | None,
    reverse: bool,
    w_hr: Tensor | None = None,
) -> Tensor:
    """The ``rnn_sequence`` primitive: the packed values of the recurrence (see
    ``ops/primitives.py``); ``c0`` and ``w_hr`` (a projection) for the LSTM only, ``b_hh``
    optional."""
    state = [c0] if mode == "LSTM" else []
    state += ([] if w_hr is None else [w_hr]) + ([] if b_hh is None else [b_hh])
    attrs = {
        "mode": mode,
        "reverse": bool(reverse),
        "bias": b_hh is not None,
        "proj": w_hr is not None,
    }
    return apply(P["rnn_sequence"], (x_gates, w_hh, h0, *state), attrs)


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
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One layer in one direction over ``x`` (T, N, in): ``(output (T, N, P), h_n (N, P),
    c_n (N, H))``, ``c_n`` None except for the LSTM; P is H except for an LSTM's projection
    ``w_hr`` (P, H)."""
    size = w_hh.shape[1]
    steps, batch = x.shape[0], x.shape[1]
    # the input projection as one 2-D product: numpy's matmul of a (T, N, in) stack runs one
    # product per time step (2.4x slower measured at 35 x 20 x 200 by 800), and the weight's
    # gradient of a stacked product is a stack of products summed afterwards
    rows = x.reshape(steps * batch, x.shape[2])
    x_gates = linear(rows, w_ih, b_ih).reshape(steps, batch, w_ih.shape[0])
    packed = rnn_sequence(mode, x_gates, w_hh, h0, c0, b_hh, reverse, w_hr)
    last = packed[0] if reverse else packed[packed.shape[0] - 1]
    output = packed if mode in ("RNN_TANH", "RNN_RELU") else packed.narrow(2, 0, size)
    h_n = last.narrow(1, 0, size)
    c_n = last.narrow(1, size, c0.shape[1]) if mode == "LSTM" and c0 is not None else None
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
) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor | None, Tensor]:
    """The gradients of ``rnn_sequence`` -- ``(x_gates, h0, c0 (LSTM, else None), w_hh,
    w_hr (a projection, else None), b_hh)`` -- for the gradient ``g`` of its packed output
    ``out``, in the op surface: the same backpropagation through time as the kernel
    (``recurrent_kernels``), one step at a time, differentiable again.  Every packed column's
    gradient counts, the gates' included."""
    steps, batch = out.shape[0], out.shape[1]
    gate_size, size = w_hh.shape[0], w_hh.shape[1]
    hidden = c0.shape[1] if mode == "LSTM" and c0 is not None else size

    def col(a: Tensor, start: int) -> Tensor:
        return a.narrow(-1, start, hidden)

    dh = zeros_like(h0)
    dc = None if c0 is None else zeros_like(c0)
    dw_hr = None
    dx: list[Tensor] = [None] * steps  # type: ignore[list-item]
    dhg: list[Tensor] = [None] * steps  # type: ignore[list-item]
    for t in range(steps) if reverse else range(steps - 1, -1, -1):
        first = t == (steps - 1 if reverse else 0)
        before = t + 1 if reverse else t - 1
        gt, o = g[t], out[t]
        dhv = gt.narrow(-1, 0, size) + dh
        if mode == "LSTM":
            cell, i, f, gc, go = (col(o, size + k * hidden) for k in range(5))
            c_prev = c0 if first else col(out[before], size)
            tc = tanh(cell)
            dm = dhv
            if w_hr is not None:  # h = (o tanh c) W_hr^T
                dm = dhv @ w_hr
                step_w_hr = dhv.mT @ (go * tc)
                dw_hr = step_w_hr if dw_hr is None else dw_hr + step_w_hr
            dcv = col(gt, size) + dc + dm * go * (1.0 - tc * tc)
            di = dcv * gc + col(gt, size + hidden)
            df = dcv * c_prev + col(gt, size + 2 * hidden)
            dg = dcv * i + col(gt, size + 3 * hidden)
            do = dm * tc + col(gt, size + 4 * hidden)
            pre = [
                di * i * (1.0 - i),
                df * f * (1.0 - f),
                dg * (1.0 - gc * gc),
                do * go * (1.0 - go),
            ]
            dx[t] = dhg[t] = cat(pre, -1)
            dc = dcv * f
            dh = dx[t] @ w_hh
        elif mode == "GRU":
            r, z, new, hn = (col(o, k * hidden) for k in range(1, 5))
            h_prev = h0 if first else col(out[before], 0)
            dz = dhv * (h_prev - new) + col(gt, 2 * hidden)
            dnew = dhv * (1.0 - z) + col(gt, 3 * hidden)
            dn_pre = dnew * (1.0 - new * new)
            dr = dn_pre * hn + col(gt, hidden)
            dhn = dn_pre * r + col(gt, 4 * hidden)
            dr_pre, dz_pre = dr * r * (1.0 - r), dz * z * (1.0 - z)
            dx[t] = cat([dr_pre, dz_pre, dn_pre], -1)
            dhg[t] = cat([dr_pre, dz_pre, dhn], -1)
            dh = dhv * z + dhg[t] @ w_hh
        else:
            value = col(o, 0)
            if mode == "RNN_TANH":
                dx[t] = dhv * (1.0 - value * value)
            else:
                dx[t] = dhv * (value > 0).to(value.dtype)
            dhg[t] = dx[t]
            dh = dx[t] @ w_hh
    d_gates = stack(dhg, 0)
    outputs = out.narrow(2, 0, size)
    if reverse:
        h_prev_all = cat([outputs.narrow(0, 1, steps - 1), h0.unsqueeze(0)], 0)
    else:
        h_prev_all = cat([h0.unsqueeze(0), outputs.narrow(0, 0, steps - 1)], 0)
    rows = d_gates.reshape(steps * batch, gate_size)
    dw_hh = rows.mT @ h_prev_all.reshape(steps * batch, size)
    db_hh = rows.sum(0)
    return stack(dx, 0), dh, (dc if mode == "LSTM" else None), dw_hh, dw_hr, db_hh
