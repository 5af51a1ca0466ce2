"""``fusegrad.nn.modules.rnn``: recurrent layers,
at PyTorch's module path (``torch.nn.modules.rnn``)."""

from __future__ import annotations

from ..rnn import (  # noqa: F401  (re-exported)
    GRU,
    LSTM,
    RNN,
    GRUCell,
    LSTMCell,
    RNNBase,
    RNNCell,
    RNNCellBase,
)

__all__ = ["GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNBase", "RNNCell", "RNNCellBase"]
