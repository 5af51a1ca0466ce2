"""``fusegrad.utils.data``: datasets, samplers, ``DataLoader`` batching/shuffling/collation and
its argument errors, ``random_split``; collation and sequential batches compared with
``torch.utils.data`` when torch is importable (shuffled orders are fusegrad's own)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    random_split,
)


def _xy(n: int = 10) -> TensorDataset:
    x = fg.arange(n * 3, dtype=fg.float32).reshape(n, 3)
    y = fg.arange(n)
    return TensorDataset(x, y)


def test_tensor_dataset_and_sequential_batches() -> None:
    ds = _xy()
    assert len(ds) == 10 and ds[2][1].item() == 2
    loader = DataLoader(ds, batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 and len(batches) == 3
    x, y = batches[0]
    assert x.shape == (4, 3) and x.dtype == fg.float32 and y.tolist() == [0, 1, 2, 3]
    assert batches[-1][1].tolist() == [8, 9]
    dropped = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dropped) == 2 and [b[1].tolist() for b in dropped] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="Size mismatch between tensors"):
        TensorDataset(fg.zeros(3), fg.zeros(4))


def test_shuffle_is_a_permutation_per_epoch_and_reproducible() -> None:
    ds = _xy(20)
    loader = DataLoader(ds, batch_size=6, shuffle=True)
    fg.manual_seed(0)
    epoch1 = [i for _, y in loader for i in y.tolist()]
    epoch2 = [i for _, y in loader for i in y.tolist()]
    assert sorted(epoch1) == list(range(20)) and sorted(epoch2) == list(range(20))
    assert epoch1 != epoch2 and epoch1 != list(range(20))
    fg.manual_seed(0)
    assert [i for _, y in loader for i in y.tolist()] == epoch1
    g1, g2 = fg.Generator().manual_seed(3), fg.Generator().manual_seed(3)
    a = [y.tolist() for _, y in DataLoader(ds, batch_size=5, shuffle=True, generator=g1)]
    b = [y.tolist() for _, y in DataLoader(ds, batch_size=5, shuffle=True, generator=g2)]
    assert a == b


def test_num_workers_runs_in_process_with_the_same_batches() -> None:
    ds = _xy(7)
    plain = [y.tolist() for _, y in DataLoader(ds, batch_size=3)]
    workers = DataLoader(ds, batch_size=3, num_workers=4, pin_memory=True, prefetch_factor=2)
    assert [y.tolist() for _, y in workers] == plain


def test_default_collate() -> None:
    Point = collections.namedtuple("Point", ["x", "y"])
    batch = [
        {"a": 1.5, "b": 2, "c": "s", "d": np.ones(2, np.float32), "e": (fg.ones(2), True)},
        {"a": 2.5, "b": 3, "c": "t", "d": np.zeros(2, np.float32), "e": (fg.zeros(2), False)},
    ]
    out = default_collate(batch)
    assert out["a"].dtype == fg.float64 and out["a"].tolist() == [1.5, 2.5]
    assert out["b"].dtype == fg.int64 and out["b"].tolist() == [2, 3]
    assert out["c"] == ["s", "t"]
    assert out["d"].dtype == fg.float32 and out["d"].shape == (2, 2)
    assert isinstance(out["e"], list) and out["e"][0].shape == (2, 2)
    assert out["e"][1].dtype == fg.bool
    pts = default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert type(pts) is Point and pts.x.tolist() == [1, 3] and pts.y.dtype == fg.float64
    assert default_collate([np.float32(1), np.float32(2)]).dtype == fg.float32
    with pytest.raises(RuntimeError, match="should be of equal size"):
        default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="batch must contain tensors"):
        default_collate([object(), object()])


def test_collate_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    import torch.utils.data as tud

    samples = [(np.arange(3.0) + i, i, float(i) / 2, {"k": [i, i + 1]}) for i in range(5)]
    want = next(iter(tud.DataLoader(samples, batch_size=5)))
    got = next(iter(DataLoader(samples, batch_size=5)))
    assert type(got) is type(want) and len(got) == len(want)

    def check(a, b) -> None:  # type: ignore[no-untyped-def]
        if isinstance(b, torch.Tensor):
            assert a.dtype.name == str(b.dtype).replace("torch.", "")
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        elif isinstance(b, dict):
            assert list(a) == list(b)
            for k in b:
                check(a[k], b[k])
        else:
            assert type(a) is type(b) and len(a) == len(b)
            for u, v in zip(a, b):
                check(u, v)

    check(got, want)


def test_samplers() -> None:
    data = list(range(10))
    assert list(SequentialSampler(data)) == data
    fg.manual_seed(1)
    perm = list(RandomSampler(data))
    assert sorted(perm) == data
    longer = list(RandomSampler(data, num_samples=25))
    assert len(longer) == 25 and sorted(longer[:20]) == sorted(data * 2)
    drawn = list(RandomSampler(data, replacement=True, num_samples=50))
    assert len(drawn) == 50 and set(drawn) <= set(data)
    # makemore's endless loader: a huge num_samples is drawn lazily
    endless = DataLoader(
        _xy(5), batch_size=4, sampler=RandomSampler(range(5), replacement=True, num_samples=10**10)
    )
    batches = iter(endless)
    assert all(next(batches)[0].shape == (4, 3) for _ in range(3))
    assert sorted(SubsetRandomSampler([3, 5, 7])) == [3, 5, 7]
    weighted = list(WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 40))
    assert len(weighted) == 40 and set(weighted) <= {1, 3}
    batches = BatchSampler(SequentialSampler(data), 4, drop_last=False)
    assert list(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(batches) == 3
    assert len(BatchSampler(data, 4, drop_last=True)) == 2
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        BatchSampler(data, 0, False)
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        RandomSampler(data, num_samples=0)


def test_loader_with_samplers_and_without_batching() -> None:
    ds = _xy(6)
    loader = DataLoader(ds, batch_size=2, sampler=[5, 4, 3, 2, 1, 0])
    assert [y.tolist() for _, y in loader] == [[5, 4], [3, 2], [1, 0]]
    loader = DataLoader(ds, batch_sampler=[[0, 2], [1, 3, 5]])
    assert [y.tolist() for _, y in loader] == [[0, 2], [1, 3, 5]] and len(loader) == 2
    single = list(DataLoader(ds, batch_size=None))
    assert len(single) == 6 and single[1][1].shape == () and single[1][1].item() == 1
    arrays = list(DataLoader([np.ones(2), np.zeros(2)], batch_size=None))
    assert isinstance(arrays[0], fg.Tensor) and arrays[0].shape == (2,)
    custom = DataLoader(ds, batch_size=3, collate_fn=lambda b: len(b))
    assert list(custom) == [3, 3]


def test_iterable_dataset() -> None:
    class Stream(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(fg.tensor([float(i)]) for i in range(7))

        def __len__(self) -> int:
            return 7

    loader = DataLoader(Stream(), batch_size=3)
    batches = list(loader)
    assert [b.reshape(-1).tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(loader) == 3
    assert len(list(DataLoader(Stream(), batch_size=3, drop_last=True))) == 2
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(Stream(), shuffle=True)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"sampler": [0, 1], "shuffle": True}, "mutually exclusive with shuffle"),
        ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler option is mutually"),
        ({"batch_sampler": [[0]], "drop_last": True}, "batch_sampler option is mutually"),
        ({"batch_size": None, "drop_last": True}, "disables auto-batching"),
        ({"num_workers": -1}, "num_workers option should be non-negative"),
    ],
)
def test_loader_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        DataLoader(_xy(4), **kwargs)


def test_subset_concat_stack_and_random_split() -> None:
    ds = _xy(10)
    sub = Subset(ds, [9, 0, 4])
    assert len(sub) == 3 and sub[0][1].item() == 9
    both = ds + sub
    assert isinstance(both, ConcatDataset) and len(both) == 13 and both[11][1].item() == 0
    assert both[-1][1].item() == 4
    stacked = StackDataset(x=[1, 2], y=["a", "b"])
    assert stacked[1] == {"x": 2, "y": "b"}
    fg.manual_seed(0)
    a, b = random_split(ds, [7, 3])
    ids = sorted([a[i][1].item() for i in range(7)] + [b[i][1].item() for i in range(3)])
    assert ids == list(range(10))
    parts = random_split(range(10), [0.5, 0.3, 0.2], generator=fg.Generator().manual_seed(1))
    assert [len(p) for p in parts] == [5, 3, 2]
    again = random_split(range(10), [0.5, 0.3, 0.2], generator=fg.Generator().manual_seed(1))
    assert list(parts[0]) == list(again[0])
    assert [len(p) for p in random_split(range(7), [0.5, 0.5])] == [4, 3]
    with pytest.raises(ValueError, match="Sum of input lengths does not equal"):
        random_split(ds, [3, 3])


def test_map_dataset_subclass_in_a_training_loop() -> None:
    class Squares(Dataset):
        def __len__(self) -> int:
            return 32

        def __getitem__(self, i: int) -> tuple:
            x = np.array([i / 32.0], dtype=np.float32)
            return x, np.float32(x[0] ** 2)

    fg.manual_seed(0)
    model = fg.nn.Linear(1, 1)
    opt = fg.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(30):
        for x, y in DataLoader(Squares(), batch_size=8, shuffle=True):
            opt.zero_grad()
            loss = ((model(x).reshape(-1) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
