"""Shared benchmark machinery: thread pinning, timing, markdown tables and JSON results.

Every benchmark module (``benchmarks/eager_overhead.py``, ``benchmarks/compiled.py``) uses these
helpers so that all results are measured and reported the same way:

* ``pin_threads`` fixes the BLAS / OpenMP thread count through environment variables.  It must run
  *before* numpy or torch is imported, so this module imports neither at load time; when numpy is
  already loaded (an in-process caller) it falls back to ``threadpoolctl`` if that is installed.
* ``measure`` runs a step function that times its own phases (``forward``, ``backward``, ...),
  discards warm-up repetitions and summarizes each phase by its median and quartiles.  A ``total``
  phase is the per-repetition sum, so its median is not the sum of the phase medians.
  ``measure_interleaved`` does the same for several implementations at once, alternating them
  in rounds so that background load is shared fairly.
* ``markdown_table`` / ``write_json`` / ``environment`` produce the report; ``environment``
  records the machine (CPU model, cores, threads used, versions, commit, date) so that
  ``benchmarks.compare`` can put two runs side by side.
* ``memory_bandwidth`` measures this machine's streaming bandwidth (numpy copy and add over
  arrays far larger than the caches), for bandwidth bounds of memory-bound workloads.

Timing is wall-clock (``time.perf_counter``) with the garbage collector left enabled: collecting
the objects an eager framework allocates is part of its real cost.  ``gc.collect()`` runs before
the warm-up and before the measured repetitions so that one benchmark's garbage is not billed to
the next.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


# ---- threads -----------------------------------------------------------------------------------


def pin_threads(n: int) -> dict[str, Any]:
    """Fix the thread count of BLAS / OpenMP / numba to ``n``; call before importing numpy.

    Returns a record for the report: the requested count and whether the environment variables
    were set early enough (numpy not yet imported) to take effect.  When numpy is already loaded,
    ``threadpoolctl`` (if installed) limits the loaded BLAS libraries in-process instead.
    """
    if n < 1:
        raise ValueError(f"pin_threads: thread count must be >= 1, got {n}")
    numpy_was_loaded = "numpy" in sys.modules
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n)
    record: dict[str, Any] = {"requested": n, "env_before_numpy": not numpy_was_loaded}
    if numpy_was_loaded:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            record["threadpoolctl"] = "unavailable: thread count may not be applied"
        else:
            # Kept alive for the rest of the process: the limit holds until it is garbage.
            _LIMITERS.append(threadpool_limits(limits=n))
            record["threadpoolctl"] = "applied"
    return record


_LIMITERS: list[Any] = []


def pin_torch_threads(torch: Any, n: int) -> dict[str, Any]:
    """Apply the thread count to an imported torch module (intra-op and, if still allowed,
    inter-op) and return what torch reports."""
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        pass  # already fixed by earlier parallel work in this process; intra-op is what matters
    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}


def blas_threads() -> list[dict[str, Any]]:
    """The thread pools actually loaded (BLAS, OpenMP) and their sizes, via threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keys = ("user_api", "internal_api", "num_threads", "version")
    return [{k: info.get(k) for k in keys} for info in threadpool_info()]


# ---- timing ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of one phase's repetitions, in seconds."""

    median: float
    q1: float
    q3: float
    min: float
    reps: int

    def scaled(self, factor: float) -> Stats:
        """The same summary with every time multiplied by ``factor`` (per-op normalization)."""
        return Stats(
            self.median * factor, self.q1 * factor, self.q3 * factor, self.min * factor, self.reps
        )


def summarize(samples: Sequence[float]) -> Stats:
    """Median, quartiles and minimum of ``samples`` (at least one)."""
    if not samples:
        raise ValueError("summarize: no samples")
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Stats(statistics.median(ordered), q1, q3, ordered[0], len(ordered))


StepFn = Callable[[], Mapping[str, float]]


def measure(step: StepFn, *, warmup: int, reps: int) -> dict[str, Stats]:
    """Run ``step`` ``warmup`` times unmeasured, then ``reps`` times; summarize each phase.

    ``step`` does one repetition and returns ``{phase: seconds}``, timing the phases itself (use
    ``clock``), so that setup such as building inputs or clearing ``.grad`` stays outside.  The
    returned mapping has one ``Stats`` per phase plus ``"total"``, the per-repetition sum.
    """
    return measure_interleaved({"step": step}, warmup=warmup, reps=reps)["step"]


def measure_interleaved(
    steps: Mapping[str, StepFn],
    *,
    warmup: int,
    reps: int,
    rounds: int = 10,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, dict[str, Stats]]:
    """``measure`` for several implementations of one workload, interleaved in ``rounds``.

    Each round runs every implementation (in an order rotated per round) for one unmeasured
    re-warm-up step and then its share of the ``reps`` measured steps, back to back.  Background
    load, CPU frequency changes and thermal drift then hit all implementations alike, which is
    what makes their ratios (measured in the same run) trustworthy; running each one in blocks
    (rather than alternating every step) keeps its caches warm, as in a real training loop,
    instead of billing it for the cache pollution of the others.  Returns
    ``{name: {phase: Stats}}``.

    ``on_step(done, total)``, when given, is called after every step (warm-up ones included),
    outside the timed region, with the number of steps run so far and the total: a progress
    display hangs on it.
    """
    if reps < 1:
        raise ValueError(f"measure: reps must be >= 1, got {reps}")
    names = list(steps)
    rounds = max(1, min(rounds, reps))
    rewarm = 1 if warmup else 0
    total = len(names) * (warmup + reps + rewarm * (rounds - 1))
    done = 0

    def run(name: str) -> Mapping[str, float]:
        nonlocal done
        phases = steps[name]()
        done += 1
        if on_step is not None:
            on_step(done, total)
        return phases

    gc.collect()
    for _ in range(warmup):
        for name in names:
            run(name)
    gc.collect()
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for round_index in range(rounds):
        count = reps // rounds + (1 if round_index < reps % rounds else 0)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if round_index and warmup:
                run(name)  # re-warm after the other implementations ran
            for _ in range(count):
                phases = run(name)
                for phase, seconds in phases.items():
                    samples[name].setdefault(phase, []).append(seconds)
                samples[name].setdefault("total", []).append(sum(phases.values()))
    return {
        name: {phase: summarize(values) for phase, values in by_phase.items()}
        for name, by_phase in samples.items()
    }


clock = time.perf_counter


# ---- memory bandwidth ----------------------------------------------------------------------------


def memory_bandwidth(np: Any, *, mib: int = 256, reps: int = 7) -> dict[str, Any]:
    """This machine's streaming memory bandwidth, measured with numpy on ``mib``-MiB float32
    arrays (far larger than any cache), in the current thread setting.

    Two kernels, both over preallocated, already-touched arrays (no page faults):

    * ``copy``: ``np.copyto(dst, src)``, counted as ``2 * nbytes`` (one read, one write);
    * ``add``: ``np.add(a, b, out=c)``, counted as ``3 * nbytes`` (two reads, one write) — the
      access pattern of a fused elementwise loop with ordinary stores.

    Write-allocate traffic (the cache line read before it is written) is not counted, as in
    STREAM.  Returns per kernel the median and best GB/s (10**9 bytes per second), plus
    ``"gbps"``: the larger of the two medians, the figure bandwidth bounds are computed with.
    """
    n = mib * 2**20 // 4
    a = np.ones(n, np.float32)
    b = np.full(n, 2.0, np.float32)
    c = np.zeros(n, np.float32)
    kernels: dict[str, tuple[Callable[[], Any], int]] = {
        "copy": (lambda: np.copyto(c, a), 2),
        "add": (lambda: np.add(a, b, out=c), 3),
    }
    result: dict[str, Any] = {"array_mib": mib, "reps": reps}
    for name, (kernel, passes) in kernels.items():
        kernel()  # warm-up
        times = []
        for _ in range(reps):
            t0 = clock()
            kernel()
            times.append(clock() - t0)
        stats = summarize(times)
        nbytes = passes * a.nbytes
        result[name] = {
            "bytes_per_rep": nbytes,
            "gbps_median": nbytes / stats.median / 1e9,
            "gbps_best": nbytes / stats.min / 1e9,
        }
    result["gbps"] = max(result[k]["gbps_median"] for k in kernels)
    return result


# ---- reporting ---------------------------------------------------------------------------------


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None where either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def format_number(value: float | None, digits: int = 3) -> str:
    """A time or ratio with ``digits`` significant digits; an em dash where there is none."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:#.{digits}g}".rstrip(".")


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], align: Sequence[str] | None = None
) -> str:
    """A GitHub markdown table; ``align`` holds ``"l"`` or ``"r"`` per column (default: first
    column left, the rest right).  Columns are padded so the text table reads well too."""
    body = [list(map(str, row)) for row in rows]
    for row in body:
        if len(row) != len(headers):
            raise ValueError(
                f"markdown_table: row {row} has {len(row)} cells, expected {len(headers)}"
            )
    if align is None:
        align = ["l"] + ["r"] * (len(headers) - 1)
    widths = [max([len(h)] + [len(r[i]) for r in body] + [3]) for i, h in enumerate(headers)]
    lines = [table_line(headers, widths, align), table_rule(widths, align)]
    return "\n".join(lines + [table_line(r, widths, align) for r in body])


def table_line(cells: Sequence[str], widths: Sequence[int], align: Sequence[str]) -> str:
    """One markdown table line, each cell padded to its width (left or right aligned); a cell
    wider than its column is kept whole (the line is still valid markdown)."""
    padded = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)]
    return "| " + " | ".join(padded) + " |"


def table_rule(widths: Sequence[int], align: Sequence[str]) -> str:
    """The markdown rule under a table's header (``---:`` for right-aligned columns)."""
    rule = ["-" * (w - 1) + ":" if a == "r" else "-" * w for w, a in zip(widths, align)]
    return "| " + " | ".join(rule) + " |"


def stats_dict(stats: Stats | None, unit_scale: float = 1.0) -> dict[str, Any] | None:
    """``Stats`` as a JSON-ready dict, times multiplied by ``unit_scale``."""
    if stats is None:
        return None
    return asdict(stats.scaled(unit_scale))


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _git_dirty() -> bool | None:
    """Whether the working tree has uncommitted changes to tracked files (None: no git)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def cpu_model() -> str | None:
    """The processor's marketing name ("AMD EPYC 7B13", ...): ``/proc/cpuinfo`` on Linux,
    ``sysctl`` on macOS, else whatever ``platform.processor()`` says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or None


def physical_cores() -> int | None:
    """Physical cores (distinct ``physical id``/``core id`` pairs in ``/proc/cpuinfo``), or None
    where that file does not say."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return None
    cores: set[tuple[str, str]] = set()
    package = core = None
    for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            package = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not key:  # a blank line ends one logical CPU's block
            if package is not None and core is not None:
                cores.add((package, core))
            package = core = None
    return len(cores) or None


def package_version(name: str) -> str | None:
    """The version of ``name``: the loaded module's ``__version__``, else the installed
    distribution's (read from its metadata, without importing it); None if not installed."""
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None) if module is not None else None
    if version is None:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            version = importlib.metadata.version(name)
    return str(version) if version is not None else None


VERSIONED_PACKAGES = ("fusegrad", "numpy", "numba", "torch", "jax", "scipy")


def environment(
    extra: Mapping[str, Any] | None = None, *, threads: int | None = None
) -> dict[str, Any]:
    """Where and with what the benchmark ran, so that two runs can be compared: date (UTC),
    CPU model and core counts, the thread count the benchmark used (``threads``), Python and
    library versions (installed ones; a library a run left out still shows its version), the
    git commit and whether the tree had uncommitted changes, the thread settings."""
    now = datetime.datetime.now(datetime.timezone.utc)
    env: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "physical_cores": physical_cores(),
        "threads": threads,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "versions": {name: package_version(name) for name in VERSIONED_PACKAGES},
        "git_commit": _git_commit(),
        "git_dirty": _git_dirty(),
        "thread_env": {var: os.environ.get(var) for var in THREAD_ENV_VARS},
        "blas_threads": blas_threads(),
    }
    if extra:
        env.update(extra)
    return env


def describe_environment(env: Mapping[str, Any]) -> str:
    """``environment()`` in one line for a report's header: machine, threads, versions, commit,
    date."""
    cores = f"{env.get('cpu_count') or '?'} logical"
    if env.get("physical_cores"):
        cores = f"{env['physical_cores']} physical / {cores}"
    versions = env.get("versions", {})
    libraries = ", ".join(
        f"{name} {versions[name]}" for name in VERSIONED_PACKAGES if versions.get(name)
    )
    commit = env.get("git_commit") or "unknown commit"
    if env.get("git_dirty"):
        commit += " + uncommitted changes"
    return (
        f"{env.get('cpu_model') or 'unknown CPU'} ({cores} cores); "
        f"threads used: {env.get('threads') if env.get('threads') is not None else '?'}; "
        f"Python {env.get('python') or '?'}, {libraries or 'library versions unknown'}; "
        f"commit {commit}; {env.get('date') or env.get('timestamp') or 'date unknown'}"
    )


def write_json(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as indented JSON, creating the folder; returns the path written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return target


def optional_torch(skip: bool, threads: int) -> Any:
    """PyTorch for an optional comparison, its threads pinned; None with ``skip`` or without
    it installed."""
    if skip:
        return None
    try:
        import torch
    except ImportError:
        return None
    pin_torch_threads(torch, threads)
    return torch


def check_gradients(np: Any, label: str, steps: dict, grads: dict, reference: str) -> None:
    """Run each implementation's step once and compare its gradients (``grads[impl]()``: name
    -> array) with those of ``reference``; exits with the difference named."""
    results = {}
    for impl in steps:
        steps[impl]()
        results[impl] = grads[impl]()
    want = results[reference]
    for impl, got in results.items():
        for key, value in want.items():
            scale = max(1.0, float(np.abs(value).max()))
            if not np.allclose(got[key], value, rtol=1e-3, atol=1e-4 * scale):
                raise SystemExit(f"{label}: {impl}'s gradient of {key} differs from {reference}'s")
