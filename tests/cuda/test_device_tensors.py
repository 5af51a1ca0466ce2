"""CUDA tensors in numba's simulator: devices, transfers, views, reductions, matmul, errors.

Runs only in the simulator process (``NUMBA_ENABLE_CUDASIM=1``, see tests/test_cuda_suites.py).
Every value is checked against numpy on a host copy."""

from __future__ import annotations

import modes  # noqa: E402
import numpy as np
import pytest

modes.require_device()

import fusegrad  # noqa: E402
from fusegrad.cuda.array import CudaArray  # noqa: E402

RNG = np.random.default_rng(7)


def cuda_tensor(a: np.ndarray, **kw: object) -> fusegrad.Tensor:
    return fusegrad.tensor(a, device="cuda", **kw)


def host(t: fusegrad.Tensor) -> np.ndarray:
    assert t.is_cuda, "expected a CUDA tensor"
    return t.cpu().numpy()


# ---- devices and transfers ----------------------------------------------------------------------
def test_availability_and_device_records() -> None:
    assert fusegrad.cuda.is_available()
    assert fusegrad.cuda.device_count() == 1
    x = fusegrad.ones(3, device="cuda")
    assert x.is_cuda and str(x.device) == "cuda:0" and x.device == fusegrad.device("cuda", 0)
    assert isinstance(x._data, CudaArray)
    assert x.get_device() == 0 and fusegrad.ones(1).get_device() == -1
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        fusegrad.ones(1, device="cuda:3")


def test_repr_names_the_device_like_pytorch() -> None:
    x = fusegrad.tensor([1.0, 2.0], device="cuda")
    assert repr(x) == "tensor([1., 2.], device='cuda:0')"
    y = fusegrad.tensor([1.0, 2.0], device="cuda", dtype=fusegrad.float64, requires_grad=True)
    assert (
        repr(y) == "tensor([1., 2.], device='cuda:0', dtype=fusegrad.float64, requires_grad=True)"
    )


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_round_trip_keeps_values_dtype_and_shape(dtype: str) -> None:
    a = (RNG.standard_normal((3, 4)) * 5).astype(dtype)
    x = fusegrad.tensor(a)
    y = x.to("cuda")
    assert y.is_cuda and y.dtype == x.dtype and tuple(y.shape) == a.shape
    back = y.cpu()
    assert not back.is_cuda
    np.testing.assert_array_equal(back.numpy(), a)


def test_creation_functions_on_the_device_match_the_host() -> None:
    fusegrad.manual_seed(3)
    host_randn = fusegrad.randn(4, 5)
    fusegrad.manual_seed(3)
    dev_randn = fusegrad.randn(4, 5, device="cuda")
    np.testing.assert_array_equal(host(dev_randn), host_randn.numpy())
    np.testing.assert_array_equal(host(fusegrad.zeros(2, 3, device="cuda")), np.zeros((2, 3)))
    np.testing.assert_array_equal(host(fusegrad.full((2,), 7.5, device="cuda")), [7.5, 7.5])
    np.testing.assert_array_equal(host(fusegrad.arange(5, device="cuda")), np.arange(5))
    x = fusegrad.ones(2, 2, device="cuda", dtype=fusegrad.float64)
    z = fusegrad.zeros_like(x)
    assert z.is_cuda and z.dtype == fusegrad.float64
    np.testing.assert_array_equal(host(fusegrad.full_like(x, 3)), np.full((2, 2), 3.0))


def test_to_with_dtype_and_device_together() -> None:
    x = fusegrad.tensor([1.5, -2.5])
    y = x.to("cuda", fusegrad.float64)
    assert y.is_cuda and y.dtype == fusegrad.float64
    np.testing.assert_array_equal(host(y), [1.5, -2.5])
    assert y.to("cuda") is y  # already there: no copy


def test_numpy_conversion_of_a_cuda_tensor_raises() -> None:
    x = fusegrad.ones(2, device="cuda")
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        x.numpy()
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        np.asarray(x)
    assert x.sum().item() == 2.0  # .item() copies, as in PyTorch
    assert x.tolist() == [1.0, 1.0]


def test_mixing_devices_names_both() -> None:
    a = fusegrad.ones(2, 3, device="cuda")
    b = fusegrad.ones(2, 3)
    with pytest.raises(RuntimeError, match="found at least two devices, cuda:0 and cpu"):
        fusegrad.matmul(a, b.t())
    x = fusegrad.ones(3, device="cuda")
    y = fusegrad.ones(3)
    with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
        fusegrad.cat([x, y])


def test_transfer_is_differentiable_both_ways() -> None:
    a = fusegrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = a.cuda()
    assert b.grad_fn is not None
    b.cpu().sum().backward()
    assert a.grad is not None and not a.grad.is_cuda
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 1.0, 1.0])


# ---- views --------------------------------------------------------------------------------------
def test_views_share_the_buffer_and_match_numpy() -> None:
    a = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    x = cuda_tensor(a)
    cases = {
        "permute": (x.permute(2, 0, 1), a.transpose(2, 0, 1)),
        "slice": (x[1:, ::2, 3], a[1:, ::2, 3]),
        "int index": (x[2], a[2]),
        "reshape": (x.reshape(12, 5), a.reshape(12, 5)),
        "transpose+reshape": (x.transpose(0, 2).reshape(-1), a.transpose(2, 1, 0).reshape(-1)),
        "expand": (x[:, :1, :].expand(3, 4, 5), np.broadcast_to(a[:, :1, :], (3, 4, 5))),
        "diagonal": (x.diagonal(0, 1, 2), np.diagonal(a, 0, 1, 2)),
        "unsqueeze": (x.unsqueeze(1), a[:, None]),
        "flip": (x.flip(1), a[:, ::-1]),
    }
    for name, (got, want) in cases.items():
        assert tuple(got.shape) == want.shape, name
        np.testing.assert_array_equal(host(got), want, err_msg=name)
    assert x.permute(2, 0, 1)._data.buffer is x._data.buffer
    assert x[1:, ::2]._data.buffer is x._data.buffer


def test_contiguity_and_strides_match_numpy() -> None:
    a = np.zeros((4, 6), np.float32)
    x = cuda_tensor(a)
    assert x.is_contiguous() and x.stride() == (6, 1)
    t = x.t()
    assert not t.is_contiguous() and t.stride() == (1, 6)
    assert x[:, ::2].stride() == (6, 2)


# ---- reductions ---------------------------------------------------------------------------------
REDUCE_SHAPES = [(7,), (3, 5), (2, 70), (4, 3, 2)]


@pytest.mark.parametrize("shape", REDUCE_SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_reductions_match_numpy(shape: tuple, dtype: str) -> None:
    a = RNG.standard_normal(shape).astype(dtype)
    x = cuda_tensor(a)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-12}
    np.testing.assert_allclose(host(x.sum()), a.sum(), **tol)
    np.testing.assert_allclose(host(x.sum(-1)), a.sum(-1), **tol)
    np.testing.assert_allclose(host(x.sum(0, keepdim=True)), a.sum(0, keepdims=True), **tol)
    np.testing.assert_array_equal(host(x.amax(-1)), a.max(-1))
    np.testing.assert_array_equal(host(x.amin(0)), a.min(0))
    np.testing.assert_array_equal(host(x.argmax(-1)), a.argmax(-1))
    np.testing.assert_array_equal(host(x.argmin()), a.argmin())
    np.testing.assert_allclose(host(x.prod(-1)), a.prod(-1), **tol)
    if len(shape) == 3:
        np.testing.assert_allclose(host(x.sum((0, 2))), a.sum((0, 2)), **tol)


def test_reductions_follow_numpy_on_nan_ties_and_integers() -> None:
    a = np.array([[1.0, np.nan, 3.0], [2.0, 2.0, 1.0]], np.float32)
    x = cuda_tensor(a)
    np.testing.assert_array_equal(host(x.amax(1)), [np.nan, 2.0])
    np.testing.assert_array_equal(host(x.argmax(1)), [1, 0])  # NaN wins; first of a tie
    np.testing.assert_array_equal(host(x.argmin(1)), [1, 2])
    i = cuda_tensor(np.array([[1, 2], [3, 4]], np.int32))
    s = i.sum(0)
    assert s.dtype == fusegrad.int64
    np.testing.assert_array_equal(host(s), [4, 6])
    b = cuda_tensor(np.array([[True, False], [True, True]]))
    np.testing.assert_array_equal(host(b.all(1)), [False, True])
    np.testing.assert_array_equal(host(b.any(0)), [True, True])
    assert host(b.sum()).item() == 3


def test_long_rows_use_the_block_tree_and_are_reproducible() -> None:
    a = RNG.standard_normal((3, 300)).astype(np.float32)
    x = cuda_tensor(a)
    first, second = host(x.sum(1)), host(x.sum(1))
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, a.astype(np.float64).sum(1), rtol=1e-6)
    np.testing.assert_array_equal(host(x.argmax(1)), a.argmax(1))


# ---- matmul -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sa,sb",
    [((5, 7), (7, 3)), ((2, 17, 18), (18, 4)), ((3, 1, 4, 5), (2, 5, 6)), ((1, 1), (1, 1))],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_matches_numpy(sa: tuple, sb: tuple, dtype: str) -> None:
    a = RNG.standard_normal(sa).astype(dtype)
    b = RNG.standard_normal(sb).astype(dtype)
    got = host(cuda_tensor(a) @ cuda_tensor(b))
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, a @ b, rtol=tol, atol=tol)


def test_matmul_of_transposed_views() -> None:
    a = RNG.standard_normal((6, 4)).astype(np.float32)
    b = RNG.standard_normal((6, 3)).astype(np.float32)
    got = host(cuda_tensor(a).t() @ cuda_tensor(b))
    np.testing.assert_allclose(got, a.T @ b, rtol=1e-5, atol=1e-5)


# ---- elementwise externs (numpy's scalar rules) ---------------------------------------------
def _same_as_cpu(fn: object, *arrays: np.ndarray) -> None:
    want = fn(*[fusegrad.tensor(a) for a in arrays])  # type: ignore[operator]
    got = fn(*[cuda_tensor(a) for a in arrays])  # type: ignore[operator]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(host(got), want.numpy())


def test_remainder_and_floor_divide_follow_numpy() -> None:
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 3.0, np.inf, 1.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 2.0, np.inf], np.float32)
    _same_as_cpu(fusegrad.remainder, a, b)
    _same_as_cpu(fusegrad.floor_divide, a, b)
    ia = np.array([7, -7, 7, -7, 0], np.int64)
    ib = np.array([2, 2, -2, -2, 5], np.int64)
    _same_as_cpu(fusegrad.remainder, ia, ib)
    _same_as_cpu(fusegrad.floor_divide, ia, ib)
    _same_as_cpu(lambda x: fusegrad.remainder(x, 3), ia)
    with pytest.raises(ZeroDivisionError, match="integer division by zero"):
        fusegrad.floor_divide(cuda_tensor(ia), cuda_tensor(np.zeros(5, np.int64)))


@pytest.mark.parametrize("decimals", [0, 1, -1])
def test_round_half_to_even_with_decimals(decimals: int) -> None:
    a = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.675, 15.0, 25.0, np.inf, np.nan, 1e30], np.float64)
    _same_as_cpu(lambda x: fusegrad.round(x, decimals=decimals), a)
    _same_as_cpu(lambda x: fusegrad.round(x, decimals=decimals), a.astype(np.float32))


def test_bitwise_ops_on_bool_and_int() -> None:
    for dtype in (np.bool_, np.int32, np.int64):
        a = np.array([0, 1, 1, 0, 5, 6], dtype)
        b = np.array([0, 0, 1, 1, 3, 3], dtype)
        for fn in (fusegrad.bitwise_and, fusegrad.bitwise_or, fusegrad.bitwise_xor):
            _same_as_cpu(fn, a, b)


def test_pickle_and_deepcopy_keep_values_and_device() -> None:
    import copy
    import pickle

    from fusegrad import nn

    x = fusegrad.tensor([1.5, -2.0], device="cuda", requires_grad=True)
    y = pickle.loads(pickle.dumps(x))
    assert y.is_cuda and y.requires_grad
    np.testing.assert_array_equal(host(y.detach()), [1.5, -2.0])
    p = nn.Parameter(fusegrad.ones(3, device="cuda"))
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, nn.Parameter) and q.is_cuda and q.requires_grad
    z = copy.deepcopy(x)
    assert z.is_cuda and z._data.buffer is not x._data.buffer
    np.testing.assert_array_equal(host(z.detach()), [1.5, -2.0])


# ---- random ops: their draws land on the input's device ----------------------------------------
@pytest.mark.parametrize(
    "op",
    [
        lambda F, t: F.dropout(t, 0.4),
        lambda F, t: F.dropout2d(t, 0.4),
        lambda F, t: F.alpha_dropout(t, 0.4, training=True),
        lambda F, t: F.rrelu(t, training=True),
        lambda F, t: F.gumbel_softmax(t, tau=0.5),
    ],
    ids=["dropout", "dropout2d", "alpha_dropout", "rrelu", "gumbel_softmax"],
)
def test_random_ops_on_cuda_draw_what_the_cpu_draws(op: object) -> None:
    F = fusegrad.nn.functional
    a = RNG.standard_normal((2, 3, 4))
    fusegrad.manual_seed(11)
    cpu = op(F, fusegrad.tensor(a))  # type: ignore[operator]
    fusegrad.manual_seed(11)
    out = op(F, cuda_tensor(a))  # type: ignore[operator]
    np.testing.assert_allclose(host(out), cpu.numpy(), rtol=1e-12, atol=1e-12)
