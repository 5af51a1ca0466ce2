"""A Transformer encoder classifier (token and position embeddings, nn.TransformerEncoder with
a padding mask, mean pooling, a linear head) trained with Adam, written against PyTorch's
public API; ``run(torch, ...)`` works with PyTorch or fusegrad as ``torch``."""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB, LENGTH, WIDTH, CLASSES = 15, 10, 16, 3


def build(torch: Any, dropout: float) -> Any:
    nn = torch.nn

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
            self.pos = nn.Parameter(torch.zeros(1, LENGTH, WIDTH))
            layer = nn.TransformerEncoderLayer(
                WIDTH, nhead=4, dim_feedforward=32, dropout=dropout, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Linear(WIDTH, CLASSES)

        def forward(self, tokens: Any) -> Any:
            pad = tokens == 0
            h = self.encoder(self.tok(tokens) + self.pos, src_key_padding_mask=pad)
            keep = (~pad).unsqueeze(-1).to(h.dtype)
            return self.head((h * keep).sum(1) / keep.sum(1))

    return Classifier()


def sequences(n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, (n, LENGTH))
    lengths = rng.integers(4, LENGTH + 1, n)
    tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    labels = (tokens.sum(1) % CLASSES).astype(np.int64)
    return tokens.astype(np.int64), labels


def run(
    torch: Any, state: dict | None, compiled: bool, steps: int = 5, dropout: float = 0.0
) -> dict:
    torch.manual_seed(0)
    model = build(torch, dropout).double()
    if state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    net = torch.compile(model) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = sequences()
    losses = []
    for step in range(steps):
        xb = torch.tensor(x[step * 8 : (step + 1) * 8])
        yb = torch.tensor(y[step * 8 : (step + 1) * 8])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {
        "losses": losses,
        "grads": {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()},
        "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
    }
