"""``RAdam``: rectified Adam (Liu et al.), PyTorch's update rule.

Per parameter (``torch.optim.RAdam``, single-tensor path), with t the step count: Adam's
moments; while the variance of the adaptive rate is intractable (``rho_t <= 5``, the first
steps) the step is SGD with momentum, ``p -= lr * m / (1 - beta1^t)``; after, Adam's step
times the rectification ``r_t``.  State: ``step`` (0-d float32), ``exp_avg``, ``exp_avg_sq``.

Which branch runs depends on the step count, so this optimizer is not recorded into a
whole-step compile (``traceable`` stays False): its ``step()`` is replayed as a call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros, zeros_like
from .adam import _count
from .optimizer import Optimizer, check_differentiable, check_options


class RAdam(Optimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_options(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "decoupled_weight_decay": decoupled_weight_decay,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            weight_decay = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = zeros((), dtype=_dt.float32)
                    state["exp_avg"] = zeros_like(p)
                    state["exp_avg_sq"] = zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"].add_(1)
                t = _count(state["step"])
                if weight_decay != 0:
                    if group["decoupled_weight_decay"]:
                        p.mul_(1 - lr * weight_decay)
                    else:
                        g = g.add(p, alpha=weight_decay)
                exp_avg.lerp_(g, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                bias_correction1 = 1 - beta1**t
                bias_correction2 = 1 - beta2**t
                corrected = exp_avg / bias_correction1
                # the length of the approximated simple moving average, and its limit
                rho_inf = 2 / (1 - beta2) - 1
                rho_t = rho_inf - 2 * t * (beta2**t) / bias_correction2
                if rho_t > 5.0:
                    rect = math.sqrt(
                        (rho_t - 4)
                        * (rho_t - 2)
                        * rho_inf
                        / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
                    )
                    adaptive = math.sqrt(bias_correction2) / exp_avg_sq.sqrt().add_(eps)
                    p.add_(corrected * lr * adaptive * rect, alpha=-1.0)
                else:
                    p.add_(corrected * lr, alpha=-1.0)
        return loss
