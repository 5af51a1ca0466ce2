"""Every ```python block of README.md and of the pages under docs/ runs as written, each in a
fresh Python process (nothing carried over from other blocks or from this test process), in a
temporary directory.  A test's id names the document and the line its code starts on
(``README.md:42-Quick start``).

A block may be preceded by a marker line, kept rare and visible in the document:

* ``<!-- readme-test: cuda (why) -->``: the block needs CUDA; it runs in numba's CUDA simulator
  (``NUMBA_ENABLE_CUDASIM=1``) when numba-cuda is installed, and skips otherwise;
* ``<!-- readme-test: skip (why) -->``: not run, for a real reason given in the marker.

Also checked: the blocks import fusegrad one way only (``import fusegrad as fg``, ``import
fusegrad.nn as nn``, ``import fusegrad.nn.functional as F``); the README stays short (at most
300 lines: reference text goes to docs/), and links every page under docs/, which
docs/ARCHITECTURE.md's list of documents names too.
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
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
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
    document: str  # its path from the repository root
    line: int  # where its code starts in the document
    heading: str  # the section it is in
    marker: str | None
    code: str

    @property
    def where(self) -> str:
        return f"{self.document} line {self.line}"


def document_blocks(path: pathlib.Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start("code")]
        headings = re.findall(r"^#+ (.*)$", before, re.MULTILINE)
        blocks.append(
            Block(
                path.relative_to(ROOT).as_posix(),
                before.count("\n") + 1,
                headings[-1] if headings else "",
                match["marker"],
                match["code"],
            )
        )
    return blocks


BLOCKS = [block for path in DOCUMENTS for block in document_blocks(path)]


def _id(block: Block) -> str:
    return f"{block.document}:{block.line}-{block.heading}"


def test_the_readme_has_python_blocks() -> None:
    assert len([b for b in BLOCKS if b.document == "README.md"]) >= 4


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_python_block_of_a_document_is_collected(path: pathlib.Path) -> None:
    # (a block the pattern misses -- a marker not on the line just before it, an unclosed
    # fence -- would silently never run)
    found = [b for b in BLOCKS if b.document == path.relative_to(ROOT).as_posix()]
    assert path.read_text(encoding="utf-8").count("```python") == len(found)


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference text to a "
        "page under docs/ and link it"
    )


def test_every_docs_page_is_linked_from_the_readme_and_the_architecture() -> None:
    readme = README.read_text(encoding="utf-8")
    architecture = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    listed = architecture[architecture.index("## The documents") :]
    for page in DOCUMENTS[1:]:
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
        if page.name != "ARCHITECTURE.md":
            assert f"]({page.name})" in listed, (
                f"docs/ARCHITECTURE.md's list of documents does not name {page.name}"
            )


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
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
    ids=_id,
)
def test_block_runs_as_written(block: Block, tmp_path: pathlib.Path) -> None:
    env = dict(os.environ)
    env.pop("FUSEGRAD_LOGS", None)
    if block.marker is not None:
        kind = block.marker.split()[0]
        assert kind in ("cuda", "skip"), f"unknown readme-test marker {block.marker!r}"
        assert "(" in block.marker, "a marker says why, in parentheses"
        if kind == "skip":
            pytest.skip(f"{block.where}: {block.marker}")
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
        f"{block.where} ({block.heading}) failed:\n{out.stdout[-4000:]}\n{out.stderr[-8000:]}"
    )
