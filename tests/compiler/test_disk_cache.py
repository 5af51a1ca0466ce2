"""The on-disk cache of generated code never breaks a run (DESIGN.md contracts 7 and 10).

* threads: many threads writing into one fresh cache directory at once;
* location: an unusable cache directory gives one warning and in-memory compilation, never a
  directory shared by all users.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler.codegen import common, diskcache, numba_cpu


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
        assert not errors, errors
        paths = {p.source_path for p in compiler.programs.values()}
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
            (program,) = compiler.programs.values()
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
    assert not errors, errors[:3]
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left behind
