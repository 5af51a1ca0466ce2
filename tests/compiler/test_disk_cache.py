"""The on-disk cache of generated code never breaks a run (docs/ARCHITECTURE.md, contracts 7 and
10).

* corruption: every kind of broken entry (generated ``.py``, numba's index ``.nbi`` and data
  ``.nbc`` files, payloads moved between modules) is repaired by the next process, which still
  computes the right gradients, without a traceback; the process after it loads from disk again;
* threads: many threads writing into one fresh cache directory (and one file) at once;
* location: an unusable cache directory gives one warning and in-memory compilation, never a
  directory shared by all users;
* counters: ``compiles`` and ``disk_hits`` count numba function specialisations compiled and
  loaded, for generated kernels, their ``prange`` variant and the precompiled interpreter;
* CUDA: numba-cuda's cache gets the same guard (checked without a GPU).

Processes are fresh interpreters (``sys.executable``) with ``FUSEGRAD_CACHE_DIR`` and
``NUMBA_CACHE_DIR`` in a temporary directory; each costs a few seconds (numba's import), so one
process exercises several corruptions, each on a graph of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.codegen import common, diskcache, numba_cpu

# one graph per op: ``op(x).sum()``, whose backward is one small elementwise kernel (``kernel_0``);
# the child compares every compiled gradient with eager and reports, per op, the program's source
# path and how many compiles and disk hits it took
_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import fusegrad as fg
    from fusegrad import compiler

    compiler.config.interpreter_max_elements = 0  # generated code for these small graphs
    x0 = np.linspace(0.1, 0.9, 64, dtype=np.float32)  # inside every op's domain
    report = {}
    for op in sys.argv[1].split(","):
        x = fg.tensor(x0, requires_grad=True)
        getattr(x, op)().sum().backward()
        expected = x.grad.numpy().copy()
        x.grad = None
        known = set(map(id, compiler.cached_programs()))
        compiles, disk_hits = compiler.counters.compiles, compiler.counters.disk_hits
        with compiler.compiled_autograd():
            getattr(x, op)().sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=op)
        (program,) = [p for p in compiler.cached_programs() if id(p) not in known]
        report[op] = {
            "path": program.source_path,
            "compiles": compiler.counters.compiles - compiles,
            "disk_hits": compiler.counters.disk_hits - disk_hits,
        }
    print(json.dumps(report))
    """
)


def _run(script: pathlib.Path, args: list[str], env: dict[str, str]) -> tuple[Any, str]:
    """Run ``script`` in a fresh interpreter: its JSON report and its stderr; fails on a
    non-zero exit or a traceback."""
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _env(tmp_path: pathlib.Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["FUSEGRAD_CACHE_DIR"] = str(tmp_path / "generated")
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")
    env.pop("FUSEGRAD_LOGS", None)
    return env


def _numba_files(tmp_path: pathlib.Path, module_path: str, pattern: str) -> list[pathlib.Path]:
    """numba's cache files of a generated module's functions (under ``NUMBA_CACHE_DIR``)."""
    module = pathlib.Path(module_path).stem
    return sorted((tmp_path / "numba").glob(f"*/{module}.{pattern}"))


def _truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path: pathlib.Path) -> None:
    """Overwrite bytes in the middle: the file keeps its size and stays mostly plausible."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 48] = bytes((b + 89) % 256 for b in data[middle : middle + 48])
    path.write_bytes(bytes(data))


def _replace_with_directory(path: pathlib.Path) -> None:
    path.unlink()
    (path / "inner").mkdir(parents=True)


def _corruptions(tmp_path: pathlib.Path, paths: dict[str, str]) -> dict[str, list[str]]:
    """Corrupt the cache entries of the first run's graphs; returns kind -> ops touched."""

    def index(op: str) -> pathlib.Path:
        (found,) = _numba_files(tmp_path, paths[op], "kernel_0-*.nbi")
        return found

    def data(op: str) -> pathlib.Path:
        (found,) = _numba_files(tmp_path, paths[op], "kernel_0-*.nbc")
        return found

    _truncate(index("sin"))
    _garble(index("cos"))
    index("tanh").write_bytes(b"")
    _truncate(data("exp"))
    _garble(data("sigmoid"))
    pathlib.Path(paths["sqrt"]).write_bytes(b"\xff\xfe not utf-8 \x80\x81")
    _replace_with_directory(pathlib.Path(paths["log"]))
    _replace_with_directory(index("erf"))
    _replace_with_directory(data("relu"))
    # numba data files exchanged between two modules (each refers to the other's module)
    a, b = data("expm1"), data("log1p")
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)
    # one module's data copied over another's whose module is already imported when it loads
    # (``reciprocal`` runs after ``abs`` in the child): without a check, the wrong kernel runs
    data("reciprocal").write_bytes(data("abs").read_bytes())
    # generated sources exchanged between two modules
    c, d = pathlib.Path(paths["square"]), pathlib.Path(paths["rsqrt"])
    c_text, d_text = c.read_text(), d.read_text()
    c.write_text(d_text)
    d.write_text(c_text)
    return {
        "index truncated": ["sin"],
        "index garbled": ["cos"],
        "index empty": ["tanh"],
        "data truncated": ["exp"],
        "data garbled": ["sigmoid"],
        "data exchanged": ["expm1", "log1p"],
        "data copied from another module": ["reciprocal"],
        "index is a directory": ["erf"],
        "data is a directory": ["relu"],
        "source not utf-8": ["sqrt"],
        "source is a directory": ["log"],
        "sources exchanged": ["square", "rsqrt"],
    }


_OPS = [
    "sin",
    "cos",
    "tanh",
    "exp",
    "sigmoid",
    "sqrt",
    "log",
    "erf",
    "expm1",
    "log1p",
    "abs",
    "reciprocal",
    "square",
    "rsqrt",
    "relu",
]


def test_every_corrupt_entry_is_logged_removed_and_rebuilt(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = _env(tmp_path)
    ops = ",".join(_OPS)
    first, _ = _run(script, [ops], env)
    for op in _OPS:
        assert first[op]["compiles"] >= 1 and first[op]["disk_hits"] == 0, (op, first[op])
    paths = {op: first[op]["path"] for op in _OPS}
    kinds = _corruptions(tmp_path, paths)

    # the next process: right gradients (the child compares with eager), no traceback, and
    # each broken entry named on the ``cache`` log channel
    second, log = _run(script, [ops], dict(env, FUSEGRAD_LOGS="cache"))
    for kind, touched in kinds.items():
        for op in touched:
            if kind.startswith("source"):
                # the rewritten source has the same content hash: numba's entry still serves
                assert second[op] == dict(first[op], compiles=0, disk_hits=1), (kind, second[op])
            else:
                # numba's entry was removed: compiled anew (and nothing loaded for it)
                assert second[op]["compiles"] >= 1 and second[op]["disk_hits"] == 0, (kind, op)
                assert pathlib.Path(paths[op]).stem in log, (kind, log)
            assert second[op]["path"] == paths[op]
    for op in ("sqrt", "log", "square"):
        assert "def kernel_0(" in pathlib.Path(paths[op]).read_text()

    # the process after it finds the cache repaired: everything loaded, nothing compiled
    third, _ = _run(script, [ops], env)
    for op in _OPS:
        assert third[op]["compiles"] == 0 and third[op]["disk_hits"] >= 1, (op, third[op])
    assert not list(tmp_path.rglob("*.tmp*"))


_COUNTERS_CHILD = textwrap.dedent(
    """
    import json, sys
    import numba
    import numpy as np
    import fusegrad as fg
    from fusegrad import compiler
    from fusegrad.compiler.codegen import numba_cpu

    numba.set_num_threads(2)

    def counted(n, op, interpreter):
        compiler.config.interpreter_max_elements = (1 << 16) if interpreter else 0
        x = fg.tensor(np.linspace(0.1, 0.9, n, dtype=np.float32), requires_grad=True)
        (getattr(x, op)() * x).sum().backward()
        expected = x.grad.numpy().copy()
        x.grad = None
        compiles, disk_hits = compiler.counters.compiles, compiler.counters.disk_hits
        with compiler.compiled_autograd():
            (getattr(x, op)() * x).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=op)
        return [compiler.counters.compiles - compiles, compiler.counters.disk_hits - disk_hits]

    big = numba_cpu.PARALLEL_MIN_ELEMENTS + 1000  # generated code, prange variant
    scenarios = {
        "serial": lambda: counted(1000, "tanh", False),
        "parallel": lambda: counted(big, "sin", False),
        "interpreter": lambda: counted(1000, "cos", True),
        "new generated": lambda: counted(1000, "erf", False),  # exp in its backward
    }
    print(json.dumps({name: scenarios[name]() for name in sys.argv[1].split(",")}))
    """
)


def test_counters_count_compiled_and_loaded_specialisations(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_COUNTERS_CHILD)
    # a private NUMBA_CACHE_DIR: the interpreter's cache starts empty (it compiles, ~10 s)
    env = _env(tmp_path, NUMBA_NUM_THREADS="2")
    scenarios = "serial,parallel,interpreter"
    first, _ = _run(script, [scenarios], env)
    # one specialisation each: the serial kernel, the prange variant (the serial one never
    # runs at that size), the interpreter's ``run_ops`` for float32
    assert first == {"serial": [1, 0], "parallel": [1, 0], "interpreter": [1, 0]}, first
    second, _ = _run(script, [scenarios], env)
    assert second == {"serial": [0, 1], "parallel": [0, 1], "interpreter": [0, 1]}, second

    # the interpreter's cache broken (a generated module: its run_ops index and data), and
    # the index of every float32 helper (read when a new generated kernel compiles)
    numba_dir = tmp_path / "numba"
    (run_ops_index,) = numba_dir.rglob("*.run_ops_float32-*.nbi")
    _truncate(run_ops_index)
    data = list(numba_dir.rglob("*.run_ops_float32-*.nbc"))
    assert data
    for path in data:
        _garble(path)
    helpers = list(numba_dir.glob("*/fastmath.*.nbi"))
    assert helpers
    for path in helpers:
        path.write_bytes(b"\x80\x05garbage")
    third, log = _run(script, ["interpreter,new generated"], dict(env, FUSEGRAD_LOGS="cache"))
    assert third == {"interpreter": [1, 0], "new generated": [1, 0]}, third
    assert "run_ops" in log and "fastmath" in log, log


def test_threads_writing_one_fresh_cache_dir_at_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, generated_code: None
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(cache))
    monkeypatch.setattr(numba_cpu, "_loaded", {})
    ops = ["sin", "cos", "tanh", "exp"]  # each written by two threads at once
    x0 = np.linspace(0.1, 0.9, 64, dtype=np.float32)
    expected = {}
    for op in ops:
        x = fg.tensor(x0, requires_grad=True)
        getattr(x, op)().sum().backward()
        expected[op] = x.grad.numpy().copy()
    errors: list[BaseException] = []
    for _round in range(12):
        # every round writes the modules again: in-memory caches cleared, sources removed
        # (numba's machine code stays: loading it is fast, so rounds are cheap)
        compiler.reset()
        numba_cpu._loaded.clear()
        for path in cache.glob("*.py"):
            path.unlink()
        barrier = threading.Barrier(8)

        def work(i: int, barrier: threading.Barrier) -> None:
            try:
                op = ops[i % len(ops)]
                x = fg.tensor(x0, requires_grad=True)
                barrier.wait(timeout=60)
                with compiler.compiled_autograd():
                    getattr(x, op)().sum().backward()
                np.testing.assert_allclose(x.grad.numpy(), expected[op], rtol=1e-5, atol=1e-6)
            except BaseException as e:  # noqa: B036 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i, barrier)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, "".join(traceback.format_exception(errors[0]))
        paths = {p.source_path for p in compiler.cached_programs()}
        assert paths and all(p.startswith(str(cache)) for p in paths), paths
    assert sorted(p.name for p in cache.glob("*.py")) == sorted(pathlib.Path(p).name for p in paths)
    assert not list(tmp_path.rglob("*.tmp*")), list(tmp_path.rglob("*"))


@pytest.fixture
def generated_code() -> Iterator[None]:
    """Small graphs on generated code (not the interpreter), with fresh program caches."""
    compiler.reset()
    previous = compiler.config.interpreter_max_elements
    compiler.config.interpreter_max_elements = 0
    yield
    compiler.config.interpreter_max_elements = previous
    compiler.reset()


def _shared_listing() -> set[str]:
    """What the old fallback directory, shared by all users, holds now."""
    shared = pathlib.Path(tempfile.gettempdir()) / "fusegrad-cache"
    return set(os.listdir(shared)) if shared.is_dir() else set()


def _check_in_memory(bad: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two graphs compiled with ``FUSEGRAD_CACHE_DIR=bad``: one warning naming it, right
    gradients, nothing written anywhere."""
    monkeypatch.setenv("FUSEGRAD_CACHE_DIR", str(bad))
    monkeypatch.setattr(numba_cpu, "_loaded", {})
    before = _shared_listing()
    x0 = np.linspace(0.1, 0.9, 64, dtype=np.float32)
    counts = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in ("sin", "cos", "sin"):
            x = fg.tensor(x0, requires_grad=True)
            getattr(x, op)().sum().backward()
            expected = x.grad.numpy().copy()
            x.grad = None
            with compiler.compiled_autograd():
                getattr(x, op)().sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-5, atol=1e-6)
            (program,) = compiler.cached_programs()
            assert not os.path.exists(program.source_path), program.source_path
            counts.append((compiler.counters.compiles, compiler.counters.disk_hits))
            compiler.reset()  # the second "sin" finds its module again (in memory)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and str(bad) in messages[0], messages
    assert counts == [(1, 0), (1, 0), (0, 0)]  # compiled in memory, once per function
    assert _shared_listing() == before


def test_a_cache_dir_under_a_regular_file_warns_once_and_compiles_in_memory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, generated_code: None
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _check_in_memory(blocker / "cache", monkeypatch)
    assert blocker.read_text() == ""


def test_a_read_only_cache_dir_warns_once_and_compiles_in_memory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, generated_code: None
) -> None:
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        if os.access(read_only, os.W_OK):
            pytest.skip("running as root: a read-only directory is still writable")
        _check_in_memory(read_only, monkeypatch)
        assert not list(read_only.iterdir())
    finally:
        read_only.chmod(0o700)


def test_the_default_location_is_per_user(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FUSEGRAD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert common.cache_dir() == str(tmp_path / "xdg" / "fusegrad")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert common.cache_dir() == str(tmp_path / "home" / ".cache" / "fusegrad")
    # an unusable default is not replaced by a shared directory either
    monkeypatch.setenv("HOME", str(tmp_path / "home" / ".cache" / "fusegrad" / "x"))
    (tmp_path / "home" / ".cache" / "fusegrad" / "x").write_text("")
    with pytest.warns(RuntimeWarning, match="in memory"):
        assert common.cache_dir() is None
    shutil.rmtree(tmp_path / "home")


def test_concurrent_atomic_writes_of_one_file_never_collide(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "module.py"
    payloads = [bytes([65 + i]) * 100_000 for i in range(8)]
    errors: list[BaseException] = []

    def work(i: int, barrier: threading.Barrier) -> None:
        try:
            barrier.wait(timeout=60)
            for _ in range(40):
                diskcache.write_atomically(str(target), payloads[i])
                assert target.read_bytes() in payloads  # never a torn or mixed file
        except BaseException as e:  # noqa: B036 - reported by the main thread
            errors.append(e)

    barrier = threading.Barrier(8)
    threads = [threading.Thread(target=work, args=(i, barrier)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "".join(traceback.format_exception(errors[0]))
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left behind


_CUDA_CHILD = textwrap.dedent(
    """
    import glob, os
    import fusegrad as fg
    from fusegrad.compiler.codegen import diskcache, numba_cuda as nc
    from fusegrad.compiler.ir import Graph
    from fusegrad.compiler.passes.fuse import Kernel

    g = Graph()
    x = g.input("saved", 0, (8,), fg.float32)
    t = g.add("tanh", (x,), {}, (8,), fg.float32)
    kernel = Kernel(shape=(8,), values=[t], inputs=[x], outputs=[t])

    # on disk: every function of the module gets a guarded, counted, checksummed cache
    source, _ = nc.emit_module([kernel], "test", nc.settings_for((9, 0), 132, 1024))
    module, path, _ = nc.load_module(source, nc.settings_for((9, 0), 132, 1024))
    functions = [
        f for f in vars(module).values()
        if getattr(getattr(f, "py_func", None), "__module__", None) == module.__name__
    ]
    assert functions and all(type(f._cache).__name__ == "GuardedCUDACache" for f in functions)
    assert all(f._cache.counted for f in functions)
    cache_file = functions[0]._cache._cache_file
    cache_file.save(("key",), {"payload": 1})
    assert cache_file.load(("key",)) == {"payload": 1}
    (data,) = glob.glob(os.path.join(functions[0]._cache.cache_path, "*.nbc"))
    with open(data, "r+b") as fh:
        fh.seek(-4, os.SEEK_END)
        fh.write(b"junk")
    try:
        cache_file.load(("key",))
        raise SystemExit("a garbled CUDA data file was loaded")
    except diskcache.CorruptCacheEntry:
        pass

    # in memory (no usable cache directory): numba-cuda's cache is switched off, not in the way
    os.environ["FUSEGRAD_CACHE_DIR"] = os.path.join(path, "under-a-file")
    source, _ = nc.emit_module([kernel], "test", nc.settings_for((8, 0), 108, 1024))
    module, path, on_disk = nc.load_module(source, nc.settings_for((8, 0), 108, 1024))
    assert path.startswith("<in memory") and not on_disk, path
    print("{}")
    """
)


def test_cuda_functions_get_the_same_guarded_cache(tmp_path: pathlib.Path) -> None:
    """numba-cuda's cache class is guarded like the CPU one (checked without a GPU, without
    the simulator: loading a kernel needs a device, saving and checking its files does not)."""
    if importlib.util.find_spec("numba_cuda") is None:  # not imported here: see tests/cuda
        pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')")
    script = tmp_path / "child.py"
    script.write_text(_CUDA_CHILD)
    env = _env(tmp_path)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    _run(script, [], env)


_LAZY_CHILD = textwrap.dedent(
    """
    import json, math, sys
    import numba
    import numpy as np
    from fusegrad.compiler.codegen import fastmath

    x = np.linspace(-3.0, 3.0, 1001, dtype=np.float32)
    first = float(fastmath.fast_erf_f32(x[7]))  # compiled, or loaded from the disk cache
    loaded = fastmath.fast_erf_f32.overloads.values()
    report = {"library": [type(c.library).__name__ for c in loaded]}
    if sys.argv[1] == "link":
        @numba.njit(cache=False)
        def erf_all(a):  # new code that calls the helper: numba links the helper's library
            out = np.empty_like(a)
            for i in range(a.size):
                out[i] = fastmath.fast_erf_f32(a[i])
            return out

        got = erf_all(x)
        want = np.array([math.erf(float(v)) for v in x], dtype=np.float32)
        report["max_error"] = float(np.max(np.abs(got.astype(np.float64) - want)))
        report["same_first"] = float(got[7]) == first
    print(json.dumps(report))
    """
)


def test_code_loaded_without_its_linking_module_still_links(tmp_path: pathlib.Path) -> None:
    """A library loaded from the disk cache keeps its linking module unparsed
    (``_LazyLinking``), which saves a warm start most of its loading; code compiled later in
    the same process that calls the loaded function (a generated kernel calling a float32
    helper) links it all the same and computes the same values."""
    script = tmp_path / "child.py"
    script.write_text(_LAZY_CHILD)
    env = _env(tmp_path)
    first, _ = _run(script, ["fill"], env)
    assert first["library"] == ["JITCodeLibrary"], first  # compiled here, saved to disk
    second, _ = _run(script, ["link"], env)
    assert [n.startswith("LazyLinking") for n in second["library"]] == [True], second
    assert second["same_first"] and second["max_error"] <= 2.4e-7, second


def test_a_generated_modules_bytecode_is_kept_and_checked(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_compiled``: a module's bytecode is written beside its source (``.fgc``) and used by
    the next load of the same source at the same path; another source, a garbled file or
    one written for another path is compiled again (and what runs is the source's code)."""
    import builtins

    path = str(tmp_path / "fusegrad_generated_test.py")
    source = "def f(x):\n    return x * 3 + 1\n"
    code = diskcache._compiled(path, source)
    code_file = tmp_path / "fusegrad_generated_test.fgc"
    assert code_file.exists() and code.co_filename == path
    stored = code_file.read_bytes()
    compiled: list = []
    real = builtins.compile

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiled.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(builtins, "compile", counting)
    namespace: dict = {}
    exec(diskcache._compiled(path, source), namespace)  # the stored bytecode
    assert namespace["f"](2) == 7 and compiled == []
    other = "def f(x):\n    return x * 5\n"
    exec(diskcache._compiled(path, other), namespace)  # another source at that path
    assert namespace["f"](2) == 10 and compiled == [path]
    code_file.write_bytes(stored[:40] + bytes([stored[40] ^ 0xFF]) + stored[41:])
    exec(diskcache._compiled(path, source), namespace)  # garbled: compiled again
    assert namespace["f"](2) == 7 and compiled == [path, path]
    moved = str(tmp_path / "elsewhere.py")
    (tmp_path / "elsewhere.fgc").write_bytes(stored)  # written for another path
    exec(diskcache._compiled(moved, source), namespace)
    assert compiled == [path, path, moved]
