"""``fusegrad.utils.data``: datasets, samplers and the ``DataLoader``, as ``torch.utils.data``.

Loading runs in the calling process: ``num_workers > 0`` is accepted and loads in-process all
the same (in order, with the same batches as ``num_workers=0``; ``worker_init_fn`` is not
called, and ``get_worker_info()`` is None, as in PyTorch's main process).  ``pin_memory``,
``timeout``, ``prefetch_factor`` and ``persistent_workers`` are accepted and have no effect.
Shuffling draws from ``fusegrad``'s generators: reproducible under ``fusegrad.manual_seed`` or
with ``generator=``, but not PyTorch's order.
"""

from __future__ import annotations

from .dataloader import DataLoader, default_collate, default_convert, get_worker_info
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .distributed import DistributedSampler
from .sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]
