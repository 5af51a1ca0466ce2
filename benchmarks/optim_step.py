"""One eager ``optimizer.step()`` over a model's parameters: fusegrad's per-parameter path
(``foreach=False``), its multi-tensor kernel (``foreach=True``, the default) and PyTorch's
for-loop and foreach paths, interleaved in one run.

The parameters are the GPT's of ``benchmarks.steps`` (2 layers, width 64); the gradients are
fixed random arrays, set once, so only the update is timed.  ``python -m benchmarks.optim_step
--threads 1`` prints one row per optimizer: the median time of one step per implementation and
fusegrad foreach's ratio to each of the others.
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
OPTIMIZERS = {
    "AdamW": ("AdamW", {"lr": 1e-3}),
    "Adam(amsgrad)": ("Adam", {"lr": 1e-3, "amsgrad": True, "weight_decay": 1e-2}),
    "SGD(momentum)": ("SGD", {"lr": 1e-2, "momentum": 0.9, "nesterov": True}),
    "RMSprop": ("RMSprop", {"lr": 1e-3, "momentum": 0.5, "centered": True}),
    "Adagrad": ("Adagrad", {"lr": 1e-2}),
    "Adadelta": ("Adadelta", {}),
    "Adamax": ("Adamax", {"lr": 2e-3}),
}


def _setup(lib: Any, kind: str, name: str, options: dict, foreach: bool, seed: int) -> Any:
    """An optimizer of ``lib`` over a fresh ``kind`` model whose gradients are set."""
    import numpy as np

    lib.manual_seed(seed)
    model = models.make(lib, kind, **GPT)
    params = [p for p in model.parameters() if p.requires_grad]
    rng = np.random.default_rng(seed)
    for p in params:
        p.grad = lib.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 1e-2)
    opt = getattr(lib.optim, name)(params, foreach=foreach, **options)
    opt.step()  # state made, kernels compiled
    return opt


def _timed(opt: Any) -> Any:
    def step() -> dict[str, float]:
        start = common.clock()
        opt.step()
        return {"step": common.clock() - start}

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.optim_step", description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)

    import fusegrad

    torch = common.optional_torch(args.no_torch, args.threads)
    kind = "gpt"
    impls = {"fg loop": (fusegrad, False), "fg foreach": (fusegrad, True)}
    if torch is not None:
        impls.update({"torch loop": (torch, False), "torch foreach": (torch, True)})
    count = sum(1 for _ in models.make(fusegrad, kind, **GPT).parameters())
    print(
        f"eager optimizer.step(), GPT parameters ({count} tensors), threads: {args.threads}, "
        f"{args.reps} steps each (median, µs)"
    )
    header = ["optimizer", *impls, "foreach / loop", "foreach / torch foreach"]
    print(" | ".join(header))
    for label in args.optimizers.split(","):
        name, options = OPTIMIZERS[label]
        steps = {
            impl: _timed(_setup(lib, kind, name, options, foreach, seed=0))
            for impl, (lib, foreach) in impls.items()
        }
        stats = common.measure_interleaved(steps, warmup=5, reps=args.reps)
        median = {impl: stats[impl]["step"].median * 1e6 for impl in impls}
        cells = [label, *(f"{median[i]:.1f}" for i in impls)]
        cells.append(f"{median['fg foreach'] / median['fg loop']:.3f}")
        cells.append(
            f"{median['fg foreach'] / median['torch foreach']:.3f}" if torch is not None else "-"
        )
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
