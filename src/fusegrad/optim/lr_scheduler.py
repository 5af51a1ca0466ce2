"""Learning-rate schedules, as ``torch.optim.lr_scheduler``.

A scheduler only writes ``param_group["lr"]`` (OneCycleLR also the momentum or Adam's beta1);
the optimizers read the group's ``lr`` at every step.  ``LRScheduler`` is the base class:
``step()`` advances ``last_epoch`` and sets each group's lr from ``get_lr()``, the *chainable*
form, which computes the new lr from the group's current one (so two schedulers can act on one
optimizer, one after the other, as in PyTorch); ``step(epoch)`` (deprecated in PyTorch) jumps to
``epoch`` through ``_get_closed_form_lr()`` where the scheduler has one.  The construction
performs the first step (``last_epoch`` 0, ``initial_lr`` stored in each group); resuming with
``last_epoch >= 0`` needs ``initial_lr`` in the groups.  ``state_dict()`` is every attribute
but the optimizer (LambdaLR keeps only the state of callable objects, never functions).

In a compiled step (``fusegrad.compile``), ``step()`` is a library call the recording replays
as a call (``opaque_method``), like ``Optimizer.zero_grad``; the learning rate (and betas,
eps, momentum, dampening, weight decay) are runtime inputs of the optimizer's recorded update,
so a scheduler stepping every call -- OneCycleLR's momentum cycling included -- does not make
the step record again.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..autograd.tracer import opaque_method
from ..tensor import Tensor
from .optimizer import Optimizer

__all__ = [
    "ConstantLR",
    "CosineAnnealingLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
    "ChainedScheduler",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "PolynomialLR",
]

_EPOCH_DEPRECATION = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where "
    "possible. Please use `scheduler.step()` to step the scheduler. During the deprecation, if "
    "epoch is different from None, the closed form is used instead of the new chainable form, "
    "where available."
)


def _check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


def _set_lr(group: dict, lr: Any) -> None:
    if isinstance(group["lr"], Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr


class LRScheduler:
    """Base class: subclasses define ``get_lr()`` (chainable) and, where they have one,
    ``_get_closed_form_lr()``."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                initial = group["lr"]
                group.setdefault(
                    "initial_lr", initial.clone() if isinstance(initial, Tensor) else initial
                )
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when resuming "
                        "an optimizer"
                    )
        self.base_lrs: list[Any] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self.step()

    def get_lr(self) -> list[Any]:
        """The learning rates of the groups at ``last_epoch`` (chainable form)."""
        raise NotImplementedError

    def get_last_lr(self) -> list[Any]:
        """The learning rates the last ``step()`` set."""
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    @opaque_method
    def step(self, epoch: int | None = None) -> None:
        """Advance one step (``epoch``: jump there, deprecated) and set each group's lr."""
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            warnings.warn(_EPOCH_DEPRECATION, UserWarning, stacklevel=2)
            values = self._lrs_at(epoch)
        for group, lr in zip(self.optimizer.param_groups, values):
            _set_lr(group, lr)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _lrs_at(self, epoch: int) -> list[Any]:
        self.last_epoch = epoch
        closed = getattr(self, "_get_closed_form_lr", None)
        return closed() if closed is not None else self.get_lr()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch})"


_LRScheduler = LRScheduler  # (PyTorch's old name)


def _per_group(name: str, optimizer: Optimizer, value: Any) -> list[Any]:
    """One value per param group: a list or tuple of as many, or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(
                f"{name} must have the same length as optimizer.param_groups. "
                f"optimizer.param_groups has {len(optimizer.param_groups)} values, {name} has "
                f"{len(value)}."
            )
        return list(value)
    return [value] * len(optimizer.param_groups)


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(epoch); one function, or one per group."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
        last_epoch: int = -1,
    ) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if not isinstance(lr_lambda, (list, tuple)):
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        else:
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(
                    f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}"
                )
            self.lr_lambdas = list(lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer; of the lambdas, only callable objects' ``__dict__``
        (functions and lambdas are saved as None and must be given again)."""
        state = {
            key: value
            for key, value in self.__dict__.items()
            if key not in ("optimizer", "lr_lambdas")
        }
        state["lr_lambdas"] = [
            None if isinstance(fn, type(lambda: 0)) else dict(fn.__dict__) for fn in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        lambdas = state_dict.pop("lr_lambdas")
        self.__dict__.update(state_dict)
        for fn, saved in zip(self.lr_lambdas, lambdas):
            if saved is not None:
                fn.__dict__.update(saved)


class MultiplicativeLR(LambdaLR):
    """lr = lr * lr_lambda(epoch) at each step after the first."""

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch > 0:
            return [g["lr"] * fn(self.last_epoch) for fn, g in zip(self.lr_lambdas, groups)]
        return [g["lr"] for g in groups]

    _get_closed_form_lr = None  # type: ignore[assignment]  (no closed form: chainable only)


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (epoch // step_size)."""

    def __init__(
        self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma for g in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr = initial_lr * gamma ** (number of milestones reached)."""

    def __init__(
        self,
        optimizer: Optimizer,
        milestones: Iterable[int],
        gamma: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch not in self.milestones:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma ** self.milestones[self.last_epoch] for g in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        reached = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [b * self.gamma**reached for b in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr = initial_lr * factor until ``total_iters``, then initial_lr."""

    def __init__(
        self,
        optimizer: Optimizer,
        factor: float = 1.0 / 3,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in groups]
        if self.last_epoch != self.total_iters:
            return [g["lr"] for g in groups]
        return [g["lr"] * (1.0 / self.factor) for g in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        below = self.last_epoch < self.total_iters
        return [b * (self.factor + (1 - self.factor) * (not below)) for b in self.base_lrs]


class LinearLR(LRScheduler):
    """lr goes linearly from initial_lr * start_factor to initial_lr * end_factor over
    ``total_iters`` steps, then stays."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(
                "Starting multiplicative factor expected to be greater than 0 and less or "
                "equal to 1."
            )
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in groups]
        if self.last_epoch > self.total_iters:
            return [g["lr"] for g in groups]
        span = self.end_factor - self.start_factor
        ratio = 1.0 + span / (self.total_iters * self.start_factor + (self.last_epoch - 1) * span)
        return [g["lr"] * ratio for g in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        done = min(self.total_iters, self.last_epoch) / self.total_iters
        factor = self.start_factor + (self.end_factor - self.start_factor) * done
        return [b * factor for b in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr = initial_lr * gamma ** epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma for g in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        return [b * self.gamma**self.last_epoch for b in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2, computed
    chainably as PyTorch does (so past ``T_max`` it rises again: SGDR without restarts)."""

    def __init__(
        self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1
    ) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        if t == 0:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and t > 0:  # resumed at epoch t
            return [lo + (b - lo) * (1 + math.cos(t * math.pi / T)) / 2 for b in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [
                g["lr"] + (b - lo) * (1 - math.cos(math.pi / T)) / 2
                for b, g in zip(self.base_lrs, groups)
            ]
        ratio = (1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
        return [ratio * (g["lr"] - lo) + lo for g in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        return [lo + (b - lo) * (1 + math.cos(math.pi * t / T)) / 2 for b in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy: lr warms up from max_lr / div_factor to max_lr over ``pct_start`` of
    ``total_steps``, then anneals to initial_lr / final_div_factor (``three_phase``: back to
    the initial lr first); momentum (or Adam's beta1) cycles the other way."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | Sequence[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.85,
        max_momentum: float | Sequence[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"Expected positive integer epochs, but got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(
                    f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}"
                )
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(
                f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}"
            )
        self.anneal_strategy = anneal_strategy
        n = float(self.total_steps)
        if three_phase:
            self._schedule_phases = [
                self._phase(pct_start * n - 1, "initial_lr", "max_lr", "max", "base"),
                self._phase(2 * pct_start * n - 2, "max_lr", "initial_lr", "base", "max"),
                self._phase(n - 1, "initial_lr", "min_lr", "max", "max"),
            ]
        else:
            self._schedule_phases = [
                self._phase(pct_start * n - 1, "initial_lr", "max_lr", "max", "base"),
                self._phase(n - 1, "max_lr", "min_lr", "base", "max"),
            ]
        max_lrs = _per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for top, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(
                    "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            tops = _per_group("max_momentum", optimizer, max_momentum)
            bases = _per_group("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for top, base, group in zip(tops, bases, optimizer.param_groups):
                    self._set_momentum(group, top)
                    group["max_momentum"] = top
                    group["base_momentum"] = base
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _phase(end: float, lr_from: str, lr_to: str, m_from: str, m_to: str) -> dict[str, Any]:
        return {
            "end_step": end,
            "start_lr": lr_from,
            "end_lr": lr_to,
            "start_momentum": f"{m_from}_momentum",
            "end_momentum": f"{m_to}_momentum",
        }

    def _set_momentum(self, group: dict, value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[Any]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(
                f"Tried to step {step} times. The specified number of total steps is "
                f"{self.total_steps}"
            )
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            last = len(self._schedule_phases) - 1
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == last:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        m = self._anneal(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], pct
                        )
                    break
                start = end
            lrs.append(lr)
            if self.cycle_momentum:
                self._set_momentum(group, m)
        return lrs


class SequentialLR(LRScheduler):
    """Runs ``schedulers`` one after the other, switching at the ``milestones`` epochs (the
    next scheduler starts from its epoch 0)."""

    def __init__(
        self,
        optimizer: Optimizer,
        schedulers: Sequence[LRScheduler],
        milestones: Sequence[int],
        last_epoch: int = -1,
    ) -> None:
        _check_optimizer(optimizer)
        if len(schedulers) < 1:
            raise ValueError(
                f"{type(self).__name__} expects at least one scheduler, but got no scheduler."
            )
        for i, s in enumerate(schedulers):
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong to the same "
                    f"optimizer, but got scheduler {type(s).__name__} at index {i} that belongs "
                    "to a different optimizer"
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "Sequential Schedulers expects number of schedulers provided to be one more "
                f"than the number of milestone points, but got number of schedulers "
                f"{len(schedulers)} and the number of milestones to be equal to {len(milestones)}"
            )
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # undo the schedulers' initial steps
            group["lr"] = group["initial_lr"]
        for s in self._schedulers:
            s.last_epoch -= 1
        self._schedulers[0]._initial_step()
        self._last_lr = self._schedulers[0].get_last_lr()

    @opaque_method
    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            # the next scheduler starts at its epoch 0 (closed form where it has one)
            scheduler._step_count += 1
            values = scheduler._lrs_at(0)
            for group, lr in zip(self.optimizer.param_groups, values):
                _set_lr(group, lr)
            scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        state = {
            key: value
            for key, value in self.__dict__.items()
            if key not in ("optimizer", "_schedulers")
        }
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        for s, sd in zip(self._schedulers, saved):
            s.load_state_dict(sd)


class ReduceLROnPlateau(LRScheduler):
    """Multiply the lr by ``factor`` when the metric passed to ``step(metric)`` has not
    improved for ``patience`` steps.  ``step`` reads the metric as a Python float (a tensor's
    value is read on the host)."""

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float | Sequence[float] = 0,
        eps: float = 1e-8,
    ) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(
                    f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}"
                )
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        if mode not in ("min", "max"):
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.factor = factor
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def step(self, metrics: Any, epoch: int | None = None) -> None:  # type: ignore[override]
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(_EPOCH_DEPRECATION, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for i, group in enumerate(self.optimizer.param_groups):
                old = float(group["lr"])
                new = max(old * self.factor, self.min_lrs[i])
                if old - new > self.eps:
                    _set_lr(group, new)
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class PolynomialLR(LRScheduler):
    """Decays each lr by ``((1 - t / total_iters) / (1 - (t - 1) / total_iters)) ** power``
    per step until ``total_iters``: ``base_lr * (1 - t / total_iters) ** power`` in closed
    form."""

    def __init__(
        self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1
    ) -> None:
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch > self.total_iters:
            return [group["lr"] for group in groups]
        factor = (
            (1.0 - self.last_epoch / self.total_iters)
            / (1.0 - (self.last_epoch - 1) / self.total_iters)
        ) ** self.power
        return [group["lr"] * factor for group in groups]

    def _get_closed_form_lr(self) -> list[Any]:
        t = min(self.total_iters, self.last_epoch)
        return [base * (1.0 - t / self.total_iters) ** self.power for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from ``base_lr`` to ``eta_min`` over ``T_0`` epochs, restarting each
    period, each ``T_mult`` times longer than the last (SGDR, Loshchilov and Hutter).
    ``step(epoch)`` may take a fractional epoch."""

    def __init__(
        self,
        optimizer: Optimizer,
        T_0: int,  # noqa: N803  (PyTorch's argument names)
        T_mult: int = 1,  # noqa: N803
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if T_0 <= 0 or not isinstance(T_0, int):
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if T_mult < 1 or not isinstance(T_mult, int):
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min}")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        cosine = (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
        return [self.eta_min + (base - self.eta_min) * cosine for base in self.base_lrs]

    @opaque_method
    def step(self, epoch: float | None = None) -> None:  # type: ignore[override]
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur - self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult**n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult**n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._step_count = getattr(self, "_step_count", 0) + 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            _set_lr(group, lr)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class CyclicLR(LRScheduler):
    """The cyclical learning rate of Smith (2017): between ``base_lr`` and ``max_lr`` in
    cycles of ``step_size_up + step_size_down`` iterations (``triangular``,
    ``triangular2``: halved amplitude each cycle, ``exp_range``: scaled by ``gamma ** t``, or
    a custom ``scale_fn``); with ``cycle_momentum`` the momentum cycles the other way.  Steps
    after every batch."""

    def __init__(
        self,
        optimizer: Optimizer,
        base_lr: Any,
        max_lr: Any,
        step_size_up: int = 2000,
        step_size_down: int | None = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_fn: Callable[[float], float] | None = None,
        scale_mode: str = "cycle",
        cycle_momentum: bool = True,
        base_momentum: Any = 0.8,
        max_momentum: Any = 0.9,
        last_epoch: int = -1,
    ) -> None:
        _check_optimizer(optimizer)
        base_lrs = _per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                _set_lr(group, lr)
        self.max_lrs = _per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = (
            scale_mode
            if scale_fn is not None
            else ("cycle" if mode in ("triangular", "triangular2") else "iterations")
        )
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(
                    "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for m, group in zip(self.max_momentums, optimizer.param_groups):
                    if self.use_beta1:
                        group["betas"] = (m, *group["betas"][1:])
                    else:
                        group["momentum"] = m
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x: float) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma**x

    def get_lr(self) -> list[Any]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        factor = self.scale_fn(at)
        lrs = [
            base + (peak - base) * scale * factor for base, peak in zip(self.base_lrs, self.max_lrs)
        ]
        if self.cycle_momentum:
            momenta = [
                top - (top - low) * scale * factor
                for low, top in zip(self.base_momentums, self.max_momentums)
            ]
            for group, m in zip(self.optimizer.param_groups, momenta):
                if self.use_beta1:
                    group["betas"] = (m, *group["betas"][1:])
                else:
                    group["momentum"] = m
        return lrs

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("_scale_fn_custom", None)  # (a function: not saved, as in PyTorch)
        return state


class ChainedScheduler(LRScheduler):
    """Several schedulers stepped together: each ``step()`` steps every one of them in order
    (their factors multiply)."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None):
        if len(schedulers) < 1:
            raise ValueError(
                f"{type(self).__name__} expects at least one scheduler to be chained, but got no "
                "scheduler."
            )
        optimizer = optimizer or schedulers[0].optimizer
        for i, scheduler in enumerate(schedulers):
            if scheduler.optimizer is not optimizer:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong to the same "
                    f"optimizer, but got scheduler {type(scheduler).__name__} at index {i} "
                    "attached to another optimizer"
                )
        self._schedulers = list(schedulers)
        self.optimizer = optimizer
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    @opaque_method
    def step(self) -> None:  # type: ignore[override]
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        saved = state.pop("_schedulers")
        self.__dict__.update(state)
        for scheduler, s in zip(self._schedulers, saved):
            scheduler.load_state_dict(s)
