"""``fusegrad.nn``: modules, parameters, layers, losses, ``init`` and ``functional``.

The same names and behaviour as ``torch.nn``: ``Module`` registers ``Parameter``s, submodules
and buffers on attribute assignment; layers initialise their weights as PyTorch does; forward
passes call ``fusegrad.nn.functional``, which is built from fusegrad's primitives so autograd
(and the backward compiler) see ordinary ops.  Importing this package loads neither numba nor
the compiler.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import functional, init, utils
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .conv_transpose import ConvTranspose1d, ConvTranspose2d
from .distance import CosineSimilarity, PairwiseDistance
from .layers import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Identity,
    InstanceNorm1d,
    InstanceNorm2d,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSigmoid,
    LogSoftmax,
    MaxPool2d,
    Mish,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Softshrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
    Unflatten,
    Upsample,
)
from .loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
    TripletMarginLoss,
)
from .module import LoadStateDictError, Module, RemovableHandle
from .parameter import Parameter
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "ConvTranspose1d",
    "ConvTranspose2d",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "TransformerDecoderLayer",
    "TransformerDecoder",
    "Transformer",
    "MultiheadAttention",
    "RNNCellBase",
    "RNNCell",
    "RNNBase",
    "RNN",
    "LSTMCell",
    "LSTM",
    "GRUCell",
    "GRU",
    "CELU",
    "GLU",
    "SELU",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "ELU",
    "GELU",
    "AvgPool2d",
    "BCELoss",
    "BCEWithLogitsLoss",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Flatten",
    "GroupNorm",
    "Hardswish",
    "HuberLoss",
    "KLDivLoss",
    "TripletMarginLoss",
    "CosineSimilarity",
    "PairwiseDistance",
    "Identity",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "L1Loss",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LoadStateDictError",
    "Hardtanh",
    "Threshold",
    "Softshrink",
    "Hardshrink",
    "Tanhshrink",
    "Softsign",
    "Hardsigmoid",
    "LogSigmoid",
    "LogSoftmax",
    "MSELoss",
    "MaxPool2d",
    "Mish",
    "Module",
    "ModuleDict",
    "ModuleList",
    "NLLLoss",
    "Parameter",
    "ParameterDict",
    "ParameterList",
    "ReLU",
    "ReLU6",
    "Softmin",
    "RemovableHandle",
    "Sequential",
    "SiLU",
    "SmoothL1Loss",
    "Sigmoid",
    "Softmax",
    "Softplus",
    "Tanh",
    "Unflatten",
    "Upsample",
    "functional",
    "init",
    "utils",
]


def __getattr__(name: str) -> Any:
    # ``nn.parallel`` (DistributedDataParallel, with ``fusegrad.distributed``) loads on first use
    if name == "parallel":
        return importlib.import_module(".parallel", __name__)
    raise AttributeError(f"module 'fusegrad.nn' has no attribute {name!r}")
