"""``RMSprop``: gradients scaled by a running root mean square, PyTorch's update rule.

Per parameter (``torch.optim.RMSprop``, single-tensor path):

    g = grad (negated if maximize) + weight_decay * p
    v = alpha * v + (1 - alpha) * g * g
    centered:  a = lerp(a, g, 1 - alpha);  root = sqrt(v - a * a) + eps
    otherwise: root = sqrt(v) + eps
    momentum > 0:  buf = momentum * buf + g / root;  p -= lr * buf
    otherwise:     p -= lr * g / root

State per parameter: ``step`` (a 0-d float32 tensor), ``square_avg``, ``momentum_buffer`` when
momentum > 0 and ``grad_avg`` when centered; all made at the first step that sees a gradient
and updated in place under ``no_grad``.  Every option is read through ``hyper``, so a
whole-step compile records the update once and a schedule may change them between calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros, zeros_like
from . import _foreach
from .adam import _option
from .optimizer import Optimizer, check_differentiable, check_options, missing_state


class RMSprop(Optimizer):
    # a whole-step compile records the update (tensor ops only; every option through ``hyper``)
    # when every group takes the per-parameter path, else replays step() after the program
    traceable = property(_foreach.records_per_parameter)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_options(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "alpha": alpha,
            "eps": eps,
            "centered": centered,
            "weight_decay": weight_decay,
            "capturable": capturable,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _state_keys(group: dict[str, Any]) -> tuple[str, ...]:
        keys = ("step", "square_avg")
        if group["momentum"] > 0:
            keys += ("momentum_buffer",)
        if group["centered"]:
            keys += ("grad_avg",)
        return keys

    def state_pending(self) -> Any:
        """A parameter missing one of the buffers its group's options need (a momentum or
        ``centered`` switched on after the first step makes its buffer then, as a first step
        does)."""
        return missing_state(self, self._state_keys)

    def _init_state(self, p: Any, group: dict[str, Any]) -> dict[str, Any]:
        state = self.state[p]
        if "step" not in state:
            state["step"] = zeros((), dtype=_dt.float32)
        for key in self._state_keys(group)[1:]:
            if key not in state:
                state[key] = zeros_like(p)
        return state

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            for p in _foreach.updated(self, group, self._multi_tensor):
                self._update(group, p)
        return loss

    def _update(self, group: dict[str, Any], p: Any) -> None:
        """The per-parameter update of ``p`` (the for-loop path; what a tracer records)."""
        g = -p.grad if group["maximize"] else p.grad
        state = self._init_state(p, group)
        state["step"].add_(1)
        if group["weight_decay"] != 0:
            g = g.add(p, alpha=_option(_weight_decay, group))
        square_avg = state["square_avg"]
        square_avg.mul_(_option(_alpha, group)).addcmul_(
            g, g, value=_option(_one_minus_alpha, group)
        )
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.lerp_(g, _option(_one_minus_alpha, group))
            root = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            root = square_avg.sqrt()
        root = root.add_(_option(_eps, group))
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf.mul_(_option(_momentum, group)).addcdiv_(g, root)
            p.add_(buf, alpha=_option(_neg_lr, group))
        else:
            p.addcdiv_(g, root, value=_option(_neg_lr, group))

    def _multi_tensor(self, group: dict[str, Any], dtype: Any, params: list) -> list:
        """The multi-tensor update of ``params`` (one dtype, each with a gradient); returns
        those whose state the kernel cannot take (left to ``_update``)."""
        keys = self._state_keys(group)[1:]  # square_avg[, momentum_buffer][, grad_avg]
        values = (
            _weight_decay(group),
            _alpha(group),
            _one_minus_alpha(group),
            _eps(group),
            _momentum(group),
            _neg_lr(group),
            -1,  # centered: ``addcmul(..., value=-1)``
            1,  # momentum: ``addcdiv``'s value
        )
        rows, left = [], []
        for p in params:
            state = self._init_state(p, group)
            buffers = [state[k] for k in keys]
            count = _foreach.next_count(state["step"])
            if count is None:
                left.append(p)
                continue
            rows.append([p, p.grad, state["step"], *buffers])
        if rows:
            left += _foreach.launch(
                self,
                group,
                _foreach.kernel("rmsprop"),
                rows,
                [values] * len(rows),
                dtype,
                group["maximize"],
                group["weight_decay"] != 0,
                bool(group["centered"]),
                group["momentum"] > 0,
            )
        return left


# the options a recorded step reads on every call (``hyper``): a schedule may change them
def _weight_decay(group: dict) -> float:
    return group["weight_decay"]


def _alpha(group: dict) -> float:
    return group["alpha"]


def _one_minus_alpha(group: dict) -> float:
    return 1 - group["alpha"]


def _eps(group: dict) -> float:
    return group["eps"]


def _momentum(group: dict) -> float:
    return group["momentum"]


def _neg_lr(group: dict) -> float:
    return -group["lr"]
