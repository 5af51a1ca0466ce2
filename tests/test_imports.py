"""``src/fusegrad`` has no import cycle at load time, and imports inside functions are only the
allowed kinds (see the layers in ``fusegrad/__init__.py``).

The graph is read from the code (``tests/import_graph.py``: every module's top-level import
statements, with the packages above each target, whose ``__init__`` runs first).  One package
``__init__`` is exempt from those implicit edges: ``fusegrad.autograd``, the public face of
modules that span every layer (``grad_mode`` below ``Tensor``, ``api`` above the engine);
``fusegrad/__init__.py`` imports it first, and a name imported *from* it is still an edge, so
nothing below it may use it.  The fresh-process imports at the end check that the order of
``fusegrad/__init__.py`` makes this hold in practice.  (``tests/compiler/test_compiler_imports.py``
holds ``fusegrad.compiler`` to the same rules.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from import_graph import SRC, describe, find_cycle

MODULES = SRC.modules

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
    ("fusegrad.ops.primitives", "fusegrad.ops.reduce_kernels"): (
        "the short-row amax / amin loops (numba), on first use"
    ),
    ("fusegrad.ops.primitives", "fusegrad.ops.erf_kernels"): (
        "the float32 erf loop (numba, and the compiler's fastmath erf), on first use"
    ),
    ("fusegrad.optim._foreach", "fusegrad.optim._multi_tensor"): (
        "the multi-tensor optimizer kernels (numba), on the first foreach/fused update"
    ),
    ("fusegrad.ops.norms", "fusegrad.ops.norm_kernels"): (
        "the fused batch / instance / group / layer norm kernels (numba), on first use"
    ),
    ("fusegrad.ops.resample", "fusegrad.ops.resample_kernels"): (
        "the fused interpolate kernels (numba), on first use"
    ),
    ("fusegrad.ops.indexing", "fusegrad.ops.embedding_kernels"): (
        "the fused embedding backward kernel (numba), on first use"
    ),
    ("fusegrad.ops.primitives", "fusegrad.ops.recurrent_kernels"): (
        "the fused LSTM / GRU / RNN kernels (numba, and the compiler's fastmath helpers), on "
        "first use"
    ),
    ("fusegrad.ops.conv_kernels", "fusegrad.ops.pool_kernels"): (
        "the convolution and pooling loop kernels (numba), on first use"
    ),
    ("fusegrad.ops.conv_kernels", "fusegrad.ops.winograd"): (
        "the Winograd convolution's transforms (numba), on first use"
    ),
}


def load_graph() -> dict[str, dict[str, int]]:
    return SRC.load_graph()


def test_the_load_time_import_graph_has_no_cycle() -> None:
    graph = load_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle at load time:\n" + describe(graph, cycle or [])


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
    assert describe(graph, cycle).splitlines()[0] == "  a (line 3) -> b"
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_function_local_imports_of_fusegrad_are_only_the_allowed_kinds() -> None:
    ours = [(m, line, n) for m, line, n in SRC.function_local_imports() if SRC.is_ours(n)]
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
    silent = SRC.silent_local_imports()
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
