"""Recurrent layers in eager mode: nn.LSTM / nn.GRU forward + backward, fusegrad against PyTorch.

The shape is the word-language-model example's (pytorch/examples ``word_language_model``):
2 layers of 200, sequence 35, batch 20, float32, an input of embedding width 200; the loss is
``(output * w).sum()`` for a fixed random ``w``, so every output gets a gradient.  Three
implementations, interleaved (``common.measure_interleaved``): ``fused`` (fusegrad's default
path: one native kernel per layer and direction, ``ops/recurrent.py``), ``per-step`` (fusegrad
with ``nn.rnn.fused_kernels(False)``: about ten eager ops per time step, the path before the
kernels existed) and ``torch`` (PyTorch eager, when importable).  Every repetition clears
``.grad`` outside the timed region and times forward and backward.  The gradients of the
three are compared once, so a benchmark that computes something else fails loudly.

Run from the repository root::

    python -m benchmarks.recurrent [--threads N] [--reps N] [--cells LSTM,GRU,LSTM-packed]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

LAYERS, HIDDEN, SEQ, BATCH = 2, 200, 35, 20


def _workloads(cell: str, np: Any, fg: Any, torch: Any) -> tuple[dict, dict]:
    """``({name: step}, {name: grads()})`` for one cell type (``LSTM-packed``: an LSTM on a
    PackedSequence of lengths 10 to 35, as a sequence classifier feeds it)."""
    packed = cell.endswith("-packed")
    cell = cell.removesuffix("-packed")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SEQ, BATCH, HIDDEN)).astype(np.float32)
    lengths = sorted(rng.integers(10, SEQ + 1, BATCH).tolist(), reverse=True)
    lengths[0] = SEQ
    rows = sum(lengths) if packed else SEQ * BATCH
    w = rng.standard_normal((rows, HIDDEN)).astype(np.float32)
    fg.manual_seed(0)
    model = getattr(fg.nn, cell)(HIDDEN, HIDDEN, LAYERS)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    steps: dict = {}
    grads: dict = {}

    def fusegrad_step(fused: bool) -> Any:
        xt, wt = fg.tensor(x), fg.tensor(w)
        pack = fg.nn.utils.rnn.pack_padded_sequence

        def step() -> dict:
            for p in model.parameters():
                p.grad = None
            with fg.nn.rnn.fused_kernels(fused):
                start = common.clock()
                if packed:
                    out = model(pack(xt, lengths))[0].data
                else:
                    out = model(xt)[0].reshape(rows, HIDDEN)
                loss = (out * wt).sum()
                middle = common.clock()
                loss.backward()
                end = common.clock()
            return {"forward": middle - start, "backward": end - middle}

        return step

    def fusegrad_grads() -> dict:
        return {k: p.grad.numpy().copy() for k, p in model.named_parameters()}

    steps["fused"], grads["fused"] = fusegrad_step(True), fusegrad_grads
    steps["per-step"], grads["per-step"] = fusegrad_step(False), fusegrad_grads
    if torch is not None:
        tmodel = getattr(torch.nn, cell)(HIDDEN, HIDDEN, LAYERS)
        tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)

        def torch_step() -> dict:
            for p in tmodel.parameters():
                p.grad = None
            start = common.clock()
            if packed:
                out = tmodel(torch.nn.utils.rnn.pack_padded_sequence(tx, lengths))[0].data
            else:
                out = tmodel(tx)[0].reshape(rows, HIDDEN)
            loss = (out * tw).sum()
            middle = common.clock()
            loss.backward()
            end = common.clock()
            return {"forward": middle - start, "backward": end - middle}

        steps["torch"] = torch_step
        grads["torch"] = lambda: {k: p.grad.numpy().copy() for k, p in tmodel.named_parameters()}
    return steps, grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--cells", default="LSTM,GRU,LSTM-packed")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg

    torch = common.optional_torch(args.no_torch, args.threads)
    print(
        f"# recurrent layers, eager: {LAYERS} layers of {HIDDEN}, sequence {SEQ}, batch "
        f"{BATCH}, float32, {args.threads} thread(s); medians of {args.reps} in ms",
        flush=True,
    )
    print("| cell | implementation | forward | backward | total | total / torch |")
    print("|---|---|---:|---:|---:|---:|", flush=True)
    for cell in args.cells.split(","):
        steps, grads = _workloads(cell, np, fg, torch)
        common.check_gradients(np, cell, steps, grads, "per-step")
        stats = common.measure_interleaved(steps, warmup=args.warmup, reps=args.reps)
        base = stats["torch"]["total"].median if "torch" in stats else None
        for name, phases in stats.items():
            total = phases["total"].median
            versus = "" if base is None else f"{total / base:.2f}x"
            print(
                f"| {cell} | {name} | {phases['forward'].median * 1e3:.2f} | "
                f"{phases['backward'].median * 1e3:.2f} | {total * 1e3:.2f} | {versus} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
