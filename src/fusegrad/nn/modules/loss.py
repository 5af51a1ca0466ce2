"""``fusegrad.nn.modules.loss``: losses,
at PyTorch's module path (``torch.nn.modules.loss``)."""

from __future__ import annotations

from ...ops.nn_more import (  # noqa: F401  (re-exported)
    LinearCrossEntropyOptions,
)
from ..loss import (  # noqa: F401  (re-exported)
    BCELoss,
    BCEWithLogitsLoss,
    CosineEmbeddingLoss,
    CrossEntropyLoss,
    GaussianNLLLoss,
    HingeEmbeddingLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MarginRankingLoss,
    MSELoss,
    MultiLabelSoftMarginLoss,
    NLLLoss,
    NLLLoss2d,
    PoissonNLLLoss,
    SmoothL1Loss,
    SoftMarginLoss,
    TripletMarginLoss,
    _Loss,
    _WeightedLoss,
)
from ..more_layers import (  # noqa: F401  (re-exported)
    CTCLoss,
    LinearCrossEntropyLoss,
    MultiLabelMarginLoss,
    MultiMarginLoss,
    TripletMarginWithDistanceLoss,
)

__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "CTCLoss",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "GaussianNLLLoss",
    "HingeEmbeddingLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "LinearCrossEntropyLoss",
    "LinearCrossEntropyOptions",
    "MSELoss",
    "MarginRankingLoss",
    "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss",
    "MultiMarginLoss",
    "NLLLoss",
    "NLLLoss2d",
    "PoissonNLLLoss",
    "SmoothL1Loss",
    "SoftMarginLoss",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]
