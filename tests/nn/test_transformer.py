"""nn.MultiheadAttention and the Transformer modules against torch.nn in float64 (dropout 0,
weights copied through state_dict): outputs, attention weights and the gradients of inputs and
every parameter; masks (bool and float, 2-D and 3-D, key padding, causal hints), batch_first,
kdim/vdim, add_bias_kv, add_zero_attn, norm_first, activations; names, reprs, init and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import nn

TOL = {"rtol": 1e-9, "atol": 1e-11}

torch: Any = None


@pytest.fixture(autouse=True)
def _bind_torch() -> None:
    global torch
    torch = pytest.importorskip("torch")


def _copy_from_torch(module: Any, torch_module: Any) -> None:
    result = module.load_state_dict(
        {k: fg.tensor(v.detach().numpy()) for k, v in torch_module.state_dict().items()}
    )
    assert not result.missing_keys and not result.unexpected_keys


def _flatten(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return [out]


def _convert(value: Any, lib: Any, grad: bool = False) -> Any:
    if isinstance(value, np.ndarray):
        return lib.tensor(value, requires_grad=grad and value.dtype.kind == "f")
    return value


def _compare(module: Any, want: Any, args: tuple, kwargs: dict, seed: int = 0) -> None:
    """Run both with the same numpy arguments (float positional arrays become leaves; keyword
    arrays are masks, constants), backpropagate the
    same cotangents, compare outputs, input gradients and parameter gradients."""
    fg_args = [_convert(a, fg, True) for a in args]
    t_args = [_convert(a, torch, True) for a in args]
    fg_kw = {k: _convert(v, fg) for k, v in kwargs.items()}
    t_kw = {k: _convert(v, torch) for k, v in kwargs.items()}
    got = [o for o in _flatten(module(*fg_args, **fg_kw)) if o is not None]
    expected = [o for o in _flatten(want(*t_args, **t_kw)) if o is not None]
    assert len(got) == len(expected)
    rng = np.random.default_rng(seed)
    loss_got, loss_want = 0, 0
    for a, b in zip(got, expected):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **TOL)
        g = rng.standard_normal(tuple(b.shape))
        loss_got = loss_got + (a * fg.tensor(g)).sum()
        loss_want = loss_want + (b * torch.tensor(g)).sum()
    loss_got.backward()
    loss_want.backward()
    for a, b in zip(fg_args + list(fg_kw.values()), t_args + list(t_kw.values())):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **TOL)
    params = dict(module.named_parameters())
    assert list(params) == [n for n, _ in want.named_parameters()]
    for name, p in want.named_parameters():
        np.testing.assert_allclose(params[name].grad.numpy(), p.grad.numpy(), **TOL, err_msg=name)


def _pair(cls: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    want = getattr(torch.nn, cls)(*args, **kwargs).double()
    module = getattr(nn, cls)(*args, **kwargs).double()
    _copy_from_torch(module, want)
    assert repr(module) == repr(want)
    return module, want


# ---- MultiheadAttention --------------------------------------------------------------------

L, S, N, E = 4, 5, 3, 8
rng0 = np.random.default_rng(0)
BOOL_2D = rng0.random((L, S)) > 0.6
BOOL_2D[:, 0] = False  # every query keeps a key
FLOAT_3D = rng0.standard_normal((N * 2, L, S))
PADDING = np.zeros((N, S), dtype=bool)
PADDING[0, 3:] = True
PADDING[2, 1] = True
CAUSAL = np.triu(np.full((L, L), -np.inf), 1)

MHA_CASES = [
    ("self", {}, {}),
    ("self", {}, {"need_weights": False}),
    ("self", {}, {"average_attn_weights": False}),
    ("self", {"bias": False, "batch_first": True}, {}),
    ("self", {}, {"attn_mask": CAUSAL, "is_causal": True, "need_weights": False}),
    ("self", {}, {"attn_mask": CAUSAL, "key_padding_mask": PADDING[:, :L]}),
    ("cross", {}, {"attn_mask": BOOL_2D}),
    ("cross", {}, {"attn_mask": BOOL_2D, "need_weights": False}),
    ("cross", {}, {"attn_mask": FLOAT_3D, "key_padding_mask": PADDING}),
    ("cross", {}, {"attn_mask": FLOAT_3D, "need_weights": False}),
    ("cross", {}, {"key_padding_mask": PADDING, "need_weights": False}),
    ("cross", {"kdim": 3, "vdim": 6}, {}),
    ("cross", {"kdim": 3, "vdim": 6, "batch_first": True}, {"need_weights": False}),
    ("cross", {"add_bias_kv": True}, {"key_padding_mask": PADDING, "attn_mask": BOOL_2D}),
    ("cross", {"add_zero_attn": True}, {"attn_mask": BOOL_2D, "need_weights": False}),
    ("kv", {}, {}),
    ("unbatched", {}, {"attn_mask": BOOL_2D}),
    ("unbatched", {}, {"key_padding_mask": PADDING[0], "need_weights": False}),
]


@pytest.mark.parametrize("kind,ctor,call", MHA_CASES)
def test_multihead_attention_matches_torch(kind: str, ctor: dict, call: dict) -> None:
    module, want = _pair("MultiheadAttention", E, 2, **ctor)
    rng = np.random.default_rng(1)
    first = ctor.get("batch_first", False)

    def seq(length: int, dim: int, batched: bool = True) -> np.ndarray:
        if not batched:
            return rng.standard_normal((length, dim))
        return rng.standard_normal((N, length, dim) if first else (length, N, dim))

    if kind == "self":
        x = seq(L, E)
        fg_x, t_x = fg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        kw = {k: _convert(v, fg) for k, v in call.items()}
        tkw = {k: _convert(v, torch) for k, v in call.items()}
        got = module(fg_x, fg_x, fg_x, **kw)
        expect = want(t_x, t_x, t_x, **tkw)
        for a, b in zip(got, expect):
            if b is None:
                assert a is None
                continue
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **TOL)
        got[0].sum().backward()
        expect[0].sum().backward()
        np.testing.assert_allclose(fg_x.grad.numpy(), t_x.grad.numpy(), **TOL)
        params = dict(module.named_parameters())
        for name, p in want.named_parameters():
            np.testing.assert_allclose(params[name].grad.numpy(), p.grad.numpy(), **TOL)
        return
    if kind == "kv":  # key is value
        q, kv = seq(L, E), seq(S, E)
        fq, fkv = fg.tensor(q, requires_grad=True), fg.tensor(kv, requires_grad=True)
        tq, tkv = torch.tensor(q, requires_grad=True), torch.tensor(kv, requires_grad=True)
        module(fq, fkv, fkv)[0].sum().backward()
        want(tq, tkv, tkv)[0].sum().backward()
        np.testing.assert_allclose(fkv.grad.numpy(), tkv.grad.numpy(), **TOL)
        np.testing.assert_allclose(fq.grad.numpy(), tq.grad.numpy(), **TOL)
        return
    batched = kind != "unbatched"
    args = (seq(L, E, batched), seq(S, ctor.get("kdim", E), batched))
    args = args + (seq(S, ctor.get("vdim", E), batched),)
    _compare(module, want, args, call)


def test_multihead_attention_names_and_init() -> None:
    mha = nn.MultiheadAttention(8, 2)
    assert [n for n, _ in mha.named_parameters()] == [
        "in_proj_weight",
        "in_proj_bias",
        "out_proj.weight",
        "out_proj.bias",
    ]
    assert mha.in_proj_weight.shape == (24, 8) and mha.q_proj_weight is None
    assert (mha.in_proj_bias.numpy(force=True) == 0).all()
    assert (mha.out_proj.bias.numpy(force=True) == 0).all()
    bound = np.sqrt(6 / (24 + 8))  # xavier_uniform_ of the packed (3E, E) weight
    assert np.abs(mha.in_proj_weight.numpy(force=True)).max() <= bound
    separate = nn.MultiheadAttention(8, 2, kdim=3, vdim=5, add_bias_kv=True, bias=False)
    assert [n for n, _ in separate.named_parameters()] == [
        "q_proj_weight",
        "k_proj_weight",
        "v_proj_weight",
        "bias_k",
        "bias_v",
        "out_proj.weight",
    ]
    assert separate.k_proj_weight.shape == (8, 3) and separate.bias_k.shape == (1, 1, 8)


def test_multihead_attention_dropout_only_in_training() -> None:
    fg.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.5).double()
    x = fg.randn(L, N, E, dtype=fg.float64)
    mha.eval()
    a = mha(x, x, x)[0].detach()
    np.testing.assert_array_equal(a.numpy(), mha(x, x, x)[0].detach().numpy())
    mha.train()
    assert not np.allclose(mha(x, x, x)[0].detach().numpy(), a.numpy())


MHA_ERRORS = [
    (lambda m: m.nn.MultiheadAttention(8, 3), "divisible by num_heads"),
    (lambda m: m.nn.MultiheadAttention(8, 0), "must be greater than 0"),
    (lambda m: _mha(m)(m.zeros(2, 3, 4, 8), m.zeros(2, 3, 4, 8), m.zeros(2, 3, 4, 8)), "3D"),
    (lambda m: _mha(m)(m.zeros(4, 3, 8), m.zeros(5, 8), m.zeros(5, 8)), "expected `key`"),
    (
        lambda m: _mha(m)(m.zeros(4, 3, 8), m.zeros(5, 3, 8), m.zeros(5, 3, 8), is_causal=True),
        "Need attn_mask",
    ),
    (
        lambda m: _mha(m)(
            m.zeros(4, 3, 8), m.zeros(5, 3, 8), m.zeros(5, 3, 8), attn_mask=m.zeros(4, 4)
        ),
        "2D attn_mask",
    ),
    (
        lambda m: _mha(m)(
            m.zeros(4, 3, 8), m.zeros(5, 3, 8), m.zeros(5, 3, 8), attn_mask=m.zeros(3, 4, 5)
        ),
        "3D attn_mask",
    ),
    (lambda m: _mha(m)(m.zeros(4, 3, 6), m.zeros(5, 3, 6), m.zeros(5, 3, 6)), "embedding dim"),
    (lambda m: m.nn.TransformerEncoderLayer(8, 2, activation="tanh"), "relu/gelu"),
    (
        lambda m: m.nn.Transformer(8, 2, 1, 1, 16)(m.zeros(4, 3, 8), m.zeros(4, 2, 8)),
        "batch number",
    ),
    (
        lambda m: m.nn.Transformer(8, 2, 1, 1, 16)(m.zeros(4, 3, 8), m.zeros(4, 3, 6)),
        "feature number",
    ),
]


def _mha(m: Any) -> Any:
    return m.nn.MultiheadAttention(8, 2)


@pytest.mark.parametrize("call,words", MHA_ERRORS)
def test_errors_as_torch(call: Any, words: str) -> None:
    with pytest.raises(Exception, match=words) as got:
        call(fg)
    with pytest.raises(Exception, match=words) as expected:
        call(torch)
    # PyTorch raises AssertionError for some of these; fusegrad's ShapeError is a RuntimeError
    # and a ValueError, so ``except (RuntimeError, ValueError)`` catches both libraries' errors
    # unless torch's is an AssertionError
    if not isinstance(expected.value, AssertionError):
        assert isinstance(got.value, type(expected.value)), (got.value, expected.value)


# ---- Transformer layers ---------------------------------------------------------------------

LAYER_CASES = [
    ({}, {}),
    ({"norm_first": True, "activation": "gelu"}, {"src_key_padding_mask": PADDING[:, :L]}),
    ({"batch_first": True, "bias": False}, {"src_mask": CAUSAL, "is_causal": True}),
    ({"activation": "relu", "layer_norm_eps": 1e-3}, {"src_mask": CAUSAL}),
]


@pytest.mark.parametrize("ctor,call", LAYER_CASES)
def test_encoder_layer_matches_torch(ctor: dict, call: dict) -> None:
    module, want = _pair("TransformerEncoderLayer", E, 2, 16, 0.0, **ctor)
    x = np.random.default_rng(2).standard_normal(
        (N, L, E) if ctor.get("batch_first") else (L, N, E)
    )
    _compare(module, want, (x,), call)


def test_encoder_layer_with_a_callable_activation() -> None:
    torch.manual_seed(0)
    want = torch.nn.TransformerEncoderLayer(E, 2, 16, 0.0, activation=torch.nn.GELU()).double()
    module = nn.TransformerEncoderLayer(E, 2, 16, 0.0, activation=nn.GELU()).double()
    _copy_from_torch(module, want)
    x = np.random.default_rng(3).standard_normal((L, N, E))
    _compare(module, want, (x,), {"src_mask": BOOL_2D[:, :L]})


DECODER_CASES = [
    ({}, {}),
    (
        {"norm_first": True},
        {"tgt_mask": CAUSAL, "tgt_is_causal": True, "memory_key_padding_mask": PADDING},
    ),
    ({"batch_first": True}, {"memory_mask": BOOL_2D, "tgt_key_padding_mask": PADDING[:, :L]}),
]


@pytest.mark.parametrize("ctor,call", DECODER_CASES)
def test_decoder_layer_matches_torch(ctor: dict, call: dict) -> None:
    module, want = _pair("TransformerDecoderLayer", E, 2, 16, 0.0, **ctor)
    rng = np.random.default_rng(4)
    first = ctor.get("batch_first", False)
    tgt = rng.standard_normal((N, L, E) if first else (L, N, E))
    memory = rng.standard_normal((N, S, E) if first else (S, N, E))
    _compare(module, want, (tgt, memory), call)


def test_encoder_and_decoder_stacks_match_torch() -> None:
    torch.manual_seed(0)
    t_enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(E, 2, 16, 0.0),
        2,
        norm=torch.nn.LayerNorm(E),
        enable_nested_tensor=False,
    ).double()
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, 2, 16, 0.0), 2, norm=nn.LayerNorm(E))
    enc = enc.double()
    _copy_from_torch(enc, t_enc)
    x = np.random.default_rng(5).standard_normal((L, N, E))
    _compare(enc, t_enc, (x,), {"mask": CAUSAL, "src_key_padding_mask": PADDING[:, :L]})
    t_dec = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(E, 2, 16, 0.0), 2)
    t_dec = t_dec.double()
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(E, 2, 16, 0.0), 2).double()
    _copy_from_torch(dec, t_dec)
    memory = np.random.default_rng(6).standard_normal((S, N, E))
    _compare(dec, t_dec, (x, memory), {"tgt_mask": CAUSAL})
    # the layers are copies with their own parameters
    assert enc.layers[0].linear1.weight is not enc.layers[1].linear1.weight


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_matches_torch(batch_first: bool) -> None:
    module, want = _pair(
        "Transformer", E, 2, 2, 2, 16, 0.0, batch_first=batch_first, norm_first=batch_first
    )
    rng = np.random.default_rng(7)
    src = rng.standard_normal((N, S, E) if batch_first else (S, N, E))
    tgt = rng.standard_normal((N, L, E) if batch_first else (L, N, E))
    mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=fg.float64).numpy()
    _compare(module, want, (src, tgt), {"tgt_mask": mask, "src_key_padding_mask": PADDING})
    # unbatched
    _compare(
        module,
        want,
        (src[0] if batch_first else src[:, 0], tgt[0] if batch_first else tgt[:, 0]),
        {},
    )


def test_generate_square_subsequent_mask_and_transformer_init() -> None:
    got = nn.Transformer.generate_square_subsequent_mask(5)
    want = torch.nn.Transformer.generate_square_subsequent_mask(5)
    assert got.dtype == fg.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    model = nn.Transformer(8, 2, 1, 1, 16)
    w = model.encoder.layers[0].linear1.weight.numpy(force=True)
    assert np.abs(w).max() <= np.sqrt(6 / (8 + 16))  # xavier_uniform_, not Linear's default
    assert set(model.state_dict()) == set(torch.nn.Transformer(8, 2, 1, 1, 16).state_dict())


def test_transformer_trains_as_torch() -> None:
    """Five Adam steps of a small encoder classifier, from torch's weights."""
    torch.manual_seed(0)
    t_layer = torch.nn.TransformerEncoderLayer(E, 2, 16, 0.0, batch_first=True).double()
    layer = nn.TransformerEncoderLayer(E, 2, 16, 0.0, batch_first=True).double()
    _copy_from_torch(layer, t_layer)
    opt = fg.optim.Adam(layer.parameters(), lr=1e-2)
    t_opt = torch.optim.Adam(t_layer.parameters(), lr=1e-2)
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((N, L, E)), rng.standard_normal((N, E))
    for _ in range(5):
        opt.zero_grad()
        t_opt.zero_grad()
        loss = ((layer(fg.tensor(x)).mean(1) - fg.tensor(y)) ** 2).mean()
        t_loss = ((t_layer(torch.tensor(x)).mean(1) - torch.tensor(y)) ** 2).mean()
        loss.backward()
        t_loss.backward()
        opt.step()
        t_opt.step()
        np.testing.assert_allclose(loss.item(), t_loss.item(), **TOL)
    for p, q in zip(layer.parameters(), t_layer.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-8, atol=1e-10)


def test_multi_head_attention_forward_is_exported() -> None:
    assert "multi_head_attention_forward" in F.__all__
