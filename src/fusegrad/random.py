"""Random number generators: ``Generator`` (numpy PCG64 underneath) and the default one.

``manual_seed`` / ``seed`` / ``get_rng_state`` / ``set_rng_state`` act on ``default_generator``,
which every random op draws from unless given a ``generator=``.  CUDA tensors draw on the host
and are copied, so ``fusegrad.cuda.manual_seed`` seeds this same generator.  This sits below the
op surface (``ops.creation`` re-exports it) and below ``fusegrad.cuda``, which needs only it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .autograd.tracer import notify_will_draw as _notify_will_draw
from .device import as_device


class Generator:
    """A random number generator (PCG64); ``manual_seed``, ``seed``, ``get_state``/``set_state``."""

    def __init__(self, device: Any = "cpu") -> None:
        as_device(device)
        self._rng = np.random.Generator(np.random.PCG64())
        self._seed: int | None = None

    def manual_seed(self, seed: int) -> Generator:
        self._seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        return self

    def seed(self) -> int:
        s = int(np.random.SeedSequence().entropy % (2**63))
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._seed if self._seed is not None else 0

    def get_state(self) -> dict:
        return self._rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    return default_generator.manual_seed(seed)


def seed() -> int:
    return default_generator.seed()


def get_rng_state() -> dict:
    return default_generator.get_state()


def set_rng_state(state: dict) -> None:
    default_generator.set_state(state)


def _gen(generator: Generator | None) -> np.random.Generator:
    """The numpy generator a random op draws from (told to the tracer first: ``will_draw``)."""
    generator = generator or default_generator
    _notify_will_draw(generator)
    return generator._rng
