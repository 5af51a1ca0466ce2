"""Stochastic weight averaging and exponential moving averages of models (``torch.optim.
swa_utils``): ``AveragedModel`` keeps a running (or EMA, through ``avg_fn``) average of a
model's parameters, ``SWALR`` anneals each group's learning rate to a constant SWA rate, and
``update_bn`` recomputes BatchNorm statistics for the averaged weights with one pass over data.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

from ..autograd.grad_mode import no_grad
from ..nn.layers import _BatchNorm
from ..nn.module import Module
from ..ops.creation import tensor
from ..tensor import Tensor
from .lr_scheduler import LRScheduler, _per_group
from .optimizer import Optimizer

__all__ = [
    "SWALR",
    "AveragedModel",
    "get_ema_avg_fn",
    "get_ema_multi_avg_fn",
    "get_swa_avg_fn",
    "get_swa_multi_avg_fn",
    "update_bn",
]


def get_ema_multi_avg_fn(decay: float = 0.999) -> Callable:
    """An in-place exponential moving average over lists of tensors."""

    def ema_update(ema: list[Tensor], current: list[Tensor], num_averaged: Any) -> None:
        for e, c in zip(ema, current):
            e.lerp_(c, 1 - decay)

    return ema_update


def get_swa_multi_avg_fn() -> Callable:
    """An in-place running mean over lists of tensors (``num_averaged`` so far)."""

    def swa_update(averaged: list[Tensor], current: list[Tensor], num_averaged: Any) -> None:
        n = float(num_averaged) if not isinstance(num_averaged, Tensor) else num_averaged.item()
        for a, c in zip(averaged, current):
            a.add_((c - a) / (n + 1))

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable:
    """``decay * ema + (1 - decay) * current``, one tensor at a time."""

    def ema_update(ema: Tensor, current: Tensor, num_averaged: Any) -> Tensor:
        return decay * ema + (1 - decay) * current

    return ema_update


def get_swa_avg_fn() -> Callable:
    """The running mean ``averaged + (current - averaged) / (num_averaged + 1)``."""

    def swa_update(averaged: Tensor, current: Tensor, num_averaged: Any) -> Tensor:
        return averaged + (current - averaged) / (num_averaged + 1)

    return swa_update


class AveragedModel(Module):
    """A copy of ``model`` whose parameters (and, with ``use_buffers``, buffers) are the
    average of the values ``update_parameters(model)`` was called with: a running mean by
    default, or what ``avg_fn`` (per tensor) or ``multi_avg_fn`` (per list) computes."""

    def __init__(
        self,
        model: Module,
        device: Any = None,
        avg_fn: Callable | None = None,
        multi_avg_fn: Callable | None = None,
        use_buffers: bool = False,
    ) -> None:
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise ValueError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", tensor(0, dtype="long", device=device))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _tensors(self, model: Module) -> list[Tensor]:
        if self.use_buffers:
            return list(itertools.chain(model.parameters(), model.buffers()))
        return list(model.parameters())

    @no_grad()
    def update_parameters(self, model: Module) -> None:
        ours = self._tensors(self.module)
        theirs = [t.detach().to(o.device) for t, o in zip(self._tensors(model), ours)]
        first = int(self.n_averaged.item()) == 0
        floats = [(o, t) for o, t in zip(ours, theirs) if o.dtype.is_floating_point]
        if first:
            for o, t in zip(ours, theirs):
                o.copy_(t)
        elif self.multi_avg_fn is not None:
            self.multi_avg_fn([o for o, _ in floats], [t for _, t in floats], self.n_averaged)
        else:
            average = self.avg_fn if self.avg_fn is not None else get_swa_avg_fn()
            for o, t in floats:
                o.copy_(average(o, t, self.n_averaged.to(o.device)))
        if not self.use_buffers:
            # the buffers follow the model's (BatchNorm statistics are recomputed by update_bn)
            for o, t in zip(self.module.buffers(), model.buffers()):
                o.copy_(t.detach().to(o.device))
        self.n_averaged.add_(1)


@no_grad()
def update_bn(loader: Iterable, model: Module, device: Any = None) -> None:
    """Recompute the running statistics of ``model``'s BatchNorm layers with one pass over
    ``loader`` (batches, or tuples whose first item is the input): a cumulative average, as
    for a model whose weights were averaged."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm) and module.running_mean is not None:
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    for batch in loader:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        if device is not None:
            x = x.to(device)
        model(x)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


class SWALR(LRScheduler):
    """Anneals each group's learning rate to ``swa_lr`` over ``anneal_epochs`` steps (cosine
    or linear), then keeps it there."""

    def __init__(
        self,
        optimizer: Optimizer,
        swa_lr: Any,
        anneal_epochs: int = 10,
        anneal_strategy: str = "cos",
        last_epoch: int = -1,
    ) -> None:
        for rate, group in zip(_per_group("swa_lr", optimizer, swa_lr), optimizer.param_groups):
            group["swa_lr"] = rate
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(
                f"anneal_strategy must by one of 'cos' or 'linear', instead got {anneal_strategy}"
            )
        self.anneal_func = self._cosine if anneal_strategy == "cos" else self._linear
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear(t: float) -> float:
        return t

    @staticmethod
    def _cosine(t: float) -> float:
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _initial_lr(lr: float, swa_lr: float, alpha: float) -> float:
        return swa_lr if alpha == 1 else (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self) -> list[Any]:
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0.0, min(1.0, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        groups = self.optimizer.param_groups
        previous = [self._initial_lr(g["lr"], g["swa_lr"], prev_alpha) for g in groups]
        t = max(0.0, min(1.0, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(groups, previous)]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("anneal_func", None)  # (a function: rebuilt from the strategy on load)
        return state
