"""Datasets: ``Dataset`` (map-style: ``__getitem__`` and ``__len__``), ``IterableDataset``,
``TensorDataset``, ``Subset``, ``ConcatDataset``, ``StackDataset`` and ``random_split``."""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from ...ops import randperm
from ...random import Generator, default_generator
from ...tensor import Tensor

T_co = TypeVar("T_co", covariant=True)


class Dataset(Generic[T_co]):
    """A map-style dataset: subclasses define ``__getitem__(index)`` (and usually
    ``__len__``)."""

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co]):
    """A dataset that is an iterable of samples: subclasses define ``__iter__``."""

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other: Dataset) -> Any:
        return ChainDataset([self, other])


class ChainDataset(IterableDataset):
    """The samples of several iterable datasets, one after the other (``a + b`` of two)."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)

    def __iter__(self) -> Iterator[Any]:
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise TypeError("ChainDataset only supports IterableDataset")
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise TypeError("ChainDataset only supports IterableDataset")
            total += len(d)  # type: ignore[arg-type]
        return total


class TensorDataset(Dataset[tuple]):
    """Samples are ``tuple(t[index] for t in tensors)``; every tensor has the same first
    dimension."""

    def __init__(self, *tensors: Tensor) -> None:
        if tensors and any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            sizes = [tuple(t.shape) for t in tensors]
            raise ValueError(f"Size mismatch between tensors: {sizes}")
        self.tensors = tensors

    def __getitem__(self, index: Any) -> tuple:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])


class StackDataset(Dataset):
    """Samples of several datasets side by side: ``StackDataset(a, b)[i] == (a[i], b[i])``,
    ``StackDataset(x=a, y=b)[i] == {"x": a[i], "y": b[i]}``."""

    def __init__(self, *args: Dataset, **kwargs: Dataset) -> None:
        if args and kwargs:
            raise ValueError(
                "Supported either ``tuple``- (via ``args``) or``dict``- (via ``kwargs``) like "
                "input/output, but both types are given."
            )
        parts = list(args) or list(kwargs.values())
        if not parts:
            raise ValueError("At least one dataset should be passed")
        self._length = len(parts[0])  # type: ignore[arg-type]
        if any(len(p) != self._length for p in parts):  # type: ignore[arg-type]
            raise ValueError("Size mismatch between datasets")
        self.datasets: Any = args if args else kwargs

    def __getitem__(self, index: Any) -> Any:
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset):
    """The samples of several map-style datasets, one after the other."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise ValueError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes: list[int] = []
        total = 0
        for d in self.datasets:
            total += len(d)  # type: ignore[arg-type]
            self.cumulative_sizes.append(total)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index = len(self) + index
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


class Subset(Dataset[T_co]):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]  # type: ignore[index]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(
    dataset: Dataset, lengths: Sequence[int | float], generator: Generator | None = None
) -> list[Subset]:
    """Split ``dataset`` at random into non-overlapping ``Subset``s of the given lengths, or of
    the given fractions of its length (summing to 1; the remainder goes one by one to the
    first subsets)."""
    generator = generator if generator is not None else default_generator
    n = len(dataset)  # type: ignore[arg-type]
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(int(math.floor(n * frac)))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    UserWarning,
                    stacklevel=2,
                )
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    order = randperm(n, generator=generator).tolist()
    out = []
    start = 0
    for length in lengths:
        out.append(Subset(dataset, order[start : start + int(length)]))
        start += int(length)
    return out
