"""Samplers: iterables of dataset indices (``SequentialSampler``, ``RandomSampler``,
``SubsetRandomSampler``, ``WeightedRandomSampler``) and of batches of them (``BatchSampler``).

Random samplers without a ``generator`` draw a fresh seed from the default generator at every
``iter()``, as PyTorch's do, so each epoch has its own order and ``fusegrad.manual_seed`` fixes
them all."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

from ...dtypes import float64
from ...ops import multinomial, randint, randperm, tensor
from ...random import Generator
from ...tensor import Tensor

T_co = TypeVar("T_co", covariant=True)


class Sampler(Generic[T_co]):
    """Base class: subclasses define ``__iter__`` (and, where they can, ``__len__``)."""

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


def _epoch_generator(generator: Generator | None) -> Generator:
    if generator is not None:
        return generator
    seed = int(randint(0, 2**62, ()).item())  # from the default generator
    return Generator().manual_seed(seed)


class SequentialSampler(Sampler[int]):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """A random permutation of the indices (``num_samples`` > len: several permutations one
    after the other), or ``num_samples`` indices drawn with replacement."""

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Generator | None = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got "
                f"num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        generator = _epoch_generator(self.generator)
        if self.replacement:
            # drawn in chunks: num_samples may be huge (an endless loader: num_samples=1e10)
            left = self.num_samples
            while left > 0:
                chunk = min(left, 32)
                yield from randint(0, n, (chunk,), generator=generator).tolist()
                left -= chunk
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=generator).tolist()
        yield from randperm(n, generator=generator).tolist()[: self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    """The given indices in a random order."""

    def __init__(self, indices: Sequence[int], generator: Generator | None = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        order = randperm(len(self.indices), generator=self.generator).tolist()
        for i in order:
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """``num_samples`` indices drawn with probabilities proportional to ``weights``."""

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Generator | None = None,
    ) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        w = weights.to(float64) if isinstance(weights, Tensor) else tensor(weights, dtype=float64)
        if w.ndim != 1:
            raise ValueError(
                f"weights should be a 1d sequence but given weights have shape {tuple(w.shape)}"
            )
        self.weights = w
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        draws = multinomial(
            self.weights, self.num_samples, self.replacement, generator=self.generator
        )
        yield from draws.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list]):
    """Lists of ``batch_size`` indices from ``sampler`` (the last one shorter, or dropped
    with ``drop_last``)."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list]:
        batch: list[Any] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size
