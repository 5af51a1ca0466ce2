"""``DistributedSampler``: each process of a distributed job its own part of the dataset
(``torch.utils.data.distributed.DistributedSampler``).

The indices (shuffled with seed ``seed + epoch`` when ``shuffle``; the same on every process) are
padded by repeating from the start to a multiple of ``num_replicas`` -- or, with ``drop_last``,
cut down to one -- and rank ``r`` takes every ``num_replicas``-th from position ``r``.  Call
``set_epoch(epoch)`` before each epoch for a new order.  The order is fusegrad's generator's,
not PyTorch's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

from ... import distributed as dist
from ...ops import randperm
from ...random import Generator
from .sampler import Sampler


class DistributedSampler(Sampler[int]):
    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            if num_replicas is None:
                num_replicas = dist.get_world_size()
            if rank is None:
                rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            g = Generator().manual_seed(self.seed + self.epoch)
            indices = randperm(n, generator=g).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``__iter__`` shuffles for (same on every process)."""
        self.epoch = epoch
