"""``Adamax``: Adam with the infinity norm in place of the second moment, PyTorch's rule.

Per parameter (``torch.optim.Adamax``, single-tensor path), with t the step count:

    g = grad (negated if maximize) + weight_decay * p
    m = lerp(m, g, 1 - beta1)
    u = max(beta2 * u, |g| + eps)
    p -= lr / (1 - beta1^t) * m / u

State per parameter: ``step`` (a 0-d float32 tensor), ``exp_avg`` (m) and ``exp_inf`` (u), made
at the first step that sees a gradient; options and the bias correction through ``hyper``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros, zeros_like
from ..ops.generated import maximum
from . import _foreach
from .adam import _option, _scalar
from .optimizer import Optimizer, check_differentiable, check_options


class Adamax(Optimizer):
    # a whole-step compile records the update (tensor ops only; options and the bias
    # correction through ``hyper``) when every group takes the per-parameter path, else
    # replays step() after the program
    traceable = property(_foreach.records_per_parameter)

    def __init__(
        self,
        params: Any,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        check_options(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
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
            for p in _foreach.updated(self, group, self._multi_tensor):
                self._update(group, p)
        return loss

    def _init_state(self, p: Any) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = zeros((), dtype=_dt.float32)
            state["exp_avg"] = zeros_like(p)
            state["exp_inf"] = zeros_like(p)
        return state

    def _update(self, group: dict[str, Any], p: Any) -> None:
        """The per-parameter update of ``p`` (the for-loop path; what a tracer records)."""
        g = -p.grad if group["maximize"] else p.grad
        state = self._init_state(p)
        step_t, exp_avg, exp_inf = state["step"], state["exp_avg"], state["exp_inf"]
        step_t.add_(1)
        if group["weight_decay"] != 0:
            g = g.add(p, alpha=_option(_weight_decay, group))
        exp_avg.lerp_(g, _option(_one_minus_beta1, group))
        exp_inf.copy_(
            maximum(exp_inf.mul_(_option(_beta2, group)), g.abs().add_(_option(_eps, group)))
        )
        p.addcdiv_(exp_avg, exp_inf, value=_scalar(_neg_step_size, group, step_t))

    def _multi_tensor(self, group: dict[str, Any], dtype: Any, params: list) -> list:
        """The multi-tensor update of ``params`` (one dtype, each with a gradient); returns
        those the kernel cannot take (left to ``_update``)."""
        rows, scalars, left = [], [], []
        by_count: dict[float, tuple] = {}
        for p in params:
            state = self._init_state(p)
            count = _foreach.next_count(state["step"])
            if count is None:
                left.append(p)
                continue
            values = by_count.get(count)
            if values is None:
                values = by_count[count] = (
                    _weight_decay(group),
                    _one_minus_beta1(group),
                    _beta2(group),
                    _eps(group),
                    _neg_step_size(group, count),
                )
            rows.append([p, p.grad, state["step"], state["exp_avg"], state["exp_inf"]])
            scalars.append(values)
        left += _foreach.launch(
            self,
            group,
            _foreach.kernel("adamax"),
            rows,
            scalars,
            dtype,
            group["maximize"],
            group["weight_decay"] != 0,
        )
        return left


# the options a recorded step reads on every call (``hyper``): a schedule may change them
def _weight_decay(group: dict) -> float:
    return group["weight_decay"]


def _one_minus_beta1(group: dict) -> float:
    return 1 - group["betas"][0]


def _beta2(group: dict) -> float:
    return group["betas"][1]


def _eps(group: dict) -> float:
    return group["eps"]


def _neg_step_size(group: dict, step: float) -> float:
    return -(group["lr"] / (1 - group["betas"][0] ** step))
