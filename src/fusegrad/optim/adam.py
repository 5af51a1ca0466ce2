"""``Adam`` and ``AdamW``: adaptive moment estimation, PyTorch's update rule.

Per parameter (``torch.optim.Adam``, single-tensor path), with t the step count:

    g = grad (negated if maximize)
    Adam:  g = g + weight_decay * p          AdamW: p *= 1 - lr * weight_decay (decoupled)
    m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
    v_hat = max(v_hat, v) if amsgrad else v
    p -= lr / (1 - beta1^t) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)

State per parameter: ``step`` (a 0-d float32 tensor, as PyTorch stores it), ``exp_avg``,
``exp_avg_sq`` and, with amsgrad, ``max_exp_avg_sq``; all updated in place under ``no_grad``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros, zeros_like
from ..ops.generated import maximum
from ..storage import to_host
from . import _foreach
from .optimizer import Optimizer, check_options, hyper


class Adam(Optimizer):
    # a whole-step compile records the update (tensor ops only; lr and the bias corrections
    # through ``hyper``) when every group takes the per-parameter path, else replays step()
    # after the program
    traceable = property(_foreach.records_per_parameter)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        check_options(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        if differentiable:
            raise NotImplementedError(
                f"{type(self).__name__}: differentiable=True is not supported"
            )
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults)
        _foreach.check_options(foreach, fused)

    def _init_state(self, p: Any, amsgrad: bool) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = zeros((), dtype=_dt.float32)
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if amsgrad:
                state["max_exp_avg_sq"] = zeros_like(p)
        elif amsgrad and "max_exp_avg_sq" not in state:
            # amsgrad switched on after some steps (e.g. via a loaded state dict)
            state["max_exp_avg_sq"] = zeros_like(p)
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
        weight_decay = group["weight_decay"]
        amsgrad = group["amsgrad"]
        g = -p.grad if group["maximize"] else p.grad
        state = self._init_state(p, amsgrad)
        step_t = state["step"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        step_t.add_(1)
        if weight_decay != 0:
            if group.get("decoupled_weight_decay", False):
                p.mul_(_scalar(_decay, group, step_t))
            else:
                g = g.add(p, alpha=_option(_weight_decay, group))
        exp_avg.lerp_(g, _option(_one_minus_beta1, group))
        exp_avg_sq.mul_(_option(_beta2, group)).addcmul_(
            g, g, value=_option(_one_minus_beta2, group)
        )
        if amsgrad:
            max_sq = state["max_exp_avg_sq"]
            max_sq.copy_(maximum(max_sq, exp_avg_sq))
            second = max_sq
        else:
            second = exp_avg_sq
        denom = (second.sqrt() / _scalar(_bc2_sqrt, group, step_t)).add_(_option(_eps, group))
        p.addcdiv_(exp_avg, denom, value=_scalar(_neg_step_size, group, step_t))

    def _multi_tensor(self, group: dict[str, Any], dtype: Any, params: list) -> list:
        """The multi-tensor update of ``params`` (one dtype, each with a gradient); returns
        those whose state the kernel cannot take (left to ``_update``)."""
        amsgrad = group["amsgrad"]
        rows, scalars, left = [], [], []
        by_count: dict[float, tuple] = {}
        for p in params:
            state = self._init_state(p, amsgrad)
            buffers = [state["exp_avg"], state["exp_avg_sq"]]
            if amsgrad:
                buffers.append(state["max_exp_avg_sq"])
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
                    _one_minus_beta2(group),
                    _eps(group),
                    _decay(group, count),
                    _bc2_sqrt(group, count),
                    _neg_step_size(group, count),
                )
            rows.append([p, p.grad, state["step"], *buffers])
            scalars.append(values)
        if rows:
            left += _foreach.launch(
                self,
                group,
                _foreach.kernel("adam"),
                rows,
                scalars,
                dtype,
                group["maximize"],
                group["weight_decay"] != 0,
                bool(group.get("decoupled_weight_decay", False)),
                bool(amsgrad),
            )
        return left


def _count(step_t: Any) -> float:
    """The stored step count (the optimizer's own state, read without notifying a tracer)."""
    return float(to_host(step_t._data).reshape(()))


def _option(fn: Callable[[dict], float], group: dict) -> Any:
    """``fn(group)``, an option of this step, through ``hyper`` (read again on a replay; one
    runtime input per group)."""
    return hyper(fn(group), lambda: fn(group), key=(id(group), fn))


def _scalar(fn: Callable[[dict, float], float], group: dict, step_t: Any) -> Any:
    """``fn(group, step)`` for this step (its count already incremented), through ``hyper``:
    a replayed step recomputes it before that step's tensor updates, so from the stored count
    plus this step's increment."""
    count = _count(step_t)
    # one runtime input per group, function and count: parameters updated together keep equal
    # counts (each replay adds one to every count it read), so their scalars are equal
    return hyper(fn(group, count), lambda: fn(group, _count(step_t) + 1), (id(group), fn, count))


# the update's scalars that may change between steps (the learning rate and what depends on
# it, bias corrections; betas, eps and weight decay, which a schedule may change too)
def _weight_decay(group: dict) -> float:
    return group["weight_decay"]


def _one_minus_beta1(group: dict) -> float:
    return 1 - group["betas"][0]


def _beta2(group: dict) -> float:
    return group["betas"][1]


def _one_minus_beta2(group: dict) -> float:
    return 1 - group["betas"][1]


def _eps(group: dict) -> float:
    return group["eps"]


def _decay(group: dict, step: float) -> float:
    return 1 - group["lr"] * group["weight_decay"]


def _bc2_sqrt(group: dict, step: float) -> float:
    return math.sqrt(1 - group["betas"][1] ** step)


def _neg_step_size(group: dict, step: float) -> float:
    return -(group["lr"] / (1 - group["betas"][0] ** step))


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); ``weight_decay`` defaults to 1e-2."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )
