"""Every primitive's shape/dtype rule (``Primitive.meta``) agrees with its eager kernel.

The op table's forward and backward (``grad``) calls run with a tracer on this thread
(``autograd.tracer``: it sees every ``registry.apply``) that evaluates each primitive's meta
from the input shapes and dtypes alone
and compares it with what the kernel actually produced.  The compiler's capture relies on these
rules, so a disagreement here would be a wrong compiled program.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from op_table import FG, OPS, build, flat_outputs, is_float

import fusegrad
from fusegrad.autograd.tracer import Tracer, tracing
from fusegrad.ops import registry

CASES = [(e, s) for e in OPS for s in e.get_samples()]


class _CheckingTracer(Tracer):
    def __init__(self, seen: Counter) -> None:
        self.seen = seen

    def apply(self, prim: registry.Primitive, inputs: tuple, attrs: dict) -> Any:
        seen = self.seen
        shapes = tuple(t._data.shape for t in inputs)
        dtypes = tuple(t._dtype for t in inputs)
        out = np.asarray(prim.kernel(*[t._data for t in inputs], **attrs))
        try:
            shape, dtype = prim.meta(shapes, dtypes, **attrs)
        except registry.DataDependentShape:
            seen[prim.name + " (data-dependent)"] += 1
            return NotImplemented
        assert tuple(shape) == out.shape, f"{prim.name}: meta {shape} vs kernel {out.shape}"
        assert dtype.np == out.dtype, f"{prim.name}: meta {dtype} vs kernel {out.dtype}"
        seen[prim.name] += 1
        return NotImplemented  # let apply run the kernel as usual


def test_meta_matches_kernels_over_the_op_table() -> None:
    seen: Counter = Counter()
    with tracing(_CheckingTracer(seen)):
        for entry, sample in CASES:
            leaves, fn = build(entry, FG, sample, "float64")
            try:
                outs = [o for o in flat_outputs(fn(*leaves)) if is_float(o) and o.requires_grad]
            except Exception:  # noqa: BLE001  (error cases of the table are tested elsewhere)
                continue
            if outs and leaves:
                grads = [fusegrad.ones_like(o) for o in outs]
                fusegrad.autograd.grad(outs, leaves, grads, allow_unused=True)
    unchecked = {n for n in registry.REGISTRY} - {k.split(" ")[0] for k in seen}
    if not fusegrad.cuda.is_available():
        unchecked.discard("to_device")  # needs a device: tests/cuda checks it (simulator)
    assert not unchecked, f"primitives never exercised: {sorted(unchecked)}"


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_every_primitive_has_a_meta(name: str) -> None:
    assert registry.REGISTRY[name].meta is not None


# ---- the indexing shape rule against numpy -----------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fusegrad.ops.primitives import key_shape, numpy_key  # noqa: E402


@st.composite
def _indexing(draw: Any) -> tuple:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    spec: list = []
    arrays: list = []
    dim = 0
    ellipsis = False
    for _ in range(draw(st.integers(0, len(shape) + 2))):
        kind = draw(st.sampled_from("snite"))
        if kind == "n":
            spec.append(("n",))
        elif kind == "e" and not ellipsis:
            ellipsis = True
            spec.append(("e",))
        elif dim >= len(shape):
            continue
        elif kind == "s":
            part = st.one_of(st.none(), st.integers(-7, 7))
            spec.append(("s", draw(part), draw(part), draw(st.integers(1, 3))))
            dim += 1
        elif kind == "i" and shape[dim] > 0:
            spec.append(("i", draw(st.integers(0, shape[dim] - 1))))
            dim += 1
        elif kind == "t" and shape[dim] > 0:
            ishape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
            arrays.append(np.zeros(ishape, np.int64))
            spec.append(("t", len(arrays) - 1))
            dim += 1
    return shape, tuple(spec), tuple(arrays)


@settings(max_examples=400, deadline=None)
@given(_indexing())
def test_key_shape_is_numpys_indexing_shape(case: tuple) -> None:
    from fusegrad import dtypes

    shape, spec, arrays = case
    try:
        want = np.empty(shape)[numpy_key(spec, arrays)].shape
    except (IndexError, ValueError):
        return  # an invalid key (e.g. index arrays that do not broadcast)
    got = key_shape(shape, tuple(a.shape for a in arrays), (dtypes.int64,) * len(arrays), spec)
    assert got == want, (shape, spec, [a.shape for a in arrays])
