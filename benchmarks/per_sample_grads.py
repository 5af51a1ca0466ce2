"""Per-sample gradients of a small MLP: ``vmap(grad(loss), in_dims=(None, 0, 0))`` over
``functional_call(model, params, (x,))``, eager and compiled (``fusegrad.compile`` of it: one
program per call), against a Python loop over the samples (one ``grad`` each) and against
PyTorch's ``torch.func`` doing the same.

The model is ``Linear(features, hidden) -> ReLU -> Linear(hidden, hidden) -> ReLU ->
Linear(hidden, classes)`` with cross entropy, in float32; the batch has ``batch`` samples.
Before timing, the per-sample gradients of every implementation are checked against the loop's
(and PyTorch's against fusegrad's).  Times are the median of ``reps`` calls after two warm-up
calls, at a fixed thread count; the compiled row's compile (in the background, as by default)
is waited for before its timing, and its time is reported apart.

Run from the repository root: ``python -m benchmarks.per_sample_grads [--threads 1]
[--batch 64] [--features 32] [--hidden 64] [--classes 10] [--reps 20]``; ``--quick`` runs tiny
sizes once (the smoke test's mode).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # after the script path fix above


def _median_ms(fn: Any, reps: int) -> float:
    fn()
    fn()  # (warm-up)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _model(lib: Any, features: int, hidden: int, classes: int) -> Any:
    nn = lib.nn
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def _per_sample(lib: Any, model: Any) -> tuple[Any, Any]:
    """(vmap version, loop version) of the per-sample gradients in library ``lib``."""
    func = lib.func
    cross_entropy = lib.nn.functional.cross_entropy

    def loss(params: Any, x: Any, y: Any) -> Any:
        out = func.functional_call(model, params, (x.unsqueeze(0),))
        return cross_entropy(out, y.unsqueeze(0))

    batched = func.vmap(func.grad(loss), in_dims=(None, 0, 0))
    single = func.grad(loss)

    def loop(params: Any, x: Any, y: Any) -> Any:
        grads = [single(params, x[i], y[i]) for i in range(x.shape[0])]
        return {k: lib.stack([g[k] for g in grads]) for k in params}

    return batched, loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one timed call")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.features, args.hidden, args.classes, args.reps = 4, 5, 6, 3, 1
    common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, args.batch)
    fg.manual_seed(0)
    model = _model(fg, args.features, args.hidden, args.classes)
    params = {k: v.detach() for k, v in model.named_parameters()}
    batched, loop = _per_sample(fg, model)
    ours = (params, fg.tensor(x), fg.tensor(y))
    want = loop(*ours)
    got = batched(*ours)
    for k in params:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-4, atol=1e-6)
    compiled = fg.compile(batched)
    t0 = time.perf_counter()
    compiled(*ours)  # recorded (an eager call)
    compiled(*ours)  # the program built and compiled (or loaded from the disk cache)
    fg.compiler.wait_for_compiles()  # (a JIT running in the background: time compiled calls)
    compiled_got = compiled(*ours)
    compile_s = time.perf_counter() - t0
    for k in params:
        np.testing.assert_allclose(compiled_got[k].numpy(), want[k].numpy(), rtol=1e-4, atol=1e-6)
    if fg.compiler.counters.step_breaks:
        raise AssertionError(f"the compiled vmap(grad) was not replayed: {fg.compiler.counters}")
    rows = [
        ("fusegrad, vmap(grad)", _median_ms(lambda: batched(*ours), args.reps)),
        ("fusegrad, compile(vmap(grad))", _median_ms(lambda: compiled(*ours), args.reps)),
        ("fusegrad, loop over samples", _median_ms(lambda: loop(*ours), args.reps)),
    ]
    torch = None
    try:
        import torch
    except ImportError:
        pass
    if torch is not None:
        common.pin_torch_threads(torch, args.threads)
        tmodel = _model(torch, args.features, args.hidden, args.classes)
        with torch.no_grad():
            for q, p in zip(tmodel.parameters(), model.parameters()):
                q.copy_(torch.tensor(p.detach().numpy()))
        tparams = {k: v.detach() for k, v in tmodel.named_parameters()}
        tbatched, tloop = _per_sample(torch, tmodel)
        theirs = (tparams, torch.tensor(x), torch.tensor(y))
        ref = tbatched(*theirs)
        for k in params:
            np.testing.assert_allclose(got[k].numpy(), ref[k].numpy(), rtol=1e-4, atol=1e-6)
        rows.append(("torch.func, vmap(grad)", _median_ms(lambda: tbatched(*theirs), args.reps)))
        rows.append(
            ("torch.func, loop over samples", _median_ms(lambda: tloop(*theirs), args.reps))
        )
    print(
        f"# Per-sample gradients of an MLP {args.features}-{args.hidden}-{args.hidden}-"
        f"{args.classes} (float32, cross entropy), batch {args.batch}; {args.threads} "
        f"thread(s), median of {args.reps}\n"
    )
    base = rows[0][1]
    table = [[name, f"{ms:.3f}", f"{ms / base:.1f}×"] for name, ms in rows]
    print(
        common.markdown_table(
            ["implementation", "ms per batch", "vs fusegrad vmap(grad)"], table, "lrr"
        )
    )
    print(
        f"\ncompile(vmap(grad)): first three calls {compile_s:.2f} s (recording, capture, "
        "fusion, numba's JIT or a disk-cache load; then a compiled run)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
