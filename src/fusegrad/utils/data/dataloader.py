"""``DataLoader``: batches of samples from a dataset, through a sampler and a collate function,
and ``default_collate`` / ``default_convert``.  Everything runs in the calling process (see the
package docstring for ``num_workers``)."""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ...dtypes import float64
from ...ops import as_tensor, stack, tensor
from ...random import Generator
from ...tensor import Tensor
from .dataset import Dataset, IterableDataset
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

_COLLATE_ERROR = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


def get_worker_info() -> None:
    """None: loading runs in the main process (there are no worker processes)."""
    return None


def default_convert(data: Any) -> Any:
    """Numpy arrays (and numbers in them) to tensors, inside mappings and sequences too; the
    collate function of a DataLoader without automatic batching."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray) and data.dtype.kind not in "SUOV":
        return as_tensor(data)
    if isinstance(data, np.generic) and not isinstance(data, (np.str_, np.bytes_)):
        return as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        converted = {k: default_convert(v) for k, v in data.items()}
        try:
            return type(data)(converted)  # type: ignore[call-arg]
        except TypeError:
            return converted
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        converted_list = [default_convert(d) for d in data]
        try:
            return type(data)(converted_list)  # type: ignore[call-arg]
        except TypeError:
            return converted_list
    return data


def default_collate(batch: list) -> Any:
    """Stack a list of samples into a batch: tensors and numpy arrays are stacked on a new
    first dimension, Python floats become a float64 tensor, ints (and bools) an int64 (bool)
    tensor, strings stay a list, and mappings, namedtuples and sequences are collated field by
    field (a tuple sample gives a list of batches, as in PyTorch)."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(batch, 0)
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "SUOV":
            raise TypeError(_COLLATE_ERROR.format(elem.dtype))
        return stack([as_tensor(b) for b in batch], 0)
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        return as_tensor(np.array(batch))
    if isinstance(elem, float):
        return tensor(batch, dtype=float64)
    if isinstance(elem, int):
        return tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(collated)  # type: ignore[call-arg]
        except TypeError:
            return collated
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # a namedtuple
        return type(elem)(*(default_collate(list(samples)) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = [default_collate(list(samples)) for samples in zip(*batch)]
        if isinstance(elem, tuple):
            return transposed  # (a list, as PyTorch returns)
        try:
            return type(elem)(transposed)  # type: ignore[call-arg]
        except TypeError:
            return transposed
    raise TypeError(_COLLATE_ERROR.format(type(elem)))


class DataLoader:
    """Iterate over ``dataset`` in batches.

    ``batch_size`` samples per batch (None: no automatic batching; each sample goes through
    ``default_convert``), in the order of ``sampler`` (``shuffle=True``: a ``RandomSampler``
    with ``generator``), or the index lists of ``batch_sampler``; ``drop_last`` drops a short
    last batch; ``collate_fn`` turns a list of samples into a batch (``default_collate``).
    ``num_workers`` and the other process options are accepted; loading is in-process."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler | Iterable | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable "
                "multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing.let "
                "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None."
            )
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.generator = generator
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            if shuffle not in (None, False):
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, but "
                    f"got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, but "
                    f"got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler "
                    f"option, but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive with "
                "drop_last"
            )
        if sampler is None and not iterable:
            sampler = (
                RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
                if shuffle
                else SequentialSampler(dataset)  # type: ignore[arg-type]
            )
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._iterable = iterable
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None or (self._iterable and self.batch_size is not None)

    def __iter__(self) -> Iterator[Any]:
        if self._iterable:
            yield from self._iterate_stream()
            return
        if self.batch_sampler is not None:
            fetch_many = getattr(self.dataset, "__getitems__", None)
            for indices in self.batch_sampler:
                samples = fetch_many(indices) if fetch_many else [self.dataset[i] for i in indices]
                yield self.collate_fn(samples)
            return
        for index in self.sampler:  # type: ignore[union-attr]
            yield self.collate_fn(self.dataset[index])

    def _iterate_stream(self) -> Iterator[Any]:
        if self.batch_size is None:
            for sample in self.dataset:  # type: ignore[attr-defined]
                yield self.collate_fn(sample)
            return
        batch: list[Any] = []
        for sample in self.dataset:  # type: ignore[attr-defined]
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)  # type: ignore[arg-type]
            if self.batch_size is None:
                return n
            if self.drop_last:
                return n // self.batch_size
            return (n + self.batch_size - 1) // self.batch_size
        if self.batch_sampler is not None:
            return len(self.batch_sampler)  # type: ignore[arg-type]
        return len(self.sampler)  # type: ignore[arg-type]
