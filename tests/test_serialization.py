"""``fusegrad.save`` / ``fusegrad.load``: bit-exact round trips of tensors and nested containers,
a model's and an optimizer's state dicts (training continues identically), ``map_location``,
the weights-only unpickler refusing a malicious file, and the atomic write."""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import nn


def _roundtrip(obj: object, **load_kwargs: object) -> object:
    buf = io.BytesIO()
    fg.save(obj, buf)
    buf.seek(0)
    return fg.load(buf, **load_kwargs)


def test_tensors_round_trip_bit_exactly() -> None:
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-310, 3.0], dtype=np.float64)
    special.view(np.uint64)[0] |= 0x5  # a NaN with a payload
    cases = [
        fg.tensor(special),
        fg.tensor(special.astype(np.float32)),
        fg.arange(12, dtype=fg.int64).reshape(3, 4),
        fg.tensor([1, -2], dtype=fg.int32),
        fg.tensor([True, False]),
        fg.tensor(2.5),
        fg.zeros(0, 3),
        fg.arange(12.0).reshape(3, 4).t(),  # a non-contiguous view
    ]
    for t in cases:
        got = _roundtrip(t)
        assert isinstance(got, fg.Tensor) and got.dtype == t.dtype and got.shape == t.shape
        want = np.ascontiguousarray(t.numpy())
        assert got.numpy().tobytes() == want.tobytes()
        assert not got.requires_grad


def test_requires_grad_parameters_and_shared_tensors() -> None:
    w = nn.Parameter(fg.randn(2, 3))
    x = fg.randn(4, requires_grad=True)
    x.grad = fg.ones(4)
    got = _roundtrip({"w": w, "again": w, "x": x, "frozen": nn.Parameter(fg.ones(1), False)})
    assert type(got["w"]) is nn.Parameter and got["w"].requires_grad
    assert got["again"] is got["w"]  # one object saved twice loads as one
    assert got["x"].requires_grad and got["x"].is_leaf and got["x"].grad is None
    assert type(got["frozen"]) is nn.Parameter and not got["frozen"].requires_grad


def test_nested_containers_and_plain_values() -> None:
    obj = {
        "list": [1, 2.5, "three", None, True, fg.ones(2)],
        "tuple": (fg.zeros(1), (4, 5)),
        "ordered": collections.OrderedDict(a=fg.tensor([1.0]), b=2),
        "set": {1, 2},
        "frozenset": frozenset({"x"}),
        "array": np.arange(5, dtype=np.int16),
        "scalar": np.float32(1.5),
        "dtype": fg.float64,
        "device": fg.device("cpu"),
        "size": fg.randn(2, 3).shape,
        "slice": slice(1, None, 2),
        "complex": 1 + 2j,
    }
    got = _roundtrip(obj)
    assert got["list"][:5] == [1, 2.5, "three", None, True]
    assert got["list"][5].tolist() == [1.0, 1.0]
    assert got["tuple"][1] == (4, 5)
    assert type(got["ordered"]) is collections.OrderedDict and list(got["ordered"]) == ["a", "b"]
    assert got["set"] == {1, 2} and got["frozenset"] == frozenset({"x"})
    assert got["array"].dtype == np.int16 and got["array"].tolist() == list(range(5))
    assert got["scalar"] == np.float32(1.5) and type(got["scalar"]) is np.float32
    assert got["dtype"] is fg.float64 and got["device"] == fg.device("cpu")
    assert got["size"] == (2, 3) and type(got["size"]) is type(obj["size"])
    assert got["slice"] == slice(1, None, 2) and got["complex"] == 1 + 2j


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


def _train(model: nn.Module, opt: fg.optim.Optimizer, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        opt.zero_grad()
        x, y = fg.tensor(rng.standard_normal((4, 3))), fg.tensor(rng.standard_normal((4, 2)))
        ((model(x.float()) - y.float()) ** 2).mean().backward()
        opt.step()


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_model_and_optimizer_state_dicts_resume_training(tmp_path: Path, opt_name: str) -> None:
    def make_opt(m: nn.Module) -> fg.optim.Optimizer:
        if opt_name == "adamw":
            return fg.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
        return fg.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    fg.manual_seed(0)
    model = _model()
    opt = make_opt(model)
    _train(model, opt, 3, seed=1)
    path = tmp_path / "ckpt.pt"
    fg.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, path)

    ckpt = fg.load(path, map_location="cpu")
    assert ckpt["epoch"] == 3
    resumed = _model()
    resumed.load_state_dict(ckpt["model"])
    resumed_opt = make_opt(resumed)
    resumed_opt.load_state_dict(ckpt["optimizer"])
    _train(model, opt, 2, seed=2)
    _train(resumed, resumed_opt, 2, seed=2)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()


def test_map_location_forms() -> None:
    t = fg.arange(3.0)
    for ml in ("cpu", fg.device("cpu"), {"cpu": "cpu"}):
        got = _roundtrip(t, map_location=ml)
        assert got.device == fg.device("cpu") and got.tolist() == [0.0, 1.0, 2.0]
    seen = []

    def move(tensor: fg.Tensor, location: str) -> fg.Tensor:
        seen.append(location)
        return tensor * 2

    assert _roundtrip(t, map_location=move).tolist() == [0.0, 2.0, 4.0]
    assert seen == ["cpu"]


class _Exploit:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned > " + os.environ["FG_MARKER"],))


def test_weights_only_refuses_a_malicious_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "marker"
    monkeypatch.setenv("FG_MARKER", str(marker))
    path = tmp_path / "evil.pt"
    fg.save({"weights": fg.ones(2), "payload": _Exploit()}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed.*system"):
        fg.load(path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        fg.load(path, weights_only=True)
    assert not marker.exists()
    # a hand-made archive whose pickle calls a function is refused the same way
    evil = tmp_path / "evil2.pt"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("fusegrad/version", "1")
        zf.writestr("fusegrad/data.pkl", pickle.dumps(_Exploit(), protocol=2))
    with pytest.raises(pickle.UnpicklingError):
        fg.load(evil)
    assert not marker.exists()


def test_whole_modules_need_weights_only_false(tmp_path: Path) -> None:
    model = _model()
    fg.save(model, tmp_path / "model.pt")
    with pytest.raises(pickle.UnpicklingError, match="Sequential"):
        fg.load(tmp_path / "model.pt")
    loaded = fg.load(tmp_path / "model.pt", weights_only=False)
    x = fg.randn(2, 3)
    assert fg.equal(loaded(x), model(x))


def test_a_failed_save_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    fg.save({"a": fg.ones(2)}, path)
    before = path.read_bytes()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        fg.save({"a": fg.zeros(2), "bad": lambda: None}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temporary left


def test_not_a_fusegrad_file(tmp_path: Path) -> None:
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(pickle.UnpicklingError, match="not a fusegrad file"):
        fg.load(path)
