"""Recurrent layers: ``RNNCell``, ``LSTMCell``, ``GRUCell`` and the multi-layer ``RNN``,
``LSTM``, ``GRU``, with PyTorch's parameter names, shapes, initialisation and gate order.

Parameters are laid out as PyTorch lays them out, so a torch ``state_dict`` loads unchanged:
per layer ``k`` and direction (suffix ``""`` or ``"_reverse"``) ``weight_ih_l{k}`` (G*H, in),
``weight_hh_l{k}`` (G*H, H_out), ``bias_ih_l{k}``, ``bias_hh_l{k}`` (G*H) and, for an LSTM with
``proj_size``, ``weight_hr_l{k}`` (proj_size, H); G is 1 for RNN, 4 for LSTM (gates i, f, g, o)
and 3 for GRU (gates r, z, n).  Every parameter starts as U(-1/sqrt(H), 1/sqrt(H)).

How the layers run.  On the CPU, in float32 or float64, each layer and direction of ``RNN``,
``LSTM`` and ``GRU`` is one matmul (the input projection of every time step at once) and one
``rnn_sequence`` primitive: a numba kernel that runs the whole time loop natively (one BLAS call
per step for ``h @ W_hh^T``, one more for an LSTM's ``proj_size``) and saves the gates, with
one backward kernel (backpropagation through time); see ``ops/recurrent.py``.  Its derivative
rule is in the derivative table; under ``create_graph`` the rule computes the same gradients in
per-step ops, so double backward works.  Compiled programs call both kernels as externs.
Dropout between layers stays an ordinary op.  A PackedSequence input runs the same kernels on
its packed rows (step t computes the ``batch_sizes[t]`` sequences still running).  CUDA
tensors, other dtypes, a forward-AD level and the cells (``LSTMCell`` & co., one step each) run
the recurrence as ordinary per-step ops (linear, sigmoid, tanh, slices, stack), which autograd
and the compilers see as primitives; ``fused_kernels(False)`` switches to that path on this
thread (for comparisons; the results agree to rounding).  On the per-step path a whole-step
compile unrolls the time loop (the recording grows with the sequence length).
A PackedSequence input (``nn.utils.rnn``) gives a PackedSequence output: at each step only the
sequences still running are computed, and each one's final state is its own last step's.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from ..autograd.forward_state import state as _forward_state
from ..errors import ShapeError
from ..ops.creation import empty, zeros
from ..ops.indexing import index_select
from ..ops.recurrent import rnn_layer
from ..ops.shape import cat, stack
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter
from .utils.rnn import PackedSequence

__all__ = ["GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNBase", "RNNCell", "RNNCellBase"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


class _FusedKernels(threading.local):
    """Whether ``RNN`` / ``LSTM`` / ``GRU`` may run their fused kernels, per thread."""

    def __init__(self) -> None:
        self.enabled = True


_kernels = _FusedKernels()


@contextlib.contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """Within the block, ``RNN`` / ``LSTM`` / ``GRU`` on this thread run their fused kernels
    (``enabled=True``, the default) or the per-step ops (``False``: for comparisons and
    benchmarks; the results are the same)."""
    before = _kernels.enabled
    _kernels.enabled = bool(enabled)
    try:
        yield
    finally:
        _kernels.enabled = before


def _rnn_step(mode: str, x_gates: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    pre = x_gates + F.linear(h, w_hh, b_hh)
    return F.tanh(pre) if mode == "RNN_TANH" else F.relu(pre)


def _gru_step(x_gates: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    hidden = h.shape[-1]
    h_gates = F.linear(h, w_hh, b_hh)
    x_r, x_z, x_n = (x_gates[..., i * hidden : (i + 1) * hidden] for i in range(3))
    h_r, h_z, h_n = (h_gates[..., i * hidden : (i + 1) * hidden] for i in range(3))
    r = F.sigmoid(x_r + h_r)
    z = F.sigmoid(x_z + h_z)
    n = F.tanh(x_n + r * h_n)
    return n + z * (h - n)  # (1 - z) * n + z * h


def _lstm_step(
    x_gates: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    b_hh: Tensor | None,
    w_hr: Tensor | None,
) -> tuple[Tensor, Tensor]:
    hidden = c.shape[-1]
    gates = x_gates + F.linear(h, w_hh, b_hh)
    i = F.sigmoid(gates[..., :hidden])
    f = F.sigmoid(gates[..., hidden : 2 * hidden])
    g = F.tanh(gates[..., 2 * hidden : 3 * hidden])
    o = F.sigmoid(gates[..., 3 * hidden :])
    c_next = f * c + i * g
    h_next = o * F.tanh(c_next)
    if w_hr is not None:
        h_next = F.linear(h_next, w_hr)
    return h_next, c_next


# ---- cells ------------------------------------------------------------------------------------


class RNNCellBase(Module):
    """The parameters and input checks shared by the three cells."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool,
        num_chunks: int,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(empty(num_chunks * hidden_size, input_size, dtype=dtype))
        self.weight_hh = Parameter(empty(num_chunks * hidden_size, hidden_size, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, dtype=dtype))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        if device is not None:
            self.to(device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s

    def _batched(self, input: Tensor, hx: Tensor | None, name: str) -> tuple[Tensor, bool]:
        """``input`` as (N, input_size) and whether it came unbatched; checks its size."""
        if input.ndim not in (1, 2):
            raise ShapeError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if hx is not None and hx.ndim != input.ndim:
            raise ShapeError(
                f"{name}: Expected hidden to be {input.ndim}D since input is {input.ndim}D, "
                f"got {hx.ndim}D instead"
            )
        if input.shape[-1] != self.input_size:
            raise ShapeError(
                f"input has inconsistent input_size: got {input.shape[-1]} expected "
                f"{self.input_size}"
            )
        return (input.unsqueeze(0), True) if input.ndim == 1 else (input, False)

    def _hidden(self, hx: Tensor | None, input: Tensor, unbatched: bool, which: str) -> Tensor:
        if hx is None:
            return zeros(input.shape[0], self.hidden_size, dtype=input.dtype, device=input.device)
        h = hx.unsqueeze(0) if unbatched else hx
        if h.shape[0] != input.shape[0]:
            raise ShapeError(
                f"Input batch size {input.shape[0]} doesn't match {which} batch size {h.shape[0]}"
            )
        if h.shape[-1] != self.hidden_size:
            raise ShapeError(
                f"{which} has inconsistent hidden_size: got {h.shape[-1]}, expected "
                f"{self.hidden_size}"
            )
        return h


class RNNCell(RNNCellBase):
    """h' = tanh(x @ W_ih.T + b_ih + h @ W_hh.T + b_hh) (or relu)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        if self.nonlinearity not in ("tanh", "relu"):
            raise ShapeError(f"Unknown nonlinearity: {self.nonlinearity}")
        x, unbatched = self._batched(input, hx, "RNNCell")
        h = self._hidden(hx, x, unbatched, "hidden0")
        mode = "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"
        out = _rnn_step(
            mode, F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh
        )
        return out.squeeze(0) if unbatched else out


class LSTMCell(RNNCellBase):
    """One LSTM step: gates i, f, g, o from ``x`` and ``h``; returns ``(h', c')``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ShapeError("lstm_cell expects two hidden states")
        x, unbatched = self._batched(input, None if hx is None else hx[0], "LSTMCell")
        h = self._hidden(None if hx is None else hx[0], x, unbatched, "hx[0]")
        c = self._hidden(None if hx is None else hx[1], x, unbatched, "hx[1]")
        x_gates = F.linear(x, self.weight_ih, self.bias_ih)
        h, c = _lstm_step(x_gates, h, c, self.weight_hh, self.bias_hh, None)
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)


class GRUCell(RNNCellBase):
    """One GRU step: r, z = sigmoid(...), n = tanh(x_n + r * h_n), h' = (1 - z) * n + z * h."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, unbatched = self._batched(input, hx, "GRUCell")
        h = self._hidden(hx, x, unbatched, "hidden0")
        out = _gru_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh)
        return out.squeeze(0) if unbatched else out


# ---- multi-layer, optionally bidirectional sequences --------------------------------------------


class RNNBase(Module):
    """The layout, checks and layer loop shared by RNN, LSTM and GRU (``mode`` says which)."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if (
            not isinstance(dropout, numbers.Number)
            or not 0 <= dropout <= 1
            or isinstance(dropout, bool)
        ):
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the probability of an "
                "element being zeroed"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero "
                f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                f"num_layers={num_layers}",
                UserWarning,
                stacklevel=2,
            )
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError(
                "proj_size should be a positive integer or zero to disable projections"
            )
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        directions = 2 if bidirectional else 1
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else real_hidden * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                shapes = [
                    ("weight_ih", (gate_size, layer_input)),
                    ("weight_hh", (gate_size, real_hidden)),
                ]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes.append(("weight_hr", (proj_size, hidden_size)))
                for name, shape in shapes:
                    setattr(self, name + suffix, Parameter(empty(*shape, dtype=dtype)))
                    self._flat_weights_names.append(name + suffix)
        if device is not None:
            self.to(device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def flatten_parameters(self) -> None:
        """Accepted for PyTorch code (cuDNN's packed weights); fusegrad has nothing to pack."""

    @property
    def _flat_weights(self) -> list[Tensor | None]:
        return [getattr(self, name, None) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """The parameters of each layer and direction, in PyTorch's order."""
        per = len(self._flat_weights_names) // (self.num_layers * (2 if self.bidirectional else 1))
        flat = self._flat_weights
        return [flat[i : i + per] for i in range(0, len(flat), per)]  # type: ignore[misc]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # -- forward pieces --

    def _check_input(self, input: Any) -> Tensor:
        name = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(self.mode, self.mode)
        if not isinstance(input, Tensor):
            raise TypeError(
                f"{name}: input must be a Tensor or a PackedSequence, got {type(input).__name__}"
            )
        if input.ndim not in (2, 3):
            raise ShapeError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise ShapeError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                f"got {input.shape[-1]}"
            )
        return input

    def _state(
        self, hx: Tensor | None, batch: int, size: int, like: Tensor, unbatched: bool, which: str
    ) -> Tensor:
        """An initial state as (layers * directions, N, size); zeros when not given."""
        directions = 2 if self.bidirectional else 1
        expected = (self.num_layers * directions, batch, size)
        if hx is None:
            return zeros(*expected, dtype=like.dtype, device=like.device)
        if unbatched and hx.ndim != 2:
            raise ShapeError(
                f"For unbatched 2-D input, hx should also be 2-D but got {hx.ndim}-D tensor"
            )
        if not unbatched and hx.ndim != 3:
            raise ShapeError(
                f"For batched 3-D input, hx should also be 3-D but got {hx.ndim}-D tensor"
            )
        h = hx.unsqueeze(1) if unbatched else hx
        if tuple(h.shape) != expected:
            raise ShapeError(f"Expected {which} size {expected}, got {list(h.shape)}")
        return h

    def _run(
        self, input: Tensor, h0: Tensor, c0: Tensor | None, sizes: list[int] | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The layer loop.  Padded: (L, N, in) input, output (L, N, D * H_out).  Packed
        (``sizes`` = batch_sizes): (sum of lengths, in) data, output (sum, D * H_out), and at
        step t only the first ``sizes[t]`` rows run; the others keep their state (a finished
        sequence's final state, or the initial state of one the reverse pass has not reached)."""
        if input.shape[0] == 0:
            raise ShapeError("Expected sequence length to be larger than 0 in RNN")
        directions = 2 if self.bidirectional else 1
        fused = self._fused_kernel_runs(input, h0, c0)
        layer_input = input
        h_last: list[Tensor] = []
        c_last: list[Tensor] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                w_ih = getattr(self, "weight_ih" + suffix)
                w_hh = getattr(self, "weight_hh" + suffix)
                b_ih = getattr(self, "bias_ih" + suffix, None)
                b_hh = getattr(self, "bias_hh" + suffix, None)
                w_hr = getattr(self, "weight_hr" + suffix, None)
                if fused:  # one matmul and one native recurrence (ops/recurrent.py)
                    c_in = None if c0 is None else c0[index]
                    out, h, c = rnn_layer(
                        self.mode, layer_input, w_ih, w_hh, b_ih, b_hh, h0[index], c_in,
                        direction == 1, w_hr, sizes,
                    )  # fmt: skip
                    outputs.append(out)
                    h_last.append(h)
                    if c is not None:
                        c_last.append(c)
                    continue
                # the input projection of every time step at once: one matmul per layer
                projected = F.linear(layer_input, w_ih, b_ih)
                x_gates = projected.unbind(0) if sizes is None else projected.split(sizes, 0)
                steps = range(len(x_gates) - 1, -1, -1) if direction == 1 else range(len(x_gates))
                h = h0[index]
                c = None if c0 is None else c0[index]
                hs: list[Tensor] = [None] * len(x_gates)  # type: ignore[list-item]
                for t in steps:
                    rows = h.shape[0] if sizes is None else sizes[t]
                    active = rows == h.shape[0]
                    h_in = h if active else h[:rows]
                    c_in = c if c is None or active else c[:rows]
                    if self.mode == "LSTM":
                        h_out, c_out = _lstm_step(x_gates[t], h_in, c_in, w_hh, b_hh, w_hr)  # type: ignore[arg-type]
                        c = c_out if active else cat([c_out, c[rows:]], 0)  # type: ignore[index]
                    elif self.mode == "GRU":
                        h_out = _gru_step(x_gates[t], h_in, w_hh, b_hh)
                    else:
                        h_out = _rnn_step(self.mode, x_gates[t], h_in, w_hh, b_hh)
                    h = h_out if active else cat([h_out, h[rows:]], 0)
                    hs[t] = h_out
                outputs.append(stack(hs, 0) if sizes is None else cat(hs, 0))
                h_last.append(h)
                if c is not None:
                    c_last.append(c)
            layer_input = outputs[0] if directions == 1 else cat(outputs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        return layer_input, stack(h_last, 0), (stack(c_last, 0) if c_last else None)

    def _fused_kernel_runs(self, input: Tensor, h0: Tensor, c0: Tensor | None) -> bool:
        """Whether the layers run as fused kernels (``rnn_sequence``): tensors of one dtype
        and device (the CPU, or CUDA: ``cuda/recurrent.py``), float32 or float64, no forward-AD
        level (whose tangents the per-step ops carry), and ``fused_kernels`` not switched off
        on this thread."""
        if not _kernels.enabled or _forward_state.level is not None:
            return False
        tensors = [input, h0] + ([] if c0 is None else [c0])
        tensors += [w for w in self._flat_weights if w is not None]
        dtype = input.dtype
        if dtype.name not in ("float32", "float64"):
            return False
        device = input.device
        if device.type not in ("cpu", "cuda"):
            return False
        return all(t.dtype == dtype and t.device == device for t in tensors)

    def _forward_packed(self, input: PackedSequence, hx: Any) -> tuple[Any, Tensor, Any]:
        data, batch_sizes, sorted_indices, unsorted_indices = input
        sizes = [int(v) for v in batch_sizes.tolist()]
        if data.ndim != 2 or data.shape[-1] != self.input_size:
            raise ShapeError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                f"got {data.shape[-1]}"
            )

        def sort(state: Tensor | None) -> Tensor | None:
            # the initial states come in the caller's batch order; the packed rows are sorted
            if state is None or sorted_indices is None:
                return state
            return index_select(state, 1, sorted_indices)

        def unsort(state: Tensor) -> Tensor:
            return state if unsorted_indices is None else index_select(state, 1, unsorted_indices)

        out_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        if self.mode == "LSTM":
            if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
                raise ShapeError("LSTM: expected hx to be a tuple (h_0, c_0)")
            h_given, c_given = (None, None) if hx is None else (sort(hx[0]), sort(hx[1]))
            h0 = self._state(h_given, sizes[0], out_size, data, False, "hidden[0]")
            c0 = self._state(c_given, sizes[0], self.hidden_size, data, False, "hidden[1]")
        else:
            h0 = self._state(sort(hx), sizes[0], out_size, data, False, "hidden")
            c0 = None
        output, h_n, c_n = self._run(data, h0, c0, sizes)
        packed = PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices)
        return packed, unsort(h_n), (None if c_n is None else unsort(c_n))

    def _forward(self, input: Any, hx: Any) -> tuple[Any, Tensor, Tensor | None]:
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        x = self._check_input(input)
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        batch = x.shape[1]
        out_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        if self.mode == "LSTM":
            if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
                raise ShapeError("LSTM: expected hx to be a tuple (h_0, c_0)")
            h_given, c_given = (None, None) if hx is None else hx
            h0 = self._state(h_given, batch, out_size, x, unbatched, "hidden[0]")
            c0 = self._state(c_given, batch, self.hidden_size, x, unbatched, "hidden[1]")
        else:
            h0 = self._state(hx, batch, out_size, x, unbatched, "hidden")
            c0 = None
        output, h_n, c_n = self._run(x, h0, c0)
        if unbatched:
            output, h_n = output.squeeze(1), h_n.squeeze(1)
            c_n = None if c_n is None else c_n.squeeze(1)
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, h_n, c_n


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(x_t @ W_ih.T + b_ih + h_{t-1} @ W_hh.T + b_hh) (or relu), stacked
    ``num_layers`` deep, optionally bidirectional.  Returns ``(output, h_n)``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            mode, input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, 0, device, dtype,
        )  # fmt: skip
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, h_n, _ = self._forward(input, hx)
        return output, h_n


class LSTM(RNNBase):
    """Long short-term memory (gates i, f, g, o), with an optional projection of h
    (``proj_size``).  Returns ``(output, (h_n, c_n))``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, proj_size, device, dtype,
        )  # fmt: skip

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, h_n, c_n = self._forward(input, hx)
        return output, (h_n, c_n)  # type: ignore[return-value]


class GRU(RNNBase):
    """Gated recurrent unit (gates r, z, n).  Returns ``(output, h_n)``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            "GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
            bidirectional, 0, device, dtype,
        )  # fmt: skip

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, h_n, _ = self._forward(input, hx)
        return output, h_n
