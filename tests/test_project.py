"""Project-level checks: import stays light, README and CI agree, packaging maps both packages."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_does_not_load_numba_or_compiler() -> None:
    code = "import sys, fusegrad; print('numba' in sys.modules, 'fusegrad.compiler' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_compiler_package_is_mapped() -> None:
    import fusegrad.compiler

    assert pathlib.Path(fusegrad.compiler.__file__).resolve().parent == ROOT / "compiler"


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = [line for line in readme.splitlines() if line.startswith("python3 -m venv")]
    assert len(setup) == 2
    demo, tests = setup
    assert demo.endswith("python -m fusegrad")
    run = "python -m pytest -n auto"  # (pytest-xdist: the suite on every core)
    assert tests.endswith(run)
    ci = (ROOT / ".ci" / "run").read_text()
    # CI runs the README's test command (with -q and an optional torch install spliced in)
    install = tests.split(f" && {run}")[0].replace("pip install -e", "pip install -q -e")
    assert install.endswith('pip install -q -e ".[test,cuda]"')  # the CUDA suites run in CI
    assert install in ci
    assert ci.rstrip().endswith(run)
    assert "set -euo pipefail" in ci


def test_every_package_directory_is_listed_in_pyproject() -> None:
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for base, prefix in (
        (ROOT / "src" / "fusegrad", "fusegrad"),
        (ROOT / "compiler", "fusegrad.compiler"),
    ):
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            found.add(".".join((prefix, *rel)))
    assert found == listed
