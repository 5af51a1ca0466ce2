"""Every ```python block of README.md runs as written, each in a fresh Python process (nothing
carried over from other blocks or from this test process), in a temporary directory.

A block may be preceded by a marker line, kept rare and visible in the README:

* ``<!-- readme-test: cuda (why) -->``: the block needs CUDA; it runs in numba's CUDA simulator
  (``NUMBA_ENABLE_CUDASIM=1``) when numba-cuda is installed, and skips otherwise;
* ``<!-- readme-test: skip (why) -->``: not run, for a real reason given in the marker.

Also checked: the blocks import fusegrad one way only (``import fusegrad as fg``, ``import
fusegrad.nn as nn``, ``import fusegrad.nn.functional as F``).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT_S = 600
ALLOWED_IMPORTS = {
    "import fusegrad as fg",
    "import fusegrad.nn as nn",
    "import fusegrad.nn.functional as F",
}
_BLOCK = re.compile(
    r"^(?:<!-- readme-test: (?P<marker>[^\n]*?) -->\n)?```python\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    line: int  # where its code starts in README.md
    heading: str  # the section it is in
    marker: str | None
    code: str


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start("code")]
        headings = re.findall(r"^#+ (.*)$", before, re.MULTILINE)
        blocks.append(
            Block(
                before.count("\n") + 1,
                headings[-1] if headings else "",
                match["marker"],
                match["code"],
            )
        )
    return blocks


BLOCKS = readme_blocks()


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 4
    assert README.read_text(encoding="utf-8").count("```python") == len(BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"line{b.line}-{b.heading}")
def test_block_imports_fusegrad_with_the_one_alias(block: Block) -> None:
    imports = {
        line.strip()
        for line in block.code.splitlines()
        if re.match(r"\s*(import|from)\s+fusegrad\b", line)
    }
    assert imports <= ALLOWED_IMPORTS, imports - ALLOWED_IMPORTS
    assert not re.search(r"(?<![\w.])fusegrad\.", _without_imports(block.code)), (
        "use fg. (import fusegrad as fg) throughout"
    )


def _without_imports(code: str) -> str:
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("import"))


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    return [pytest.mark.cuda] if block.marker and block.marker.startswith("cuda") else []


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=_marks(b)) for b in BLOCKS],
    ids=lambda b: f"line{b.line}-{b.heading}",
)
def test_block_runs_as_written(block: Block, tmp_path: pathlib.Path) -> None:
    env = dict(os.environ)
    env.pop("FUSEGRAD_LOGS", None)
    if block.marker is not None:
        kind = block.marker.split()[0]
        assert kind in ("cuda", "skip"), f"unknown readme-test marker {block.marker!r}"
        assert "(" in block.marker, "a marker says why, in parentheses"
        if kind == "skip":
            pytest.skip(f"README.md line {block.line}: {block.marker}")
        if importlib.util.find_spec("numba_cuda") is None:
            pytest.skip("numba-cuda is not installed (the cuda extra): CUDA block not run")
        env["NUMBA_ENABLE_CUDASIM"] = "1"  # set before the block's process imports numba
        env.pop("FUSEGRAD_CUDA_PTX", None)
    out = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 0, (
        f"README.md line {block.line} ({block.heading}) failed:\n{out.stdout[-4000:]}\n"
        f"{out.stderr[-8000:]}"
    )
