"""``pad_sequence``, as ``torch.nn.utils.rnn`` (packed sequences are not provided)."""

from __future__ import annotations

from collections.abc import Iterable

from ...errors import ShapeError, describe
from ...ops import pad, stack
from ...tensor import Tensor


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
