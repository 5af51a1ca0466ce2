"""Whole training steps over changing sizes: automatic dynamic sizes (``compiler/dynamic.py``)
against a recording per size.

The workload is ``benchmarks.steps``' GPT+AdamW (2 layers, width 64, 4 heads, block 32,
vocabulary 65, dropout 0.1) trained on batches of 8 (batch, sequence length) shapes in turn:
both the batch size and the sequence length change, so the positions (``arange(T)``) and the
slice of the causal mask follow the length.  Implementations, each from the same parameters on
the same batches (the fusegrad ones with the same dropout masks):

* ``fg eager``: the step as written;
* ``fg dynamic``: ``fusegrad.compile(step)``, sizes symbolic from the second shape on;
* ``fg per size``: the same with ``config.dynamic_sizes = False``: one recording and one
  program per shape (``config.step_recordings`` is 8, as many as the shapes);
* ``torch``: PyTorch eager, when installed.

``python -m benchmarks.dynamic_sizes --threads 1`` prints, per implementation, the time of
two passes over the shapes (recording, building and compiling included, until every shape has
run compiled: what new sizes cost), the recordings and program builds they took, the median
time of one step afterwards (interleaved with the others), and the largest parameter difference
from ``fg eager`` after the run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, models  # noqa: E402

GPT = {"vocab": 65, "width": 64, "heads": 4, "block": 32}
SHAPES = [(8, 32), (6, 24), (4, 17), (8, 9), (3, 28), (5, 12), (7, 20), (2, 31)]
IMPLS = ("fg eager", "fg dynamic", "fg per size", "torch")


class _Impl:
    """One implementation's model, step and position in the shape cycle."""

    def __init__(
        self, name: str, lib: Any, sizes: dict, batches: list, compiled: Any = None
    ) -> None:
        self.name = name
        self.lib = lib
        lib.manual_seed(0)
        self.model = model = models.make(lib, "gpt", **sizes)
        opt = lib.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x: Any, y: Any) -> Any:  # (a closure over the model: its tensors are watched)
            opt.zero_grad()
            loss = models.loss(lib, model, x, y)
            loss.backward()
            opt.step()
            return loss.detach()

        self.step = compiled(step) if compiled is not None else step
        self.batches = [(lib.tensor(x), lib.tensor(y)) for x, y in batches]
        self.calls = 0

    def __call__(self) -> dict[str, float]:
        x, y = self.batches[self.calls % len(self.batches)]
        self.lib.manual_seed(1 + self.calls)  # (the fusegrad ones: the same dropout masks)
        self.calls += 1
        start = common.clock()
        self.step(x, y)
        return {"step": common.clock() - start}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_sizes", description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--reps", type=int, default=48, help="measured steps after the first passes"
    )
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small GPT, 2 steps: a smoke test")
    args = parser.parse_args(argv)
    sizes = dict(GPT, width=16, heads=2) if args.quick else GPT
    reps = 2 if args.quick else args.reps
    common.pin_threads(args.threads)

    import numpy as np

    import fusegrad
    from fusegrad import compiler

    # (a new size's cost in full: its recording, build and numba compile in the foreground)
    compiler.config.background_compile = False
    torch = common.optional_torch(args.no_torch, args.threads)
    rng = np.random.default_rng(0)
    batches = [
        (rng.integers(0, GPT["vocab"], shape), rng.integers(0, GPT["vocab"], shape))
        for shape in SHAPES
    ]
    print(
        f"GPT+AdamW (width {sizes['width']}) whole steps over {len(SHAPES)} (batch, sequence) "
        f"shapes {SHAPES}, "
        f"threads: {args.threads}; first passes: two steps per shape (after one eager step "
        "that makes AdamW's state), recording, building and compiling included, until every "
        f"shape has run compiled; then the median of {reps} steps, interleaved (ms); "
        "params: the largest difference from fg eager's parameters after the run (float32, "
        "AdamW: rounding differences grow to about the learning rate, 1e-3)"
    )
    impls: dict[str, _Impl] = {}
    first: dict[str, tuple[float, int | str, int | str]] = {}
    for name in IMPLS:
        if name == "torch" and torch is None:
            continue
        lib = torch if name == "torch" else fusegrad
        compiled = None
        if name in ("fg dynamic", "fg per size"):
            compiler.config.dynamic_sizes = name == "fg dynamic"
            compiled = fusegrad.compile
        impl = impls[name] = _Impl(name, lib, sizes, batches, compiled)
        builds = compiler.counters.builds
        impl.calls = -1  # (the optimizer's first step, eager in a compiled step: not timed)
        impl()
        impl.calls = 0
        start = common.clock()
        for _ in range(2 * len(SHAPES)):  # (each shape recorded or replayed, then replayed)
            impl()
        seconds = common.clock() - start
        if compiled is not None:
            first[name] = (seconds, impl.step.recordings, compiler.counters.builds - builds)
        else:
            first[name] = (seconds, "-", "-")
    compiler.config.dynamic_sizes = True
    stats = common.measure_interleaved(impls, warmup=len(SHAPES), reps=reps)
    reference = [p.detach().numpy() for p in impls["fg eager"].model.parameters()]
    header = ["implementation", "first passes (s)", "recordings", "builds", "step (ms)", "params"]
    print(" | ".join(header))
    for name, impl in impls.items():
        seconds, recordings, builds = first[name]
        if name == "torch":
            diff = "-"
        else:
            params = [p.detach().numpy() for p in impl.model.parameters()]
            diff = f"{max(float(np.max(np.abs(a - b))) for a, b in zip(params, reference)):.1e}"
        median = stats[name]["step"].median * 1e3
        print(
            f"{name} | {seconds:.2f} | {recordings} | {builds} | {median:.2f} | {diff}", flush=True
        )


if __name__ == "__main__":
    main()
