"""The registry, the derivative table and the op table agree: every differentiable primitive has
exactly one rule, and every primitive is exercised (forward, backward, double backward) by at
least one op-table entry."""

from __future__ import annotations

import numpy as np
from op_table import FG, OPS, build, flat_outputs, is_float

import fusegrad
from fusegrad.autograd import tracer
from fusegrad.ops import REGISTRY, RULES


def test_every_differentiable_primitive_has_a_rule() -> None:
    missing = sorted(n for n, p in REGISTRY.items() if p.differentiable and n not in RULES)
    assert not missing, f"differentiable primitives without a derivative rule: {missing}"


def test_rules_belong_to_differentiable_primitives() -> None:
    stray = sorted(n for n in RULES if n not in REGISTRY or not REGISTRY[n].differentiable)
    assert not stray, f"rules for unknown or non-differentiable primitives: {stray}"


def test_rules_save_only_known_values() -> None:
    for name, rule in RULES.items():
        prim = REGISTRY[name]
        for value in rule.save:
            assert value == "out" or value in prim.inputs, (name, value)


def _exercise_table() -> set[str]:
    """Run every table case forward, backward and (where twice differentiable) double backward,
    recording the primitives that ``registry.apply`` sees."""
    seen: set[str] = set()

    class Recorder(tracer.Tracer):
        def apply(self, prim, inputs, attrs):  # type: ignore[no-untyped-def]
            seen.add(prim.name)
            return NotImplemented  # let the primitive run as usual

    with tracer.tracing(Recorder()):
        for entry in OPS:
            for sample in entry.get_samples():
                leaves, fn = build(entry, FG, sample, "float64", entry.differentiable)
                outs = [o for o in flat_outputs(fn(*leaves)) if is_float(o) and o.requires_grad]
                if not (leaves and outs):
                    continue
                cots = [fusegrad.ones_like(o) for o in outs]
                grads = fusegrad.autograd.grad(
                    outs, leaves, cots, allow_unused=True, create_graph=entry.twice
                )
                used = [g for g in grads if g is not None and g.requires_grad]
                if entry.twice and used:
                    total = sum((g * g).sum() for g in used)
                    fusegrad.autograd.grad(total, leaves, allow_unused=True)
    return seen


def test_every_primitive_is_exercised_by_the_op_table() -> None:
    seen = _exercise_table()
    if not fusegrad.cuda.is_available():
        # host <-> device copies need a device: tests/cuda (simulator) exercises them
        seen.add("to_device")
    missing = sorted(set(REGISTRY) - seen)
    assert not missing, f"primitives no op-table entry reaches: {missing}"


def test_no_tracer_is_left_installed() -> None:
    assert tracer.current() is None
    x = fusegrad.tensor(np.ones(2))
    assert (x + x).tolist() == [2.0, 2.0]
