"""Loading fusegrad's numba functions from the disk cache (``fusegrad._numba_cache``).

A second process finds the eager kernels in numba's disk cache and loads them without numba's
registries (no ``BaseContext.refresh``) and without parsing their linking bitcode; the values
are bit for bit the first process's.  Where loaded code needs a symbol nothing registered, the
registries are loaded first, as numba would.  Processes are fresh interpreters with
``NUMBA_CACHE_DIR`` in a temporary directory.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fusegrad import _numba_cache

_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import numba.core.base as base

    refreshes = []
    _refresh = base.BaseContext.refresh
    def counted(self):
        refreshes.append(1)
        return _refresh(self)
    base.BaseContext.refresh = counted

    import numpy as np
    import fusegrad as fg
    from fusegrad import _numba_cache
    if os.environ.get("UNRESOLVED"):  # pretend a symbol of the loaded code resolves nowhere
        _numba_cache._resolves = lambda codegen, names: False

    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal((6, 33)).astype(np.float32), requires_grad=True)
    w = fg.tensor(rng.standard_normal(33).astype(np.float32), requires_grad=True)
    y = fg.nn.functional.layer_norm(x, (33,), weight=w)        # norm kernels
    z = fg.special.erf(y).amax(dim=-1)                         # erf, row extremes (a factory's)
    z.sum().backward()
    opt = fg.optim.Adam([x, w], lr=0.1, foreach=True)          # the fused optimizer kernels
    opt.step()
    import numba
    from fusegrad._numba_cache import fast_load

    @numba.njit(cache=True, parallel=True)
    def total(a):  # a parallel loop: its threads' symbols come with its load
        s = 0.0
        for i in numba.prange(a.size):
            s += a[i]
        return s

    fast_load(total)
    summed = total(np.arange(10000.0))
    from fusegrad.ops import norm_kernels, reduce_kernels
    libraries = [
        type(c.library).__name__
        for f in (norm_kernels._row_forward, reduce_kernels._rows_max, total)
        for c in f.overloads.values()
    ]
    print(json.dumps({
        "values": [t.detach().numpy().tolist() for t in (x, w, z)] + [summed],
        "refreshes": len(refreshes),
        "libraries": libraries,
    }))
    """
)


def _run(script: pathlib.Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_warm_process_loads_kernels_without_numbas_registries(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    env.pop("UNRESOLVED", None)
    first = _run(script, env)
    assert first["refreshes"] >= 1  # (compiled: numba's compiler loads its registries)
    assert first["libraries"] and not any(n.startswith("LazyLinking") for n in first["libraries"])
    second = _run(script, env)
    assert second["refreshes"] == 0, second["refreshes"]
    assert second["libraries"] and all(n.startswith("LazyLinking") for n in second["libraries"])
    assert second["values"] == first["values"]
    # a symbol that does not resolve: the registries are loaded before the code, as numba does
    third = _run(script, dict(env, UNRESOLVED="1"))
    assert third["refreshes"] >= 1
    assert third["values"] == first["values"]


def test_elf_symbols_of_compiled_code() -> None:
    """The names a compiled library's object file defines include every function its linking
    module defines with a visible linkage (the entry points among them); what it needs from
    elsewhere are NRT's, Python's and numba's helpers, none of them defined there."""
    import llvmlite.binding as llvm
    import numba

    @numba.njit(cache=False)
    def scaled(a: np.ndarray, k: float) -> np.ndarray:
        return np.exp(a) * k + np.sin(a)

    scaled(np.ones(3, dtype=np.float32), 2.0)
    (cres,) = scaled.overloads.values()
    _name, kind, (object_code, bitcode) = cres.library.serialize_using_object_code()
    assert kind == "object"
    symbols = _numba_cache.elf_symbols(object_code)
    if symbols is None:
        pytest.skip("machine code is not ELF64 on this platform")
    defined, needed = symbols
    visible = {
        f.name
        for f in llvm.parse_bitcode(bitcode).functions
        if not f.is_declaration and f.linkage.name not in ("private", "internal")
    }
    assert cres.fndesc.llvm_cpython_wrapper_name in visible
    assert visible <= defined, visible - defined
    assert needed and not needed & defined
    assert any(n.startswith("NRT_") for n in needed), needed
    assert _numba_cache.elf_symbols(b"\x7fELF" + b"\0" * 10) is None
    assert _numba_cache.elf_symbols(bitcode) is None
