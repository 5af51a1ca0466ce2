"""Graph breaks that split a compiled function instead of abandoning it (``compile(fn)``).

When the whole-step recording of ``fn`` breaks because Python reads a tensor's value
(``loss.item()``, ``bool(t)``, ``print(t)``, ``t.tolist()``) and tensor ops follow, or the value
read is not returned, the function is split at the top-level statement of ``fn`` that made the
read: the statements before it are one compiled function, the statement itself runs as written
(inside a compiled-backward region: a ``backward()`` there is compiled), and the statements
after it are another compiled function, which may split again at its own first break.  The
parts hand the function's local variables on: each part takes them as arguments and returns
them (``locals()``), so a tensor computed before the break is an output of the first program
and an input of the next, as between PyTorch's graph breaks.

A read in the last statements (``total_loss += loss.item()`` after the optimizer step) thus
costs no break inside the step: the step before it is one program, and the read happens after
it ran.

The parts are made from ``fn``'s source (``inspect.getsource``): its syntax tree is cut into
statement lists, each compiled as a function with the original file name and line numbers (so
tracebacks, logs and ``explain`` name the user's lines), with ``fn``'s globals and closure cells
(``global`` and ``nonlocal`` declarations are repeated in every part).  What cannot be split
falls back as before, with the reason: no source, a generator or coroutine, a ``return``
anywhere but as the last statement.  Values of Python variables other than tensors and the
arguments' own are handed on as the recording saw them (as a whole step's Python results are).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

from fusegrad.tensor import Tensor

# a local variable not bound yet when a part starts (its parameters' default)
UNBOUND: Any = type("Unbound", (), {"__repr__": lambda self: "<unbound local>"})()

_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_FN_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class Source:
    """A function's syntax tree and what a part of it needs: its file, globals, closure cells
    and the local variable names the parts hand on (the function's own and those its nested
    functions close over)."""

    def __init__(
        self, node: ast.FunctionDef, filename: str, fn_globals: dict, cells: dict, names: tuple
    ) -> None:
        self.node = node
        self.filename = filename
        self.globals = fn_globals
        self.cells = cells  # free variable name -> the function's cell
        self.names = names  # the function's local variable names (arguments first)
        self.declarations = [s for s in node.body if isinstance(s, (ast.Global, ast.Nonlocal))]

    @classmethod
    def of(cls, fn: Callable) -> Source | str:
        """``fn``'s source (a part's is kept on it), or why it has none to split."""
        kept = getattr(fn, "__fusegrad_source__", None)
        if kept is not None:
            return kept  # type: ignore[no-any-return]
        func = getattr(fn, "__func__", fn)
        code = getattr(func, "__code__", None)
        if code is None:
            return "it is not a Python function"
        if code.co_flags & (
            inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
        ):
            return "it is a generator or coroutine"
        if "__class__" in code.co_freevars:
            return "it calls super() without arguments (a part would have no __class__ cell)"
        try:
            lines, first = inspect.getsourcelines(func)
        except (OSError, TypeError):
            return "its source is not available"
        if first != code.co_firstlineno or inspect.getsourcefile(func) != code.co_filename:
            # (``inspect`` follows ``__wrapped__``: the source of another function than the
            # one that runs, a decorator's wrapper)
            return "its source is not the code that runs (a wrapper of another function)"
        try:
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except SyntaxError:
            return "its source does not parse on its own"
        node = tree.body[0] if tree.body else None
        if not isinstance(node, ast.FunctionDef) or node.name != func.__name__:
            return "its source is not a plain def (a lambda or a decorated expression)"
        ast.increment_lineno(tree, first - 1)  # (the parts are new defs: no decorators)
        cells = dict(zip(code.co_freevars, func.__closure__ or ()))
        names = tuple(dict.fromkeys(code.co_varnames + code.co_cellvars))
        return cls(node, code.co_filename, func.__globals__, cells, names)

    def statement_at(self, line: int) -> int | None:
        """The index of the top-level statement of the body that holds ``line``."""
        for k, stmt in enumerate(self.node.body):
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                return k
        return None

    def why_not(self) -> str | None:
        """Why the body cannot be cut into parts, or None."""
        body = self.node.body
        for k, stmt in enumerate(body):
            for sub in _walk_own(stmt):
                if isinstance(sub, ast.Return) and not (k == len(body) - 1 and sub is stmt):
                    return f"a return at line {sub.lineno} that is not the last statement"
                if isinstance(sub, (ast.Yield, ast.YieldFrom, ast.Await)):
                    return f"a yield or await at line {sub.lineno}"
        return None

    def names_in(self, start: int, stop: int) -> tuple[set, set]:
        """The local variables statements ``start:stop`` read (nested functions included) and
        bind."""
        stmts = self.node.body[start:stop]
        known = set(self.names)
        loads = {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name)} & known
        stores = {
            n.id
            for s in stmts
            for n in _walk_own(s)
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
        } & known
        return loads, stores

    def part(self, start: int, stop: int, index: int, later: set) -> Callable:
        """The function running statements ``start:stop`` of the body: it takes the local
        variables it reads or binds as keyword arguments (``__fusegrad_uses__``; ``UNBOUND``
        where not bound yet) and returns a dict of those it binds that the statements after it
        use (``later``), or, when it ends with the body's ``return``, what that returns."""
        body = self.node.body[start:stop]
        returns = stop == len(self.node.body) and isinstance(body[-1], ast.Return)
        stmts = [s for s in body if not isinstance(s, (ast.Global, ast.Nonlocal))]
        loads, stores = self.names_in(start, stop)
        tail: list[ast.stmt] = []
        if not returns:
            last = body[-1]
            kept = sorted(stores & later)
            out = ast.Dict(
                keys=[ast.Constant(value=n) for n in kept],
                values=[ast.Name(id=n, ctx=ast.Load()) for n in kept],
            )
            tail = [_at(ast.Return(value=out), last.end_lineno or last.lineno)]
        name = f"{self.node.name}__part{index}"
        args = ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=n) for n in self.names],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[ast.Name(id="__fusegrad_unbound__", ctx=ast.Load()) for _ in self.names],
        )
        fn_node = ast.FunctionDef(
            name=name,
            args=args,
            body=[*self.declarations, *(stmts or [ast.Pass()]), *tail],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        free = list(self.cells)
        factory = ast.FunctionDef(
            name="__fusegrad_factory__",
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg(arg=n) for n in ["__fusegrad_unbound__", *free]],
                kwonlyargs=[],
                kw_defaults=[],
                defaults=[],
            ),
            body=[fn_node, ast.Return(value=ast.Name(id=name, ctx=ast.Load()))],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        module = ast.Module(body=[factory], type_ignores=[])
        for node in (module, factory, fn_node, *fn_node.args.defaults):
            _at(node, body[0].lineno, deep=False)
        ast.fix_missing_locations(module)
        code = compile(module, self.filename, "exec")
        factory_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
        part_code = next(c for c in factory_code.co_consts if isinstance(c, types.CodeType))
        # the part's closure: the function's own cells, and one holding ``UNBOUND`` (for the
        # parameters' defaults, evaluated in the factory)
        defaults = tuple(UNBOUND for _ in self.names)
        closure = tuple(
            self.cells[n] if n in self.cells else types.CellType(UNBOUND)
            for n in part_code.co_freevars
        )
        fn = types.FunctionType(part_code, self.globals, name, defaults, closure or None)
        fn.__fusegrad_source__ = Source(  # type: ignore[attr-defined]
            _sub_function(self.node, stmts, returns),
            self.filename,
            self.globals,
            self.cells,
            self.names,
        )
        fn.__fusegrad_source__.declarations = self.declarations
        fn.__fusegrad_part_returns__ = returns  # type: ignore[attr-defined]
        # the local variables the part reads or binds: its arguments on a call (binding one
        # conditionally keeps the value it had)
        fn.__fusegrad_uses__ = tuple(n for n in self.names if n in loads | stores)  # type: ignore[attr-defined]
        return fn


def _sub_function(node: ast.FunctionDef, stmts: list, returns: bool) -> ast.FunctionDef:
    """A function node with the statements ``stmts`` only (a part's own source, to split it
    again at its own break)."""
    sub = ast.FunctionDef(
        name=node.name,
        args=node.args,
        body=list(stmts),
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    return ast.copy_location(sub, node)


def _walk_own(stmt: ast.AST) -> Any:
    """The nodes of ``stmt``, not entering nested functions, lambdas and classes."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _FN_NODES):
                stack.append(child)


def _at(node: ast.AST, line: int, deep: bool = True) -> ast.AST:
    """``node`` (and, ``deep``, every node inside it) placed at ``line``."""
    for sub in ast.walk(node) if deep else (node,):
        if "lineno" in sub._attributes:
            sub.lineno = sub.end_lineno = line  # type: ignore[attr-defined]
            sub.col_offset = sub.end_col_offset = 0  # type: ignore[attr-defined]
    return node


class Split:
    """A compiled function cut at a graph break: its parts, run in order on the call's local
    variables.  ``parts`` are ``(line range, compiled)`` pairs: compiled parts are
    ``fusegrad.compile``d functions (recorded and replayed as whole steps, and split again at
    their own breaks); the others run as written inside a compiled-backward region."""

    def __init__(
        self,
        fn: Callable,
        source: Source,
        at: int,
        reason: str,
        compiled: Callable[[Callable], Callable],
        region: Callable,
    ) -> None:
        func = getattr(fn, "__func__", fn)
        self.signature = inspect.signature(func)
        self.names = source.names
        self.reason = reason
        self.region = region
        body = source.node.body
        self.line = body[at].lineno
        self.parts: list[tuple[tuple[int, int], bool, Callable]] = []
        cuts = [(0, at, True), (at, at + 1, False), (at + 1, len(body), True)]
        cuts = [c for c in cuts if c[0] < c[1]]
        for n, (start, stop, compile_it) in enumerate(cuts):
            later: set = set()
            for a, b, _ in cuts[n + 1 :]:
                later |= set().union(*source.names_in(a, b))
            part = source.part(start, stop, len(self.parts), later)
            lines = (body[start].lineno, body[stop - 1].end_lineno or body[stop - 1].lineno)
            self.parts.append((lines, compile_it, compiled(part) if compile_it else part))
        plain = [getattr(p, "__wrapped__", p) for _, _, p in self.parts]
        self.uses = [p.__fusegrad_uses__ for p in plain]
        self.returns = plain[-1].__fusegrad_part_returns__

    def describe(self) -> str:
        """In words: where the function breaks and into which parts (``explain``, the log)."""
        parts = ", ".join(
            f"lines {a}-{b} {'compiled' if c else 'run as written'}" for (a, b), c, _ in self.parts
        )
        return f"graph break at line {self.line} ({self.reason}): split into {parts}"

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        local = {name: UNBOUND for name in self.names}
        local.update(bound.arguments)
        last = len(self.parts) - 1
        for k, (_, compiled, part) in enumerate(self.parts):
            uses = {n: local[n] for n in self.uses[k]}
            if compiled:
                out = part(**uses)
                if not (k == last and self.returns):
                    self.check_handed_on(k, out, uses)
            else:
                with self.region():
                    out = part(**uses)
            if k == last and self.returns:
                return out
            local.update(out)
        return None

    def check_handed_on(self, k: int, out: dict, uses: dict) -> None:
        """A compiled part may hand on tensors (program outputs) and what it was handed; a
        Python value it computed (``n = len(items)``, ``start = time.time()``) would be the
        recording's on every replay, so the part runs as written from now on.  This call
        computed it for real: a part's first call with a guard key is never a replay."""
        for name, value in out.items():
            if value is None or value is UNBOUND or isinstance(value, Tensor):
                continue
            if value is uses.get(name, UNBOUND):
                continue
            lines, _, part = self.parts[k]
            self.parts[k] = (lines, False, getattr(part, "__wrapped__", part))
            self.reason += (
                f"; lines {lines[0]}-{lines[1]} run as written: they hand on the Python "
                f"value {name!r} ({type(value).__name__})"
            )
            return
