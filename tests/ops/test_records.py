"""Everything about a primitive comes from its record (docs/ARCHITECTURE.md, contract 1): the op
surface,
``Tensor`` methods and aliases, the shape/dtype rule, the compiler's lowering table, the
interpreter's opcodes, the CPU and CUDA spellings of its scalar functions and the CUDA
simulator's ``math``.

The strongest check adds primitives the way a contributor would — records inserted into
``primitives.py`` — in a fresh process (the global registry of this one stays as it is), and
finds them everywhere, compiled and interpreted included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import fusegrad
from fusegrad.ops import _INPLACE, _METHODS, REGISTRY
from fusegrad.tensor import Tensor

# three throw-away records: a compiled helper of its own, a bool predicate, a libm function
RECORDS = """
def ztest_cube_scalar(x):
    return x * x * x


_elementwise(
    "ztest_cube",
    "x",
    lambda x: x * x * x,
    "{ztest_cube}({0})",
    ScalarFunction("ztest_cube", ztest_cube_scalar),
    surface="float",
    method=True,
    inplace=True,
    aliases=("ztest_cube_alias",),
)
_elementwise(
    "ztest_big",
    "x",
    lambda x: x >= 0.5,
    "({0} >= 0.5)",
    surface="same",
    method=True,
    bool_result=True,
    differentiable=False,
)
_elementwise(
    "ztest_gamma",
    "x",
    np.vectorize(math.gamma, otypes=[np.float64]),
    "{gamma}({0})",
    _libm("gamma", math.gamma),
    surface="float",
)
"""

SCRIPT = """
import importlib.machinery
import sys

MARKER = "# ---- shape/dtype rules"


class Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        source = self.get_data(self.path).decode()
        assert MARKER in source
        return compile(source.replace(MARKER, RECORDS + MARKER, 1), self.path, "exec")


class Finder:
    @staticmethod
    def find_spec(name, path, target=None):
        if name != "fusegrad.ops.primitives":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Loader(name, spec.origin)
        return spec


sys.meta_path.insert(0, Finder)

import math

import numpy as np

import fusegrad as fg
from fusegrad.ops import REGISTRY

# the op surface, methods, aliases and promotion
x = fg.tensor([0.25, 2.0, -3.0], dtype=fg.float64)
assert fg.ztest_cube(x).tolist() == [0.015625, 8.0, -27.0]
assert x.ztest_cube().tolist() == [0.015625, 8.0, -27.0]
assert fg.ztest_cube_alias is fg.ztest_cube and fg.Tensor.ztest_cube_alias is fg.ztest_cube
assert (x * 1.0).ztest_cube_().tolist() == [0.015625, 8.0, -27.0]
assert (x * 1.0).ztest_cube_alias_().tolist() == [0.015625, 8.0, -27.0]
assert fg.ztest_cube(fg.tensor([2, 3])).dtype is fg.float32
assert "ztest_cube" in fg.ops.generated.__all__
# the shape/dtype rule: a bool result
assert x.ztest_big().dtype is fg.bool and x.ztest_big().tolist() == [False, True, False]
assert REGISTRY["ztest_big"].meta(((3,),), (fg.float64,)) == ((3,), fg.bool)

# the compiler's tables
from fusegrad.compiler.codegen import cpu_helpers, interpreter, lowering, numba_cpu
from fusegrad.compiler.ir import Graph
from fusegrad.compiler.passes.fuse import Kernel

for name in ("ztest_cube", "ztest_big", "ztest_gamma"):
    assert name in lowering.EXPRESSIONS and name in interpreter.OPCODES, name
assert "_ztest_cube" in cpu_helpers.RECORD_HELPERS and "_ztest_cube" in numba_cpu.module_imports()
assert cpu_helpers.MATH64["ztest_cube"] == "_ztest_cube"
assert cpu_helpers.MATH64["gamma"] == "math.gamma"
try:
    from fusegrad.compiler.codegen import numba_cuda
except ImportError:  # numba-cuda not installed
    pass
else:
    assert "_ztest_cube" in numba_cuda.HELPERS
    assert numba_cuda.simulator_math.gamma is math.gamma

# compiled: generated code and the interpreter, against the eager kernels
g = Graph()
a = g.input("saved", 0, (3,), fg.float64)
values = []
for name in ("ztest_cube", "ztest_big", "ztest_gamma"):
    shape, dtype = REGISTRY[name].meta(((3,),), (fg.float64,))
    values.append(g.add(name, (a,), {}, shape, dtype))
kernel = Kernel(shape=(3,), values=values, inputs=[a], outputs=values)
data = np.array([0.25, 2.0, 3.5])
source, (plan,) = numba_cpu.emit_module([kernel], "throw-away records")
module, _, _ = numba_cpu.load_module(source)
outs = [np.empty(3, v.dtype.np) for v in plan.outputs]
numba_cpu.kernel_function(module, plan)(3, data, *outs)
assert interpreter.eligible(kernel)
interpreted = interpreter.InterpretedKernel(kernel)({a: data})
for v, generated in zip(plan.outputs, outs):
    want = REGISTRY[v.op].kernel(data)
    np.testing.assert_allclose(generated, want, rtol=1e-14)
    np.testing.assert_allclose(interpreted[v], want, rtol=1e-14)
print("records ok")
"""


def test_new_records_reach_every_derived_table(tmp_path: object) -> None:
    env = dict(os.environ, FUSEGRAD_CACHE_DIR=str(tmp_path))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    code = f"RECORDS = {RECORDS!r}\n" + textwrap.dedent(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "records ok" in done.stdout


def test_method_lists_hold_no_primitive() -> None:
    """``_METHODS`` and ``_INPLACE`` list composites only: a primitive's names are flags of its
    record, and every one of them is installed."""
    declared = set()
    for prim in REGISTRY.values():
        for name in (prim.name, *prim.aliases):
            if prim.method:
                declared.add(name)
                assert getattr(Tensor, name) is getattr(fusegrad, name), name
            if prim.inplace:
                declared.add(name + "_")
                assert callable(getattr(Tensor, name + "_")), name
    assert not declared & (set(_METHODS) | set(_INPLACE))


def test_bool_results_are_record_flags() -> None:
    for name, prim in REGISTRY.items():
        if prim.kind != "elementwise" or name in ("cast", "where"):
            continue
        shape, dtype = prim.meta(((2,),) * len(prim.inputs), (fusegrad.float64,) * len(prim.inputs))
        assert (dtype is fusegrad.bool) == prim.bool_result, name


@pytest.mark.parametrize("name", ["atan2", "hypot", "logaddexp", "erfc", "lgamma", "digamma"])
def test_the_new_primitives_are_declared_once(name: str) -> None:
    prim = REGISTRY[name]
    assert prim.lowering is not None and prim.surface == "float" and prim.method
    assert prim.inplace == (name != "logaddexp")  # PyTorch has no logaddexp_
