"""Differential fuzzing campaign: compiled vs eager autograd on generated programs.

``python -m benchmarks.fuzz --programs 10000`` generates the programs of seeds ``S .. S+N-1``
(``benchmarks.fuzzgen``: what a program is, which configurations run and how results are
compared), checks each, prints progress every few seconds and then the totals: programs,
mismatches, crashes, gradcheck failures, fallback rate with reasons, cache-hit rate (program
cache lookups that hit, from ``fusegrad.compiler.counters``) and time.  Every failing program's
standalone repro script goes to ``--out`` (default ``benchmarks/results/fuzz``), together with a
shrunk version (statements and leaves removed while it still fails the same way).  The exit
status is 1 when anything failed, 0 otherwise.

Options: ``--seed S`` (first seed, default 0), ``--max-ops K`` (statements per program, default
``fuzzgen.DEFAULT_MAX_OPS``), ``--threads N`` (BLAS / numba threads, fixed before numpy is
imported, default 1), ``--json PATH`` (totals and findings), ``--no-shrink``, ``--only NAMES``
(comma-separated short names of ``ONLY``: run every program under just these configurations,
whether or not its seed draws them; ``--only native`` is the campaign of the native runtime).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "fuzz"
PROGRESS_EVERY_S = 5.0
# programs per child process of a campaign (``--chunk``): a campaign in one process held 13 GB
# after 1,148 programs, the compiled code of every one of them
CHUNK = 250
# ``--only``'s short names of fuzzgen's configurations (fuzzgen.CONFIGS is keyed by long names)
ONLY = {
    "default": "default",
    "cached": "default, cached",
    "debug": "debug",
    "generated": "generated code",
    "gradcheck": "gradcheck",
    "whole": "whole step",
    "module": "compile(module)",
    "native": "native whole step",
    "native-module": "native compile(module)",
    "native-backward": "native compiled backward",
    "quick": "quick whole step",
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fuzz",
        description="Differential fuzzing of fusegrad's compiled backward against eager.",
    )
    parser.add_argument("--programs", type=int, default=1000, help="how many programs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first program")
    parser.add_argument("--max-ops", type=int, default=None, help="statements per program")
    parser.add_argument("--threads", type=int, default=1, help="BLAS / numba threads")
    parser.add_argument("--json", type=Path, default=None, help="write totals and findings")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="repro script directory")
    parser.add_argument("--no-shrink", action="store_true", help="write full repros only")
    parser.add_argument(
        "--only", default=None, help=f"configurations to run, of: {', '.join(ONLY)}"
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=CHUNK,
        help="programs per child process (numba never frees the code it compiled: one process "
        f"grew by about 11 MB per program); 0: all in this process (default {CHUNK})",
    )
    args = parser.parse_args(argv)
    if args.chunk < 0:
        parser.error("--chunk must be at least 0")
    if args.programs < 1:
        parser.error("--programs must be at least 1")
    if args.only is not None:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in ONLY]
        if unknown or not names:
            parser.error(f"--only: unknown configuration(s) {unknown}; known: {', '.join(ONLY)}")
        args.only = names
    return args


def signature(kind: str, message: str) -> str:
    """A finding's class for the summary: its kind and first line, numbers and quoted values
    blanked, so that one bug hit by many programs counts once."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"^\S+: ", "", first, count=1) if kind == "mismatch" else first
    first = re.sub(r"np\.float\d+\([^)]*\)", "#", first)
    first = re.sub(r"\[[^\]]*\]|\([^)]*\)|-?\d+(\.\d+)?(e[+-]?\d+)?", "#", first)
    return f"{kind}: {first[:110]}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.chunk and args.programs > args.chunk:
        return _chunked(args)
    from benchmarks.common import pin_threads

    threads = pin_threads(args.threads)  # before numpy (imported by fuzzgen) loads
    from benchmarks import fuzzgen

    max_ops = args.max_ops or fuzzgen.DEFAULT_MAX_OPS
    only = None if args.only is None else [fuzzgen.CONFIGS[ONLY[n]] for n in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = range(args.seed, args.seed + args.programs)
    which = "every configuration" if only is None else "only " + ", ".join(c.name for c in only)
    print(
        f"fuzzing {args.programs} programs (seeds {seeds[0]}..{seeds[-1]}, up to {max_ops} "
        f"statements, {which}), {args.threads} thread(s); repros -> {args.out}",
        flush=True,
    )
    start = last = time.perf_counter()
    kinds: Counter = Counter()  # findings by kind
    failing: Counter = Counter()  # programs by worst kind
    classes: Counter = Counter()  # findings by signature
    class_seeds: dict[str, list[int]] = {}
    fallbacks: Counter = Counter()
    fallback_programs = eager_errors = 0
    captures = builds = cache_hits = compiled_runs = 0
    native_runs = native_steps = native_programs = 0
    native_dropped: Counter = Counter()
    gradchecks: Counter = Counter()
    inconclusive: list[int] = []  # seeds whose eager backward fails gradcheck too
    generator_errors: list[str] = []
    records: list[dict[str, Any]] = []
    for n, seed in enumerate(seeds, 1):
        try:
            program = fuzzgen.generate(seed, max_ops)
        except Exception as e:  # a generator bug: reported, and the campaign goes on
            generator_errors.append(f"seed {seed}: {type(e).__name__}: {e}")
            print(f"generator error, {generator_errors[-1]}", flush=True)
            continue
        report = fuzzgen.check(program, only)
        captures += report.captures
        builds += report.builds
        cache_hits += report.cache_hits
        compiled_runs += report.compiled_runs
        native_runs += report.native_runs
        native_steps += report.native_steps
        native_programs += report.native_runs > 0
        native_dropped.update(report.native_dropped)
        fallbacks.update(report.fallbacks)
        fallback_programs += bool(report.fallbacks)
        eager_errors += report.eager_error is not None
        if report.gradcheck != "n/a":
            gradchecks[report.gradcheck.split(" (")[0]] += 1
            if report.gradcheck.startswith("inconclusive"):
                inconclusive.append(seed)
        if report.findings:
            failing[report.findings[0].kind] += 1
            _write_repros(report, program, args, records, fuzzgen)
            for f in report.findings:
                kinds[f.kind] += 1
                sig = signature(f.kind, f.message)
                classes[sig] += 1
                class_seeds.setdefault(sig, [])
                if seed not in class_seeds[sig]:
                    class_seeds[sig].append(seed)
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY_S or n == len(seeds):
            last = now
            print(
                f"[{n:>6}/{len(seeds)}] {now - start:7.1f} s  mismatches {kinds['mismatch']}  "
                f"crashes {kinds['crash']}  gradcheck failures {kinds['gradcheck']}  "
                f"fallback programs {fallback_programs}",
                flush=True,
            )
    elapsed = time.perf_counter() - start
    lookups = builds + cache_hits  # every compiled backward either finds or builds a program
    totals = {
        "programs": len(seeds),
        "first_seed": args.seed,
        "max_ops": max_ops,
        "only": args.only,
        "failing_programs": sum(failing.values()),
        "mismatches": kinds["mismatch"],
        "crashes": kinds["crash"],
        "gradcheck_failures": kinds["gradcheck"],
        "mismatch_programs": failing["mismatch"],
        "crash_programs": failing["crash"],
        "eager_error_programs": eager_errors,
        "fallback_programs": fallback_programs,
        "fallback_rate": fallback_programs / len(seeds),
        "fallback_reasons": dict(fallbacks.most_common()),
        "captures": captures,
        "builds": builds,
        "cache_hits": cache_hits,
        "cache_hit_rate": cache_hits / lookups if lookups else 0.0,
        "compiled_runs": compiled_runs,
        "native_programs": native_programs,
        "native_runs": native_runs,
        "native_steps": native_steps,
        "native_dropped": dict(native_dropped),
        "gradcheck": dict(gradchecks),
        "gradcheck_inconclusive_seeds": inconclusive,
        "generator_errors": generator_errors,
        "seconds": elapsed,
        "threads": threads,
        "classes": {k: {"findings": v, "seeds": class_seeds[k]} for k, v in classes.items()},
    }
    _print_totals(totals, args.out)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"totals": totals, "findings": records}, indent=2))
        print(f"JSON: {args.json}")
    return 1 if failing or generator_errors else 0


def _write_repros(
    report: Any, program: Any, args: argparse.Namespace, records: list, fuzzgen: Any
) -> None:
    """One script per failing configuration, plus a shrunk one for the first finding."""
    for i, f in enumerate(report.findings):
        slug = re.sub(r"[^a-z0-9]+", "-", f.config.lower()).strip("-")
        path = args.out / f"seed{f.seed}_{slug}_{f.kind}.py"
        path.write_text(f.script)
        record = {
            "seed": f.seed,
            "config": f.config,
            "kind": f.kind,
            "message": f.message,
            "script": str(path),
        }
        if i == 0 and not args.no_shrink:
            small = fuzzgen.shrink(f, program, budget_s=20.0)
            config = fuzzgen.CONFIGS.get(f.config, fuzzgen.Config(f.config))
            shrunk = args.out / f"seed{f.seed}_{slug}_{f.kind}_min.py"
            shrunk.write_text(small.source(config, f"{f.kind} [{f.config}]:\n{f.message}"))
            record["shrunk_script"] = str(shrunk)
        records.append(record)


# totals a chunked campaign adds up over its chunks, and those it merges as counters
_SUMMED = (
    "programs",
    "failing_programs",
    "mismatches",
    "crashes",
    "gradcheck_failures",
    "mismatch_programs",
    "crash_programs",
    "eager_error_programs",
    "fallback_programs",
    "captures",
    "builds",
    "cache_hits",
    "compiled_runs",
    "native_programs",
    "native_runs",
    "native_steps",
)
_COUNTED = ("fallback_reasons", "native_dropped", "gradcheck")
_LISTED = ("gradcheck_inconclusive_seeds", "generator_errors")


def merge_totals(parts: Sequence[dict[str, Any]], first_seed: int, seconds: float) -> dict:
    """The totals of a campaign run as chunks (``--chunk``): each chunk's totals, in seed
    order, added up (the rates recomputed over the whole)."""
    t: dict[str, Any] = {k: sum(p[k] for p in parts) for k in _SUMMED}
    for k in _COUNTED:
        merged: Counter = Counter()
        for p in parts:
            merged.update(p[k])
        t[k] = dict(merged.most_common())
    for k in _LISTED:
        t[k] = [x for p in parts for x in p[k]]
    classes: dict[str, dict[str, Any]] = {}
    for p in parts:
        for sig, c in p["classes"].items():
            into = classes.setdefault(sig, {"findings": 0, "seeds": []})
            into["findings"] += c["findings"]
            into["seeds"] += c["seeds"]
    lookups = t["builds"] + t["cache_hits"]
    t.update(
        first_seed=first_seed,
        max_ops=parts[0]["max_ops"],
        only=parts[0]["only"],
        threads=parts[0]["threads"],
        fallback_rate=t["fallback_programs"] / max(t["programs"], 1),
        cache_hit_rate=t["cache_hits"] / lookups if lookups else 0.0,
        seconds=seconds,
        classes=classes,
    )
    return t


def _chunked(args: argparse.Namespace) -> int:
    """The campaign as child processes of ``--chunk`` programs each, one after the other
    (their progress lines pass through), its totals and findings merged from their JSON."""
    import subprocess
    import tempfile

    start = time.perf_counter()
    parts: list[dict[str, Any]] = []
    findings: list[dict[str, Any]] = []
    end = args.seed + args.programs
    with tempfile.TemporaryDirectory(prefix="fusegrad-fuzz-") as tmp:
        for k, first in enumerate(range(args.seed, end, args.chunk)):
            n = min(args.chunk, end - first)
            path = Path(tmp) / f"chunk{k}.json"
            command = [
                sys.executable, "-m", "benchmarks.fuzz", "--seed", str(first),
                "--programs", str(n), "--threads", str(args.threads), "--out", str(args.out),
                "--json", str(path), "--chunk", "0",
            ]  # fmt: skip
            if args.max_ops:
                command += ["--max-ops", str(args.max_ops)]
            if args.no_shrink:
                command.append("--no-shrink")
            if args.only:
                command += ["--only", ",".join(args.only)]
            print(f"chunk {k + 1}: seeds {first}..{first + n - 1}", flush=True)
            subprocess.run(command, cwd=REPO_ROOT, check=False)
            if not path.exists():  # (the child died: its seeds are reported, not skipped)
                print(f"chunk {k + 1} wrote no results: seeds {first}..{first + n - 1}")
                return 2
            data = json.loads(path.read_text())
            parts.append(data["totals"])
            findings += data["findings"]
    totals = merge_totals(parts, args.seed, time.perf_counter() - start)
    _print_totals(totals, args.out)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"totals": totals, "findings": findings}, indent=2))
        print(f"JSON: {args.json}")
    return 1 if totals["failing_programs"] or totals["generator_errors"] else 0


def _print_totals(t: dict[str, Any], out: Path) -> None:
    n = t["programs"]
    print()
    print(f"programs            {n} (seeds {t['first_seed']}..{t['first_seed'] + n - 1})")
    print(
        f"failing programs    {t['failing_programs']}  "
        f"(mismatch {t['mismatch_programs']}, crash {t['crash_programs']})"
    )
    print(f"mismatches          {t['mismatches']} findings")
    print(f"crashes             {t['crashes']} findings")
    print(f"gradcheck failures  {t['gradcheck_failures']}")
    print(f"eager raised        {t['eager_error_programs']} programs (compiled must raise alike)")
    print(
        f"fallbacks           {t['fallback_programs']} programs ({100 * t['fallback_rate']:.1f}%)"
        f", {sum(t['fallback_reasons'].values())} backward calls:"
    )
    for reason, count in t["fallback_reasons"].items():
        print(f"  {count:6d}  {reason}")
    print(
        f"cache               {t['cache_hits']} hits, {t['builds']} programs built "
        f"({t['captures']} graph captures): hit rate {100 * t['cache_hit_rate']:.1f}% of "
        f"program lookups ({t['compiled_runs']} compiled runs)"
    )
    dropped = ", ".join(f"{k} {v}" for k, v in t["native_dropped"].items()) or "none"
    print(
        f"native segments     {t['native_runs']} calls ran {t['native_steps']} steps, in "
        f"{t['native_programs']} programs; segments run step by step instead: {dropped}"
    )
    gc = t["gradcheck"]
    print(f"gradcheck           {sum(gc.values())} programs: {dict(gc)}")
    if t["gradcheck_inconclusive_seeds"]:
        seeds = ", ".join(str(s) for s in t["gradcheck_inconclusive_seeds"][:20])
        print(f"  inconclusive (eager fails gradcheck too; worth a look): seeds {seeds}")
    print(f"time                {t['seconds']:.1f} s ({t['seconds'] / n:.3f} s per program)")
    if t["generator_errors"]:
        print(f"generator errors    {len(t['generator_errors'])} (programs not checked):")
        for line in t["generator_errors"][:10]:
            print(f"  {line[:150]}")
    if t["classes"]:
        print("finding classes (findings, first seeds):")
        for sig, info in sorted(t["classes"].items(), key=lambda kv: -kv[1]["findings"]):
            seeds = ", ".join(str(s) for s in info["seeds"][:8])
            print(f"  {info['findings']:5d}  {sig}  [seeds {seeds}]")
        print(f"repro scripts in {out}")


if __name__ == "__main__":
    sys.exit(main())
