"""``SGD``: stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

The update is PyTorch's (``torch.optim.SGD``, single-tensor path), written with in-place
Tensor methods under ``no_grad``:

    g = grad (negated if maximize) + weight_decay * p
    buf = g                                   (first step)
    buf = momentum * buf + (1 - dampening) * g (later steps)
    g = g + momentum * buf if nesterov else buf
    p -= lr * g
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros_like
from . import _foreach
from .optimizer import Optimizer, OptimizerError, hyper


class SGD(Optimizer):
    # a whole-step compile records the update (tensor ops only; the learning rate through ``hyper``)
    # when every group takes the per-parameter path, else replays step() after the program
    traceable = property(_foreach.records_per_parameter)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        if lr < 0.0:
            raise OptimizerError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise OptimizerError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise OptimizerError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise OptimizerError("Nesterov momentum requires a momentum and zero dampening")
        if differentiable:
            raise NotImplementedError("SGD: differentiable=True is not supported")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": differentiable,
            "fused": fused,
        }
        super().__init__(params, defaults)
        _foreach.check_options(foreach, fused)

    def state_pending(self) -> Any:
        """Only momentum keeps state (``momentum_buffer``)."""
        for group in self.param_groups:
            if group["momentum"] != 0:
                for p in group["params"]:
                    if p.requires_grad and "momentum_buffer" not in self.state.get(p, {}):
                        return p
        return None

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
        momentum = group["momentum"]
        weight_decay = group["weight_decay"]
        g = p.grad
        if group["maximize"]:
            g = -g
        if weight_decay != 0:
            g = g.add(
                p, alpha=hyper(weight_decay, _option(group, "weight_decay"), (id(group), "wd"))
            )
        if momentum != 0:
            state = self.state[p]
            buf = state.get("momentum_buffer")
            m = hyper(momentum, _option(group, "momentum"), (id(group), "momentum"))
            if buf is None:
                # a copy: the buffer must not alias p.grad, which the user zeroes
                buf = g.clone().detach()
                state["momentum_buffer"] = buf
            else:
                buf.mul_(m).add_(
                    g, alpha=hyper(1 - group["dampening"], _damp(group), (id(group), "damp"))
                )
            g = g.add(buf, alpha=m) if group["nesterov"] else buf
        p.add_(g, alpha=hyper(-group["lr"], _neg_lr(group), (id(group), "-lr")))

    def _multi_tensor(self, group: dict[str, Any], dtype: Any, params: list) -> list:
        """The multi-tensor update of ``params`` (one dtype, each with a gradient); returns
        those the kernel cannot take (left to ``_update``)."""
        momentum = group["momentum"]
        options = (group["weight_decay"], momentum, 1 - group["dampening"], -group["lr"])
        rows, scalars, made = [], [], []
        for p in params:
            if momentum == 0:
                rows.append([p, p.grad])
                scalars.append((*options, 0))
                continue
            state = self.state[p]
            buf = state.get("momentum_buffer")
            new = buf is None
            if new:
                # made here, filled by the kernel with this step's gradient (a copy, as the
                # per-parameter path's clone)
                state["momentum_buffer"] = buf = zeros_like(p)
                made.append(p)
            rows.append([p, p.grad, buf])
            scalars.append((*options, 1 if new else 0))
        left = _foreach.launch(
            self,
            group,
            _foreach.kernel("sgd"),
            rows,
            scalars,
            dtype,
            group["maximize"],
            group["weight_decay"] != 0,
            momentum != 0,
            bool(group["nesterov"]),
            counted=False,
        )
        made_ids = {id(p) for p in made}
        for p in left:
            if id(p) in made_ids:
                del self.state[p]["momentum_buffer"]  # the per-parameter path makes it
        return left


# the options a recorded step reads on every call (``hyper``): a schedule may change them
def _neg_lr(group: dict) -> Callable[[], float]:
    return lambda: -group["lr"]


def _option(group: dict, name: str) -> Callable[[], float]:
    return lambda: group[name]


def _damp(group: dict) -> Callable[[], float]:
    return lambda: 1 - group["dampening"]
