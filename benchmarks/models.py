"""Small training programs written against PyTorch's public API, for any module that provides
it: ``fusegrad`` (``import fusegrad as torch``) or ``torch`` itself.  The whole-step tests
(``tests/compiler/test_whole_step.py``) and the whole-step benchmark (``benchmarks.steps``)
build them with ``make(torch, kind, dtype)``.

* ``mlp``: 6-16-16-3 GELU/tanh MLP with dropout;
* ``cnn``: two 3x3 convolutions, ReLU, max-pool, a linear head (8x8 one-channel images);
* ``rnn``: an Elman network unrolled over the sequence in Python;
* ``gpt``: nanoGPT's structure (token and position embeddings, pre-norm blocks of causal
  self-attention and a GELU MLP, dropout, tied input/output embeddings), any width.
"""

from __future__ import annotations

from typing import Any


def make(torch: Any, kind: str, dtype: Any = None, **sizes: Any) -> Any:
    """A fresh model of ``kind`` built with ``torch`` (fusegrad or PyTorch)."""
    nn, F = torch.nn, torch.nn.functional
    dtype = dtype if dtype is not None else torch.float32

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(6, 16, dtype=dtype)
            self.fc2 = nn.Linear(16, 16, dtype=dtype)
            self.fc3 = nn.Linear(16, 3, dtype=dtype)
            self.drop = nn.Dropout(0.2)

        def forward(self, x: Any) -> Any:
            h = self.drop(F.gelu(self.fc1(x)))
            return self.fc3(self.fc2(h).tanh())

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, padding=1, dtype=dtype)
            self.conv2 = nn.Conv2d(4, 6, 3, dtype=dtype)
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(6 * 2 * 2, 3, dtype=dtype)

        def forward(self, x: Any) -> Any:
            h = self.pool(F.relu(self.conv1(x)))
            h = F.relu(self.conv2(h))
            return self.fc(h.flatten(1))

    class RNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(4, 12, dtype=dtype)
            self.rec = nn.Linear(12, 12, bias=False, dtype=dtype)
            self.out = nn.Linear(12, 3, dtype=dtype)

        def forward(self, x: Any) -> Any:
            h = torch.zeros(x.shape[0], 12, dtype=x.dtype)
            for t in range(x.shape[1]):
                h = (self.inp(x[:, t]) + self.rec(h)).tanh()
            return self.out(h)

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, block: int, dropout: float) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d, dtype=dtype)
            self.qkv = nn.Linear(d, 3 * d, dtype=dtype)
            self.proj = nn.Linear(d, d, dtype=dtype)
            self.ln2 = nn.LayerNorm(d, dtype=dtype)
            self.fc = nn.Linear(d, 4 * d, dtype=dtype)
            self.fc2 = nn.Linear(4 * d, d, dtype=dtype)
            self.drop = nn.Dropout(dropout)
            self.heads = heads
            mask = torch.ones(block, block).tril().view(1, 1, block, block)
            self.register_buffer("mask", mask)

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.heads) ** 0.5)
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            att = self.drop(F.softmax(att, dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.proj(y)
            return x + self.drop(self.fc2(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(
            self,
            vocab: int = 65,
            width: int = 64,
            heads: int = 4,
            block: int = 32,
            layers: int = 2,
            dropout: float = 0.1,
        ) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, width, dtype=dtype)
            self.wpe = nn.Embedding(block, width, dtype=dtype)
            self.blocks = nn.ModuleList(
                [Block(width, heads, block, dropout) for _ in range(layers)]
            )
            self.ln = nn.LayerNorm(width, dtype=dtype)
            self.head = nn.Linear(width, vocab, bias=False, dtype=dtype)
            self.head.weight = self.wte.weight

        def forward(self, idx: Any) -> Any:
            _, T = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    models = {"mlp": MLP, "cnn": CNN, "rnn": RNN, "gpt": GPT}
    return models[kind](**sizes)


def batch(torch: Any, kind: str, rng: Any, size: int = 4, dtype: Any = None, **sizes: Any) -> tuple:
    """One (input, target) batch for ``kind`` from numpy generator ``rng`` (inputs in
    ``dtype``, default float32)."""
    dtype = dtype if dtype is not None else torch.float32
    if kind == "mlp":
        x = rng.standard_normal((size, 6))
    elif kind == "cnn":
        x = rng.standard_normal((size, 1, 8, 8))
    elif kind == "rnn":
        x = rng.standard_normal((size, 5, 4))
    else:
        vocab, block = sizes.get("vocab", 65), sizes.get("block", 32)
        idx = rng.integers(0, vocab, (size, block))
        tgt = rng.integers(0, vocab, (size, block))
        return torch.tensor(idx), torch.tensor(tgt)
    return torch.tensor(x, dtype=dtype), torch.tensor(rng.integers(0, 3, size))


def loss(torch: Any, model: Any, x: Any, y: Any) -> Any:
    """Cross-entropy of the model's output (all positions, for the GPT)."""
    out = model(x)
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
