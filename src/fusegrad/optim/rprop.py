"""``Rprop``: resilient backpropagation, PyTorch's update rule.

Per parameter (``torch.optim.Rprop``, single-tensor path): each element keeps its own step
size, grown by ``etas[1]`` while its gradient keeps its sign and shrunk by ``etas[0]`` when the
sign flips (then that element skips this step), clamped to ``step_sizes``; the parameter moves
by ``-sign(g) * step_size``.  State: ``step`` (a 0-d float32 tensor), ``prev`` (the last
gradient used) and ``step_size`` (starting at ``lr``).  The update is tensor ops with the
``etas`` and ``step_sizes`` as constants (the guard of a whole-step compile holds them), so it
is recorded into a compiled step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import full_like, zeros, zeros_like
from ..ops.elementwise import sign, where
from .optimizer import Optimizer, OptimizerError, check_differentiable


class Rprop(Optimizer):
    traceable = True  # (tensor ops only; lr is read once, when the state is made)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        if not 0.0 <= lr:
            raise OptimizerError(f"Invalid learning rate: {lr}")
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise OptimizerError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        check_differentiable(self, differentiable)
        defaults = {
            "lr": lr,
            "etas": etas,
            "step_sizes": step_sizes,
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
            eta_minus, eta_plus = group["etas"]
            smallest, largest = group["step_sizes"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = zeros((), dtype=_dt.float32)
                    state["prev"] = zeros_like(p)
                    state["step_size"] = full_like(g, group["lr"])
                state["step"].add_(1)
                prev, step_size = state["prev"], state["step_size"]
                agreement = sign(g * prev)
                # (the factors in the gradient's dtype: Python numbers alone would be float32)
                factor = where(
                    agreement > 0,
                    full_like(g, eta_plus),
                    where(agreement < 0, full_like(g, eta_minus), full_like(g, 1.0)),
                )
                step_size.mul_(factor).clamp_(smallest, largest)
                g = where(agreement < 0, 0.0, g)  # a sign flip: no step for that element now
                p.addcmul_(sign(g), step_size, value=-1)
                prev.copy_(g)
        return loss
