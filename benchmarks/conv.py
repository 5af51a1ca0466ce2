"""Convolution and pooling layers in eager mode: forward + backward at real networks' shapes,
fusegrad against PyTorch.

Workloads (float32, batch 64, as the pytorch/examples programs train):

* ``mnist-conv1``: Conv2d(1, 32, 3) on 1x28x28 (the MNIST example's first layer);
* ``mnist-conv2``: Conv2d(32, 64, 3) on 32x26x26 (its second);
* ``mnist-maxpool``: max_pool2d(2) on 64x24x24 (its pooling);
* ``mnist-cnn``: those three with the ReLUs, flatten and Linear(9216, 128) (the example's
  network without dropout; the loss as below);
* ``dcgan-convT1``: ConvTranspose2d(100, 512, 4) on 100x1x1 (the DCGAN generator's first
  layer);
* ``dcgan-convT2``: ConvTranspose2d(512, 256, 4, 2, 1) on 512x4x4 (its second);
* ``dcgan-conv1``: Conv2d(3, 64, 4, 2, 1) on 3x64x64 (the discriminator's first);
* ``depthwise-3x3``: Conv2d(64, 64, 3, padding=1, groups=64) on 64x32x32 (a MobileNet block's
  depthwise layer: the direct loops' shape class);
* ``avgpool-3x3``: avg_pool2d(3, 2, 1) on 64x32x32.

The loss is ``(output * w).sum()`` for a fixed random ``w``, so every output gets a gradient.
Three implementations, interleaved (``common.measure_interleaved``): ``kernels`` (fusegrad's
default: one primitive per layer, im2col + BLAS or loop kernels, ``ops/conv_kernels.py``),
``composite`` (fusegrad inside ``ops.convolution.window_kernels(False)``: strided-slice
windows, stacks and matmuls, the path before the kernels) and ``torch`` (PyTorch eager, when
importable).  Every repetition clears ``.grad`` outside the timed region and times forward and
backward.  The gradients of the three are compared once, so a benchmark that computes
something else fails loudly.

Run from the repository root::

    python -m benchmarks.conv [--threads N] [--reps N] [--workloads mnist-conv2,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

BATCH = 64

# name -> (input shape without the batch, the layer, built by ``_layer(lib, name)``)
WORKLOADS = {
    "mnist-conv1": (1, 28, 28),
    "mnist-conv2": (32, 26, 26),
    "mnist-maxpool": (64, 24, 24),
    "mnist-cnn": (1, 28, 28),
    "dcgan-convT1": (100, 1, 1),
    "dcgan-convT2": (512, 4, 4),
    "dcgan-conv1": (3, 64, 64),
    "depthwise-3x3": (64, 32, 32),
    "avgpool-3x3": (64, 32, 32),
}


def _layer(lib: Any, name: str) -> Any:
    """The workload as a module of ``lib`` (fusegrad or torch), the same structure in both."""
    nn = lib.nn
    if name == "mnist-conv1":
        return nn.Conv2d(1, 32, 3)
    if name == "mnist-conv2":
        return nn.Conv2d(32, 64, 3)
    if name == "mnist-maxpool":
        return nn.MaxPool2d(2)
    if name == "mnist-cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(9216, 128),
        )
    if name == "dcgan-convT1":
        return nn.ConvTranspose2d(100, 512, 4, 1, 0, bias=False)
    if name == "dcgan-convT2":
        return nn.ConvTranspose2d(512, 256, 4, 2, 1, bias=False)
    if name == "dcgan-conv1":
        return nn.Conv2d(3, 64, 4, 2, 1, bias=False)
    if name == "depthwise-3x3":
        return nn.Conv2d(64, 64, 3, padding=1, groups=64)
    return nn.AvgPool2d(3, 2, 1)  # avgpool-3x3


def _workloads(name: str, np: Any, fg: Any, torch: Any) -> tuple[dict, dict]:
    """``({implementation: step}, {implementation: grads()})`` for one workload."""
    from fusegrad.ops.convolution import window_kernels

    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, *WORKLOADS[name])).astype(np.float32)
    fg.manual_seed(0)
    model = _layer(fg, name)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    xt0 = fg.tensor(x, requires_grad=True)
    with fg.no_grad():
        shape = tuple(model(xt0).shape)
    w = rng.standard_normal(shape).astype(np.float32)
    steps: dict = {}
    grads: dict = {}

    def fusegrad_step(kernels: bool) -> Any:
        xt, wt = fg.tensor(x, requires_grad=True), fg.tensor(w)

        def step() -> dict:
            xt.grad = None
            for p in model.parameters():
                p.grad = None
            with window_kernels(kernels):
                start = common.clock()
                loss = (model(xt) * wt).sum()
                middle = common.clock()
                loss.backward()
                end = common.clock()
            return {"forward": middle - start, "backward": end - middle}

        def result() -> dict:
            out = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
            out["input"] = xt.grad.numpy().copy()
            return out

        return step, result

    steps["kernels"], grads["kernels"] = fusegrad_step(True)
    steps["composite"], grads["composite"] = fusegrad_step(False)
    if torch is not None:
        tmodel = _layer(torch, name)
        tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        tx = torch.from_numpy(x).requires_grad_(True)
        tw = torch.from_numpy(w)

        def torch_step() -> dict:
            tx.grad = None
            for p in tmodel.parameters():
                p.grad = None
            start = common.clock()
            loss = (tmodel(tx) * tw).sum()
            middle = common.clock()
            loss.backward()
            end = common.clock()
            return {"forward": middle - start, "backward": end - middle}

        def torch_grads() -> dict:
            out = {k: p.grad.numpy().copy() for k, p in tmodel.named_parameters()}
            out["input"] = tx.grad.numpy().copy()
            return out

        steps["torch"], grads["torch"] = torch_step, torch_grads
    return steps, grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    names = args.workloads.split(",")
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r} (known: {', '.join(WORKLOADS)})")
    common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg

    torch = common.optional_torch(args.no_torch, args.threads)
    print(
        f"# convolution and pooling, eager: batch {BATCH}, float32, {args.threads} thread(s); "
        f"medians of {args.reps} in ms",
        flush=True,
    )
    print("| workload | implementation | forward | backward | total | total / torch |")
    print("|---|---|---:|---:|---:|---:|", flush=True)
    for name in names:
        steps, grads = _workloads(name, np, fg, torch)
        common.check_gradients(np, name, steps, grads, "composite")
        stats = common.measure_interleaved(steps, warmup=args.warmup, reps=args.reps)
        base = stats["torch"]["total"].median if "torch" in stats else None
        for impl, phases in stats.items():
            total = phases["total"].median
            versus = "" if base is None else f"{total / base:.2f}x"
            print(
                f"| {name} | {impl} | {phases['forward'].median * 1e3:.2f} | "
                f"{phases['backward'].median * 1e3:.2f} | {total * 1e3:.2f} | {versus} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
