"""``Adagrad``: per-element learning rates from the sum of squared gradients, PyTorch's rule.

Per parameter (``torch.optim.Adagrad``, single-tensor path), with t the step count:

    g = grad (negated if maximize) + weight_decay * p
    clr = lr / (1 + (t - 1) * lr_decay)
    sum += g * g
    p -= clr * g / (sqrt(sum) + eps)

State per parameter: ``step`` (a 0-d float32 tensor) and ``sum`` (filled with
``initial_accumulator_value``).  As in PyTorch the constructor makes it for every parameter,
so even the first ``step`` of a whole-step compile is recorded; a group added later gets its
state at its first step (PyTorch would fail there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import full_like, zeros
from . import _foreach
from .adam import _option, _scalar
from .optimizer import Optimizer, OptimizerError, check_differentiable, check_options, missing_state


class Adagrad(Optimizer):
    # a whole-step compile records the update (tensor ops only; options and the decayed rate
    # through ``hyper``) when every group takes the per-parameter path, else replays step()
    # after the program
    traceable = property(_foreach.records_per_parameter)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        check_options(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay)
        if not 0.0 <= initial_accumulator_value:
            raise OptimizerError(
                f"Invalid initial_accumulator_value value: {initial_accumulator_value}"
            )
        if not 0.0 <= eps:
            raise OptimizerError(f"Invalid epsilon value: {eps}")
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "eps": eps,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
            "fused": fused,
        }
        super().__init__(params, defaults)
        _foreach.check_options(foreach, fused)
        # PyTorch makes the state here, filled with the constructor's value (not a group's)
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, initial_accumulator_value)

    def _init_state(self, p: Any, initial_value: float) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = zeros((), dtype=_dt.float32)
            state["sum"] = full_like(p, initial_value)
        return state

    def state_pending(self) -> Any:
        """A parameter of a group added after construction, before its first step."""
        return missing_state(self, lambda group: ("step", "sum"))

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
        state = self._init_state(p, group["initial_accumulator_value"])
        step_t, state_sum = state["step"], state["sum"]
        step_t.add_(1)
        if group["weight_decay"] != 0:
            g = g.add(p, alpha=_option(_weight_decay, group))
        state_sum.addcmul_(g, g, value=1)
        std = state_sum.sqrt().add_(_option(_eps, group))
        p.addcdiv_(g, std, value=_scalar(_neg_clr, group, step_t))

    def _multi_tensor(self, group: dict[str, Any], dtype: Any, params: list) -> list:
        """The multi-tensor update of ``params`` (one dtype, each with a gradient); returns
        those whose state the kernel cannot take (left to ``_update``)."""
        rows, scalars, left = [], [], []
        by_count: dict[float, tuple] = {}
        for p in params:
            state = self._init_state(p, group["initial_accumulator_value"])
            count = _foreach.next_count(state["step"])
            if count is None:
                left.append(p)
                continue
            values = by_count.get(count)
            if values is None:
                values = by_count[count] = (
                    _weight_decay(group),
                    _eps(group),
                    _neg_clr(group, count),
                    1,  # ``addcmul``'s value
                )
            rows.append([p, p.grad, state["step"], state["sum"]])
            scalars.append(values)
        if rows:
            left += _foreach.launch(
                self,
                group,
                _foreach.kernel("adagrad"),
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


def _eps(group: dict) -> float:
    return group["eps"]


def _neg_clr(group: dict, step: float) -> float:
    return -(group["lr"] / (1 + (step - 1) * group["lr_decay"]))
