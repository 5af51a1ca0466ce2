"""Saving only what is needed (``@vjp(..., save={...})`` in ``derivatives.py``, ``OpNode``): a
node saves a value only if the gradient of an input that requires grad uses it.  For ``x * y``
with only ``x`` requiring grad, ``y`` alone is saved: one pack-hook call, as in PyTorch.  Counts
of pack-hook calls and packed bytes for the binary ops, matmul and linear are checked against a
table and against torch; gradients (eager, compiled, second order) stay right."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import gradgradcheck

# name -> (the op written for a module ``m``, shapes of its two operands, tensors saved when
# both / the first / the second operand require grad)
OPS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], tuple[int, int, int]]] = {
    # each operand only for the other's gradient
    "mul": (lambda m, a, b: a * b, ((3, 4), (3, 4)), (2, 1, 1)),
    "mul broadcast": (lambda m, a, b: a * b, ((3, 4), (4,)), (2, 1, 1)),
    "matmul": (lambda m, a, b: a @ b, ((3, 4), (4, 5)), (2, 1, 1)),
    "matmul batched": (lambda m, a, b: a @ b, ((2, 3, 4), (2, 4, 5)), (2, 1, 1)),
    "linear": (lambda m, a, b: m.nn.functional.linear(a, b), ((3, 4), (5, 4)), (2, 1, 1)),
    "linear with bias": (
        lambda m, a, b: m.nn.functional.linear(a, b, m.ones(5, dtype=m.float64)),
        ((3, 4), (5, 4)),
        (2, 1, 1),
    ),
    # the divisor's gradient needs both
    "div": (lambda m, a, b: a / b, ((3, 4), (3, 4)), (2, 1, 2)),
    # the output only for the exponent's gradient (PyTorch keeps it for the base's too)
    "pow": (lambda m, a, b: a**b, ((3, 4), (3, 4)), (3, 2, 3)),
    "pow by a number": (lambda m, a, b: a**2.5, ((3, 4), (3, 4)), (1, 1, 0)),
    # each operand for its own gradient, the output for both
    "hypot": (lambda m, a, b: m.hypot(a, b), ((3, 4), (3, 4)), (3, 2, 2)),
    # both operands only for the divisor's gradient
    "remainder": (lambda m, a, b: m.remainder(a, b), ((3, 4), (3, 4)), (2, 0, 2)),
    # both for each gradient: always saved
    "atan2": (lambda m, a, b: m.atan2(a, b), ((3, 4), (3, 4)), (2, 2, 2)),
    "maximum": (lambda m, a, b: m.maximum(a, b), ((3, 4), (3, 4)), (2, 2, 2)),
}
NEEDS = {"both": (True, True), "first": (True, False), "second": (False, True)}
# fusegrad saves less than PyTorch here (PowBackward1 keeps its result for the base's gradient)
FEWER_THAN_TORCH = {("pow", "first")}


def _operands(m: Any, shapes: tuple, needs: tuple) -> list:
    rng = np.random.default_rng(0)
    return [
        m.tensor(rng.uniform(0.5, 2.0, shape), dtype=m.float64, requires_grad=rg)
        for shape, rg in zip(shapes, needs)
    ]


def _packs(m: Any, name: str, needs: str) -> tuple[int, int, Any, list]:
    """Pack-hook calls and packed bytes while building ``name``; its output and operands."""
    fn, shapes, _ = OPS[name]
    operands = _operands(m, shapes, NEEDS[needs])
    packed: list = []

    def pack(t: Any) -> Any:
        packed.append(t.numel() * t.element_size())
        return t

    with m.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(m, *operands)
    return len(packed), sum(packed), out, operands


@pytest.mark.parametrize("needs", list(NEEDS))
@pytest.mark.parametrize("name", list(OPS))
def test_saves_only_what_the_gradients_need(name: str, needs: str) -> None:
    count, nbytes, out, operands = _packs(fg, name, needs)
    assert count == OPS[name][2][list(NEEDS).index(needs)]
    if not out.requires_grad:
        return  # (pow by a number of a base that does not require grad: no node at all)
    # and the gradients are those of the node that saved everything
    out.sum().backward()
    fn, shapes, _ = OPS[name]
    full = _operands(fg, shapes, (True, True))
    fn(fg, *full).sum().backward()
    for t, ref in zip(operands, full):
        if t.requires_grad and ref.grad is not None:
            np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy(), rtol=1e-12)


def test_the_other_operand_is_saved_whole() -> None:
    # x (3, 4) * y (4,): x's gradient needs y (32 bytes), y's needs x (96 bytes)
    assert _packs(fg, "mul broadcast", "first")[:2] == (1, 4 * 8)
    assert _packs(fg, "mul broadcast", "second")[:2] == (1, 12 * 8)
    assert _packs(fg, "matmul", "first")[:2] == (1, 20 * 8)


@pytest.mark.parametrize("needs", list(NEEDS))
@pytest.mark.parametrize("name", list(OPS))
def test_pack_hook_calls_and_bytes_match_torch(name: str, needs: str) -> None:
    torch = pytest.importorskip("torch")
    ours = _packs(fg, name, needs)[:2]
    theirs = _packs(torch, name, needs)[:2]
    if (name, needs) in FEWER_THAN_TORCH:
        assert ours[0] < theirs[0] and ours[1] < theirs[1]
    else:
        assert ours == theirs


def test_unsaved_values_read_as_none_as_in_pytorch() -> None:
    x = fg.ones(2, dtype=fg.float64, requires_grad=True)
    c = fg.ones(2, dtype=fg.float64)
    node = (x * c).grad_fn
    assert node._saved_self is None and node._saved_a is None
    assert node._saved_other is c
    assert [name for name in dir(node) if name.startswith("_raw_saved_")] == [
        "_raw_saved_b",
        "_raw_saved_other",
    ]


@pytest.mark.parametrize("needs", ["first", "second"])
@pytest.mark.parametrize("name", ["mul", "div", "matmul", "linear with bias", "pow", "hypot"])
def test_compiled_backward_with_partly_saved_nodes(name: str, needs: str) -> None:
    from fusegrad import compiler

    compiler.reset()
    fn, shapes, _ = OPS[name]
    eager = _operands(fg, shapes, NEEDS[needs])
    (fn(fg, *eager).tanh() * 2.0).sum().backward()
    compiled = _operands(fg, shapes, NEEDS[needs])
    with compiler.compiled_autograd():
        for _ in range(2):  # a capture, then a run of the cached program
            for t in compiled:
                t.grad = None
            (fn(fg, *compiled).tanh() * 2.0).sum().backward()
    assert compiler.counters.captures == 1 and not compiler.counters.fallbacks
    for t, ref in zip(compiled, eager):
        if t.requires_grad:
            np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy(), rtol=1e-12)
    compiler.reset()


@pytest.mark.parametrize("name", ["mul", "div", "matmul", "pow", "hypot", "remainder"])
def test_second_order_through_partly_saved_nodes(name: str) -> None:
    fn, shapes, _ = OPS[name]
    for needs in ("first", "second"):
        a, b = _operands(fg, shapes, NEEDS[needs])
        free = b if needs == "first" else a

        def f(t: fg.Tensor, needs: str = needs, free: fg.Tensor = free) -> fg.Tensor:
            return fn(fg, t, free) if needs == "first" else fn(fg, free, t)

        assert gradgradcheck(f, (a if needs == "first" else b,))


# ---- conv2d and the normalisation layers: one node each (``fusegrad.autograd.native``) ---------

# name -> (the layer written for a module ``m``: input, weight, bias; their shapes; tensors
# saved when the input and the weight and bias / the input only / the weight and bias only
# require grad)
LAYERS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], tuple[int, int, int]]] = {
    # the input for the weight's gradient, the weight for the input's (PyTorch: both always)
    "conv2d": (
        lambda m, x, w, b: m.nn.functional.conv2d(x, w, b, padding=1),
        ((2, 3, 8, 8), (4, 3, 3, 3), (4,)),
        (2, 1, 1),
    ),
    "conv2d strided groups": (
        lambda m, x, w, b: m.nn.functional.conv2d(x, w, b, stride=2, dilation=2, groups=2),
        ((2, 4, 9, 9), (6, 2, 3, 2), (6,)),
        (2, 1, 1),
    ),
    "conv2d same even kernel": (
        lambda m, x, w, b: m.nn.functional.conv2d(x, w, b, padding="same"),
        ((2, 3, 6, 6), (4, 3, 2, 2), (4,)),
        (2, 1, 1),
    ),
    "conv1d": (
        lambda m, x, w, b: m.nn.functional.conv1d(x, w, b, padding=1),
        ((2, 3, 8), (4, 3, 3), (4,)),
        (2, 1, 1),
    ),
    # the input, mean and rstd for the input's and the weight's gradients, the weight for the
    # input's (PyTorch keeps the bias, and batch_norm the running statistics, too)
    "batch_norm": (
        lambda m, x, w, b: m.nn.functional.batch_norm(
            x, m.zeros(4, dtype=x.dtype), m.ones(4, dtype=x.dtype), w, b, training=True
        ),
        ((8, 4, 5, 5), (4,), (4,)),
        (4, 4, 3),
    ),
    "layer_norm": (
        lambda m, x, w, b: m.nn.functional.layer_norm(x, (16,), w, b),
        ((8, 16), (16,), (16,)),
        (4, 4, 3),
    ),
    "layer_norm over two dims": (
        lambda m, x, w, b: m.nn.functional.layer_norm(x, (3, 4), w, b),
        ((2, 5, 3, 4), (3, 4), (3, 4)),
        (4, 4, 3),
    ),
    "group_norm": (
        lambda m, x, w, b: m.nn.functional.group_norm(x, 2, w, b),
        ((8, 4, 5, 5), (4,), (4,)),
        (4, 4, 3),
    ),
    # PyTorch's way: batch_norm of the (1, N * C, *) input, the weight repeated N times
    "instance_norm": (
        lambda m, x, w, b: m.nn.functional.instance_norm(x, weight=w, bias=b),
        ((8, 4, 5, 5), (4,), (4,)),
        (4, 4, 3),
    ),
    # by the running statistics: the composite (x - mean) * scale * weight + bias, whose nodes
    # save less than PyTorch's NativeBatchNormBackward0 already
    "batch_norm eval": (
        lambda m, x, w, b: m.nn.functional.batch_norm(
            x, m.full((4,), 0.1, dtype=x.dtype), m.full((4,), 2.0, dtype=x.dtype), w, b
        ),
        ((8, 4, 5, 5), (4,), (4,)),
        (3, 2, 1),
    ),
}
NODE_NAMES = {
    "batch_norm": "NativeBatchNormBackward0",
    "batch_norm eval": "NativeBatchNormBackward0",
    "layer_norm": "NativeLayerNormBackward0",
    "layer_norm over two dims": "NativeLayerNormBackward0",
    "group_norm": "NativeGroupNormBackward0",
    "instance_norm": "ViewBackward0",  # (as PyTorch's: the view back from (1, N * C, *))
}
LAYER_NEEDS = {
    "both": (True, True, True),
    "input": (True, False, False),
    "weight": (False, True, True),
}
# (name, needs) where fusegrad saves fewer tensors or bytes than PyTorch; elsewhere the same
LAYER_SAME_AS_TORCH = {(name, "both") for name in LAYERS if name.startswith("conv")} | {
    ("group_norm", needs) for needs in ("both", "input")
}
# (name, needs) where fusegrad saves as many tensors as PyTorch but fewer bytes: instance_norm's
# weight once (PyTorch's batch_norm of the (1, N * C, *) input keeps it repeated N times)
LAYER_FEWER_BYTES = {("instance_norm", needs) for needs in ("both", "input")}


def _layer_packs(m: Any, name: str, needs: str, dtype: str = "float32") -> tuple:
    """Pack-hook calls and packed bytes while building layer ``name``; its output, operands."""
    fn, shapes, _ = LAYERS[name]
    rng = np.random.default_rng(0)
    operands = [
        m.tensor(rng.uniform(0.5, 2.0, shape), dtype=getattr(m, dtype), requires_grad=rg)
        for shape, rg in zip(shapes, LAYER_NEEDS[needs])
    ]
    packed: list = []

    def pack(t: Any) -> Any:
        packed.append(t.numel() * t.element_size())
        return t

    with m.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(m, *operands)
    return len(packed), sum(packed), out, operands


@pytest.mark.parametrize("needs", list(LAYER_NEEDS))
@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_save_only_what_their_gradients_need(name: str, needs: str) -> None:
    count, _, out, _ = _layer_packs(fg, name, needs)
    assert count == LAYERS[name][2][list(LAYER_NEEDS).index(needs)]
    assert out.grad_fn.name() == NODE_NAMES.get(name, "ConvolutionBackward0")


def test_layer_norm_saves_the_input_weight_and_statistics() -> None:
    # x (8, 16) float32: 512 bytes; weight 64; mean and rstd (8, 1): 32 each (PyTorch: + bias)
    assert _layer_packs(fg, "layer_norm", "both")[:2] == (4, 512 + 64 + 32 + 32)
    assert _layer_packs(fg, "layer_norm", "weight")[:2] == (3, 512 + 32 + 32)


def test_conv2d_saves_the_input_and_the_weight_not_their_columns() -> None:
    # x (2, 3, 8, 8) float32: 1536 bytes; w (4, 3, 3, 3): 432 (im2col's columns: 13824)
    assert _layer_packs(fg, "conv2d", "both")[:2] == (2, 1536 + 432)
    assert _layer_packs(fg, "conv2d", "input")[:2] == (1, 432)
    assert _layer_packs(fg, "conv2d", "weight")[:2] == (1, 1536)


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # (torch's note on even kernels)
@pytest.mark.parametrize("needs", list(LAYER_NEEDS))
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_pack_hook_calls_and_bytes_against_torch(name: str, needs: str) -> None:
    torch = pytest.importorskip("torch")
    ours = _layer_packs(fg, name, needs)[:2]
    theirs = _layer_packs(torch, name, needs)[:2]
    assert ours[0] <= theirs[0] and ours[1] <= theirs[1]
    if (name, needs) in LAYER_SAME_AS_TORCH:
        assert ours == theirs
    elif (name, needs) in LAYER_FEWER_BYTES:
        assert ours[0] == theirs[0] and ours[1] < theirs[1]
    else:
        assert ours[0] < theirs[0]


def _layer_grads(m: Any, name: str, needs: str, compiled: bool = False) -> list:
    """float64 gradients of ``(layer(...).tanh() * 2).sum()`` for the operands that need one."""
    *_, out, operands = _layer_packs(m, name, needs, "float64")
    if compiled:
        from fusegrad import compiler

        with compiler.compiled_autograd():
            (out.tanh() * 2.0).sum().backward()
    else:
        (out.tanh() * 2.0).sum().backward()
    return [t.grad.numpy() if t.requires_grad else None for t in operands]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("needs", list(LAYER_NEEDS))
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_gradients_match_torch_eager_and_compiled(name: str, needs: str) -> None:
    torch = pytest.importorskip("torch")
    from fusegrad import compiler

    compiler.reset()
    theirs = _layer_grads(torch, name, needs)
    for compiled in (False, True):
        for ours, ref in zip(_layer_grads(fg, name, needs, compiled), theirs):
            assert (ours is None) == (ref is None)
            if ref is not None:
                np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)
    # one program, its backward traced into it (not an opaque eager step)
    assert compiler.counters.captures == 1 and not compiler.counters.fallbacks
    assert not compiler.counters.opaque_functions
    compiler.reset()


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_second_order_per_requires_grad_pattern(name: str) -> None:
    fn, shapes, _ = LAYERS[name]
    rng = np.random.default_rng(1)
    values = [rng.uniform(0.5, 2.0, shape) for shape in shapes]
    for needs in LAYER_NEEDS.values():
        operands = [
            fg.tensor(v, dtype=fg.float64, requires_grad=rg) for v, rg in zip(values, needs)
        ]
        free = [t for t in operands if t.requires_grad]

        def f(*inputs: fg.Tensor, operands: list = operands) -> fg.Tensor:
            it = iter(inputs)
            return fn(fg, *(next(it) if t.requires_grad else t for t in operands))

        assert gradgradcheck(f, tuple(free), fast_mode=True)
