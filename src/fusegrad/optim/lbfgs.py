"""``LBFGS``: limited-memory BFGS over all parameters as one flat vector, PyTorch's algorithm.

``step(closure)`` runs up to ``max_iter`` iterations.  Each one builds a search direction from
the last ``history_size`` curvature pairs (s = step taken, y = change of gradient) by the
two-loop recursion (Nocedal & Wright, Numerical Optimization, algorithm 7.4), then moves along
it: by a fixed step ``lr`` (the very first iteration scales it by ``min(1, 1/|g|_1)``), or
with ``line_search_fn="strong_wolfe"`` by a step satisfying the strong Wolfe conditions found by
bracketing and cubic-interpolation zoom (algorithms 3.5 and 3.6).  It stops early on a small
gradient (``tolerance_grad``), a small change of loss or step (``tolerance_change``), or after
``max_eval`` closure evaluations.  The decisions and the scalar arithmetic (0-d tensors where
PyTorch keeps 0-d tensors) follow ``torch.optim.LBFGS``, so a run matches PyTorch's iterate by
iterate; its state (on the first parameter, as PyTorch keeps it) has PyTorch's keys.

The closure reads tensor values at every iteration, so a whole-step compile cannot record this
step: calling it inside ``fusegrad.compile`` stops the recording with a logged reason and the
call runs eagerly (its backward passes still compiled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..autograd.grad_mode import enable_grad, no_grad
from ..ops.shape import cat
from ..tensor import Tensor
from .optimizer import Optimizer, OptimizerError

# the strong Wolfe conditions' constants: sufficient decrease (c1) and curvature (c2)
_C1 = 1e-4
_C2 = 0.9


class LBFGS(Optimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1,
        max_iter: int = 20,
        max_eval: int | None = None,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        history_size: int = 100,
        line_search_fn: str | None = None,
    ) -> None:
        if not 0.0 <= lr:
            raise OptimizerError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = {
            "lr": lr,
            "max_iter": max_iter,
            "max_eval": max_eval,
            "tolerance_grad": tolerance_grad,
            "tolerance_change": tolerance_change,
            "history_size": history_size,
            "line_search_fn": line_search_fn,
        }
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise OptimizerError("LBFGS doesn't support per-parameter options (parameter groups)")

    def state_pending(self) -> None:
        # the state is made and read by eager code only (the step is never recorded)
        return None

    @property
    def _params(self) -> list[Tensor]:
        return self.param_groups[0]["params"]

    # -- the parameters as one flat vector -----------------------------------------------------
    def _flat_grad(self) -> Tensor:
        """All gradients concatenated (zeros for a parameter without one)."""
        parts = [
            p.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in self._params
        ]
        return cat(parts, 0)

    def _move(self, step_size: Any, direction: Tensor) -> None:
        """p += step_size * (p's slice of the flat ``direction``), for every parameter."""
        offset = 0
        for p in self._params:
            n = p.numel()
            p.add_(direction[offset : offset + n].view_as(p), alpha=step_size)
            offset += n

    def _evaluate_at(
        self, closure: Callable[[], Any], start: list[Tensor], t: Any, d: Tensor
    ) -> tuple[float, Tensor]:
        """Loss and flat gradient at ``start + t * d``; the parameters are left at ``start``."""
        self._move(t, d)
        loss = float(closure())
        flat_grad = self._flat_grad()
        for p, value in zip(self._params, start):
            p.copy_(value)
        return loss, flat_grad

    @no_grad()
    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        """Up to ``max_iter`` iterations; ``closure`` clears the gradients, computes the loss,
        calls ``backward()`` and returns the loss.  Returns the first loss the closure gave."""
        group = self.param_groups[0]
        lr = group["lr"]
        max_iter = group["max_iter"]
        max_eval = group["max_eval"]
        tolerance_grad = group["tolerance_grad"]
        tolerance_change = group["tolerance_change"]
        line_search_fn = group["line_search_fn"]
        history_size = group["history_size"]

        def evaluate() -> Any:
            with enable_grad():
                return closure()

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        first_loss = evaluate()
        loss = float(first_loss)
        evals = 1
        state["func_evals"] += 1
        flat_grad = self._flat_grad()
        if flat_grad.abs().max() <= tolerance_grad:
            return first_loss  # already optimal

        d = state.get("d")
        t = state.get("t")
        old_dirs = state.get("old_dirs")
        old_stps = state.get("old_stps")
        ro = state.get("ro")
        h_diag = state.get("H_diag")
        prev_flat_grad = state.get("prev_flat_grad")
        prev_loss = state.get("prev_loss")

        iteration = 0
        while iteration < max_iter:
            iteration += 1
            state["n_iter"] += 1

            if state["n_iter"] == 1:  # steepest descent, an empty history
                d = flat_grad.neg()
                old_dirs, old_stps, ro = [], [], []
                h_diag = 1
            else:
                # the newest curvature pair, kept only when it keeps the Hessian estimate
                # positive definite (y.s > 0, with margin)
                y = flat_grad.sub(prev_flat_grad)
                s = d.mul(t)
                ys = y.dot(s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:
                        del old_dirs[0], old_stps[0], ro[0]
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / y.dot(y)  # the initial inverse Hessian's scale
                if "al" not in state:
                    state["al"] = [None] * history_size
                d = _two_loop(flat_grad, old_dirs, old_stps, ro, h_diag, state["al"])

            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone()
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)  # directional derivative
            if gtd > -tolerance_change:
                break  # not a descent direction (to tolerance)

            added_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                start = [p.clone() for p in self._params]

                def at(t_: Any, d_: Tensor, start: list[Tensor] = start) -> tuple[float, Tensor]:
                    return self._evaluate_at(evaluate, start, t_, d_)

                loss, flat_grad, t, added_evals = _strong_wolfe(
                    at, t, d, loss, flat_grad, gtd, tolerance_change, max_eval - evals
                )
                self._move(t, d)
                optimal = flat_grad.abs().max() <= tolerance_grad
            else:
                self._move(t, d)
                optimal = False
                if iteration != max_iter:  # the last iteration's loss is not needed
                    loss = float(evaluate())
                    flat_grad = self._flat_grad()
                    optimal = flat_grad.abs().max() <= tolerance_grad
                    added_evals = 1
            evals += added_evals
            state["func_evals"] += added_evals

            if (
                iteration == max_iter
                or evals >= max_eval
                or optimal
                or d.mul(t).abs().max() <= tolerance_change
                or abs(loss - prev_loss) < tolerance_change
            ):
                break

        state.update(
            d=d,
            t=t,
            old_dirs=old_dirs,
            old_stps=old_stps,
            ro=ro,
            H_diag=h_diag,
            prev_flat_grad=prev_flat_grad,
            prev_loss=prev_loss,
        )
        return first_loss


def _two_loop(
    flat_grad: Tensor,
    old_dirs: list[Tensor],
    old_stps: list[Tensor],
    ro: list[Any],
    h_diag: Any,
    al: list[Any],
) -> Tensor:
    """-H g for the L-BFGS inverse-Hessian estimate H of the stored pairs: the first loop
    projects out the newest pairs first, the second adds them back oldest first."""
    q = flat_grad.neg()
    for i in reversed(range(len(old_dirs))):
        al[i] = old_stps[i].dot(q) * ro[i]
        q.add_(old_dirs[i], alpha=-al[i])
    r = q.mul(h_diag)
    for i in range(len(old_dirs)):
        be_i = old_dirs[i].dot(r) * ro[i]
        r.add_(old_stps[i], alpha=al[i] - be_i)
    return r


def _cubic_minimum(
    x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any, bounds: tuple | None = None
) -> Any:
    """The minimiser of the cubic through (x1, f1) and (x2, f2) with slopes g1, g2, clipped to
    ``bounds`` (default: the interval between x1 and x2); its midpoint when the cubic has no
    minimum (Nocedal & Wright, equation 3.59)."""
    low, high = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if not d2_square >= 0:
        return (low + high) / 2.0
    d2 = d2_square.sqrt() if isinstance(d2_square, Tensor) else d2_square**0.5
    if x1 <= x2:
        at = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        at = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(at, low), high)


def _strong_wolfe(
    evaluate: Callable[[Any, Tensor], tuple[float, Tensor]],
    t: Any,
    d: Tensor,
    f: float,
    g: Tensor,
    gtd: Any,
    tolerance_change: float,
    max_ls: int,
) -> tuple[float, Tensor, Any, int]:
    """A step ``t`` along ``d`` satisfying the strong Wolfe conditions, from the loss ``f``,
    gradient ``g`` and slope ``gtd`` at t = 0.  Returns (loss, gradient, t, evaluations)."""
    d_norm = d.abs().max()
    g = g.clone()
    f_new, g_new = evaluate(t, d)
    evals = 1
    gtd_new = g_new.dot(d)

    # phase 1: grow t until an interval [lo, hi] is known to hold an acceptable step
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    iteration = 0
    bracket: list[Any] = []
    while iteration < max_ls:
        if f_new > (f + _C1 * t * gtd) or (iteration > 1 and f_new >= f_prev):
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new.clone(), gtd_new]]
            break
        if abs(gtd_new) <= -_C2 * gtd:  # t itself is acceptable
            bracket = [[t, f_new, g_new, gtd_new]]
            done = True
            break
        if gtd_new >= 0:
            bracket = [[t_prev, f_prev, g_prev, gtd_prev], [t, f_new, g_new.clone(), gtd_new]]
            break
        # extrapolate: a cubic step between 1.01 t and 10 t
        t_next = _cubic_minimum(
            t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(t + 0.01 * (t - t_prev), t * 10)
        )
        t_prev, f_prev, g_prev, gtd_prev = t, f_new, g_new.clone(), gtd_new
        t = t_next
        f_new, g_new = evaluate(t, d)
        evals += 1
        gtd_new = g_new.dot(d)
        iteration += 1
    if iteration == max_ls:  # no bracket in the budget: the zoom has none to refine either
        bracket = [[0, f, g, None], [t, f_new, g_new, None]]

    # phase 2 (zoom): shrink the bracket by safeguarded cubic steps; ``lo`` holds the lower loss
    insufficient_progress = False
    lo, hi = (0, 1) if bracket[0][1] <= bracket[-1][1] else (1, 0)
    while not done and iteration < max_ls:
        if abs(bracket[1][0] - bracket[0][0]) * d_norm < tolerance_change:
            break
        (t_a, f_a, _, gtd_a), (t_b, f_b, _, gtd_b) = bracket
        t = _cubic_minimum(t_a, f_a, gtd_a, t_b, f_b, gtd_b)
        # keep t away from the bracket's ends: after a step that made too little progress, or
        # one at an end, move it a tenth of the bracket inside
        top, bottom = max(t_a, t_b), min(t_a, t_b)
        margin = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < margin:
            if insufficient_progress or t >= top or t <= bottom:
                t = top - margin if abs(t - top) < abs(t - bottom) else bottom + margin
                insufficient_progress = False
            else:
                insufficient_progress = True
        else:
            insufficient_progress = False

        f_new, g_new = evaluate(t, d)
        evals += 1
        gtd_new = g_new.dot(d)
        iteration += 1
        if f_new > (f + _C1 * t * gtd) or f_new >= bracket[lo][1]:
            bracket[hi] = [t, f_new, g_new.clone(), gtd_new]
            lo, hi = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(gtd_new) <= -_C2 * gtd:
                done = True
            elif gtd_new * (bracket[hi][0] - bracket[lo][0]) >= 0:
                bracket[hi] = list(bracket[lo])  # the slope points back: the old low end bounds
            bracket[lo] = [t, f_new, g_new.clone(), gtd_new]

    t, f_new, g_new, _ = bracket[lo]
    return f_new, g_new, t, evals
