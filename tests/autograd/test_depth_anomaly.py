"""Anomaly mode in depth: which errors get the ``Error detected in <Node>`` warning (rule, hooks,
gradient validation, custom Functions) while the original error propagates unchanged, the parent
traceback for double backward, NaN checks per output index and after post-hooks, the enable
warning, the state switches, and the warnings and errors against PyTorch's."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd import Function, detect_anomaly, grad, set_detect_anomaly


def _t(data, requires_grad: bool = False) -> fg.Tensor:
    return fg.tensor(np.asarray(data, dtype=np.float64), requires_grad=requires_grad)


@pytest.fixture(autouse=True)
def _quiet_anomaly_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
        yield


@contextmanager
def reports() -> Iterator[list[str]]:
    """The anomaly reports (``Error detected in`` / ``Previous calculation`` warnings) emitted
    inside the block, in order; each must be a UserWarning."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
        try:
            yield found
        finally:
            for w in record:
                assert w.category is UserWarning, w
                found.append(str(w.message))


def test_detect_anomaly_warns_like_pytorch() -> None:
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"), detect_anomaly():
        pass


def test_nodes_record_forward_traceback_only_under_anomaly_mode() -> None:
    x = _t([1.0], True)
    assert "traceback_" not in (x * 2.0).grad_fn.metadata
    with detect_anomaly():
        y = x * 2.0  # marker-line-for-traceback
    trace = y.grad_fn.metadata["traceback_"]
    assert "marker-line-for-traceback" in trace and "test_depth_anomaly.py" in trace
    assert "parent_" not in y.grad_fn.metadata


def test_custom_function_nodes_record_the_traceback_and_report_errors() -> None:
    class Broken(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            raise ValueError("broken backward")

    x = _t([1.0], True)
    with detect_anomaly():
        y = Broken.apply(x)  # the-custom-function-call
        with reports() as found, pytest.raises(ValueError) as info:
            y.sum().backward()
    assert str(info.value) == "broken backward"  # the original error, unchanged
    assert len(found) == 1
    assert found[0].startswith("Error detected in BrokenBackward. Traceback of forward call")
    assert "the-custom-function-call" in found[0]


def test_errors_from_hooks_and_validation_are_reported_with_the_node() -> None:
    x = _t([1.0, 2.0], True)
    with detect_anomaly():
        y = x.exp()

        def bad_hook(g):
            raise KeyError("from a tensor hook")

        y.register_hook(bad_hook)
        with reports() as found, pytest.raises(KeyError, match="from a tensor hook") as info:
            (y * 1.0).sum().backward()
    assert "Error detected" not in str(info.value)
    assert len(found) == 1 and found[0].startswith("Error detected in ExpBackward0.")

    class WrongShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return fg.ones(5, dtype=fg.float64)

    with detect_anomaly():
        z = WrongShape.apply(x)
        with reports() as found, pytest.raises(RuntimeError) as info:
            z.sum().backward()
    assert str(info.value).startswith("Function WrongShapeBackward returned an invalid gradient")
    assert len(found) == 1 and found[0].startswith("Error detected in WrongShapeBackward.")


def test_error_in_a_node_created_outside_anomaly_mode() -> None:
    x = _t([1.0, 2.0], True)
    y = (x * x).sum()
    with fg.no_grad():
        x.add_(1.0)
    with (
        detect_anomaly(),
        reports() as found,
        pytest.raises(RuntimeError, match="modified by an inplace operation"),
    ):
        y.backward()
    assert found == [
        "Error detected in MulBackward0. No forward pass information available. Enable detect "
        "anomaly during forward pass for more information."
    ]


def test_double_backward_error_shows_the_parent_traceback() -> None:
    x = _t([0.5, 1.0], True)
    with detect_anomaly():
        y = x.sin()  # the-first-order-forward-line
        (g,) = grad(y.sum(), x, create_graph=True)
        # g = 1 * cos(x): its nodes were created by SinBackward0's rule, their parent
        assert g.grad_fn.metadata["parent_"] is y.grad_fn
        cos_node = g.grad_fn.next_functions[1][0]
        assert cos_node.name() == "CosBackward0" and cos_node.metadata["parent_"] is y.grad_fn
        with fg.no_grad():
            x.add_(1.0)  # CosBackward0 saved x: the second backward must fail there
        with reports() as found, pytest.raises(RuntimeError) as info:
            g.sum().backward()
    assert str(info.value).startswith("one of the variables needed for gradient computation")
    # as PyTorch: one warning for the failing node, one per parent
    assert len(found) == 2
    assert found[0].startswith("Error detected in CosBackward0. Traceback of forward")
    assert found[1].startswith(
        "\n\nPrevious calculation was induced by SinBackward0. Traceback of forward call that "
        "induced the previous calculation:\n"
    )
    assert "the-first-order-forward-line" in found[1]


def test_third_order_nodes_chain_their_parents() -> None:
    x = _t([0.5], True)
    with detect_anomaly():
        y = x.sin()
        (g,) = grad(y.sum(), x, create_graph=True)
        (gg,) = grad(g.sum(), x, create_graph=True)
    parent = gg.grad_fn.metadata.get("parent_")
    assert parent is not None
    chain = []
    while parent is not None:
        chain.append(parent.name())
        parent = parent.metadata.get("parent_")
    assert chain[-1] == "SinBackward0"
    assert len(chain) >= 2


def test_nan_reports_the_output_index() -> None:
    class NanSecond(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g, g * float("nan")

    a, b = _t([1.0], True), _t([2.0], True)
    with detect_anomaly():
        y = NanSecond.apply(a, b)
        with (
            pytest.warns(UserWarning, match="Error detected in NanSecondBackward"),
            pytest.raises(
                RuntimeError,
                match=r"^Function 'NanSecondBackward' returned nan values in its 1th output\.$",
            ),
        ):
            y.sum().backward()
    with detect_anomaly(check_nan=False):
        NanSecond.apply(a, b).sum().backward()
    assert np.isnan(b.grad.numpy()[0])


def test_nan_check_runs_after_node_post_hooks() -> None:
    x = _t([1.0], True)
    with detect_anomaly():
        y = x * 2.0
        y.grad_fn.register_hook(lambda gi, go: (gi[0] * float("nan"), gi[1]))
        with (
            pytest.warns(UserWarning, match="Error detected in MulBackward0"),
            pytest.raises(RuntimeError, match="'MulBackward0' returned nan values in its 0th"),
        ):
            y.sum().backward()


def test_nan_check_matches_torch_message() -> None:
    torch = pytest.importorskip("torch")
    messages = []
    for lib in (fg, torch):
        x = lib.tensor([0.0, 1.0], dtype=lib.float64, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with lib.autograd.detect_anomaly():
                y = (x.sqrt() * 0.0).sum()
                with pytest.raises(RuntimeError) as info:
                    y.backward()
        messages.append(str(info.value))
    expected = "Function 'SqrtBackward0' returned nan values in its 0th output."
    assert all(expected in m for m in messages)


def test_set_detect_anomaly_with_check_nan_off() -> None:
    x = _t([0.0], True)
    with set_detect_anomaly(True, check_nan=False):
        assert fg.autograd.is_anomaly_enabled()
        (x.sqrt() * 0.0).sum().backward()
    assert not fg.autograd.is_anomaly_enabled()
    assert np.isnan(x.grad.numpy()[0])


def test_anomaly_state_is_restored_after_an_error() -> None:
    x = _t([1.0], True)
    with pytest.raises(RuntimeError), detect_anomaly():
        y = (x * x).sum()
        with fg.no_grad():
            x.add_(1.0)
        with pytest.warns(UserWarning, match="Error detected in MulBackward0"):
            y.backward()
    assert not fg.autograd.is_anomaly_enabled()
    from fusegrad.autograd import anomaly

    assert anomaly._state.current_node is None


def _anomaly_scenarios(lib):  # noqa: ANN001, ANN202  (lib: fusegrad or torch)
    """name -> a zero-argument call that fails in backward under anomaly mode, written the same
    for fusegrad and torch; each forward line that should be reported carries a marker."""

    class Broken(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            raise ValueError("broken backward")

    class CallsBroken(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return Broken.apply(x) * g  # marker-built-in-backward

    def leaf(*values):  # noqa: ANN002, ANN202
        return lib.tensor(list(values), dtype=lib.float64, requires_grad=True)

    def nan_in_pow():
        x = leaf(-1.0, 4.0)
        with lib.autograd.detect_anomaly():
            y = x**0.5  # marker-pow
            y.sum().backward()

    def nan_in_sqrt():
        x = leaf(0.0, 1.0)
        with lib.autograd.detect_anomaly():
            y = (x.sqrt() * 0.0).sum()  # marker-sqrt
            y.backward()

    def custom_function_raises():
        x = leaf(1.0, 2.0)
        with lib.autograd.set_detect_anomaly(True):
            y = Broken.apply(x)  # marker-broken
            y.sum().backward()

    def tensor_hook_raises():
        x = leaf(1.0, 2.0)
        with lib.autograd.set_detect_anomaly(True):
            y = x * 2.0  # marker-hooked
            y.register_hook(lambda g: 1 / 0)
            y.sum().backward()

    def modified_in_place():
        x = leaf(1.0, 2.0)
        with lib.autograd.set_detect_anomaly(True):
            e = x.exp()
            z = (e * e).sum()  # marker-mul
            with lib.no_grad():
                e.add_(1.0)
            z.backward()

    def created_outside_anomaly_mode():
        x = leaf(1.0, 2.0)
        y = Broken.apply(x).sum()
        with lib.autograd.set_detect_anomaly(True):
            y.backward()

    def double_backward():
        x = leaf(1.0, 2.0)
        with lib.autograd.set_detect_anomaly(True):
            y = CallsBroken.apply(x)  # marker-first-order
            (g,) = lib.autograd.grad(y.sum(), x, create_graph=True)
            g.sum().backward()

    return {
        "nan_in_pow": (nan_in_pow, ["marker-pow"]),
        "nan_in_sqrt": (nan_in_sqrt, ["marker-sqrt"]),
        "custom_function_raises": (custom_function_raises, ["marker-broken"]),
        "tensor_hook_raises": (tensor_hook_raises, ["marker-hooked"]),
        "modified_in_place": (modified_in_place, ["marker-mul"]),
        "created_outside_anomaly_mode": (created_outside_anomaly_mode, []),
        "double_backward": (double_backward, ["marker-built-in-backward", "marker-first-order"]),
    }


def _first_line(report: str) -> str:
    """A report's first line, without torch's ``(Triggered internally at ...)`` suffix."""
    line = report.lstrip("\n").split("\n")[0]
    return re.sub(r" \(Triggered internally at .*\)$", "", line)


def _run_and_record(call):  # noqa: ANN001, ANN202
    with reports() as found:
        try:
            call()
        except Exception as e:  # noqa: BLE001
            error = e
        else:
            raise AssertionError("no error raised")
    return error, found


@pytest.mark.parametrize("name", list(_anomaly_scenarios(fg)))
def test_warnings_and_error_match_torch(name: str) -> None:
    """Same failing backward in both libraries: the same error (class and message), and the
    same ``UserWarning`` reports: one per traceback, same first line, and the forward line
    that built the failing node (and, for double backward, its parent) in each."""
    torch = pytest.importorskip("torch")
    ours_call, markers = _anomaly_scenarios(fg)[name]
    theirs_call, _ = _anomaly_scenarios(torch)[name]
    ours_error, ours = _run_and_record(ours_call)
    theirs_error, theirs = _run_and_record(theirs_call)
    assert type(theirs_error).__name__ in {c.__name__ for c in type(ours_error).__mro__}
    if name == "modified_in_place":  # fusegrad names the tensor and the node its own way
        hint = "Hint: the backtrace further above shows the operation that failed to compute"
        for error in (ours_error, theirs_error):
            assert str(error).startswith("one of the variables needed for gradient computation")
            assert hint in str(error)
    else:
        assert str(ours_error) == str(theirs_error).replace("torch", "fusegrad")
    assert len(ours) == len(theirs) >= 1
    assert [_first_line(r) for r in ours] == [_first_line(r) for r in theirs]
    for report, marker in zip(ours, markers):
        assert marker in report, (marker, report)
    for report, marker in zip(theirs, markers):
        assert marker in report, (marker, report)


def test_compiled_backward_under_anomaly_mode_warns_and_raises_as_eager() -> None:
    """Compiled backward under anomaly mode checks each node's gradients for NaN in its
    program: the report and the error are the eager ones, and nothing falls back."""
    from fusegrad import compiler

    compiler.reset()  # counters too
    x = _t([0.0, 1.0], True)
    with compiler.compiled_autograd(), detect_anomaly():
        y = (x.sqrt() * 0.0).sum()  # marker-compiled
        with (
            reports() as found,
            pytest.raises(RuntimeError, match="^Function 'SqrtBackward0' returned nan values"),
        ):
            y.backward()
    assert len(found) == 1 and found[0].startswith("Error detected in SqrtBackward0.")
    assert "marker-compiled" in found[0]
    assert compiler.counters.captures == 1
    assert not compiler.counters.fallbacks
    compiler.reset()
