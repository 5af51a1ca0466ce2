"""Smoke test of ``benchmarks/programs.py`` (training steps shaped like real programs):
``--quick`` on two workloads in a subprocess (it pins threads before numpy is imported),
without PyTorch to stay fast; and every workload's step built and run once for both
frameworks, eagerly (its definitions written against the PyTorch API work in both).

Checks what a person sees and what the JSON keeps, never the timings.
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

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import programs  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def programs_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any]]:
    out = tmp_path_factory.mktemp("programs") / "programs.json"
    args = ["-m", "benchmarks.programs", "--quick", "--no-torch", "--workloads", "LSTM-LM,VAE"]
    args += ["--progress", "plain", "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    return proc.stdout.splitlines(), json.loads(out.read_text(encoding="utf-8"))


def test_rows_stream_and_the_table_has_every_column(
    programs_run: tuple[list[str], dict[str, Any]],
) -> None:
    lines, _ = programs_run
    header = next(i for i, line in enumerate(lines) if line.startswith("| workload"))
    rows = [i for i, line in enumerate(lines) if line.startswith(("| LSTM-LM", "| VAE"))]
    done = [i for i, line in enumerate(lines) if " done in " in line]
    assert len(rows) == 2 and header < rows[0] < done[0] < rows[1] < done[1], lines
    headers = [c.strip() for c in lines[header].strip("|").split("|")]
    assert headers[:6] == [
        "workload",
        "unit",
        "fg eager",
        "fg compiled bwd",
        "fg compile(model)",
        "fg whole step",
    ]
    assert "compiled bwd/fg eager" in headers
    assert headers[-1] == "first calls (s): model / step"
    assert not any("torch" in h for h in headers[:6])


def test_json_has_the_checks_and_compiled_variants_match_eager(
    programs_run: tuple[list[str], dict[str, Any]],
) -> None:
    _, payload = programs_run
    assert payload["benchmark"] == "programs" and payload["quick"] is True
    assert payload["implementations"] == ["fg_eager", "fg_compiled", "fg_module", "fg_step"]
    assert [r["workload"] for r in payload["rows"]] == ["LSTM-LM", "VAE"]
    for name, check in payload["checks"].items():
        # (SGD and Adam over a few steps: float32 rounding stays small here)
        assert max(check["max_rel_param_difference"].values()) < 1e-4, (name, check)
        assert check["step_runs"] > 0 and not check["step_breaks"], (name, check)
    for row in payload["rows"]:
        first = row["first_calls_s"]
        assert first["fg_step"] > 0 and first["fg_module"] > 0
        assert row["fg_step/fg_eager"] > 0 and row["fg_compiled/fg_eager"] > 0


@pytest.mark.parametrize("name", programs.WORKLOADS)
def test_every_workload_runs_a_step_in_both_frameworks(name: str) -> None:
    import fusegrad as fg

    libs = [fg]
    if HAVE_TORCH:
        import torch

        libs.append(torch)
    spec = programs.SPECS[name]
    fg.manual_seed(0)
    states = {
        k: {n: v.detach().clone() for n, v in m.state_dict().items()}
        for k, m in spec.modules(fg, True).items()
    }
    data = spec.batches(np, True)
    for lib in libs:
        own = states
        if lib is not fg:
            own = {
                k: {n: lib.from_numpy(v.numpy().copy()) for n, v in s.items()}
                for k, s in states.items()
            }
        impl = programs._impl(lib, spec, own, data, True)
        before = impl.params()
        assert impl.step()["step"] > 0
        after = impl.params()
        assert all(np.isfinite(p).all() for p in after)
        assert any(not np.array_equal(a, b) for a, b in zip(before, after))  # it trained
        assert math.isfinite(sum(float(np.abs(p).sum()) for p in after))
