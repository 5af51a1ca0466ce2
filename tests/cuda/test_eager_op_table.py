"""Eager CUDA (numba's simulator) against the CPU over the op table: forward values and
gradients of the first sample of every entry, each in one of float64 and float32 (alternating
down the table: the simulator takes about 2.5 minutes per pass on 2 cores); with
``FUSEGRAD_CUDA_FULL=1`` (``benchmarks.gpu_check`` sets it) a second pass runs every entry in
the other dtype.

Ops whose CUDA kernel does not exist yet must fail with ``NotImplementedError`` naming the
primitive (never a wrong value, never a silent trip through host memory); the set of those is
pinned below, so a new gap or a fixed one shows up here."""

from __future__ import annotations

import os
import sys
from typing import Any

import modes
import numpy as np
import pytest

import fusegrad
from fusegrad.ops.special_functions import SCIPY_KERNELS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))

from op_table import FG, OPS, Lib, build, flat_outputs  # noqa: E402

modes.require_device()


class _CudaNamespace:
    """fusegrad with ``tensor`` creating CUDA tensors: the op table's inputs land on the GPU."""

    def __getattr__(self, item: str) -> Any:
        return getattr(fusegrad, item)

    @staticmethod
    def tensor(data: Any, **kw: Any) -> Any:
        return fusegrad.tensor(data, device="cuda", **kw)


CUDA = Lib(_CudaNamespace(), FG.F, "fusegrad-cuda")

# primitives without a CUDA kernel yet
# what CUDA refuses by design for now, in the words of its NotImplementedError: torch.linalg,
# torch.fft and view_as_complex on CUDA tensors, and arithmetic on complex CUDA tensors
# (docs/complex.md, docs/cuda.md)
CPU_ONLY = ("CUDA tensors are not supported yet", "CUDA kernels take no complex operands")
KNOWN_GAPS: set[str] = {"cummax_index", "mode_index", "searchsorted", "histc"}
# special functions whose eager kernel is scipy.special's, on the host (docs/special.md)
KNOWN_GAPS |= set(SCIPY_KERNELS)


def _host(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy()


def _run(entry: Any, lib: Lib, sample: Any, dtype: str) -> tuple[list, list]:
    leaves, fn = build(entry, lib, sample, dtype, entry.differentiable)
    outs = flat_outputs(fn(*leaves))
    values = [_host(o) if isinstance(o, fusegrad.Tensor) else np.asarray(o) for o in outs]
    diff = [o for o in outs if isinstance(o, fusegrad.Tensor) and o.requires_grad]
    grads: list = []
    if leaves and diff:
        cots = [fusegrad.ones_like(o) for o in diff]
        got = fusegrad.autograd.grad(diff, leaves, cots, allow_unused=True)
        grads = [None if g is None else _host(g) for g in got]
    return values, grads


CASES = [(entry, entry.get_samples()[0]) for entry in OPS if entry.get_samples()]
DTYPES = ("float64", "float32")
PASSES = 2 if os.environ.get("FUSEGRAD_CUDA_FULL") == "1" else 1


@pytest.mark.parametrize("swap", range(PASSES))
def test_op_table_on_cuda_matches_cpu(swap: int) -> None:
    gaps: dict[str, str] = {}
    cpu_only: list[str] = []
    failures: list[str] = []
    ran = 0
    for k, (entry, sample) in enumerate(CASES):
        dtype = DTYPES[(k + swap) % 2]
        try:
            want_values, want_grads = _run(entry, FG, sample, dtype)
        except Exception:  # noqa: BLE001 - error cases are the op table's own business
            continue
        try:
            got_values, got_grads = _run(entry, CUDA, sample, dtype)
        except NotImplementedError as e:
            if any(why in str(e) for why in CPU_ONLY):
                cpu_only.append(entry.name)  # (documented: linalg, fft, complex arithmetic)
                continue
            prim = str(e).split(" ", 1)[0]
            gaps[prim] = entry.name
            continue
        except Exception as e:  # noqa: BLE001 - collected and reported together
            failures.append(
                f"{entry.name} ({dtype}): {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            )
            continue
        ran += 1
        rtol, atol = (1e-9, 1e-12) if dtype == "float64" else (2e-5, 2e-6)
        for i, (g, w) in enumerate(zip(got_values, want_values)):
            if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True) or g.dtype != w.dtype:
                failures.append(f"{entry.name} ({dtype}): output {i} differs")
        for i, (g, w) in enumerate(zip(got_grads, want_grads)):
            # a gradient summed from many products (attention's projection weights) has
            # float32 rounding of the size of its largest entries, also where an entry is
            # near 0: the absolute tolerance scales with the gradient's magnitude
            scaled = atol if w is None or not w.size else atol * max(1.0, float(np.abs(w).max()))
            if (g is None) != (w is None) or (
                g is not None and not np.allclose(g, w, rtol=rtol, atol=scaled, equal_nan=True)
            ):
                failures.append(f"{entry.name} ({dtype}): gradient {i} differs")
    assert not failures, "\n".join(failures)
    assert set(gaps) <= KNOWN_GAPS, f"new CUDA gaps: {gaps}"
    assert ran >= 0.9 * (len(CASES) - len(cpu_only)) - 10, (
        f"only {ran} of {len(CASES) - len(cpu_only)} entries ran on CUDA"
    )
