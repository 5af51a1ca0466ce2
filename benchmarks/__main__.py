"""Run the benchmark suites one after the other: ``python -m benchmarks``.

Suites (``--suites``, default both): ``eager`` (``benchmarks.eager_overhead``: eager overhead vs
numpy and PyTorch) and ``compiled`` (``benchmarks.compiled``: compiled backward vs eager, numpy,
PyTorch eager / torch.compile and JAX).  The shared flags ``--threads N``, ``--quick`` and
``--no-torch`` go to every suite; any other argument is passed to the compiled suite only
(``--workloads A,D``, ``--no-torch-compile``, ...).  Each suite runs in its own process, so
each pins its thread count before numpy is imported; each writes its own JSON under
``benchmarks/results/``.  The exit status is non-zero when any suite fails (for instance a
gradient mismatch).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SUITES = {"eager": "benchmarks.eager_overhead", "compiled": "benchmarks.compiled"}


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run fusegrad's benchmark suites (extra arguments go to the compiled suite).",
    )
    parser.add_argument(
        "--suites",
        default=",".join(SUITES),
        help=f"comma-separated subset of {','.join(SUITES)} (default: all)",
    )
    parser.add_argument("--threads", type=int, default=1, help="threads for every suite")
    parser.add_argument("--quick", action="store_true", help="smoke-test mode of every suite")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch in every suite")
    args, extra = parser.parse_known_args(argv)
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if unknown or not suites:
        parser.error(f"--suites: unknown {unknown or 'empty list'}; choose from {list(SUITES)}")
    if extra and "compiled" not in suites:
        parser.error(
            f"unrecognized arguments: {' '.join(extra)} (only the compiled suite "
            "takes extra arguments)"
        )
    args.suite_list = suites
    return args, extra


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected suites; returns the worst exit status."""
    args, extra = parse_args(argv)
    shared = ["--threads", str(args.threads)]
    shared += ["--quick"] if args.quick else []
    shared += ["--no-torch"] if args.no_torch else []
    status = 0
    for suite in args.suite_list:
        command = [sys.executable, "-m", SUITES[suite], *shared]
        if suite == "compiled":
            command += extra
        print(f"$ {' '.join(command[1:])}", flush=True)
        proc = subprocess.run(command, cwd=REPO_ROOT, check=False)
        if proc.returncode:
            print(f"suite {suite} exited with status {proc.returncode}", flush=True)
        status = max(status, proc.returncode)
        print(flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
