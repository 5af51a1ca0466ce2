"""The guard of a replayed whole step on its own: the full walk (``recording.Watch``: the key
built and looked up) against the fast guard (``guard.FastGuard``: one pass over identities
and the guard epoch), and the whole replayed call, for two steps:

* ``GPT+AdamW``: the training step of ``benchmarks.steps`` (2-layer GPT, width 64, batch 8,
  AdamW: 28 parameters, 84 optimizer state tensors);
* ``16 elements``: ``((w * x - y) ** 2).sum()`` over 16 elements with SGD, a step whose time is
  the fixed per-call overhead of a replay.

``python -m benchmarks.guards --threads 1`` prints, per step, the median of each in µs, the
implementations interleaved.  The fast guard must pass on every measured call: the run checks
that it does (and that the walk finds the replayed entry) before timing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, models, steps  # noqa: E402


def _gpt(fg: Any, np: Any) -> tuple[Any, tuple]:
    fg.manual_seed(0)
    model = steps._build(fg, "GPT+AdamW")
    opt = steps._optimizer(fg, "GPT+AdamW", model.parameters())
    x, y = (fg.tensor(a) for a in steps._batches(np, "GPT+AdamW")[0])

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = models.loss(fg, model, x, y)
        loss.backward()
        opt.step()
        return loss

    return step, (x, y)


def _small(fg: Any, np: Any) -> tuple[Any, tuple]:
    fg.manual_seed(0)
    w = fg.randn(16, requires_grad=True)
    opt = fg.optim.SGD([w], lr=0.01)

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = ((w * x - y) ** 2).sum()
        loss.backward()
        opt.step()
        return loss

    return step, (fg.randn(16), fg.randn(16))


STEPS = {"GPT+AdamW": _gpt, "16 elements": _small}


def _timed(fn: Any) -> Any:
    def call() -> dict[str, float]:
        start = common.clock()
        fn()
        return {"t": common.clock() - start}

    return call


def _measure(name: str, make: Any, reps: int) -> dict[str, float]:
    """The medians (µs) of the walk, the fast guard and the replayed call of one step."""
    import numpy as np

    import fusegrad as fg
    from fusegrad import compiler
    from fusegrad.compiler.recording import Watch

    step, call_args = make(fg, np)
    compiled = fg.compile(step)
    for _ in range(4):
        compiled(*call_args)
    compiler.wait_for_compiles()
    for _ in range(10):
        compiled(*call_args)
    found = compiled.guards.find(compiled.fn, call_args, {}, compiled.entries, compiled.dynamics)
    if found is None:
        raise SystemExit(f"{name}: the fast guard does not pass on an unchanged call")
    fast = found[0]
    if compiled.entries.get(Watch(step, call_args, {}).key) is not fast.entry:
        raise SystemExit(f"{name}: the walk finds another entry than the fast guard's")
    stats = common.measure_interleaved(
        {
            "walk": _timed(lambda: compiled.entries.get(Watch(step, call_args, {}).key)),
            "fast": _timed(lambda: fast.check(step, call_args, {})),
            "call": _timed(lambda: compiled(*call_args)),
        },
        warmup=20,
        reps=reps,
    )
    return {k: stats[k]["t"].median * 1e6 for k in stats}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.guards", description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)
    print(f"whole-step guards, threads: {args.threads}, {args.reps} calls each (median, µs)")
    print(" | ".join(["step", "full walk", "fast guard", "walk / fast", "replayed call"]))
    for name, make in STEPS.items():
        median = _measure(name, make, args.reps)
        cells = [name, f"{median['walk']:.1f}", f"{median['fast']:.1f}"]
        cells += [f"{median['walk'] / median['fast']:.1f}×", f"{median['call']:.1f}"]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
