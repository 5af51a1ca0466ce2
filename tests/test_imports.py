"""``src/fusegrad`` has no import cycle at load time, and imports inside functions are only the
allowed kinds (see the layers in ``fusegrad/__init__.py``).

The graph is built statically from every module's top-level import statements (``if
TYPE_CHECKING:`` blocks left out: they never run).  An edge goes to every module a statement
executes: the named module, a submodule named in ``from package import name``, and the packages
above them, whose ``__init__`` Python runs first (``import fusegrad.cuda.array`` runs
``fusegrad/cuda/__init__.py``), except the importer's own packages, which are already running
when it runs.  One package ``__init__`` is exempt from those implicit edges: ``fusegrad.autograd``,
the public face of modules that span every layer (``grad_mode`` below ``Tensor``, ``api`` above
the engine); ``fusegrad/__init__.py`` imports it first, and a name imported *from* it is still an
edge, so nothing below it may use it.  The fresh-process imports at the end check that the order
of ``fusegrad/__init__.py`` makes this hold in practice.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "fusegrad"

# Packages whose __init__ is not an implicit dependency of their submodules' importers (above).
FACADES = frozenset({"fusegrad.autograd"})

# Imports of fusegrad modules that stay inside functions: (module, imported module) -> why.  Only
# optional or heavy dependencies loaded on first use belong here (``fusegrad.compiler`` brings
# numba); a cycle is never a reason.  (``nn``, ``optim``, ``utils`` and ``compiler`` also load on
# first use, through ``fusegrad.__getattr__`` and importlib, not an import statement.)
ALLOWED_LOCAL = {
    ("fusegrad", "fusegrad.compiler"): "fusegrad.compile: the compiler and numba, on first use",
    ("fusegrad.cuda.generated", "fusegrad.compiler.codegen"): "the CUDA emitter, on first use",
    ("fusegrad.ops.primitives", "fusegrad.ops.attention_kernels"): (
        "the fused attention kernels (numba, and the compiler's fastmath exp), on first use"
    ),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}
PACKAGES = {_module_name(p) for p in SRC.rglob("__init__.py")}


def _is_ours(name: str) -> bool:
    return name == "fusegrad" or name.startswith("fusegrad.")


def _resolve(module: str, level: int, name: str | None) -> str:
    """The absolute name ``from <level dots><name> import ...`` in ``module`` refers to."""
    if level == 0:
        return name or ""
    base = module.split(".") if module in PACKAGES else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _known(name: str) -> str:
    """``name``, or the deepest module of ours above it (``fusegrad.ops.X``: ``fusegrad.ops``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> tuple[set[str], set[str]]:
    """(modules the statement names, modules it reads names from); fusegrad's only, excluding
    ``fusegrad.compiler`` (a separate package that ``src/fusegrad`` never imports at load)."""
    named: set[str] = set()
    read: set[str] = set()
    if isinstance(node, ast.Import):
        named = {alias.name for alias in node.names}
    else:
        base = _resolve(module, node.level, node.module)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in MODULES:
                named.add(sub)  # ``from package import submodule``
            else:
                named.add(base)
                read.add(base)  # a name defined in ``base`` (or a module outside src/)
    keep = {
        n for n in named if _is_ours(n) and not n.startswith("fusegrad.compiler") and n != module
    }
    return {_known(n) for n in keep}, {_known(n) for n in read & keep}


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module loads (under if/try too, not TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append(stmt)
        elif isinstance(stmt, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(stmt.test):
                found += _top_level_imports(stmt.body) + _top_level_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            found += _top_level_imports(stmt.body) + _top_level_imports(stmt.orelse)
            found += _top_level_imports(stmt.finalbody)
            for handler in stmt.handlers:
                found += _top_level_imports(handler.body)
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def load_graph() -> dict[str, dict[str, int]]:
    """module -> {module its loading executes: line of the import statement}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        edges: dict[str, int] = {}
        running = set(_ancestors(module))  # our packages: already being initialised
        for node in _top_level_imports(ast.parse(path.read_text()).body):
            named, read = _targets(module, node)
            for target in named:
                implicit = {p for p in _ancestors(target) if p not in running}
                for dep in ({target} - running) | read | (implicit - FACADES):
                    if dep != module:
                        edges.setdefault(dep, node.lineno)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def _describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return "\n".join(f"  {a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:]))


def test_the_load_time_import_graph_has_no_cycle() -> None:
    graph = load_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle at load time:\n" + _describe(graph, cycle or [])


def test_the_graph_is_the_layering_described() -> None:
    """The graph sees what the layers say: a few edges that must exist, read from the code."""
    graph = load_graph()
    assert "fusegrad.autograd.graph_base" in graph["fusegrad.tensor"]
    assert "fusegrad.tensor" in graph["fusegrad.autograd.node"]
    assert "fusegrad.autograd.node" in graph["fusegrad.ops.registry"]
    assert "fusegrad.ops" in graph["fusegrad.autograd.derivatives"]
    assert "fusegrad.autograd.derivatives" in graph["fusegrad"]
    assert "fusegrad.autograd.derivatives" not in graph["fusegrad.ops"]
    # an implicit package edge: importing cuda.array runs fusegrad/cuda/__init__.py first
    assert "fusegrad.cuda" in graph["fusegrad.tensor"]


def test_a_cycle_is_found_and_reported() -> None:
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert _describe(graph, cycle).splitlines()[0] == "  a (line 3) -> b"
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None


def _function_local_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) for every import statement inside a function."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        seen: set[int] = set()  # (a nested function's imports are in its parent's walk too)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                    seen.add(id(node))
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    else:
                        names = [_resolve(module, node.level, node.module)]
                    found += [(module, node.lineno, n) for n in names]
    return found


def test_function_local_imports_of_fusegrad_are_only_the_allowed_kinds() -> None:
    ours = [(m, line, n) for m, line, n in _function_local_imports() if _is_ours(n)]
    unexpected = [f"{m}:{line} imports {n}" for m, line, n in ours if (m, n) not in ALLOWED_LOCAL]
    assert not unexpected, "imports inside functions (move them to the top):\n" + "\n".join(
        unexpected
    )
    # each allowed one is still there: a stale entry would let a new import of the pair in
    assert {(m, n) for m, _, n in ours} == set(ALLOWED_LOCAL)
    assert len(ours) == len(ALLOWED_LOCAL)


def test_every_import_inside_a_function_says_why() -> None:
    """Optional and heavy dependencies (numba, scipy, cupy, ...) load on first use; a comment on
    the import's line or the line above says so."""
    silent = []
    for module, line, name in _function_local_imports():
        lines = MODULES[module].read_text().splitlines()
        if "#" not in lines[line - 1] and "#" not in lines[line - 2]:
            silent.append(f"{module}:{line} imports {name}")
    assert not silent, "imports inside functions without a comment:\n" + "\n".join(silent)


def _fresh_import(statement: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", statement], capture_output=True, text=True, timeout=120
    )


# Python runs ``fusegrad/__init__.py`` before any submodule, so whatever a program imports first,
# the package's own order is what loads; these check that it works for each entry point (and
# loads neither numba nor the compiler).
@pytest.mark.parametrize(
    "module",
    [
        "fusegrad.tensor",
        "fusegrad.autograd.node",
        "fusegrad.autograd.graph_base",
        "fusegrad.ops.registry",
        "fusegrad.ops.shape",
        "fusegrad.autograd.engine",
        "fusegrad.cuda.array",
        "fusegrad.storage",
        "fusegrad.nn",
        "fusegrad.optim",
        "fusegrad.utils.checkpoint",
    ],
)
def test_a_module_imported_first_in_a_fresh_process_loads(module: str) -> None:
    done = _fresh_import(
        f"import sys, {module}; print('numba' in sys.modules, 'fusegrad.compiler' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_every_module_loads() -> None:
    names = sorted(n for n in MODULES if n != "fusegrad.__main__")
    done = _fresh_import(
        f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)"
    )
    assert done.returncode == 0, done.stderr


def test_distributed_and_nn_parallel_are_attributes_as_in_pytorch() -> None:
    """``torch.distributed`` and ``torch.nn.parallel`` are there after ``import torch``: here
    they load on first use (MPI itself only at ``init_process_group``)."""
    code = (
        "import sys, fusegrad as fg\n"
        "assert 'fusegrad.distributed' not in sys.modules\n"
        "assert callable(fg.distributed.init_process_group)\n"
        "assert fg.nn.parallel.DistributedDataParallel.__name__ == 'DistributedDataParallel'\n"
        "assert 'mpi4py.MPI' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
