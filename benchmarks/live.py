"""What a person watching a benchmark sees while it runs: table rows printed the moment they are
measured, and one progress display per workload.

A benchmark used to print its tables when everything had finished (seconds of silence per
workload, minutes for a suite).  Now each module opens a ``StreamTable`` before it measures and
hands it every row as soon as that row's workload is done; every line is flushed, so the rows
show up on a terminal, through a pipe (``| tee log``) and in a file as they are measured.

Progress goes to stderr, apart from the results on stdout: ``Progress`` shows a ``tqdm`` bar
(the optional ``bench`` extra) when tqdm is importable and stderr is a terminal, and otherwise
plain lines -- one when a stage starts, one every few seconds while it runs, one at the end --
which read well in a CI log.  ``common.measure_interleaved``'s ``on_step`` callback drives it.

Imports nothing heavy (no numpy): benchmark modules import it before pinning threads.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from benchmarks import common

RATIO_CONVENTION = (
    "Ratios are fusegrad's median time divided by the peer's median time, both measured in "
    "this run: 0.52× means fusegrad takes 52% of the peer's time (faster); above 1× it is "
    "slower."
)


def _tqdm_class() -> Any | None:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def emit(line: str = "", file: TextIO | None = None) -> None:
    """Print ``line`` and flush at once; when tqdm bars are showing, they are cleared first and
    redrawn after, so the line does not land in the middle of a bar."""
    out = file if file is not None else sys.stdout
    tqdm = _tqdm_class() if Progress.bars_open else None
    if tqdm is None:
        print(line, file=out, flush=True)
        return
    with tqdm.external_write_mode(file=out):
        print(line, file=out, flush=True)


class StreamTable:
    """A markdown table printed one row at a time, each line flushed.

    Column widths are fixed when the header is printed (the header's width, at least
    ``min_width``, or the caller's ``widths`` for the first columns), since the rows are not
    known yet; a cell wider
    than its column is printed whole, so a rare long figure shifts one row but the markdown stays
    valid.  ``rows`` keeps what was printed.
    """

    def __init__(
        self,
        headers: Sequence[str],
        align: Sequence[str] | None = None,
        *,
        widths: Sequence[int | None] | None = None,
        min_width: int = 7,
    ) -> None:
        self.headers = list(headers)
        self.align = list(align) if align is not None else ["l"] + ["r"] * (len(headers) - 1)
        if len(self.align) != len(self.headers):
            raise ValueError(
                f"StreamTable: {len(self.align)} alignments for {len(self.headers)} columns"
            )
        given = list(widths or [])[: len(self.headers)]
        given += [None] * (len(self.headers) - len(given))
        self.widths = [max(len(h), min_width, w or 0) for h, w in zip(self.headers, given)]
        self.rows: list[list[str]] = []
        self._started = False

    def start(self) -> None:
        """Print the header and the rule (once)."""
        if not self._started:
            self._started = True
            emit(common.table_line(self.headers, self.widths, self.align))
            emit(common.table_rule(self.widths, self.align))

    def row(self, cells: Sequence[str]) -> None:
        """Print one row now (the header first if it has not been printed)."""
        cells = [str(c) for c in cells]
        if len(cells) != len(self.headers):
            raise ValueError(
                f"StreamTable.row: {len(cells)} cells {cells}, expected {len(self.headers)}"
            )
        self.start()
        self.rows.append(cells)
        emit(common.table_line(cells, self.widths, self.align))


class Progress:
    """Progress of one workload on stderr.

    ``stage(text)`` names what runs now ("compiling", "measuring 60 repetitions"); ``update``
    is the ``on_step(done, total)`` callback of ``common.measure_interleaved``; ``close()`` ends
    the display with the elapsed time.  Mode ``"auto"`` uses a tqdm bar when tqdm is importable
    and stderr is a terminal, plain lines otherwise; ``"plain"`` always plain lines; ``"off"``
    prints nothing.  Use as a context manager.
    """

    bars_open = 0  # tqdm bars showing now, in this process (``emit`` clears them)

    def __init__(
        self,
        label: str,
        *,
        mode: str = "auto",
        interval_s: float = 5.0,
        position: tuple[int, int] | None = None,
        file: TextIO | None = None,
    ) -> None:
        if mode not in ("auto", "plain", "off"):
            raise ValueError(f"Progress: mode must be 'auto', 'plain' or 'off', got {mode!r}")
        self.label = label if position is None else f"{label} ({position[0]}/{position[1]})"
        self.mode = mode
        self.interval_s = interval_s
        self.file = file if file is not None else sys.stderr
        self.started = time.monotonic()
        self._stage = ""
        self._last_line = self.started
        self._bar: Any = None
        tqdm = _tqdm_class() if mode == "auto" and self.file.isatty() else None
        if tqdm is not None:
            self._bar = tqdm(total=None, desc=self.label, file=self.file, leave=False, unit="step")
            Progress.bars_open += 1

    def _line(self, text: str) -> None:
        if self.mode != "off":
            print(f"[{self.label}] {text}", file=self.file, flush=True)
        self._last_line = time.monotonic()

    def stage(self, text: str) -> None:
        """A new stage starts (its counts start again from zero)."""
        self._stage = text
        if self._bar is not None:
            self._bar.reset(total=None)
            self._bar.set_description_str(f"{self.label}: {text}")
        else:
            self._line(f"{text}…")

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` steps of the current stage have run."""
        if self._bar is not None:
            if self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)
        elif time.monotonic() - self._last_line >= self.interval_s:
            elapsed = time.monotonic() - self.started
            self._line(f"{self._stage}: {done}/{total} steps, {elapsed:.0f} s so far")

    def close(self) -> None:
        """End the display: the bar disappears, a last line gives the workload's wall time."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            Progress.bars_open -= 1
        self._line(f"done in {time.monotonic() - self.started:.1f} s")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
