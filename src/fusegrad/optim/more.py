"""``Adafactor``, ``SparseAdam`` and ``Muon``: PyTorch's rules, per parameter.

* ``Adafactor`` (Shazeer and Stern, 2018, as ``torch.optim.Adafactor``): the second moment of a
  matrix (of each matrix of a batch of them) kept as row and column means, a relative step
  size ``max(eps2, rms(p)) * min(lr, 1 / sqrt(t))``, the update clipped to RMS ``d``.
* ``SparseAdam``: lazy Adam, which moves the moments and the parameter only where the gradient
  has entries.  fusegrad's gradients are dense: an entry (a slice along dim 0, an embedding
  row, for a matrix) is present when the gradient is not all zero there, which is what the
  sparse gradient of an ``Embedding`` holds except for rows looked up whose gradient is exactly
  zero (PyTorch moves those too).
* ``Muon`` (Jordan et al., 2024): momentum, then each 2-D update orthogonalised by a quintic
  Newton-Schulz iteration (in bfloat16 when ``ml_dtypes`` is installed, as PyTorch's, float32
  otherwise) and scaled by ``sqrt(max(1, rows / cols))`` (``adjust_lr_fn``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..ops.creation import zeros, zeros_like
from .optimizer import Optimizer, OptimizerError, check_options

__all__ = ["Adafactor", "Muon", "SparseAdam"]


def _finfo_eps(dtype: Any) -> float:
    return float(np.finfo(dtype.np).eps)


class Adafactor(Optimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        beta2_decay: float = -0.8,
        eps: tuple[float | None, float] = (None, 1e-3),
        d: float = 1.0,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
    ) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 >= beta2_decay:
            raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not 0.0 <= eps[0]:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not 0.0 <= eps[1]:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not 1.0 <= d:
            raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")
        defaults = {
            "lr": lr,
            "beta2_decay": beta2_decay,
            "eps": eps,
            "d": d,
            "weight_decay": weight_decay,
            "foreach": foreach,
            "maximize": maximize,
        }
        super().__init__(params, defaults)

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for group, p, g, state in self.gradients():
            if not state:
                state["step"] = zeros((), dtype=_dt.float32)
                if g.dim() > 1:
                    state["row_var"] = zeros(*g.shape[:-1], 1, dtype=g.dtype, device=g.device)
                    row = list(g.shape)
                    row[-2] = 1
                    state["col_var"] = zeros(*row, dtype=g.dtype, device=g.device)
                else:
                    state["variance"] = zeros_like(g)
            eps1, eps2 = group["eps"]
            if eps1 is None:
                eps1 = _finfo_eps(p.dtype)
            lr = group["lr"]
            state["step"].add_(1)
            t = float(state["step"].item())
            one_minus_beta2 = t ** group["beta2_decay"]
            rho = min(lr, 1 / t**0.5)
            alpha = max(eps2, p.norm(2).item() / p.numel() ** 0.5) * rho
            if group["weight_decay"] != 0:
                p.mul_(1 - lr * group["weight_decay"])
            if g.dim() > 1:
                row_var, col_var = state["row_var"], state["col_var"]
                row_var.lerp_((g * g).mean(-1, keepdim=True), one_minus_beta2)
                col_var.lerp_((g * g).mean(-2, keepdim=True), one_minus_beta2)
                estimate = (row_var @ col_var) / row_var.mean(-2, keepdim=True).clamp(min=eps1)
            else:
                state["variance"].lerp_(g * g, one_minus_beta2)
                estimate = state["variance"].clone()
            update = estimate.clamp(min=eps1 * eps1).rsqrt() * g
            denom = max(1.0, update.norm(2).item() / (update.numel() ** 0.5 * group["d"]))
            p.add_(update, alpha=-alpha / denom)
        return loss


class SparseAdam(Optimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        maximize: bool = False,
    ) -> None:
        check_options(lr=lr, eps=eps, betas=betas)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "maximize": maximize})

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Adam on the gradient's present entries only (see the module docstring)."""
        loss = self._evaluate_closure(closure)
        for group, p, g, state in self.gradients():
            if not state:
                state["step"] = 0
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
            state["step"] += 1
            beta1, beta2 = group["betas"]
            # the present entries: slices along dim 0 where the gradient is not all zero
            present = g != 0 if g.dim() < 2 else (g != 0).flatten(1).any(1)
            if g.dim() >= 2:
                present = present.reshape(-1, *([1] * (g.dim() - 1)))
            mask = present.to(p.dtype)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.add_((g - exp_avg) * (1 - beta1) * mask)
            exp_avg_sq.add_((g * g - exp_avg_sq) * (1 - beta2) * mask)
            bias1 = 1 - beta1 ** state["step"]
            bias2 = 1 - beta2 ** state["step"]
            step_size = group["lr"] * math.sqrt(bias2) / bias1
            p.add_(exp_avg / (exp_avg_sq.sqrt() + group["eps"]) * mask, alpha=-step_size)
        return loss


_NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)


def _orthogonalise(update: Any, coefficients: tuple, steps: int, eps: float) -> Any:
    """The quintic Newton-Schulz iteration towards ``U V^T`` of ``update = U S V^T``."""
    if steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if update.dim() != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = coefficients
    # computed in float32 and rounded to bfloat16 where PyTorch's bfloat16 ops round (each
    # matmul and fused multiply-add once)
    x = _bf16(update.float())
    tall = update.shape[0] > update.shape[1]
    if tall:
        x = x.T
    x = _bf16(x / _bf16(x.norm()).clamp(min=eps))
    for _ in range(steps):
        gram = _bf16(x @ x.T)
        poly = _bf16(gram * b + (gram @ gram) * c)
        x = _bf16(x * a + poly @ x)
    if tall:
        x = x.T
    return x


def _bf16(t: Any) -> Any:
    """``t`` (float32) rounded to bfloat16 and back (unchanged without ``ml_dtypes``)."""
    if _dt.bfloat16 is None:
        return t
    return t.to(_dt.bfloat16).float()


def _adjust_lr(lr: float, adjust_lr_fn: str | None, shape: Any) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class Muon(Optimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = _NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ) -> None:
        check_options(lr=lr, eps=eps, weight_decay=weight_decay)
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if adjust_lr_fn is not None and adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": ns_coefficients,
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "maximize": False,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise OptimizerError(
                        f"Muon only supports 2D parameters whereas we found a parameter with "
                        f"size: {tuple(p.shape)}"
                    )

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Momentum, orthogonalisation and a scaled step for every 2-D parameter."""
        loss = self._evaluate_closure(closure)
        for group, p, g, state in self.gradients():
            if not state:
                state["momentum_buffer"] = zeros_like(g)
            buf = state["momentum_buffer"]
            momentum = group["momentum"]
            buf.lerp_(g, 1 - momentum)
            update = g.lerp(buf, momentum) if group["nesterov"] else buf
            ortho = _orthogonalise(
                update, group["ns_coefficients"], group["ns_steps"], group["eps"]
            )
            lr = group["lr"]
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(ortho.to(p.dtype), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss
