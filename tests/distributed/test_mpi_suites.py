"""The MPI suites (tests/distributed/mpi_*.py) on two real processes: ``mpiexec -n 2 python -m
pytest ...`` in a subprocess, as tests/test_cuda_suites.py runs the CUDA suites.  Their file
names keep them out of this single-process collection.  Skipped when mpi4py or mpiexec is
missing (the ``distributed`` extra, which the ``test`` extra includes).

Also here: the launcher, ``python -m fusegrad.distributed.run -n 2``, on a small script and on
the examples of docs/distributed.md (the blocks after ``<!-- mpi-example -->`` and
``<!-- mpi-rpc-example -->``, which tests/test_readme.py cannot run in one process).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from fusegrad.distributed.run import find_mpiexec

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DISTRIBUTED_DOC = ROOT / "docs" / "distributed.md"
TIMEOUT_S = 240  # the suites take ~30 s on two busy cores; a wait times out after 60 s
SUITES = ["mpi_collectives.py", "mpi_ddp.py", "mpi_rpc.py"]  # mpi_cuda.py: in the simulator

MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="mpi4py or mpiexec is missing (pip install -e '.[distributed]'): MPI suites not run",
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # two processes on a small machine
    return env


def test_mpi_suites_on_two_processes() -> None:
    files = [str(HERE / name) for name in SUITES]
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "pytest", *files]
    cmd += ["-q", "-x", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        out = (
            (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        )
        pytest.fail(f"mpiexec -n 2 pytest {' '.join(SUITES)} ran past {TIMEOUT_S} s:\n{out}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the MPI suites failed ({done.returncode}):\n{output}"
    # each of the two ranks ran every test and reported its own pass line
    passed = [line for line in output.splitlines() if " passed" in line and "failed" not in line]
    assert len(passed) == 2, output


@pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda") is None,
    reason="numba-cuda is not installed (the cuda extra): CUDA tensors over MPI not run",
)
def test_mpi_cuda_suite_in_the_simulator() -> None:
    env = _env()
    env["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is imported in the ranks
    env.pop("FUSEGRAD_CUDA_PTX", None)
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "pytest", str(HERE / "mpi_cuda.py")]
    cmd += ["-q", "-x", "-p", "no:cacheprovider"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"mpi_cuda.py failed ({done.returncode}):\n{output}"
    assert output.count(" passed") == 2, output


SCRIPT = """
import os, sys
import fusegrad as fg
import fusegrad.distributed as dist
dist.init_process_group("gloo")
t = fg.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
env = os.environ
line = f"rank {env['RANK']} of {env['WORLD_SIZE']} local {env['LOCAL_RANK']} sum {t.item()}"
sys.stdout.write(f"{line} args {sys.argv[1:]}\\n")  # one write: the ranks' lines do not mix
sys.stdout.flush()
if "--fail" in sys.argv and dist.get_rank() == 1:
    raise ValueError("rank 1 fails")
dist.barrier()  # rank 0 waits here for a peer that failed: the launcher must end the job
dist.destroy_process_group()
"""


def test_launcher_runs_the_script_on_n_processes(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "fusegrad.distributed.run", "-n", "2", str(script), "--lr", "1"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank"))
    assert lines == [
        "rank 0 of 2 local 0 sum 3.0 args ['--lr', '1']",
        "rank 1 of 2 local 1 sum 3.0 args ['--lr', '1']",
    ]


def test_launcher_ends_the_job_when_a_rank_fails(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "fusegrad.distributed.run", "-n", "2", str(script), "--fail"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ValueError: rank 1 fails" in done.stderr
    assert "rank 1 failed; aborting the other processes" in done.stderr


def test_docs_example_trains_on_two_processes(tmp_path: pathlib.Path) -> None:
    doc = DISTRIBUTED_DOC.read_text(encoding="utf-8")
    match = re.search(r"^<!-- mpi-example -->\n```\n(.*?)^```$", doc, re.MULTILINE | re.DOTALL)
    assert match, "docs/distributed.md: the data-parallel example is marked <!-- mpi-example -->"
    script = tmp_path / "train.py"
    script.write_text(match[1])
    cmd = [sys.executable, "-m", "fusegrad.distributed.run", "-n", "2", str(script)]
    env = _env()
    del env["PYTHONUNBUFFERED"]  # each rank's print leaves in one write at exit: lines unmixed
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # each rank prints its rank and the loss of its replica on the whole data: replicas agree
    ranks_and_losses = sorted(
        line.split() for line in done.stdout.splitlines() if re.fullmatch(r"[01] \S+", line)
    )
    assert [r for r, _ in ranks_and_losses] == ["0", "1"], done.stdout
    assert ranks_and_losses[0][1] == ranks_and_losses[1][1]


def test_docs_rpc_example_trains_a_model_split_over_two_processes(tmp_path: pathlib.Path) -> None:
    doc = DISTRIBUTED_DOC.read_text(encoding="utf-8")
    match = re.search(r"^<!-- mpi-rpc-example -->\n```\n(.*?)^```$", doc, re.MULTILINE | re.DOTALL)
    assert match, "docs/distributed.md: the RPC example is marked <!-- mpi-rpc-example -->"
    script = tmp_path / "train.py"
    script.write_text(match[1])
    cmd = [sys.executable, "-m", "fusegrad.distributed.run", "-n", "2", str(script)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # worker 0 prints step and loss: 30 steps, the loss going down (both workers' parameters
    # are trained: the gradients reached worker 1's layer and its optimizer stepped)
    losses = [
        float(line.split()[1])
        for line in done.stdout.splitlines()
        if re.fullmatch(r"\d+ \S+", line)
    ]
    assert len(losses) == 30, done.stdout
    assert losses[-1] < 0.6 * losses[0], losses
