"""``torch.nn.utils.rnn``: ``pad_sequence``, and packed sequences (``PackedSequence``,
``pack_padded_sequence``, ``pad_packed_sequence``, ``pack_sequence``, ``unpack_sequence``,
``unpad_sequence``) that ``nn.RNN``/``LSTM``/``GRU`` accept.

A PackedSequence holds the time steps of a batch of sequences sorted by decreasing length, one
after another: ``data`` is (sum of lengths, *), ``batch_sizes[t]`` (an int64 CPU tensor) is how
many sequences are still running at step t.  Packing and unpacking are slices, ``cat``,
``pad`` and ``index_select``, so they are differentiable; the lengths are host values (a
whole-step compile that packs reads them, and re-records when they change).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ...errors import ShapeError, describe
from ...ops import cat, pad, stack
from ...ops.creation import tensor as _tensor
from ...ops.indexing import index_select
from ...tensor import Tensor

__all__ = [
    "PackedSequence",
    "pack_padded_sequence",
    "pack_sequence",
    "pad_packed_sequence",
    "pad_sequence",
    "unpack_sequence",
    "unpad_sequence",
]


def pad_sequence(
    sequences: Tensor | Iterable[Tensor],
    batch_first: bool = False,
    padding_value: float = 0.0,
    padding_side: str = "right",
) -> Tensor:
    """Stack sequences of shapes ``(L_i, *)`` into ``(L_max, B, *)`` (``batch_first``: ``(B,
    L_max, *)``), padding each with ``padding_value`` on ``padding_side``; differentiable."""
    if padding_side not in ("left", "right"):
        raise ValueError(
            f"Expected padding_side to be one of left or right, but got {padding_side}."
        )
    seqs = list(sequences.unbind(0)) if isinstance(sequences, Tensor) else list(sequences)
    if not seqs:
        raise ShapeError("pad_sequence: received an empty list of sequences")
    trailing = tuple(seqs[0].shape[1:])
    for s in seqs:
        if s.ndim == 0 or tuple(s.shape[1:]) != trailing:
            raise ShapeError(
                "pad_sequence: every sequence needs the same trailing dimensions "
                f"{trailing}, got {describe(s)}"
            )
    longest = max(int(s.shape[0]) for s in seqs)
    padded = []
    for s in seqs:
        extra = longest - int(s.shape[0])
        widths = [0, 0] * len(trailing) + ([extra, 0] if padding_side == "left" else [0, extra])
        padded.append(pad(s, widths, value=float(padding_value)) if extra else s)
    return stack(padded, 0 if batch_first else 1)


class _PackedFields(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


class PackedSequence(_PackedFields):
    """A packed batch of variable-length sequences (a named tuple, as PyTorch's): ``data``,
    ``batch_sizes``, ``sorted_indices`` and ``unsorted_indices`` (None when the input was
    already sorted by decreasing length)."""

    def __new__(
        cls,
        data: Tensor,
        batch_sizes: Tensor | None = None,
        sorted_indices: Tensor | None = None,
        unsorted_indices: Tensor | None = None,
    ) -> PackedSequence:
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = _invert(sorted_indices)
        if batch_sizes is None:
            raise ShapeError("PackedSequence: batch_sizes is required")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args: Any, **kwargs: Any) -> PackedSequence:
        """``data`` converted as ``Tensor.to`` does; the indices follow its device."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        move = lambda t: None if t is None else t.to(data.device)  # noqa: E731
        return type(self)(
            data, self.batch_sizes, move(self.sorted_indices), move(self.unsorted_indices)
        )

    def cpu(self) -> PackedSequence:
        return self.to("cpu")

    def cuda(self, *args: Any, **kwargs: Any) -> PackedSequence:
        return type(self)(self.data.cuda(*args, **kwargs), *self[1:])

    def double(self) -> PackedSequence:
        return type(self)(self.data.double(), *self[1:])

    def float(self) -> PackedSequence:
        return type(self)(self.data.float(), *self[1:])

    @property
    def is_cuda(self) -> bool:
        return self.data.device.type == "cuda"


def _invert(permutation: Tensor) -> Tensor:
    order = np.asarray(permutation.tolist(), dtype=np.int64)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return _tensor(inverse).to(permutation.device)


def _lengths(lengths: Any) -> list[int]:
    if isinstance(lengths, Tensor):
        return [int(v) for v in lengths.reshape(-1).tolist()]
    return [int(v) for v in lengths]


def pack_padded_sequence(
    input: Tensor,
    lengths: Tensor | Sequence[int],
    batch_first: bool = False,
    enforce_sorted: bool = True,
) -> PackedSequence:
    """Pack a padded (T, B, *) batch (``batch_first``: (B, T, *)) whose sequence b is
    ``lengths[b]`` long.  With ``enforce_sorted`` the lengths must be decreasing; otherwise the
    batch is sorted first and the permutation kept in the result."""
    sizes = _lengths(lengths)
    batch_dim = 0 if batch_first else 1
    if input.ndim < 2 or len(sizes) != input.shape[batch_dim]:
        raise ShapeError(
            f"Expected `len(lengths)` to be equal to batch_size, but got {len(sizes)} "
            f"(batch_size={input.shape[batch_dim] if input.ndim >= 2 else describe(input)})"
        )
    if any(n <= 0 for n in sizes):
        raise ShapeError(
            "Length of all samples has to be greater than 0, but found an element in "
            "'lengths' that is <= 0"
        )
    if max(sizes) > input.shape[1 - batch_dim]:
        raise ShapeError(
            f"pack_padded_sequence: a length of {max(sizes)} is longer than the padded "
            f"sequences ({input.shape[1 - batch_dim]} steps)"
        )
    sorted_indices = None
    if enforce_sorted:
        if any(a < b for a, b in zip(sizes, sizes[1:])):
            raise ShapeError(
                "`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
                "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
                "pack_sequence to sidestep this requirement if you do not need ONNX "
                "exportability."
            )
    else:
        order = sorted(range(len(sizes)), key=lambda b: -sizes[b])  # stable, as torch's sort
        sizes = [sizes[b] for b in order]
        sorted_indices = _tensor(np.asarray(order, dtype=np.int64)).to(input.device)
        input = index_select(input, batch_dim, sorted_indices)
    if batch_first:
        input = input.transpose(0, 1)
    batch_sizes = [sum(1 for n in sizes if n > t) for t in range(sizes[0])]
    data = cat([input[t, :count] for t, count in enumerate(batch_sizes)], 0)
    return PackedSequence(
        data, _tensor(np.asarray(batch_sizes, dtype=np.int64)), sorted_indices, None
    )


def pad_packed_sequence(
    sequence: PackedSequence,
    batch_first: bool = False,
    padding_value: float = 0.0,
    total_length: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The inverse of ``pack_padded_sequence``: ``(padded, lengths)``, the batch in its
    original order, padded with ``padding_value`` to the longest length (or ``total_length``)."""
    data, batch_sizes, _, unsorted = sequence
    sizes = [int(v) for v in batch_sizes.tolist()]
    steps = len(sizes)
    if total_length is not None:
        if total_length < steps:
            raise ShapeError(
                "Expected total_length to be at least the length of the longest sequence in "
                f"input, but got total_length={total_length} and max sequence length being "
                f"{steps}"
            )
    batch = sizes[0]
    trailing = [0, 0] * (data.ndim - 1)
    rows, offset = [], 0
    for count in sizes:
        chunk = data[offset : offset + count]
        offset += count
        rows.append(
            pad(chunk, trailing + [0, batch - count], value=float(padding_value))
            if count < batch
            else chunk
        )
    padded = stack(rows, 0)
    if total_length is not None and total_length > steps:
        padded = pad(padded, trailing + [0, 0, 0, total_length - steps], value=float(padding_value))
    lengths = np.asarray([sum(1 for c in sizes if c > b) for b in range(batch)], dtype=np.int64)
    if unsorted is not None:
        padded = index_select(padded, 1, unsorted)
        lengths = lengths[np.asarray(unsorted.tolist(), dtype=np.int64)]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, _tensor(lengths)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of (L_i, *) tensors (decreasing lengths unless ``enforce_sorted=False``)."""
    lengths = [int(s.shape[0]) for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of (L_i, *) tensors a PackedSequence holds, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)


def unpad_sequence(
    padded_sequences: Tensor, lengths: Tensor | Sequence[int], batch_first: bool = False
) -> list[Tensor]:
    """Split a padded (T, B, *) batch ((B, T, *) with ``batch_first``) into B tensors of their
    own lengths."""
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[b, :n] for b, n in enumerate(_lengths(lengths))]
