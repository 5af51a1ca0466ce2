"""The pictures of the README and docs/ARCHITECTURE.md: ``docs/make_pictures.py`` (the
commands that drew them) still runs and draws each, and the documents show the files it
writes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "docs" / "make_pictures.py"


def test_readme_shows_the_pictures_the_script_writes() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\((docs/images/[^)]+)\)", readme))
    assert shown == {"docs/images/backward_graph.svg", "docs/images/fused_step.svg"}
    for path in shown:
        text = (REPO_ROOT / path).read_text()
        assert text.lstrip().startswith(("<?xml", "<svg")) and "</svg>" in text
    assert "python docs/make_pictures.py" in readme
    architecture = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert "(images/compiler_layers.svg)" in architecture
    assert "python docs/make_pictures.py" in architecture


def test_make_pictures_draws_each(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = [Path(line) for line in proc.stdout.split() if line]
    suffix = ".svg" if shutil.which("dot") else ".dot"  # no dot: the DOT text, with a warning
    assert sorted(p.name for p in written) == [
        "backward_graph" + suffix,
        "compiler_layers" + suffix,
        "fused_step" + suffix,
    ]
    backward = written[0].read_text()
    step = written[1].read_text()
    layers = written[2].read_text()
    # the layers' clusters and a few modules that must be in them
    for needle in ("front ends", "the compilation service", "service", "region", "events"):
        assert needle in layers, needle
    # what the README says the pictures show
    for needle in ("TanhBackward0", "0.weight", "2.bias", "float32"):
        assert needle in backward, needle
    for needle in ("whole step", "kernel", "optimizer", "backward graph"):
        assert needle in step, needle
