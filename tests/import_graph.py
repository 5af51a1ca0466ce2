"""The load-time import graph of one of fusegrad's two source trees (``src/fusegrad``, or
``compiler/`` = ``fusegrad.compiler``), read from the code with ``ast``: used by the import tests
(no cycle; imports inside functions only where allowed) and by ``docs/make_pictures.py``, which
draws the compiler's layers from it.

The graph is built statically from every module's top-level import statements (``if
TYPE_CHECKING:`` blocks left out: they never run).  An edge goes to every module a statement
executes: the named module, a submodule named in ``from package import name``, and the packages
above them, whose ``__init__`` Python runs first (``import fusegrad.cuda.array`` runs
``fusegrad/cuda/__init__.py``), except the importer's own packages, which are already running
when it runs, and the ``facades``: package ``__init__`` modules that are no implicit dependency
of their submodules' importers (a name imported *from* one is still an edge).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class Tree:
    """The modules of the source tree at ``root`` (package ``package``); ``outside`` names a
    module prefix of ours that is not part of the graph (``src/fusegrad`` never imports
    ``fusegrad.compiler`` at load time, and the compiler's edges into ``src`` are no cycle risk:
    ``src`` is complete without it)."""

    def __init__(
        self,
        root: Path,
        package: str,
        outside: tuple[str, ...] = (),
        facades: frozenset = frozenset(),
    ) -> None:
        self.root = root
        self.package = package
        self.outside = outside
        self.facades = facades
        self.modules = {self.module_name(p): p for p in sorted(root.rglob("*.py"))}
        self.packages = {self.module_name(p) for p in root.rglob("__init__.py")}

    def module_name(self, path: Path) -> str:
        parts = [self.package, *path.relative_to(self.root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def is_ours(self, name: str) -> bool:
        return name == self.package or name.startswith(self.package + ".")

    def resolve(self, module: str, level: int, name: str | None) -> str:
        """The absolute name ``from <level dots><name> import ...`` in ``module`` refers to."""
        if level == 0:
            return name or ""
        base = module.split(".") if module in self.packages else module.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    def known(self, name: str) -> str:
        """``name``, or the deepest module of ours above it (``a.b.X``: ``a.b``)."""
        while name not in self.modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    def targets(self, module: str, node: ast.Import | ast.ImportFrom) -> tuple[set[str], set[str]]:
        """(modules the statement names, modules it reads names from), of this tree only."""
        named: set[str] = set()
        read: set[str] = set()
        if isinstance(node, ast.Import):
            named = {alias.name for alias in node.names}
        else:
            base = self.resolve(module, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in self.modules:
                    named.add(sub)  # ``from package import submodule``
                else:
                    named.add(base)
                    read.add(base)  # a name defined in ``base`` (or a module outside the tree)
        keep = {
            n
            for n in named
            if self.is_ours(n) and not n.startswith(self.outside or ("\0",)) and n != module
        }
        return {self.known(n) for n in keep}, {self.known(n) for n in read & keep}

    def load_graph(self) -> dict[str, dict[str, int]]:
        """module -> {module its loading executes: line of the import statement}."""
        graph: dict[str, dict[str, int]] = {}
        for module, path in self.modules.items():
            edges: dict[str, int] = {}
            running = set(_ancestors(module))  # our packages: already being initialised
            for node in top_level_imports(ast.parse(path.read_text()).body):
                named, read = self.targets(module, node)
                for target in named:
                    implicit = {p for p in _ancestors(target) if p not in running}
                    for dep in ({target} - running) | read | (implicit - self.facades):
                        if dep != module and self.is_ours(dep):
                            edges.setdefault(dep, node.lineno)
            graph[module] = edges
        return graph

    def function_local_imports(self) -> list[tuple[str, int, str]]:
        """(module, line, imported module) for every import statement inside a function."""
        found = []
        for module, path in self.modules.items():
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
                            names = [self.resolve(module, node.level, node.module)]
                        found += [(module, node.lineno, n) for n in names]
        return found

    def silent_local_imports(self) -> list[str]:
        """Imports inside functions without a comment on their line or the line above."""
        silent = []
        for module, line, name in self.function_local_imports():
            lines = self.modules[module].read_text().splitlines()
            if "#" not in lines[line - 1] and "#" not in lines[line - 2]:
                silent.append(f"{module}:{line} imports {name}")
        return silent


def top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module loads (under if/try too, not TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append(stmt)
        elif isinstance(stmt, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(stmt.test):
                found += top_level_imports(stmt.body) + top_level_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            found += top_level_imports(stmt.body) + top_level_imports(stmt.orelse)
            found += top_level_imports(stmt.finalbody)
            for handler in stmt.handlers:
                found += top_level_imports(handler.body)
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


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


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return "\n".join(f"  {a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:]))


# the two trees
SRC = Tree(
    REPO_ROOT / "src" / "fusegrad",
    "fusegrad",
    outside=("fusegrad.compiler",),
    facades=frozenset({"fusegrad.autograd"}),
)
COMPILER = Tree(REPO_ROOT / "compiler", "fusegrad.compiler")
