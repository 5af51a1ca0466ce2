"""Normalisation layers in eager mode: forward + backward of BatchNorm2d, LayerNorm and
GroupNorm, fusegrad against PyTorch.

Shapes of real programs, float32: BatchNorm2d on (64, 32, 28, 28) in training (a conv net's
activations; running statistics updated), LayerNorm over the last dim of (32, 128, 768) (a
transformer's hidden states) and GroupNorm(8 groups) on (16, 64, 32, 32).  The loss is
``(out * w).sum()`` for a fixed random ``w``, so every output gets a gradient; the input,
weight and bias require grad.  Three implementations, interleaved
(``common.measure_interleaved``): ``fused`` (fusegrad's default path: the ``norm_stats`` /
``norm`` / ``norm_backward`` kernels of ``ops/norms.py``), ``composite`` (fusegrad with
``ops.norms.fused_norm_kernels(False)``: means, differences and products, the path before the
kernels existed) and ``torch`` (PyTorch eager, when importable).  Every repetition clears
``.grad`` outside the timed region and times forward and backward.  The gradients of the
three are compared once, so a benchmark that computes something else fails loudly.

Run from the repository root::

    python -m benchmarks.norms [--threads N] [--reps N] [--layers BatchNorm2d,LayerNorm,GroupNorm]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

LAYERS = {
    "BatchNorm2d": ((64, 32, 28, 28), lambda nn: nn.BatchNorm2d(32)),
    "LayerNorm": ((32, 128, 768), lambda nn: nn.LayerNorm(768)),
    "GroupNorm": ((16, 64, 32, 32), lambda nn: nn.GroupNorm(8, 64)),
}
SMALL = {"BatchNorm2d": (4, 32, 5, 5), "LayerNorm": (2, 3, 768), "GroupNorm": (2, 64, 3, 3)}


def _workloads(layer: str, np: Any, fg: Any, torch: Any, shape: tuple) -> tuple[dict, dict]:
    """``({name: step}, {name: grads()})`` for one layer."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape).astype(np.float32)
    make = LAYERS[layer][1]
    module = make(fg.nn)
    params = {
        "weight": rng.uniform(0.5, 1.5, module.weight.shape).astype(np.float32),
        "bias": rng.standard_normal(module.bias.shape).astype(np.float32),
    }
    with fg.no_grad():
        for name, value in params.items():
            getattr(module, name).copy_(fg.tensor(value))
    steps: dict = {}
    grads: dict = {}
    xt, wt = fg.tensor(x, requires_grad=True), fg.tensor(w)

    def fusegrad_step(fused: bool) -> Any:
        def step() -> dict:
            xt.grad = None
            for p in module.parameters():
                p.grad = None
            with fg.ops.norms.fused_norm_kernels(fused):
                start = common.clock()
                loss = (module(xt) * wt).sum()
                middle = common.clock()
                loss.backward()
                end = common.clock()
            return {"forward": middle - start, "backward": end - middle}

        return step

    def fusegrad_grads() -> dict:
        got = {k: p.grad.numpy().copy() for k, p in module.named_parameters()}
        got["input"] = xt.grad.numpy().copy()
        return got

    steps["fused"], grads["fused"] = fusegrad_step(True), fusegrad_grads
    steps["composite"], grads["composite"] = fusegrad_step(False), fusegrad_grads
    if torch is not None:
        tmodule = make(torch.nn)
        with torch.no_grad():
            for name, value in params.items():
                getattr(tmodule, name).copy_(torch.from_numpy(value))
        tx = torch.from_numpy(x).requires_grad_(True)
        tw = torch.from_numpy(w)

        def torch_step() -> dict:
            tx.grad = None
            for p in tmodule.parameters():
                p.grad = None
            start = common.clock()
            loss = (tmodule(tx) * tw).sum()
            middle = common.clock()
            loss.backward()
            end = common.clock()
            return {"forward": middle - start, "backward": end - middle}

        def torch_grads() -> dict:
            got = {k: p.grad.numpy().copy() for k, p in tmodule.named_parameters()}
            got["input"] = tx.grad.numpy().copy()
            return got

        steps["torch"], grads["torch"] = torch_step, torch_grads
    return steps, grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--small", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg

    torch = common.optional_torch(args.no_torch, args.threads)
    print(
        f"# normalisation layers, eager forward + backward, float32, {args.threads} thread(s); "
        f"medians of {args.reps} in ms",
        flush=True,
    )
    print("| layer | shape | implementation | forward | backward | total | total / torch |")
    print("|---|---|---|---:|---:|---:|---:|", flush=True)
    for layer in args.layers.split(","):
        shape = SMALL[layer] if args.small else LAYERS[layer][0]
        steps, grads = _workloads(layer, np, fg, torch, shape)
        common.check_gradients(np, layer, steps, grads, "composite")
        stats = common.measure_interleaved(steps, warmup=args.warmup, reps=args.reps)
        base = stats["torch"]["total"].median if "torch" in stats else None
        for name, phases in stats.items():
            total = phases["total"].median
            versus = "" if base is None else f"{total / base:.2f}x"
            print(
                f"| {layer} | {shape} | {name} | {phases['forward'].median * 1e3:.2f} | "
                f"{phases['backward'].median * 1e3:.2f} | {total * 1e3:.2f} | {versus} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
