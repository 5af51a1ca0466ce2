"""Smoke test of ``benchmarks/distributed.py``: ``--quick`` (tiny models, two measured steps)
on two processes under ``mpiexec -n 2`` with a timeout, as tests/distributed/test_mpi_suites.py
launches the MPI suites.  Checks the structure of what is printed and written and that every
figure is finite and positive (the overlap fraction within [0, 1]), never the timings
themselves.  Skipped without mpi4py or mpiexec; the torch (gloo) rows are checked when torch
is importable.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fusegrad.distributed.run import find_mpiexec

REPO_ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = find_mpiexec()
HAVE_TORCH = importlib.util.find_spec("torch") is not None
TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="mpi4py or mpiexec is missing (pip install -e '.[distributed]')",
)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("distributed") / "distributed.json"
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "benchmarks.distributed", "--quick"]
    cmd += ["--json", str(out)] + ([] if HAVE_TORCH else ["--no-torch"])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n 2 python -m benchmarks.distributed ran past {TIMEOUT_S} s: {e}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text(encoding="utf-8"))


def test_printed_tables(bench_run: tuple[str, dict[str, Any]]) -> None:
    stdout, _ = bench_run
    lines = stdout.splitlines()
    assert lines[0] == "# data-parallel training over MPI (QUICK: smoke test, not a measurement)"
    # only rank 0 prints; the thread setting is stated
    assert stdout.count("# data-parallel training") == 1
    assert any(line.startswith("processes: 2 (mpiexec), 1 thread(s) each") for line in lines)
    assert "overlap_fraction: 1 - (after all ranks) / allreduce" in stdout
    step_header = next(line for line in lines if line.startswith("| model | global batch"))
    assert "1 process (ms)" in step_header and "2 processes (ms)" in step_header
    assert "2 alone (ms)" in step_header
    impls = ["fg eager", "fg compiled bwd"] + (["torch (gloo)"] if HAVE_TORCH else [])
    for model in ("MLP", "GPT"):
        rows = [line for line in lines if line.startswith(f"| {model} ")]
        assert len(rows) == 2 * len(impls), rows  # a row in each table
        for impl in impls:
            assert sum(f"| {impl} " in row for row in rows) == 2, (impl, rows)


def test_json_values_are_finite_and_positive(bench_run: tuple[str, dict[str, Any]]) -> None:
    _, payload = bench_run
    assert payload["benchmark"] == "distributed" and payload["world_size"] == 2
    assert payload["threads"]["requested"] == 1
    assert payload["environment"]["threads"] == 1
    keys = ["fg_eager", "fg_compiled"] + (["torch"] if HAVE_TORCH else [])
    assert payload["implementations"] == keys
    assert [row["model"] for row in payload["rows"]] == ["MLP", "GPT"]
    for row in payload["rows"]:
        assert row["per_process_batch"] * 2 == row["global_batch"]
        # every measured backward of "fg compiled bwd" ran compiled (no fallback), DDP's too
        shares = row["fg_compiled_backwards_run_compiled"]
        assert set(shares) == {"1 process", "DDP"}
        for share in shares.values():
            compiled, steps = map(int, share.split("/"))
            assert compiled == steps > 0, shares
        for key in keys:
            r = row[key]
            for field in (
                "single_step_ms",
                "ddp_step_ms",
                "alone_step_ms",
                "alone_speedup",
                "speedup",
                "efficiency",
                "ddp_backward_ms",
                "allreduce_ms",
                "exposed_ms",
            ):
                value = r[field]
                assert isinstance(value, float) and math.isfinite(value) and value > 0, (
                    row["model"],
                    key,
                    field,
                    value,
                )
            assert r["efficiency"] == pytest.approx(r["speedup"] / 2)
            assert r["speedup"] == pytest.approx(r["single_step_ms"] / r["ddp_step_ms"])
            assert 0.0 <= r["overlap_fraction"] <= 1.0
            after_all = r["exposed_after_all_ranks_ms"]  # (the ranks share one machine here)
            assert isinstance(after_all, float) and math.isfinite(after_all) and after_all >= 0
            assert r["overlap_fraction"] == pytest.approx(
                min(1.0, max(0.0, 1 - after_all / r["allreduce_ms"]))
            )
            assert r["buckets"] >= 1 and len(r["exposed_ms_per_rank"]) == 2
            assert r["replica_max_abs_difference"] == 0.0  # DDP kept the replicas equal
