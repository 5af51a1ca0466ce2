"""The real-GPU check: one command for a machine with an NVIDIA GPU.

    python -m benchmarks.gpu_check [--quick] [--skip-tests] [--json PATH] [--log-dir DIR]

1. runs the CUDA test suite on the GPU for real (``tests/cuda`` without the simulator, and the
   PTX compile tests), logging each run's output;
2. benchmarks workloads A–D (``benchmarks.compiled``'s definitions) on the device: fusegrad
   eager CUDA, fusegrad compiled CUDA (the backward in ``compiled_autograd``), and PyTorch CUDA
   eager / ``torch.compile`` when importable; forward and backward timed separately, each ended
   by a device synchronisation;
3. measures the device's copy bandwidth (device-to-device copy of a large buffer) and reports
   A's compiled backward at N=1e8 (float32) as a fraction of it, with two byte counts: the
   naive one (6 * 4 * N: read x, w, b, write three gradients, each counted as N floats) and the
   minimum (4 * 4 * N: b and its gradient are one element);
4. times whole training steps on the device (``benchmarks.steps``' C+SGD and GPT+AdamW):
   fusegrad eager CUDA, fusegrad's whole step compiled for the device (``fusegrad.compile``),
   PyTorch CUDA eager and ``torch.compile``, each step ended by a device synchronisation; the
   parameters after the run are compared with fusegrad eager's.

Prints markdown tables, writes JSON (default ``benchmarks/results/gpu_check.json``).  Gradients
of every implementation are compared with fusegrad eager CUDA.  Exit status non-zero when a test
run fails or a gradient disagrees.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import common
from . import compiled as cb

REPO_ROOT = Path(__file__).resolve().parent.parent
A_SIZES = (10**6, 10**7, 10**8)
A_SIZES_QUICK = (10**5,)
REPS = {"A": (3, 20), "B": (5, 30), "C": (5, 30), "D": (10, 50)}
REPS_QUICK = (1, 3)
GRAD_RTOL = 2e-3


def run_tests(log_dir: Path) -> list[dict[str, Any]]:
    """The CUDA suites on the real device, each in its own process (as CI runs them)."""
    runs = []
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    suites = [
        (
            "cuda-gpu",
            ["tests/cuda", "-p", "no:cacheprovider"],
            {"FUSEGRAD_CUDA_DEVICE": "1", "FUSEGRAD_CUDA_FULL": "1"},  # (every dtype: fast here)
        ),
        ("cuda-ptx", ["tests/cuda", "-p", "no:cacheprovider"], {"FUSEGRAD_CUDA_PTX": "1"}),
    ]
    for name, args, extra in suites:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *args],
            cwd=REPO_ROOT,
            env={**env, **extra},
            capture_output=True,
            text=True,
        )
        log = log_dir / f"{name}.log"
        log.write_text(proc.stdout + proc.stderr)
        tail = [line for line in proc.stdout.splitlines() if line.strip()][-1:]
        runs.append(
            {
                "suite": name,
                "returncode": proc.returncode,
                "seconds": round(time.perf_counter() - t0, 1),
                "summary": tail[0] if tail else "",
                "log": str(log),
            }
        )
        print(f"{name}: exit {proc.returncode} in {runs[-1]['seconds']} s: {runs[-1]['summary']}")
    return runs


def device_bandwidth(nbytes: int = 1 << 30, reps: int = 10) -> dict[str, Any]:
    """Device-to-device copy bandwidth (read + write counted), best of ``reps``."""
    from numba import cuda

    n = nbytes // 4
    src = cuda.device_array(n, np.float32)
    dst = cuda.device_array(n, np.float32)
    best = float("inf")
    for _ in range(reps):
        cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_to_device(src)
        cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return {"bytes_moved": 2 * n * 4, "seconds": best, "gbps": 2 * n * 4 / best / 1e9}


Impl = tuple[Callable[[], dict[str, float]], Callable[[], dict[str, Any]]]


def _device_impl(
    leaves: list,
    forward: Callable[[], Any],
    sync: Callable[[], None],
    to_numpy: Callable[[Any], Any],
    names: Sequence[str],
    context: Callable[[], Any] = contextlib.nullcontext,
) -> Impl:
    """(step, grads) for one framework on the device: ``step`` times forward and backward, each
    ended by ``sync`` (kernels run asynchronously); ``.grad`` is cleared outside the timing."""

    def step() -> dict[str, float]:
        for t in leaves:
            t.grad = None
        with context():
            t0 = time.perf_counter()
            loss = forward()
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1}

    def grads() -> dict[str, Any]:
        return {k: to_numpy(t.grad) for k, t in zip(names, leaves)}

    return step, grads


def _fg_impl(fg: Any, wl: cb.Workload, compiled: bool) -> Impl:
    from fusegrad import compiler

    ops = cb.fg_ops(fg)
    leaves = [fg.tensor(wl.data[k], device="cuda", requires_grad=True) for k in wl.leaves]
    consts = [fg.tensor(wl.data[k], device="cuda") for k in wl.consts]
    return _device_impl(
        leaves,
        lambda: wl.forward(ops, *leaves, *consts),
        fg.cuda.synchronize,
        lambda g: g.cpu().numpy(),
        wl.leaves,
        compiler.compiled_autograd if compiled else contextlib.nullcontext,
    )


def _torch_impl(torch: Any, wl: cb.Workload, compile_it: bool) -> Impl:
    ops = cb.torch_ops(torch)
    dev = torch.device("cuda")
    leaves = [torch.tensor(wl.data[k], device=dev, requires_grad=True) for k in wl.leaves]
    consts = [torch.tensor(wl.data[k], device=dev) for k in wl.consts]

    def forward(*tensors: Any) -> Any:
        return wl.forward(ops, *tensors)

    fn = torch.compile(forward) if compile_it else forward
    return _device_impl(
        leaves,
        lambda: fn(*leaves, *consts),
        torch.cuda.synchronize,
        lambda g: g.detach().cpu().numpy(),
        wl.leaves,
    )


def _workloads(names: Sequence[str], quick: bool) -> list[cb.Workload]:
    out = cb.make_workloads(np, [n for n in names if n != "A"], quick)
    rng = np.random.default_rng(0)
    for n in (A_SIZES_QUICK if quick else A_SIZES) if "A" in names else ():
        out.insert(
            0,
            cb.Workload(
                "A",
                f"A N={cb._exp_label(n)}",
                "A",
                {
                    "x": rng.standard_normal(n).astype(np.float32),
                    "w": rng.standard_normal(n).astype(np.float32),
                    "b": rng.standard_normal(1).astype(np.float32),
                },
                ("x", "w", "b"),
                (),
                cb.a_forward,
                "ms",
                size=n,
            ),
        )
    return sorted(out, key=lambda w: (w.name, w.size or 0))


def benchmark(names: Sequence[str], quick: bool, torch: Any, torch_compile: bool) -> dict[str, Any]:
    import fusegrad as fg

    results: dict[str, Any] = {"rows": [], "notes": {}}
    for wl in _workloads(names, quick):
        warmup, reps = REPS_QUICK if quick else REPS[wl.name]
        impls: dict[str, tuple] = {
            "fg_eager": _fg_impl(fg, wl, compiled=False),
            "fg_compiled": _fg_impl(fg, wl, compiled=True),
        }
        if torch is not None:
            impls["torch"] = _torch_impl(torch, wl, compile_it=False)
            if torch_compile:
                impls["torch_compile"] = _torch_impl(torch, wl, compile_it=True)
        steps = {}
        for name, (step, _) in impls.items():
            try:
                step()  # first call: JIT / torch.compile, outside the measurement
            except Exception as e:  # noqa: BLE001 - reported, column skipped
                results["notes"][f"{wl.label} {name}"] = f"{type(e).__name__}: {e}"[:300]
                continue
            steps[name] = step
        stats = common.measure_interleaved(steps, warmup=warmup, reps=reps)
        reference = impls["fg_eager"][1]()
        row: dict[str, Any] = {"workload": wl.label, "N": wl.size, "impls": {}}
        for name in steps:
            got = impls[name][1]()
            ok = all(
                np.allclose(got[k], reference[k], rtol=GRAD_RTOL, atol=GRAD_RTOL * 1e-2)
                for k in reference
            )
            row["impls"][name] = {
                phase: common.stats_dict(s, 1e3) for phase, s in stats[name].items()
            } | {"grads_match": ok}
        results["rows"].append(row)
        print(render_row(row))
    return results


STEP_IMPLS = ("fg_eager", "fg_step", "torch", "torch_compile")


def step_benchmark(
    names: Sequence[str], quick: bool, torch: Any, torch_compile: bool
) -> dict[str, Any]:
    """Section 4: whole training steps on the device (see the module docstring).  Returns
    ``{"rows": [{"workload", "impls": {name: stats in ms}, "max_rel_param_difference"}],
    "notes": {...}}``."""
    import fusegrad as fg

    from . import steps as sb

    results: dict[str, Any] = {"rows": [], "notes": {}}
    for name in names:
        fg.manual_seed(0)
        state = {k: v.detach().clone() for k, v in sb._build(fg, name).state_dict().items()}
        data = sb._batches(np, name)
        impls = {
            "fg_eager": sb._impl(fg, name, state, data, device="cuda", sync=fg.cuda.synchronize),
            "fg_step": sb._impl(
                fg, name, state, data, wrap_step=fg.compile, device="cuda", sync=fg.cuda.synchronize
            ),
        }
        if torch is not None:
            tstate = {k: torch.from_numpy(v.numpy().copy()) for k, v in state.items()}
            for key, wrap in (("torch", None), ("torch_compile", torch.compile)):
                if key == "torch_compile" and not torch_compile:
                    continue
                impls[key] = sb._impl(
                    torch,
                    name,
                    tstate,
                    data,
                    wrap_step=wrap,
                    device="cuda",
                    sync=torch.cuda.synchronize,
                )
        timed = {}
        for key, impl in impls.items():
            try:
                for _ in range(3):  # (state, recording, the program's foreground compile)
                    impl.step()
            except Exception as e:  # noqa: BLE001 - reported, column skipped
                results["notes"][f"{name} {key}"] = f"{type(e).__name__}: {e}"[:300]
                continue
            timed[key] = impl.step
        warmup, reps = sb.QUICK_REPS if quick else sb.REPS[name]
        stats = common.measure_interleaved(timed, warmup=warmup, reps=reps)
        reference = impls["fg_eager"].params()
        row: dict[str, Any] = {"workload": name, "impls": {}, "max_rel_param_difference": {}}
        for key in timed:
            row["impls"][key] = common.stats_dict(stats[key]["step"], 1e3)
            if key != "fg_eager":
                # (the implementations took different numbers of steps only if one failed)
                got = impls[key].params()
                row["max_rel_param_difference"][key] = max(
                    float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) or 1.0))
                    for a, b in zip(got, reference)
                )
        step_runs = fg.compiler.counters.step_runs
        results["notes"][f"{name} whole-step replays so far"] = str(step_runs)
        results["rows"].append(row)
        print(render_step_row(row))
    return results


def render_step_row(row: dict[str, Any]) -> str:
    cells = [row["workload"]]
    for key, info in row["impls"].items():
        cells.append(f"{key}: {info['median']:.3f} ms")
    return " | ".join(cells)


def render_step_table(results: dict[str, Any]) -> str:
    rows = []
    for row in results["rows"]:
        med = {k: v["median"] for k, v in row["impls"].items()}
        cells = [row["workload"]] + [common.format_number(med.get(k)) for k in STEP_IMPLS]
        step = med.get("fg_step")
        for peer in ("fg_eager", "torch", "torch_compile"):
            ok = step is not None and med.get(peer)
            cells.append(f"{step / med[peer]:.2f}×" if ok else "—")
        diffs = row["max_rel_param_difference"]
        cells.append(", ".join(f"{k} {v:.1e}" for k, v in diffs.items()) or "—")
        rows.append(cells)
    headers = ["workload (ms per step)", *STEP_IMPLS]
    headers += ["step/fg eager", "step/torch", "step/torch.compile", "params vs fg eager"]
    return common.markdown_table(headers, rows, ["l"] + ["r"] * (len(headers) - 1))


def render_row(row: dict[str, Any]) -> str:
    cells = [row["workload"]]
    for name, info in row["impls"].items():
        bwd = info.get("backward") or {}
        cells.append(f"{name}: bwd {bwd.get('median', float('nan')):.3f} ms")
    return " | ".join(cells)


def render_table(results: dict[str, Any]) -> str:
    names = ["fg_eager", "fg_compiled", "torch", "torch_compile"]
    header = ["workload"] + [f"{n} bwd (ms)" for n in names] + ["compiled/torch", "compiled/tc"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in results["rows"]:
        med = {
            n: (row["impls"][n].get("backward") or {}).get("median") if n in row["impls"] else None
            for n in names
        }
        cells = [row["workload"]] + [common.format_number(med[n]) for n in names]
        cells.append(common.format_number(common.ratio(med["fg_compiled"], med["torch"])))
        cells.append(common.format_number(common.ratio(med["fg_compiled"], med["torch_compile"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--workloads", default="A,B,C,D", help="comma-separated subset")
    parser.add_argument(
        "--steps",
        default="C+SGD,GPT+AdamW",
        help="whole training steps to time on the device (benchmarks.steps' names; '' for none)",
    )
    parser.add_argument(
        "--allow-simulator",
        action="store_true",
        help="run under numba's CUDA simulator (a smoke test of this script: no measurement)",
    )
    parser.add_argument("--json", default=str(REPO_ROOT / "benchmarks/results/gpu_check.json"))
    parser.add_argument("--log-dir", default=str(REPO_ROOT / "benchmarks/results"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import fusegrad as fg

    if not fg.cuda.is_available() or (fg.cuda.is_simulator() and not args.allow_simulator):
        print(f"no GPU: {fg.cuda.unavailable_reason()} (simulator: {fg.cuda.is_simulator()})")
        return 2
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"device": fg.cuda.get_device_name()}
    failed = False
    if not args.skip_tests:
        payload["tests"] = run_tests(log_dir)
        failed |= any(r["returncode"] != 0 for r in payload["tests"])
    torch = None
    if not args.no_torch:
        try:
            import torch as torch_module

            torch = torch_module if torch_module.cuda.is_available() else None
        except ImportError:
            torch = None
    payload["bandwidth"] = device_bandwidth(1 << 20 if fg.cuda.is_simulator() else 1 << 30)
    print(f"device copy bandwidth: {payload['bandwidth']['gbps']:.0f} GB/s")
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    payload["benchmarks"] = benchmark(names, args.quick, torch, not args.no_torch_compile)
    print(render_table(payload["benchmarks"]))
    for row in payload["benchmarks"]["rows"]:
        failed |= not all(info["grads_match"] for info in row["impls"].values())
        if row["workload"].startswith("A") and row["N"] == max(
            r["N"] or 0 for r in payload["benchmarks"]["rows"]
        ):
            compiled = row["impls"].get("fg_compiled", {}).get("backward")
            if compiled:
                gbps = payload["bandwidth"]["gbps"]
                seconds = compiled["median"] / 1e3
                counts = {
                    "naive": (24 * row["N"], "6*4*N: x, w, b read, 3 gradients written"),
                    "minimum": (16 * row["N"], "4*4*N: b and grad_b are one element"),
                }
                for label, (nbytes, what) in counts.items():
                    frac = nbytes / seconds / 1e9 / gbps
                    payload.setdefault("bandwidth_fraction", {})[label] = frac
                    print(
                        f"A N={row['N']:.0e} compiled backward: {frac:.1%} of the device's "
                        f"copy bandwidth ({label} byte count, {what})"
                    )
    for key, note in payload["benchmarks"]["notes"].items():
        print(f"note: {key}: {note}")
    step_names = [n.strip() for n in args.steps.split(",") if n.strip()]
    if step_names:
        payload["steps"] = step_benchmark(step_names, args.quick, torch, not args.no_torch_compile)
        print(render_step_table(payload["steps"]))
        for row in payload["steps"]["rows"]:
            # (float32 training steps drift apart by rounding; a wrong program by far more)
            failed |= any(v > 1e-2 for v in row["max_rel_param_difference"].values())
        for key, note in payload["steps"]["notes"].items():
            print(f"note: {key}: {note}")
    payload["environment"] = common.environment()
    common.write_json(args.json, payload)
    print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
