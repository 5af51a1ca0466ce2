"""``ASGD``: averaged stochastic gradient descent (Polyak & Juditsky), PyTorch's update rule.

Per parameter (``torch.optim.ASGD``, single-tensor path), with t the step count:

    g = grad (negated if maximize) + weight_decay * p
    p = p * (1 - lambd * eta) - eta * g
    ax = p while mu == 1, else ax + mu * (p - ax)      (the running average of the iterates)
    eta = lr / (1 + lambd * lr * t)^alpha;  mu = 1 / max(1, t - t0)

State: ``step``, ``eta`` and ``mu`` (0-d float32 tensors, as PyTorch keeps them) and ``ax``.
The step reads ``eta`` and ``mu`` as numbers, so it is not recorded into a whole-step compile
(``traceable`` stays False): its ``step()`` is replayed as a call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import ones, tensor, zeros, zeros_like
from .adam import _count
from .optimizer import Optimizer, check_differentiable, check_options


class ASGD(Optimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        check_options(lr=lr, weight_decay=weight_decay)
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "lambd": lambd,
            "alpha": alpha,
            "t0": t0,
            "weight_decay": weight_decay,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
            "capturable": capturable,
        }
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            lr, lambd, alpha, t0 = group["lr"], group["lambd"], group["alpha"], group["t0"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = zeros((), dtype=_dt.float32)
                    state["eta"] = tensor(lr, dtype=_dt.float32)
                    state["mu"] = ones((), dtype=_dt.float32)
                    state["ax"] = zeros_like(p)
                eta, mu, ax = state["eta"], state["mu"], state["ax"]
                state["step"].add_(1)
                if group["weight_decay"] != 0:
                    g = g.add(p, alpha=group["weight_decay"])
                eta_value = _count(eta)
                p.mul_(1 - lambd * eta_value)
                p.add_(g, alpha=-eta_value)
                if _count(mu) != 1:
                    ax.add_(p.sub(ax).mul_(mu))
                else:
                    ax.copy_(p)
                t = _count(state["step"])
                # PyTorch stores the new values through a tensor of the default dtype (float32),
                # also into a float64 eta or mu (as load_state_dict casts them)
                rounded = _dt.get_default_dtype().np.type
                eta.fill_(float(rounded(lr / ((1 + lambd * lr * t) ** alpha))))
                mu.fill_(float(rounded(1 / max(1, t - t0))))
        return loss
