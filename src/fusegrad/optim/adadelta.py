"""``Adadelta``: steps scaled by the ratio of running RMS of updates and of gradients,
PyTorch's update rule (``torch.optim.Adadelta``, single-tensor path):

    g = grad (negated if maximize) + weight_decay * p
    v = rho * v + (1 - rho) * g * g
    delta = sqrt(u + eps) / sqrt(v + eps) * g
    u = rho * u + (1 - rho) * delta * delta
    p -= lr * delta

State per parameter: ``step`` (a 0-d float32 tensor), ``square_avg`` (v) and ``acc_delta`` (u),
made at the first step that sees a gradient and updated in place under ``no_grad``; options
through ``hyper`` so a whole-step compile records the update once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros, zeros_like
from . import _foreach
from .adam import _option
from .optimizer import Optimizer, OptimizerError, check_differentiable, check_options


class Adadelta(Optimizer):
    # a whole-step compile records the update (tensor ops only; every option through ``hyper``)
    # when every group takes the per-parameter path, else replays step() after the program
    traceable = property(_foreach.records_per_parameter)

    def __init__(
        self,
        params: Any,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        if not 0.0 <= lr:
            raise OptimizerError(f"Invalid learning rate: {lr}")
        if not 0.0 <= rho <= 1.0:
            raise OptimizerError(f"Invalid rho value: {rho}")
        check_options(eps=eps, weight_decay=weight_decay)
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "rho": rho,
            "eps": eps,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "capturable": capturable,
            "foreach": foreach,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            for p in _foreach.updated(self, group, self._multi_tensor):
                self._update(group, p)
        return loss

    def _init_state(self, p: Any) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = zeros((), dtype=_dt.float32)
            state["square_avg"] = zeros_like(p)
            state["acc_delta"] = zeros_like(p)
        return state

    def _update(self, group: dict[str, Any], p: Any) -> None:
        """The per-parameter update of ``p`` (the for-loop path; what a tracer records)."""
        g = -p.grad if group["maximize"] else p.grad
        state = self._init_state(p)
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        state["step"].add_(1)
        if group["weight_decay"] != 0:
            g = g.add(p, alpha=_option(_weight_decay, group))
        rho = _option(_rho, group)
        one_minus_rho = _option(_one_minus_rho, group)
        eps = _option(_eps, group)
        square_avg.mul_(rho).addcmul_(g, g, value=one_minus_rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_().div_(std).mul_(g)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=one_minus_rho)
        p.add_(delta, alpha=_option(_neg_lr, group))

    def _multi_tensor(self, group: dict[str, Any], dtype: Any, params: list) -> list:
        """The multi-tensor update of ``params`` (one dtype, each with a gradient); returns
        those whose state the kernel cannot take (left to ``_update``)."""
        values = (
            _weight_decay(group),
            _rho(group),
            _one_minus_rho(group),
            _eps(group),
            _neg_lr(group),
        )
        rows, left = [], []
        for p in params:
            state = self._init_state(p)
            buffers = [state["square_avg"], state["acc_delta"]]
            count = _foreach.next_count(state["step"])
            if count is None:
                left.append(p)
                continue
            rows.append([p, p.grad, state["step"], *buffers])
        if rows:
            left += _foreach.launch(
                self,
                group,
                _foreach.kernel("adadelta"),
                rows,
                [values] * len(rows),
                dtype,
                group["maximize"],
                group["weight_decay"] != 0,
            )
        return left


# the options a recorded step reads on every call (``hyper``): a schedule may change them
def _weight_decay(group: dict) -> float:
    return group["weight_decay"]


def _rho(group: dict) -> float:
    return group["rho"]


def _one_minus_rho(group: dict) -> float:
    return 1 - group["rho"]


def _eps(group: dict) -> float:
    return group["eps"]


def _neg_lr(group: dict) -> float:
    return -group["lr"]
