"""The repository explains itself (docs/ARCHITECTURE.md, contract 13): code and documents cite
docs/ARCHITECTURE.md and the other pages under docs/, never design files outside the repository,
and every relative link of a document under docs/ (or the README) leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\b(DESIGN|CONVENTIONS|SEMANTICS)\.md\b")
TREES = ("src", "compiler", "tests", "benchmarks", "docs")


def _texts() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for tree in TREES:
        files += [p for p in (ROOT / tree).rglob("*") if p.suffix in (".py", ".md", ".txt")]
    return [p for p in files if p.is_file() and p.name != Path(__file__).name]


def test_nothing_cites_design_files_outside_the_repository() -> None:
    found = []
    for path in _texts():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "cite docs/ARCHITECTURE.md instead:\n" + "\n".join(found)


def test_relative_links_of_the_documents_exist() -> None:
    broken = []
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for doc in documents:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
