"""``FUSEGRAD_TEST_COMPILED=1 python -m pytest tests/autograd`` runs every test of this folder
inside ``fusegrad.compiler.compiled_autograd()`` and prints at the end how many backward calls
ran a compiled program and how many fell back to the eager engine, with the reasons: the
compiler's coverage measured on the project's own autograd suite.  Tests marked
``shows_fallback`` exist to show a fallback and are left out of the figures (they still run);
tests marked ``compiled_differs(reason)`` check eager behaviour that compiled backward knowingly
does not have (docs/compile.md): they are expected to fail there (strictly: one that passes
fails, so that a difference fixed is unmarked).  ``tests/compiler/test_autograd_suite_compiled.py``
runs this mode.

Without the variable this file does nothing."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

COMPILED = os.environ.get("FUSEGRAD_TEST_COMPILED") == "1"

# backward calls over the run: compiled, fell back (by reason); tests by outcome
_totals: dict[str, Any] = {
    "compiled": 0,
    "fallbacks": Counter(),
    "tests": Counter(),
    "excluded": 0,
    "opaque": Counter(),  # custom Function backwards compiled programs ran as opaque steps
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "shows_fallback: the test exists to show a compiled-backward fallback"
    )
    config.addinivalue_line(
        "markers",
        "compiled_differs(reason): a known difference of compiled backward from eager (an "
        "expected failure, strict, under FUSEGRAD_TEST_COMPILED=1)",
    )

    config.addinivalue_line(
        "markers",
        "compares_compiled: the test runs compiled autograd against eager itself (skipped "
        "under FUSEGRAD_TEST_COMPILED=1, where its eager half would be compiled too)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if not COMPILED:
        return
    for item in items:
        marker = item.get_closest_marker("compiled_differs")
        if marker is not None:
            item.add_marker(pytest.mark.xfail(reason=marker.args[0], strict=True))
        if item.get_closest_marker("compares_compiled") is not None:
            item.add_marker(pytest.mark.skip(reason="compares compiled with eager itself"))


if COMPILED:

    @pytest.fixture(autouse=True)
    def _inside_compiled_autograd(request: pytest.FixtureRequest) -> Iterator[None]:
        from fusegrad import compiler

        counters = compiler.counters
        before = (counters.compiled_runs, Counter(counters.fallbacks))
        opaque_before = Counter(counters.opaque_functions)
        with compiler.compiled_autograd():
            yield
        # (a test that calls compiler.reset() zeroes the counters: count from zero then)
        start_runs, start_fallbacks = before
        if counters.compiled_runs < start_runs:
            start_runs, start_fallbacks, opaque_before = 0, Counter(), Counter()
        compiled = counters.compiled_runs - start_runs
        fallbacks = Counter(counters.fallbacks)
        fallbacks.subtract(start_fallbacks)
        fallbacks = +fallbacks  # (drops the zero and negative counts)
        if request.node.get_closest_marker("shows_fallback"):
            _totals["excluded"] += 1
            return
        _totals["compiled"] += compiled
        _totals["fallbacks"].update(fallbacks)
        opaque = Counter(counters.opaque_functions)
        opaque.subtract(opaque_before)
        _totals["opaque"].update(+opaque)
        if compiled or fallbacks:
            outcome = (
                "compiled" if not fallbacks else "fell back" if not compiled else "partly fell back"
            )
            _totals["tests"][outcome] += 1

    def pytest_terminal_summary(terminalreporter: Any) -> None:
        fell_back = sum(_totals["fallbacks"].values())
        total = _totals["compiled"] + fell_back
        write = terminalreporter.write_line
        write("")
        write("compiled-autograd coverage of tests/autograd (FUSEGRAD_TEST_COMPILED=1):")
        if not total:
            write("  no backward call ran")
            return
        tests = _totals["tests"]
        write(
            f"  backward calls: {total}; compiled {_totals['compiled']} "
            f"({100 * _totals['compiled'] / total:.1f}%), fell back {fell_back}"
        )
        write(
            f"  tests with backward calls: {sum(tests.values())}; all compiled "
            f"{tests['compiled']}, partly fell back {tests['partly fell back']}, fell back "
            f"{tests['fell back']} ({_totals['excluded']} shows_fallback tests left out)"
        )
        for reason, count in _totals["fallbacks"].most_common():
            write(f"  {count:5d}  {reason}")
        opaque = _totals["opaque"]
        if opaque:
            write(
                f"  custom Function backwards the compiled programs ran eagerly, as opaque steps: "
                f"{sum(opaque.values())}"
            )
            for reason, count in opaque.most_common():
                write(f"  {count:5d}  {reason}")
