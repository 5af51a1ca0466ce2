"""``fusegrad.compiler`` (``compiler/``) has no import cycle at load time, no submodule imports
from the package facade (``compiler/__init__.py`` is the public face only: nothing below it
reads from it), and every import inside a function is listed here with its reason.

The graph is read from the code (``tests/import_graph.py``), as for ``src/fusegrad``
(``tests/test_imports.py``); the layers it must follow are drawn in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import subprocess
import sys

from import_graph import COMPILER, describe, find_cycle

FACADE = "fusegrad.compiler"

# Imports of fusegrad modules that stay inside functions: (module, imported module) -> why.
# Only optional or heavy dependencies loaded on first use belong here; a cycle is never a reason.
ALLOWED_LOCAL = {
    ("fusegrad.compiler.program", "fusegrad.compiler.codegen"): (
        "the numba-cuda emitter and launcher (numba_cuda): loaded by the first CUDA program"
    ),
    ("fusegrad.compiler.program", "fusegrad.cuda.ops"): (
        "the CUDA eager kernels (numba-cuda): loaded by the first CUDA program"
    ),
    ("fusegrad.compiler.program", "fusegrad.cuda.generated"): (
        "the CUDA eager kernels (numba-cuda): loaded by the first CUDA program"
    ),
    ("fusegrad.compiler.program", "fusegrad"): (
        "fusegrad.distributed (MPI): loaded by the first DDP collective a program runs"
    ),
    ("fusegrad.compiler.step", "fusegrad.compiler.module"): (
        "a function compiled as a module (CompiledFunction.module_form), made at its first "
        "need: module sits above step (compile(model) records through step.record)"
    ),
    ("fusegrad.compiler.trace", "fusegrad.compiler.viz"): (
        "pictures for the trace report, on first use: viz sits above the passes, which report "
        "to the trace"
    ),
}


def _is_fusegrad(name: str) -> bool:
    return name == "fusegrad" or name.startswith("fusegrad.")


def test_the_compilers_load_time_import_graph_has_no_cycle() -> None:
    graph = COMPILER.load_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle at load time:\n" + describe(graph, cycle or [])


def test_no_submodule_imports_from_the_package_facade() -> None:
    graph = COMPILER.load_graph()
    readers = [m for m, edges in graph.items() if m != FACADE and FACADE in edges]
    assert not readers, f"modules that import from compiler/__init__.py: {readers}"
    local = [(m, n) for m, _, n in COMPILER.function_local_imports() if n == FACADE]
    assert not local, f"imports of the facade inside functions: {local}"


def test_the_graph_is_the_layering_described() -> None:
    """A few edges the layers must have, and a few they must not, read from the code."""
    graph = COMPILER.load_graph()
    # the front ends ask the service; the service builds programs
    for front in ("region", "step", "module"):
        assert "fusegrad.compiler.service" in graph[f"fusegrad.compiler.{front}"], front
    assert "fusegrad.compiler.program" in graph["fusegrad.compiler.service"]
    # the bottom: settings imports nothing of the compiler; events only logs and trace
    assert not graph["fusegrad.compiler.settings"]
    assert set(graph["fusegrad.compiler.events"]) == {
        "fusegrad.compiler.logs",
        "fusegrad.compiler.trace",
    }
    # the code generators report numba's work as events, never to a cache
    assert "fusegrad.compiler.cache" not in graph["fusegrad.compiler.codegen.diskcache"]


def test_function_local_imports_are_only_the_allowed_kinds() -> None:
    ours = [(m, line, n) for m, line, n in COMPILER.function_local_imports() if _is_fusegrad(n)]
    unexpected = [f"{m}:{line} imports {n}" for m, line, n in ours if (m, n) not in ALLOWED_LOCAL]
    assert not unexpected, "imports inside functions (move them to the top):\n" + "\n".join(
        unexpected
    )
    # each allowed one is still there: a stale entry would let a new import of the pair in
    assert {(m, n) for m, _, n in ours} == set(ALLOWED_LOCAL)


def test_every_import_inside_a_function_says_why() -> None:
    silent = COMPILER.silent_local_imports()
    assert not silent, "imports inside functions without a comment:\n" + "\n".join(silent)


def test_every_compiler_module_loads_in_a_fresh_process() -> None:
    names = sorted(n for n in COMPILER.modules if "numba_cuda" not in n and "_fit" not in n)
    code = f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
