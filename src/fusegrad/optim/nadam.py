"""``NAdam``: Adam with Nesterov momentum (Dozat), PyTorch's update rule.

Per parameter (``torch.optim.NAdam``, single-tensor path), with t the step count and
psi = ``momentum_decay``:

    g = grad (negated if maximize)
    g = g + weight_decay * p          decoupled_weight_decay: p *= 1 - lr * weight_decay
    mu_t = beta1 * (1 - 0.5 * 0.96^(t * psi));  mu_next = the same at t + 1
    mu_product *= mu_t                (a float32 0-d state tensor, as PyTorch keeps it)
    m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
    denom = sqrt(v / (1 - beta2^t)) + eps
    p -= lr * (1 - mu_t) / (1 - mu_product) * g / denom
    p -= lr * mu_next / (1 - mu_product * mu_next) * m / denom

State per parameter: ``step`` and ``mu_product`` (0-d float32 tensors), ``exp_avg`` (m),
``exp_avg_sq`` (v).  The scalars are ``hyper`` values; those that read ``mu_product`` are
recomputed on a replayed step from its stored value (rounded to float32 as the in-place product
rounds it), so a whole-step compile records the update once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import ones, zeros, zeros_like
from .adam import _count, _option, _scalar
from .optimizer import Optimizer, check_differentiable, check_options, hyper


class NAdam(Optimizer):
    traceable = True  # (tensor ops only; options and per-step scalars through ``hyper``)

    def __init__(
        self,
        params: Any,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_options(
            lr=lr, eps=eps, betas=betas, weight_decay=weight_decay, momentum_decay=momentum_decay
        )
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum_decay": momentum_decay,
            "decoupled_weight_decay": decoupled_weight_decay,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for group, p, g, state in self.gradients():
            if not state:
                state["step"] = zeros((), dtype=_dt.float32)
                state["mu_product"] = ones((), dtype=_dt.float32)
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
            step_t, mu_product = state["step"], state["mu_product"]
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            step_t.add_(1)
            if group["weight_decay"] != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(_option(_decay, group))
                else:
                    g = g.add(p, alpha=_option(_weight_decay, group))
            mu_product.mul_(_scalar(_mu, group, step_t))
            exp_avg.lerp_(g, _option(_one_minus_beta1, group))
            exp_avg_sq.mul_(_option(_beta2, group)).addcmul_(
                g, g, value=_option(_one_minus_beta2, group)
            )
            denom = (
                exp_avg_sq.div(_scalar(_bias_correction2, group, step_t))
                .sqrt()
                .add_(_option(_eps, group))
            )
            p.addcdiv_(g, denom, value=_product_scalar(_grad_coef, group, step_t, mu_product))
            p.addcdiv_(exp_avg, denom, value=_product_scalar(_avg_coef, group, step_t, mu_product))
        return loss


def _product_scalar(
    fn: Callable[[dict, float, float], float], group: dict, step_t: Any, mu_product: Any
) -> Any:
    """``fn(group, step, mu_product)`` for this step (count incremented, product updated), as
    a ``hyper`` value: a replay computes it before its tensor updates, from the stored count
    plus one and the stored product times that step's mu, rounded to the product's dtype as the
    in-place product on the state tensor rounds it."""
    count = _count(step_t)
    product = _count(mu_product)
    # float32 as made; a loaded state dict casts it to the parameter's dtype, as PyTorch's does
    rounded = mu_product.dtype.np.type

    def replay() -> float:
        next_count = _count(step_t) + 1
        mu = rounded(_mu(group, next_count))
        return fn(group, next_count, float(rounded(_count(mu_product)) * mu))

    return hyper(fn(group, count, product), replay, (id(group), fn, count, product))


# the update's scalars (``hyper``): options a schedule may change, and what the step count and
# the product of the momentum coefficients give
def _weight_decay(group: dict) -> float:
    return group["weight_decay"]


def _decay(group: dict) -> float:
    return 1 - group["lr"] * group["weight_decay"]


def _one_minus_beta1(group: dict) -> float:
    return 1 - group["betas"][0]


def _beta2(group: dict) -> float:
    return group["betas"][1]


def _one_minus_beta2(group: dict) -> float:
    return 1 - group["betas"][1]


def _eps(group: dict) -> float:
    return group["eps"]


def _mu(group: dict, step: float) -> float:
    return group["betas"][0] * (1.0 - 0.5 * 0.96 ** (step * group["momentum_decay"]))


def _bias_correction2(group: dict, step: float) -> float:
    return 1 - group["betas"][1] ** step


def _grad_coef(group: dict, step: float, mu_product: float) -> float:
    return -group["lr"] * (1.0 - _mu(group, step)) / (1.0 - mu_product)


def _avg_coef(group: dict, step: float, mu_product: float) -> float:
    mu_next = _mu(group, step + 1)
    return -group["lr"] * mu_next / (1.0 - mu_product * mu_next)
