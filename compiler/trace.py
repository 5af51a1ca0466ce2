"""The trace report: ``FUSEGRAD_TRACE_DIR=dir`` (or ``set_trace_dir(dir)``) makes the compiler
write one self-contained HTML page per process, ``dir/fusegrad_trace_<pid>.html``, with a
section per capture -- in the spirit of PyTorch's ``TORCH_TRACE`` + tlparse, without the
second tool: the page is rewritten after every capture, build, first run and fallback, so it is
always complete and can be opened while the process still runs.

A section is opened where a capture starts (``begin``) and gathers what happens on its thread
until it ends:

* the backward compile path (``compiler.run`` / ``_program_for``): why there was a capture (the
  cache miss in words), the key and the capture's size guards;
* a whole-step recording (``step.CompiledFunction.record``): the recompile reason from the
  guard keys (``step.describe_change``) and the guards (``Watch.describe_guards``); the step's
  program is built on its first replay, which reopens the section (``resume``);
* ``compile(module)`` (``module.OptimizedModule._remember`` and ``AOTEntry.backward``).

Into the open section go: the time of each phase (``phase``: capture, passes, fusion, codegen,
load of the generated module; the first run, which includes numba's JIT or its disk-cache load,
comes from ``Program._run``), each pass with the graph's size before and after
(``pass_done``, from ``passes.run``), each program built (``program_built``: its schedule, a
picture of it through ``compiler.viz`` -- inline SVG from Graphviz's ``dot``, or the DOT text
when ``dot`` is missing -- and its generated source), and fallbacks with their reasons (a
fallback outside any capture gets a section of its own).

Cost when off: the hooks sit on the slow paths only (capture, build, first run, fallback); each
is one check of the module-level ``enabled`` flag, or a ``with phase(...)`` that returns a shared
do-nothing context.  Cache hits run no hook at all.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import os
import platform
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .ir import format_graph

__all__ = ["ENV", "enabled", "set_trace_dir", "trace_path"]

ENV = "FUSEGRAD_TRACE_DIR"
# graphs with more values than this are not drawn (Graphviz's layout time grows fast with size)
MAX_DRAWN_VALUES = 800
# generated sources longer than this are cut in the page (the file itself is named)
MAX_SOURCE_CHARS = 200_000

enabled = False  # the one flag every hook checks
_directory: str | None = None
_lock = threading.RLock()
_sections: list[Section] = []
_numbers = itertools.count(1)
_pid = os.getpid()
_started = time.time()
_clock0 = time.perf_counter()
_write_failed = False  # (warned once)
_by_owner: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Step / AOTEntry -> section
_by_program: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Program -> its record


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[Section] = []  # the open sections of this thread, innermost last


_state = _ThreadState()
_nothing = contextlib.nullcontext()


@dataclass(eq=False)
class ProgramRecord:
    """What the page shows of one program built in a section (text made when it was built)."""

    title: str
    schedule: str
    picture: str  # inline SVG, or a <pre> of the DOT text, or a note
    kernels: int
    externs: int
    interpreted: int
    source_path: str | None
    source: str
    first_run: float | None = None


@dataclass(eq=False)
class Section:
    """One capture and what followed from it (see the module docstring)."""

    number: int
    kind: str  # "backward" | "whole step" | "compile(module)" | "fallback"
    title: str
    reason: str = ""
    at: float = 0.0  # seconds since the process loaded the compiler
    guards: list[str] = field(default_factory=list)
    key: str = ""
    graph_text: list[tuple[str, str]] = field(default_factory=list)  # (caption, IR text)
    passes: list[tuple[str, int, int, float]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    programs: list[ProgramRecord] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list | None = None  # a whole step's input kinds (``Step.sources``), for pictures


# ---- switching on and off ----------------------------------------------------------------------


def set_trace_dir(directory: str | os.PathLike | None) -> None:
    """Write the trace report into ``directory`` from now on (None or "": stop).  A new
    directory starts a new page; sections recorded so far are dropped."""
    global enabled, _directory
    with _lock:
        path = os.fspath(directory) if directory else None
        if path != _directory:
            _sections.clear()
        _directory = path
        enabled = path is not None


def trace_path() -> str | None:
    """The page this process writes (None while tracing is off)."""
    if _directory is None:
        return None
    return os.path.join(_directory, f"fusegrad_trace_{os.getpid()}.html")


# ---- sections ----------------------------------------------------------------------------------


def current() -> Section | None:
    stack = _state.stack
    return stack[-1] if stack else None


def clock() -> float:
    """The time, for a caller to pass back as ``started`` (``recorded``)."""
    return time.perf_counter()


def _new_section(kind: str, title: str, reason: str = "") -> Section:
    section = Section(next(_numbers), kind, title, reason, at=time.perf_counter() - _clock0)
    with _lock:
        _fork_check()
        _sections.append(section)
    return section


def begin(kind: str, title: str, reason: str = "") -> Section:
    """Open a section on this thread (it becomes the current one) and list it on the page."""
    section = _new_section(kind, title, reason)
    _state.stack.append(section)
    return section


def end(section: Section) -> None:
    """Close ``section`` (and any section opened on this thread after it) and write the page."""
    stack = _state.stack
    if section in stack:
        del stack[stack.index(section) :]
    write()


def depth() -> int:
    """How many sections are open on this thread (``unwind`` closes those opened later)."""
    return len(_state.stack)


def unwind(to: int) -> None:
    """Close the sections this thread opened since ``depth()`` was ``to``, and write the page."""
    stack = _state.stack
    if len(stack) > to:
        del stack[to:]
        write()


@contextlib.contextmanager
def _reopened(section: Section) -> Iterator[None]:
    _state.stack.append(section)
    try:
        yield
    finally:
        end(section)


def resume(owner: Any) -> Any:
    """A context in which ``owner``'s section (a ``Step`` or module entry, see ``adopt``) is
    current again: a program built later lands in the section of its recording."""
    if not enabled:
        return _nothing
    section = _by_owner.get(owner)
    return _nothing if section is None else _reopened(section)


def adopt(owner: Any, section: Section) -> None:
    """``owner`` (a ``Step``, a module entry) belongs to ``section`` (``resume``)."""
    _by_owner[owner] = section


def phase(name: str) -> Any:
    """``with phase("codegen"):`` adds the block's time to the current section (does nothing
    when tracing is off or no section is open)."""
    if not enabled or not _state.stack:
        return _nothing
    return _timed(_state.stack[-1], name)


@contextlib.contextmanager
def _timed(section: Section, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        section.times[name] = section.times.get(name, 0.0) + time.perf_counter() - start


def pass_done(name: str, before: int, after: int, seconds: float) -> None:
    """One pass ran on the current section's graph: values before and after, its time."""
    section = current()
    if section is not None:
        section.passes.append((name, before, after, seconds))
        section.times["passes"] = section.times.get("passes", 0.0) + seconds


def graph(caption: str, graph: Any) -> None:
    """Show an IR graph (as ``ir.format_graph`` prints it) in the current section."""
    section = current()
    if section is not None:
        section.graph_text.append((caption, _graph_text(graph)))


# ---- what the compile paths report -------------------------------------------------------------


def captured(captured: Any, kind: str, key: Any) -> None:
    """The backward path's capture (``capture.Captured``): how it was captured, its guards and
    its key."""
    section = current()
    if section is None:
        return
    section.notes.append(f"captured with {kind}")
    section.guards.extend(g.describe() for g in captured.guards)
    text = repr(key)
    section.key = text if len(text) <= 4000 else text[:4000] + " ..."


def _graph_text(graph: Any) -> str:
    return format_graph(graph)


def recorded(
    fn: Any, watch: Any, started: float, why: str, step: Any, broke: str | None = None
) -> None:
    """A whole-step recording of ``fn`` (a ``step.CompiledFunction``) ended, recorded because
    of ``why``: as ``step`` (a ``step.Step``, whose program is built on its first replay:
    ``resume``), or not replayable because of ``broke``."""
    name = getattr(fn.fn, "__qualname__", repr(fn.fn))
    section = _new_section("whole step", f"whole step: {name}", why)
    section.times["recording"] = time.perf_counter() - started
    section.guards.append(watch.describe_guards())
    if step is None:
        section.fallbacks.append(
            f"whole step not replayable: {broke}; backward() compiled on its own"
        )
    else:
        adopt(step, section)
        section.sources = step.sources
        section.notes.extend(f"{what}: {value}" for what, value in step.stats.items())
        section.graph_text.append(
            ("the recorded graph, before the passes", _graph_text(step.graph))
        )
    write()


def module_recorded(
    module: Any, watch: Any, started: float, why: str, entry: Any, broke: str | None = None
) -> None:
    """``compile(module)`` recorded a forward and captured its backward (``entry``, a
    ``module.AOTEntry``), recorded because of ``why``, or could not (because of ``broke``)."""
    name = f"compile({type(module._orig_mod).__name__})"
    section = _new_section("compile(module)", name, why)
    section.times["capture"] = time.perf_counter() - started
    section.guards.append(watch.describe_guards())
    if entry is None:
        section.fallbacks.append(
            f"the forward is not replayable ({broke}); its backward is still compiled"
        )
    else:
        adopt(entry, section)
        adopt(entry.step, section)
        section.sources = entry.step.sources
        section.graph_text.append(
            ("the forward graph, before the passes", _graph_text(entry.step.graph))
        )
        section.graph_text.append(
            ("the backward graph, before the passes", _graph_text(entry.backward_graph))
        )
    write()


def program_built(program: Any) -> None:
    """A ``Program`` was built in the current section: keep its schedule, picture and code."""
    section = current()
    if section is None:
        return
    whole = section.kind != "backward"
    schedule = program.default.schedule
    n_values = len(program.graph.values)
    record = ProgramRecord(
        title=f"program {len(section.programs) + 1}",
        schedule=program.describe_schedule(),
        picture=_picture(program, section, whole, n_values),
        kernels=len(schedule.kernels),
        externs=len(schedule.externs),
        interpreted=len(schedule.interpreted),
        source_path=program.source_path,
        source=_read_source(program.source_path),
    )
    section.graph_text.append(
        (f"{record.title}: the graph after the passes", _graph_text(program.graph))
    )
    section.programs.append(record)
    _by_program[program] = record


def first_run(program: Any, seconds: float) -> None:
    """The first run of a program's variant finished (numba's JIT or cache load included)."""
    record = _by_program.get(program)
    if record is None or record.first_run is not None:
        return
    record.first_run = seconds
    write()


def fallback(reason: str) -> None:
    """Something ran eagerly instead of compiled: noted in the open section, or in a section
    of its own when none is open."""
    section = current()
    if section is None:
        section = begin("fallback", "fallback: ran eagerly", reason)
        section.fallbacks.append(reason)
        end(section)
        return
    section.fallbacks.append(reason)
    write()


def _picture(program: Any, section: Section, whole: bool, n_values: int) -> str:
    # (pictures, on first use: compiler.viz sits above the passes, which report to this module)
    from .viz import program_dot

    if n_values > MAX_DRAWN_VALUES:
        return (
            f'<p class="note">not drawn: {n_values} IR values (more than '
            f"trace.MAX_DRAWN_VALUES = {MAX_DRAWN_VALUES})</p>"
        )
    try:
        dot = program_dot(program, None, "p", "", section.sources, whole_step=whole)
    except Exception as e:  # noqa: BLE001  (a report never stops a compile: the page says why)
        return f'<p class="note">no picture: {html.escape(repr(e))}</p>'
    try:
        svg = dot.pipe("svg").decode("utf-8")
    except (RuntimeError, OSError) as e:
        return (
            f'<p class="note">no picture ({html.escape(str(e))}); the DOT text:</p>'
            f'<pre class="dot">{html.escape(dot.source)}</pre>'
        )
    at = svg.find("<svg")
    return f'<div class="picture">{svg[at:] if at >= 0 else svg}</div>'


def _read_source(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_SOURCE_CHARS + 1)
    except OSError as e:
        return f"(could not read {path}: {e})"
    if len(text) > MAX_SOURCE_CHARS:
        text = text[:MAX_SOURCE_CHARS] + f"\n... (cut at {MAX_SOURCE_CHARS} characters)"
    return text


def _fork_check() -> None:
    """A forked child starts a page of its own."""
    global _pid
    if os.getpid() != _pid:
        _pid = os.getpid()
        _sections.clear()


# ---- the page ----------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 110em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1em; margin-bottom: 0.3em; }
pre { background: #f6f6f6; padding: 0.6em; overflow: auto; font-size: 12px; max-height: 40em; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fallback { color: #a00; } .note { color: #666; }
.picture { overflow: auto; max-height: 60em; border: 1px solid #ddd; }
.picture svg { max-width: 100%; height: auto; }
section.fallback-only h2 { color: #a00; }
"""

_PHASES = ("capture", "recording", "passes", "fusion", "codegen", "module load", "first run")


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def _section_html(s: Section) -> str:
    esc = html.escape
    classes = "capture" if s.kind != "fallback" else "capture fallback-only"
    out = [
        f'<section id="s{s.number}" class="{classes}" data-kind="{esc(s.kind)}">',
        f"<h2>{s.number}. {esc(s.title)}</h2>",
        f'<p class="when">at {s.at:.3f} s</p>',
    ]
    if s.reason:
        out.append(f'<p class="reason"><b>why:</b> {esc(s.reason)}</p>')
    if s.guards:
        items = "".join(f"<li>{esc(g)}</li>" for g in s.guards)
        out.append(f'<h3>Guards</h3><ul class="guards">{items}</ul>')
    if s.key:
        out.append(
            f'<details><summary>cache key</summary><pre class="key">{esc(s.key)}</pre></details>'
        )
    times = dict(s.times)
    for k, record in enumerate(s.programs):
        if record.first_run is not None:
            times[f"first run{'' if k == 0 else f' ({record.title})'}"] = record.first_run
    if times:
        known = [p for p in _PHASES if p in times] + [p for p in times if p not in _PHASES]
        rows = "".join(
            f'<tr><td>{esc(p)}</td><td class="num">{_ms(times[p])}</td></tr>' for p in known
        )
        out.append(
            '<h3>Compile time</h3><table class="times"><tr><th>phase</th><th>ms</th></tr>'
            f"{rows}</table>"
        )
        out.append(
            '<p class="note">recording: the call, run eagerly while recorded; module load: '
            "writing and importing the generated module; first run: the program's first call, "
            "numba's JIT or its disk-cache load included</p>"
        )
    if s.passes:
        rows = "".join(
            f'<tr><td>{esc(n)}</td><td class="num">{b}</td><td class="num">{a}</td>'
            f'<td class="num">{_ms(t)}</td></tr>'
            for n, b, a, t in s.passes
        )
        out.append(
            '<h3>Passes</h3><table class="passes"><tr><th>pass</th><th>values before</th>'
            f"<th>values after</th><th>ms</th></tr>{rows}</table>"
        )
    for record in s.programs:
        out.append(
            f'<div class="program"><h3>{esc(record.title)}: {record.kernels} kernel(s) '
            f"({record.interpreted} interpreted), {record.externs} extern call(s)</h3>"
        )
        out.append(record.picture)
        out.append(f'<h3>Kernels</h3><pre class="schedule">{esc(record.schedule)}</pre>')
        if record.source_path:
            out.append(
                f'<h3>Generated code</h3><p class="path">{esc(record.source_path)}</p>'
                f'<pre class="code">{esc(record.source)}</pre>'
            )
        else:
            out.append('<p class="note">no generated code: every kernel is interpreted</p>')
        out.append("</div>")
    for caption, text in s.graph_text:
        out.append(
            f'<details class="graph"><summary>{esc(caption)}</summary>'
            f'<pre class="ir">{esc(text)}</pre></details>'
        )
    if s.fallbacks:
        items = "".join(f"<li>{esc(r)}</li>" for r in s.fallbacks)
        out.append(f'<h3 class="fallback">Fallbacks</h3><ul class="fallbacks">{items}</ul>')
    if s.notes:
        items = "".join(f"<li>{esc(n)}</li>" for n in s.notes)
        out.append(f'<ul class="notes">{items}</ul>')
    out.append("</section>")
    return "\n".join(out)


def render_page() -> str:
    """The whole page as HTML text."""
    esc = html.escape
    with _lock:
        sections = list(_sections)
    toc = "".join(
        f'<li><a href="#s{s.number}">{esc(s.title)}</a>'
        f"{' <span class=fallback>(fallback)</span>' if s.fallbacks else ''}</li>"
        for s in sections
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_started))
    head = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>fusegrad trace, process {os.getpid()}</title><style>{_STYLE}</style></head><body>"
        f"<h1>fusegrad compile trace</h1><p>process {os.getpid()} ({esc(' '.join(sys.argv))}), "
        f"Python {platform.python_version()}, compiler loaded at {started}; "
        f"{len(sections)} section(s), written {time.strftime('%H:%M:%S')}</p>"
        f'<nav><ol class="toc">{toc}</ol></nav>'
    )
    body = "\n".join(_section_html(s) for s in sections)
    return f"{head}\n{body}\n</body></html>\n"


def write() -> None:
    """Rewrite the page (atomically: a reader never sees half of it).  A page that cannot be
    written warns once and never stops the compile."""
    global _write_failed
    path = trace_path()
    if path is None:
        return
    with _lock:
        text = render_page()
        temporary = f"{path}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(temporary, path)
        except OSError as e:
            if not _write_failed:
                _write_failed = True
                warnings.warn(f"fusegrad: cannot write the trace report {path}: {e}", stacklevel=2)


set_trace_dir(os.environ.get(ENV) or None)
