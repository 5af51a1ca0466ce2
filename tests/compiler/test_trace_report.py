"""The trace report (``FUSEGRAD_TRACE_DIR``, ``compiler/trace.py``): a process that compiles a
training step, a backward and a module, and falls back once, writes one HTML page; the page is
parsed back (``html.parser``) and must list what happened -- a section per capture with its
reason, guards, compile times, passes with graph sizes, kernels and their generated code, the
picture, and the fallback's reason.  When Playwright and its Chromium are installed, the page
is also opened in a real browser."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

import fusegrad as fg
from fusegrad.compiler import trace

SCRIPT = textwrap.dedent(
    """
    import fusegrad as fg
    from fusegrad import compiler, nn, optim

    compiler.config.interpreter_max_elements = 0  # every kernel generated: code to show
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = optim.SGD(model.parameters(), lr=0.1)

    @fg.compile
    def train_step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    x, y = fg.randn(16, 4), fg.randn(16, 2)
    for _ in range(3):
        train_step(x, y)
    train_step(fg.randn(8, 4), fg.randn(8, 2))  # new shapes: a second recording
    w = fg.randn(4, requires_grad=True)
    with compiler.compiled_autograd():
        (fg.randn(5, 4) * w).exp().sum().backward()
        # a fallback: create_graph=True with a user hook in the backward
        h = fg.randn(5, 4) * w
        h.register_hook(lambda g: g * 2.0)
        h.exp().sum().backward(create_graph=True)
    print(compiler.trace.trace_path())
    """
)


FALLBACK = "create_graph=True with user hooks (their results would be recorded)"


class Page(HTMLParser):
    """The parts of the page the tests read: per section its kind, heading, reason, tables
    (by class: rows of cell texts), <pre> texts and list items (by class), whether it has an
    inline SVG; and that every element the report writes is closed."""

    TRACKED = ("section", "table", "tr", "pre", "ul", "li", "details", "h2", "p", "div")

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[dict] = []
        self.open: list[str] = []
        self.toc: list[str] = []
        self._text: list[str] | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._table: str | None = None
        self._list: str | None = None
        self._pre: str | None = None
        self._p: str | None = None
        self._in_toc = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag in self.TRACKED:
            self.open.append(tag)
        s = self.sections[-1] if self.sections else None
        if tag == "section":
            self.sections.append(
                {"kind": a.get("data-kind"), "tables": {}, "pre": {}, "lists": {}, "svg": False}
            )
        elif tag == "ol" and a.get("class") == "toc":
            self._in_toc = True
        elif tag == "a" and self._in_toc:
            self._text = []
        elif s is None:
            return
        elif tag == "h2":
            self._text = []
        elif tag == "table":
            self._table = a.get("class")
            s["tables"][self._table] = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "pre":
            self._pre = a.get("class")
            self._text = []
        elif tag == "ul":
            self._list = a.get("class")
            s["lists"][self._list] = []
        elif tag == "li":
            self._text = []
        elif tag == "p":
            self._p = a.get("class")
            self._text = []
        elif tag == "svg":
            s["svg"] = True

    def handle_endtag(self, tag: str) -> None:
        if tag in self.TRACKED:
            assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
            self.open.pop()
        s = self.sections[-1] if self.sections else None
        text = "".join(self._text) if self._text is not None else ""
        if tag == "ol":
            self._in_toc = False
        elif tag == "a" and self._in_toc:
            self.toc.append(text)
            self._text = None
        elif s is None:
            return
        elif tag == "h2":
            s["title"] = text
            self._text = None
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            s["tables"][self._table].append(self._row)
            self._row = None
        elif tag == "pre":
            s["pre"].setdefault(self._pre, []).append(text)
            self._text = None
        elif tag == "li" and self._list is not None:
            s["lists"][self._list].append(text)
            self._text = None
        elif tag == "p":
            s.setdefault("p", {}).setdefault(self._p, []).append(text)
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._text is not None:
            self._text.append(data)


def _parse(path: Path) -> Page:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    page = Page()
    page.feed(text)
    page.close()
    assert page.open == [], f"unclosed: {page.open}"
    return page


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Page, Path]:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("trace")
    env = dict(os.environ, FUSEGRAD_TRACE_DIR=str(directory))
    env.pop("FUSEGRAD_LOGS", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.parent == directory and path.name.startswith("fusegrad_trace_")
    assert [p.name for p in directory.iterdir()] == [path.name]  # one page, no temporaries
    return _parse(path), path


def _sections(page: Page, kind: str) -> list[dict]:
    return [s for s in page.sections if s["kind"] == kind]


def _times(section: dict) -> dict[str, float]:
    rows = section["tables"]["times"]
    assert rows[0] == ["phase", "ms"]
    return {phase: float(ms) for phase, ms in rows[1:]}


def test_one_section_per_capture(report) -> None:  # type: ignore[no-untyped-def]
    page, _ = report
    kinds = [s["kind"] for s in page.sections]
    assert kinds == ["whole step", "whole step", "backward", "fallback"]
    assert [f"{k + 1}. {t}" for k, t in enumerate(page.toc)] == [s["title"] for s in page.sections]


def test_whole_step_section(report) -> None:  # type: ignore[no-untyped-def]
    page, _ = report
    first, second = _sections(page, "whole step")
    assert first["title"] == "1. whole step: train_step"
    assert first["p"]["reason"] == ["why: first call of train_step"]
    assert "2 tensor argument(s) by shape" in first["lists"]["guards"][0]
    # the compile time, split by phase: recorded call, passes, fusion, codegen, module load,
    # and the first run (numba's JIT)
    times = _times(first)
    assert list(times) == [
        "recording",
        "passes",
        "fusion",
        "codegen",
        "module load",
        "first run",
    ]
    assert all(t >= 0 for t in times.values()) and times["first run"] > 0
    # the passes, with the graph's size before and after each
    rows = first["tables"]["passes"]
    assert rows[0] == ["pass", "values before", "values after", "ms"]
    assert [r[0] for r in rows[1:]] == ["simplify", "dce"]
    sizes = [(int(r[1]), int(r[2])) for r in rows[1:]]
    assert sizes[0][1] == sizes[1][0] and sizes[1][1] < sizes[0][0]  # dce removed values
    # kernels and the generated code (the file's own text)
    (schedule,) = first["pre"]["schedule"]
    assert "kernel over [16, 8] (generated)" in schedule and "extern %" in schedule
    (path,) = first["p"]["path"]
    (code,) = first["pre"]["code"]
    assert code == Path(path).read_text(encoding="utf-8")
    assert "def " in code and "# %" in code  # one commented line per IR value
    graphs = first["pre"]["ir"]
    assert len(graphs) == 2 and all("= input(arg[0])" in g for g in graphs)
    # the picture: inline SVG when Graphviz's dot is there, else the DOT text
    if shutil.which("dot"):
        assert first["svg"]
    else:
        assert 'digraph "program"' in first["pre"]["dot"][0]
    # the second recording says why, in words; its program is built on its first replay
    assert second["p"]["reason"] == [
        "why: recording #2 of train_step: the positional arguments changed: tensor ((16, 4), "
        "fusegrad.float32, <class 'numpy.ndarray'>, False) -> ((8, 4), fusegrad.float32, "
        "<class 'numpy.ndarray'>, False)"
    ]
    assert list(_times(second)) == ["recording"]


def test_backward_section(report) -> None:  # type: ignore[no-untyped-def]
    page, _ = report
    (section,) = _sections(page, "backward")
    assert section["title"] == "3. backward of a 4-node graph"
    assert section["p"]["reason"] == ["why: first capture"]
    assert list(_times(section)) == [
        "capture",
        "passes",
        "fusion",
        "codegen",
        "module load",
        "first run",
    ]
    assert (
        "('call', True, 1, False, False)" in section["pre"]["key"][0]
    )  # (no NaN checks, create_graph)
    assert section["lists"]["notes"] == ["captured with symbolic sizes"]
    assert "float32[s0, s1]" in section["pre"]["ir"][0]


def test_fallback_section(report) -> None:  # type: ignore[no-untyped-def]
    page, _ = report
    (section,) = _sections(page, "fallback")
    assert section["lists"]["fallbacks"] == [FALLBACK]


def test_module_and_fallbacks_inside_a_section(tmp_path, fresh_compiler) -> None:  # type: ignore[no-untyped-def]
    """In process (``set_trace_dir``): compile(module) gets a section with its forward and
    backward programs; a recording that breaks says why in its section."""
    trace.set_trace_dir(tmp_path)
    try:
        cm = fg.compile(fg.nn.Linear(4, 3))
        x = fg.randn(6, 4)
        for _ in range(2):
            cm(x).sum().backward()

        @fg.compile
        def reads(x):  # type: ignore[no-untyped-def]
            y = (x * 2).sum()
            if y.item() > 0:  # Python reads a value, tensor ops follow: not replayable
                y = y * 2
            return y

        reads(fg.randn(3))
        path = Path(trace.trace_path() or "")
    finally:
        trace.set_trace_dir(None)
    assert trace.trace_path() is None and not trace.enabled
    page = _parse(path)
    (module,) = _sections(page, "compile(module)")
    assert module["title"].endswith("compile(Linear)")
    assert len(module["pre"]["schedule"]) == 2  # its forward program and its backward program
    assert len(module["pre"]["ir"]) == 4  # forward and backward graphs, before and after passes
    (broken,) = _sections(page, "whole step")
    (reason,) = broken["lists"]["fallbacks"]
    assert reason.startswith("whole step not replayable: graph break at line")
    assert "Python read a tensor's value (item())" in reason


def test_tracing_off_writes_nothing(tmp_path, fresh_compiler) -> None:  # type: ignore[no-untyped-def]
    assert not trace.enabled
    before = len(trace._sections)
    w = fg.randn(3, requires_grad=True)
    with fg.compiler.compiled_autograd():
        (w * w).sum().backward()
        w.exp().sum().backward(create_graph=True)
    assert len(trace._sections) == before and trace.current() is None


def test_in_a_browser(report) -> None:  # type: ignore[no-untyped-def]
    sync_api = pytest.importorskip("playwright.sync_api")
    _, path = report
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch()
        except Exception as e:  # noqa: BLE001  (no browser downloaded: `playwright install`)
            system = shutil.which("chromium") or shutil.which("chromium-browser")
            if system is None:
                pytest.skip(f"no Chromium for Playwright: {e}")
            browser = p.chromium.launch(executable_path=system)  # the system's (apt-get)
        try:
            page = browser.new_page()
            page.goto(path.as_uri())
            assert page.title().startswith("fusegrad trace, process ")
            assert page.locator("section.capture").count() == 4
            assert (
                page.locator("section[data-kind='fallback'] ul.fallbacks li").inner_text()
                == FALLBACK
            )
            if shutil.which("dot"):
                box = page.locator("section#s1 .picture svg").bounding_box()
                assert box is not None and box["width"] > 100 and box["height"] > 100
        finally:
            browser.close()
