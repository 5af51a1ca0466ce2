"""Whole training steps (forward, backward, optimizer): fusegrad eager, fusegrad with its
backward compiled (``compiled_autograd``), fusegrad ``compile(model)`` (the forward replayed as a
program, the backward called outside it a second program; the optimizer eager), fusegrad
whole-step compile (``fusegrad.compile`` of the step function), PyTorch eager and
``torch.compile`` (of the model; the optimizer eager).

Workloads (``benchmarks.models`` builds the GPT from the PyTorch API, for both frameworks):

* ``C+SGD``: workload C's 784-512-512-10 ReLU MLP, batch 128, cross-entropy, SGD with momentum;
* ``GPT+AdamW``: a 2-layer GPT (width 64, 4 heads, block 32, vocabulary 65, dropout 0.1),
  batch 8, AdamW.

Every implementation runs the same sequence of batches from the same initial parameters; the
fusegrad ones each keep their own random-generator state (restored around each step, outside
the timing), so their dropout masks agree and their parameters after the run are compared
with eager's (``check``).  ``python -m benchmarks.steps`` runs it; each workload's row is
printed as soon as it is measured (``benchmarks.live``), ``--json`` writes the results with the
machine info (``benchmarks.compare`` puts two runs side by side) and ``--plot`` draws the whole
step's ratios against each peer.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, live, models, plot  # noqa: E402

STEP_IMPLS = ("fg_eager", "fg_compiled", "fg_module", "fg_step", "torch", "torch_compile")
STEP_HEADERS = {
    "fg_eager": "fg eager",
    "fg_compiled": "fg compiled bwd",
    "fg_module": "fg compile(model)",
    "fg_step": "fg whole step",
    "torch": "torch",
    "torch_compile": "torch.compile",
}
WORKLOADS = ("C+SGD", "GPT+AdamW")
GPT = {"vocab": 65, "width": 64, "heads": 4, "block": 32}
REPS = {"C+SGD": (3, 30), "GPT+AdamW": (3, 30)}
QUICK_REPS = (2, 2)
BATCHES = 4  # distinct batches, cycled


@dataclass
class StepImpl:
    step: Callable[[], dict[str, float]]
    params: Callable[[], list]
    first_calls_s: float | None = None
    module: Any = None  # the compiled model (``fg_module``)
    compiled: list = field(default_factory=list)  # fg.compile's results (``program_notes``)


def settle(impls: dict[str, StepImpl], keys: Sequence[str], others: Sequence[str]) -> int:
    """After the compiled implementations' first calls (their background compiles waited for):
    call each of ``keys`` until no ``service.Trial`` between two candidate programs runs any
    more (they run in turn and the faster stays: only the kept program is measured), then every
    one of ``keys`` and ``others`` as often, so that all have taken the same steps (their
    parameters are compared).  Returns the calls made per implementation."""
    service = importlib.import_module("fusegrad.compiler.service")
    limit = 4 * (service.Trial.RUNS + 1)
    counts = dict.fromkeys(keys, 0)
    for key in keys:
        while counts[key] < limit and (counts[key] < 2 or service.trials_running()):
            impls[key].step()
            counts[key] += 1
    total = max(counts.values(), default=0)
    for key in [*keys, *others]:
        for _ in range(total - counts.get(key, 0)):
            impls[key].step()
    return total


def program_notes(impls: dict[str, StepImpl]) -> str:
    """The programs of the whole step and of ``compile(model)`` after their trials
    (``program_summary``), for a workload's notes."""
    return (
        "; ".join(
            f"{label}: {program_summary(impls[key].compiled)}"
            for key, label in (("fg_step", "whole step"), ("fg_module", "compile(model)"))
            if key in impls
        )
        + " (native N seg. X/Y: N native segments run X of the program's Y steps)"
    )


def program_summary(compiled: Sequence[Any]) -> str:
    """What runs the compiled functions' and modules' replays after their trials: per program
    (a whole step's, a compiled module's forward and backward), its native segments and how
    many of its steps they run (``explain``'s first line of a native program), or "steps" for
    a program of steps; "none" when nothing was recorded."""
    programs = []
    for obj in compiled:
        entries = getattr(obj, "entries", None)  # (a compiled function)
        if entries is None:
            entries = getattr(obj, "_aot", None)  # (a compiled module)
        for entry in entries.values() if entries is not None else ():
            step = getattr(entry, "step", entry)
            tables = (getattr(step, "programs", None), getattr(entry, "backward_programs", None))
            for table in tables:
                if table is not None:
                    programs.extend(table.programs())
    parts = []
    for program in programs:
        variant = program.default
        steps = len(variant.schedule.steps)
        if program.native:
            inside = sum(seg.last - seg.first + 1 for seg in variant.segments.values())
            parts.append(f"native {len(variant.segments)} seg. {inside}/{steps}")
        else:
            parts.append(f"steps {steps}")
    return ", ".join(parts) or "none"


def _build(torch: Any, name: str) -> Any:
    if name == "C+SGD":
        nn = torch.nn
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    return models.make(torch, "gpt", **GPT)


def _batches(np: Any, name: str) -> list:
    rng = np.random.default_rng(0)
    if name == "C+SGD":
        return [
            (rng.standard_normal((128, 784)).astype(np.float32), rng.integers(0, 10, 128))
            for _ in range(BATCHES)
        ]
    shape = (8, GPT["block"])
    return [
        (rng.integers(0, GPT["vocab"], shape), rng.integers(0, GPT["vocab"], shape))
        for _ in range(BATCHES)
    ]


def _optimizer(torch: Any, name: str, params: Any) -> Any:
    if name == "C+SGD":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3)


def _impl(
    torch: Any,
    name: str,
    state: dict,
    data: list,
    *,
    wrap_step: Callable | None = None,
    wrap_model: Callable | None = None,
    context: Callable | None = None,
    rng: Any = None,
    device: str = "cpu",
    sync: Callable[[], None] | None = None,
) -> StepImpl:
    """One implementation: a model loaded from ``state``, its optimizer and a step function.
    ``device``: where the model and the batches live; ``sync``: what ends a timed step there
    (a device's kernels run asynchronously: ``benchmarks.gpu_check``)."""
    model = _build(torch, name)
    model.load_state_dict(copy.deepcopy(state))
    if device != "cpu":
        model.to(device)
    net = wrap_model(model) if wrap_model is not None else model
    opt = _optimizer(torch, name, model.parameters())
    batches = [(torch.tensor(x, device=device), torch.tensor(y, device=device)) for x, y in data]

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = models.loss(torch, net, x, y)
        loss.backward()
        opt.step()
        return loss

    fn = wrap_step(step) if wrap_step is not None else step
    compiled = [fn] if wrap_step is not None else [net] if wrap_model is not None else []
    counter = [0]
    generator = [rng]  # this implementation's generator state (fusegrad's: None for torch)

    def timed() -> dict[str, float]:
        x, y = batches[counter[0] % len(batches)]
        counter[0] += 1
        if rng is not None:
            torch.random.set_rng_state(generator[0])
        if context is not None:
            with context():
                t0 = common.clock()
                fn(x, y)
                if sync is not None:
                    sync()
                t1 = common.clock()
        else:
            t0 = common.clock()
            fn(x, y)
            if sync is not None:
                sync()
            t1 = common.clock()
        if rng is not None:
            generator[0] = torch.random.get_rng_state()
        return {"step": t1 - t0}

    def params() -> list:
        return [p.detach().cpu().numpy().copy() for p in model.parameters()]

    return StepImpl(
        timed, params, module=net if wrap_model is not None else None, compiled=compiled
    )


def run(
    np: Any,
    fg: Any,
    torch: Any | None,
    torch_compile: bool,
    names: Sequence[str] = WORKLOADS,
    quick: bool = False,
    *,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: str = "off",
) -> dict[str, Any]:
    """Measure every workload; returns ``{"rows": [...], "checks": {...}, "notes": {...}}``.

    ``on_row`` gets each workload's row as soon as it is measured (the streamed table);
    ``progress`` is ``live.Progress``'s mode for the per-workload display on stderr."""
    fc = importlib.import_module("fusegrad.compiler")
    rows, checks, notes = [], {}, {}
    for index, name in enumerate(names, 1):
        bar = live.Progress(name, mode=progress, position=(index, len(names)))
        bar.stage("building and compiling (first calls of every implementation)")
        fg.manual_seed(0)
        state = {k: v.detach().clone() for k, v in _build(fg, name).state_dict().items()}
        data = _batches(np, name)
        fg.manual_seed(1)
        rng = fg.random.get_rng_state()  # every fusegrad implementation draws the same masks
        impls = {
            "fg_eager": _impl(fg, name, state, data, rng=rng),
            "fg_compiled": _impl(fg, name, state, data, context=fc.compiled_autograd, rng=rng),
            "fg_module": _impl(fg, name, state, data, wrap_model=fg.compile, rng=rng),
            "fg_step": _impl(fg, name, state, data, wrap_step=fg.compile, rng=rng),
        }
        wl_notes: dict[str, str] = {}
        if torch is not None:
            tstate = {k: torch.from_numpy(v.numpy().copy()) for k, v in state.items()}
            add_torch(
                impls,
                lambda wrap, name=name, state=tstate, data=data: _impl(
                    torch, name, state, data, wrap_model=wrap
                ),
                torch.compile if torch_compile else None,
                wl_notes,
            )
        # three calls each (fusegrad's parameters are compared after the same steps): a whole
        # step's first call makes the optimizer's state, the second records, the third is the
        # first replay, which builds and compiles the program on a thread (waited for, so that
        # compiled steps are measured)
        # Then the calls that choose between a program of steps and its native segments,
        # which a background compile makes both of (``service.Trial``: they run in turn, the
        # faster stays), before anything is measured; eager takes as many steps.
        for key in ("fg_step", "fg_compiled", "fg_module"):
            t0 = common.clock()
            for _ in range(3):
                impls[key].step()
            fc.wait_for_compiles()  # (compiled on a thread while the calls ran uncompiled)
            impls[key].first_calls_s = common.clock() - t0
        for _ in range(3):
            impls["fg_eager"].step()
        settle(impls, ("fg_step", "fg_compiled", "fg_module"), ("fg_eager",))
        warmup, reps = QUICK_REPS if quick else REPS[name]
        before = (fc.counters.step_runs, dict(fc.counters.step_breaks))
        medians, checks[name] = measure(
            np,
            fc,
            impls,
            STEP_IMPLS,
            ("fg_compiled", "fg_module", "fg_step"),
            warmup,
            reps,
            bar,
            before,
        )
        rows.append(
            {
                "workload": name,
                "unit": "ms",
                **medians,
                "first_calls_s": {k: i.first_calls_s for k, i in impls.items()},
                **{
                    f"fg_step/{o}": common.ratio(medians["fg_step"], medians[o])
                    for o in STEP_IMPLS
                    if o != "fg_step"
                },
            }
        )
        wl_notes["programs"] = program_notes(impls)
        saved = saved_bytes(impls["fg_module"].module)
        if saved is not None:
            checks[name]["compile_model_saved_bytes"] = saved
        notes[name] = wl_notes
        if on_row is not None:
            on_row(rows[-1])
        bar.close()
    return {"rows": rows, "checks": checks, "notes": notes}


def add_torch(
    impls: dict, make: Callable[[Any], StepImpl], compile_fn: Any, notes: dict[str, str]
) -> None:
    """PyTorch's implementations: eager (``make(None)``) and, with ``compile_fn``
    (``torch.compile``), the compiled one, whose first two calls are timed (a failure is noted
    and the column skipped)."""
    impls["torch"] = make(None)
    if compile_fn is None:
        return
    impl = make(compile_fn)
    t0 = common.clock()
    try:
        impl.step()
        impl.step()
    except Exception as e:  # noqa: BLE001 - a failing torch.compile is skipped
        notes["torch_compile"] = f"failed: {type(e).__name__}: {e}"[:300]
    else:
        impl.first_calls_s = common.clock() - t0
        impls["torch_compile"] = impl


def measure(
    np: Any,
    fc: Any,
    impls: dict,
    columns: Sequence[str],
    compiled: Sequence[str],
    warmup: int,
    reps: int,
    bar: Any,
    before: tuple,
) -> tuple[dict[str, float | None], dict[str, Any]]:
    """The implementations interleaved: the median step in ms per column (None: not run),
    and the checks -- each ``compiled`` variant's parameters against fusegrad eager's (max
    relative difference), the whole-step replays and breaks since ``before`` (``(step_runs,
    step_breaks)`` of ``fc.counters``)."""
    bar.stage(f"measuring {len(impls)} implementations, {warmup}+{reps} steps each")
    stats = common.measure_interleaved(
        {k: i.step for k, i in impls.items()}, warmup=warmup, reps=reps, on_step=bar.update
    )
    medians = {k: stats[k]["step"].median * 1e3 if k in stats else None for k in columns}
    want = impls["fg_eager"].params()
    worst = {}
    for key in compiled:
        got = impls[key].params()
        worst[key] = max(
            float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-12)
            for a, b in zip(got, want)
        )
    check = {
        "max_rel_param_difference": worst,
        "step_runs": fc.counters.step_runs - before[0],
        "step_breaks": {
            k: v - before[1].get(k, 0)
            for k, v in fc.counters.step_breaks.items()
            if v != before[1].get(k, 0)
        },
    }
    return medians, check


def saved_bytes(module: Any) -> dict[str, int] | None:
    """What ``fg.compile(model)``'s forward keeps for the backward (its recording's AOT entry:
    saved values after recomputing cheap elementwise ones, and the module inputs it reads) vs
    what eager's autograd nodes saved on the recorded call; None without such an entry."""
    entries = [e for e in getattr(module, "_aot", {}).values() if hasattr(e, "stats")]
    if not entries:
        return None
    stats = entries[-1].stats
    return {"program": stats["saved bytes"], "eager": stats["eager saved bytes"]}


def planned_impls(have_torch: bool, torch_compile: bool) -> list[str]:
    """The columns a run will have, known before it measures."""
    skip = set() if have_torch else {"torch", "torch_compile"}
    if not torch_compile:
        skip.add("torch_compile")
    return [k for k in STEP_IMPLS if k not in skip]


def table_headers(impls: Sequence[str]) -> list[str]:
    """The table's headers: medians per implementation, whole step / each other one, and the
    whole step's first calls (until its program is ready)."""
    others = [k for k in impls if k != "fg_step"]
    headers = ["workload", "unit", *(STEP_HEADERS[k] for k in impls)]
    headers += [f"step/{STEP_HEADERS[o].replace('fg ', '')}" for o in others]
    return headers + ["fg step: first calls until compiled (s)"]


def table_cells(row: dict[str, Any], impls: Sequence[str]) -> list[str]:
    cells = [row["workload"], row["unit"]]
    cells += [common.format_number(row.get(k)) for k in impls]
    for o in (k for k in impls if k != "fg_step"):
        value = row[f"fg_step/{o}"]
        cells.append(common.format_number(value, 2) + "×" if value is not None else "—")
    cells.append(common.format_number(row["first_calls_s"].get("fg_step")))
    return cells


def render_notes(result: dict[str, Any]) -> str:
    """The parameter checks and notes under the table."""
    lines = []
    for name, check in result["checks"].items():
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in check["max_rel_param_difference"].items())
        lines.append(
            f"{name}: parameters after the run vs fg eager (max relative difference): {diffs}; "
            f"whole-step replays {check['step_runs']}, breaks {check['step_breaks'] or 'none'}"
        )
        saved = check.get("compile_model_saved_bytes")
        if saved:
            lines.append(
                f"{name}: compile(model) keeps {saved['program']:,} bytes of forward values for "
                f"its backward (eager's nodes: {saved['eager']:,} bytes; "
                f"{saved['program'] / max(saved['eager'], 1):.2f}×)"
            )
    for name, wl_notes in result["notes"].items():
        for key, note in wl_notes.items():
            lines.append(f"{name} {key}: {note}")
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """The table (the columns some row has) and the notes, as one text."""
    present = [k for k in STEP_IMPLS if any(r.get(k) is not None for r in result["rows"])]
    headers = table_headers(present)
    body = [table_cells(row, present) for row in result["rows"]]
    table = common.markdown_table(headers, body, ["l", "l"] + ["r"] * (len(headers) - 2))
    notes = render_notes(result)
    return table + ("\n" + notes if notes else "")


CHILD_MARKER = "STEP_COMPILE_CHILD "


def compile_child(name: str) -> dict[str, Any]:
    """In a fresh process: the whole step's calls until its first replay, timed (the first
    call, which makes the optimizer's state, runs eagerly; the second records; the third
    builds, compiles or loads the program and runs it)."""
    t0 = common.clock()
    import numpy as np

    import fusegrad as fg

    fc = importlib.import_module("fusegrad.compiler")
    t1 = common.clock()
    impl = _impl(fg, name, _build(fg, name).state_dict(), _batches(np, name), wrap_step=fg.compile)
    calls = []
    start = common.clock()
    while fc.counters.step_runs == 0 and len(calls) < 5:
        calls.append(impl.step()["step"])
    # with the JIT in the background (``config.background_compile``), calls go on running the
    # step uncompiled until a compiled program is published (the first of a background
    # compile's candidates; a second may still compile, and a trial keep the faster): the time
    # until a call has run compiled code, as a user's loop sees it
    counters = fc.counters
    deadline = start + 600.0
    # the first program a background compile publishes may be its quick tier (nothing
    # generated: about eager's speed): the time until a call ran generated code is the second
    # figure (the same where the first compiled call ran generated code)
    compiled = counters.step_runs - counters.uncompiled_runs
    until_compiled = common.clock() - start if compiled else None
    until_generated = until_compiled if compiled > counters.quick_runs else None
    while until_generated is None and common.clock() < deadline:
        runs = (counters.step_runs, counters.uncompiled_runs, counters.quick_runs)
        impl.step()
        ran = (counters.step_runs - runs[0]) - (counters.uncompiled_runs - runs[1])
        if ran and until_compiled is None:
            until_compiled = common.clock() - start
        if ran > counters.quick_runs - runs[2]:
            until_generated = common.clock() - start
    fc.wait_for_compiles()
    # a training loop goes on: the trial between the candidates ends (and is remembered on
    # disk, so that a later process loads the kept program alone)
    service = importlib.import_module("fusegrad.compiler.service")
    for calls_after in range(4 * (service.Trial.RUNS + 1)):
        if calls_after >= 2 and not service.trials_running():  # (a trial starts at a call)
            break
        impl.step()
    return {
        "import_s": t1 - t0,
        "calls_s": calls,
        "until_first_replay_s": sum(calls),
        "until_compiled_s": until_compiled,
        "until_generated_s": until_generated,
        "until_all_compiled_s": common.clock() - start,
        "background_compile": counters.background_compiles > 0,
    }


def compile_times(names: Sequence[str]) -> dict[str, Any]:
    """Per workload: ``cold`` (empty FUSEGRAD_CACHE_DIR and NUMBA_CACHE_DIR) and ``warm`` (a
    second process on the same directories), each a fresh process."""
    import json
    import os
    import shutil
    import subprocess
    import tempfile

    out: dict[str, Any] = {}
    for name in names:
        root = Path(tempfile.mkdtemp(prefix="fusegrad-steps-"))
        env = dict(os.environ)
        env["FUSEGRAD_CACHE_DIR"] = str(root / "fusegrad")
        env["NUMBA_CACHE_DIR"] = str(root / "numba")
        env["PYTHONPATH"] = str(common.REPO_ROOT)
        try:
            for case in ("cold", "warm"):
                proc = subprocess.run(
                    [sys.executable, "-m", "benchmarks.steps", "--compile-child", name],
                    cwd=common.REPO_ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=900,
                    check=False,
                )
                lines = [x for x in proc.stdout.splitlines() if x.startswith(CHILD_MARKER)]
                out.setdefault(name, {})[case] = (
                    json.loads(lines[-1][len(CHILD_MARKER) :])
                    if lines
                    else {"error": (proc.stdout + proc.stderr)[-2000:]}
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


def render_compile_times(result: dict[str, Any]) -> str:
    rows = []
    for name, cases in result.items():
        cells = [name]
        for case in ("cold", "warm"):
            r = cases.get(case, {})
            cells.append(common.format_number(r.get("until_first_replay_s")))
            cells.append(" / ".join(f"{c:.2f}" for c in r.get("calls_s", [])) or "FAILED")
            cells.append(common.format_number(r.get("until_compiled_s")))
            cells.append(common.format_number(r.get("until_generated_s")))
        rows.append(cells)
    headers = ["workload"] + [
        f"{case}{what}"
        for case in ("cold", "warm")
        for what in (" (s)", ": calls (s)", ": until compiled (s)", ": until generated (s)")
    ]
    return common.markdown_table(headers, rows, ["l"] + ["r", "l", "r", "r"] * 2)


def write_results(args: Any, payload: dict[str, Any]) -> None:
    """The JSON (``--json``) and the picture (``--plot``), each announced."""
    path = common.write_json(args.json, payload)
    live.emit(f"\nJSON written to {path} (compare two runs: python -m benchmarks.compare A B)")
    if args.plot is not None:
        live.emit(f"plot written to {plot.plot_payload(payload, args.plot)}")


def add_arguments(parser: Any, workloads: Sequence[str], json_name: str, quick: str) -> None:
    """The options ``benchmarks.steps`` and ``benchmarks.programs`` share."""
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--workloads", default=",".join(workloads))
    parser.add_argument("--json", type=Path, default=common.RESULTS_DIR / json_name)
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="also draw the whole step's time ratios against each peer into this PNG "
        "(needs matplotlib)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "plain", "off"),
        default="auto",
        help="progress on stderr: a tqdm bar when tqdm is installed and stderr is a terminal, "
        "plain lines otherwise (auto); always plain lines; none",
    )


def workload_names(parser: Any, args: Any, workloads: Sequence[str]) -> list[str]:
    """``--workloads`` checked (and ``--plot``'s matplotlib)."""
    if args.plot is not None and (missing := plot.matplotlib_missing()) is not None:
        parser.error(missing)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    if not names or any(n not in workloads for n in names):
        parser.error(f"--workloads: choose from {','.join(workloads)}, got {args.workloads!r}")
    return names


def peers(args: Any) -> tuple[Any, bool]:
    """PyTorch (None without it or with ``--no-torch``), its threads pinned, and whether
    torch.compile runs."""
    torch = None
    if not args.no_torch:
        try:
            import torch  # (optional comparison)

            common.pin_torch_threads(torch, args.threads)
        except ImportError:
            torch = None
    return torch, not args.no_torch_compile and torch is not None


PLOT_PANELS = [
    {
        "title": "whole training step: fg whole step time / peer's step time",
        "numerator": "fg_step",
        "peers": [k for k in STEP_IMPLS if k != "fg_step"],
        "metrics": None,
    }
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.steps", description=__doc__)
    add_arguments(parser, WORKLOADS, "steps.json", "2+2 repetitions: a smoke test")
    parser.add_argument(
        "--compile-time",
        action="store_true",
        help="also time the calls until the first replay in fresh processes (cold, warm)",
    )
    parser.add_argument("--compile-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = workload_names(parser, args, WORKLOADS)
    threads = common.pin_threads(args.threads)
    if args.compile_child:
        import json

        print(CHILD_MARKER + json.dumps(compile_child(args.compile_child)))
        return 0
    import numpy as np

    import fusegrad as fg

    torch, torch_compile = peers(args)
    environment = common.environment(threads=args.threads)
    quick_note = " (QUICK: smoke test, not a measurement)" if args.quick else ""
    live.emit(f"# whole training steps{quick_note}")
    live.emit()
    live.emit(f"machine: {common.describe_environment(environment)}")
    reps = ", ".join(
        f"{n} {w}/{r}" for n in names for w, r in [QUICK_REPS if args.quick else REPS[n]]
    )
    live.emit(
        f"threads: {args.threads}; repetitions (warm-up/measured steps): {reps}; torch: "
        + ("not used" if torch is None else torch.__version__)
        + ("" if torch_compile or torch is None else "; torch.compile skipped")
    )
    live.emit(
        "Times: median wall time of one training step (zero_grad, forward, loss, backward, "
        "optimizer step) in ms, from one interleaved run. "
        + live.RATIO_CONVENTION
        + " Here fusegrad is the whole step: step/X = fg whole step time / X's time. "
        "'first 2 calls': wall time of the whole step's first two calls in this process "
        "(recording, then building and compiling or loading the program), in seconds."
    )
    live.emit()
    planned = planned_impls(torch is not None, torch_compile)
    headers = table_headers(planned)
    stream = live.StreamTable(
        headers,
        ["l", "l"] + ["r"] * (len(headers) - 2),
        widths=[max(len(n) for n in names), 4],
    )
    stream.start()
    result = run(
        np,
        fg,
        torch,
        torch_compile,
        names,
        args.quick,
        on_row=lambda row: stream.row(table_cells(row, planned)),
        progress=args.progress,
    )
    live.emit()
    live.emit(render_notes(result))
    if args.compile_time:
        result["compile_times"] = compile_times(names)
        live.emit()
        live.emit(
            "Whole step, calls until the first replay in a fresh process (the first makes the "
            "optimizer's state and runs eagerly, the second records, the third builds and "
            "compiles or loads the program): 'cold' with empty FUSEGRAD_CACHE_DIR and "
            "NUMBA_CACHE_DIR, 'warm' a second process on them.  When numba has to compile, it "
            "does so on a thread of its own (config.background_compile) while the third and "
            "later calls run the step uncompiled; 'until compiled' is the time from the first "
            "call until a call has run a compiled program (the first published may be the quick "
            "tier: every kernel interpreted or by eager kernels, nothing generated, about "
            "eager's speed), 'until generated' until a call has run one with generated code."
        )
        live.emit()
        live.emit(render_compile_times(result["compile_times"]))
    present = [k for k in STEP_IMPLS if any(r.get(k) is not None for r in result["rows"])]
    payload = {
        "benchmark": "steps",
        "quick": args.quick,
        "threads": threads,
        "implementations": present,
        "columns": dict(STEP_HEADERS),
        "ratio_convention": "fg_step/x: the whole step's median time divided by x's, in the "
        "same run (below 1: the whole step is faster)",
        "plot_panels": PLOT_PANELS,
        **result,
        "table": render(result),
        "environment": environment,
    }
    write_results(args, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
