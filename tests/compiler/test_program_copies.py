"""The copies a CPU program makes (``program.note_copies``, ``Instance.copies``): measured on a
program's first run at each size vector, reported in its description (``explain()``, the
``fusion`` log) and on the ``perf`` log.  A view op that numpy cannot make a view (a reshape of
a permuted array) copies; a matrix product with an operand in no BLAS layout (a broadcast
gradient) is named; a program without either says "none"."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.compiler import program as P

pytestmark = pytest.mark.usefixtures("fresh_compiler")


def test_blas_layouts_as_numpy_decides() -> None:
    a = np.zeros((6, 4), np.float32)
    assert P._blas_layout(a) and P._blas_layout(a.T)
    assert P._blas_layout(np.zeros((3, 6, 4), np.float32).transpose(0, 2, 1))
    assert not P._blas_layout(np.broadcast_to(np.float32(1), (6, 4)))
    assert not P._blas_layout(a[:, ::2])  # (neither stride one element)
    assert P._blas_layout(np.zeros((1, 4), np.float32)[:, ::2])  # (one row: either way)


def _copies_of_one_capture(fn: Any) -> tuple[dict, str]:
    report = compiler.explain(fn)
    ((_, program),) = report.captures
    ((inst),) = [i for i in program._instances.values() if i.copies is not None]
    return inst.copies, str(report)


def test_a_reshape_of_a_permuted_array_is_reported_as_a_copy() -> None:
    x = fg.randn(4, 48, requires_grad=True)
    c = fg.randn(4, 8, 6)

    def fn() -> None:
        # the backward permutes the (4, 8, 6) gradient back to (4, 6, 8), a strided view, and
        # reshapes it to (4, 48): dims numpy cannot merge without a copy
        ((x.reshape(4, 6, 8).permute(0, 2, 1) * c).tanh().sum()).backward()

    copies, text = _copies_of_one_capture(fn)
    (what,) = copies.values()
    assert what.startswith("reshape") and "copies 768 bytes" in what, what
    assert "strides [192, 4, 24]" in what and "copy at sizes" in text
    want = x.grad.numpy().copy()  # (explain's call ran the program: eager's gradient next)
    x.grad = None
    fn()
    np.testing.assert_allclose(want, x.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_matmul_of_a_broadcast_gradient_is_named() -> None:
    x = fg.randn(4, 6, 8, requires_grad=True)

    def fn() -> None:
        (x.transpose(1, 2) @ x).sum().backward()  # d(sum)/dz: ones broadcast to (4, 8, 8)

    copies, text = _copies_of_one_capture(fn)
    named = [what for what in copies.values() if "matmul" in what and "no BLAS layout" in what]
    assert named, text
    assert "strides [0, 0, 0]" in named[0]
    assert "copy at sizes" in text and "no BLAS layout" in text


def test_no_copies_is_said_and_the_perf_log_has_the_line(caplog: Any) -> None:
    x = fg.randn(64, 32, requires_grad=True)
    w = fg.randn(32, 16, requires_grad=True)
    compiler.set_logs("perf")
    try:
        with caplog.at_level(logging.INFO, logger="fusegrad.compiler"):
            copies, text = _copies_of_one_capture(lambda: (x @ w).relu().sum().backward())
    finally:
        compiler.set_logs(None)
    assert copies == {}
    assert "copies at sizes" in text or "copies: none" in text
    lines = [r.getMessage() for r in caplog.records if "copies" in r.getMessage()]
    assert lines and lines[0].endswith("none")
