"""Character-level name models in the manner of makemore: a context-window MLP (embedding,
concatenated context, tanh hidden layer) and a GRU language model (embedding, nn.GRU with
batch_first, a linear head, the loss ignoring padding), trained with AdamW, then sampled with
``torch.multinomial`` from a ``torch.Generator``; written against PyTorch's public API.
``run(torch, ...)`` works with PyTorch or fusegrad as ``torch``.  The names are made up here
from syllables (no data set)."""

from __future__ import annotations

from typing import Any

import numpy as np

SYLLABLES = ["an", "el", "mi", "ra", "to", "su", "ki", "lo", "ne", "da", "ri", "va"]
CHARS = sorted(set("".join(SYLLABLES)))
VOCAB = len(CHARS) + 1  # 0 is the boundary token "."
BLOCK, EMBED, HIDDEN = 3, 6, 24


def names(n: int = 40) -> list[str]:
    rng = np.random.default_rng(0)
    return ["".join(rng.choice(SYLLABLES, rng.integers(1, 4))) for _ in range(n)]


def encode(word: str) -> list[int]:
    return [CHARS.index(c) + 1 for c in word]


def build(torch: Any, kind: str = "mlp") -> Any:
    nn, F = torch.nn, torch.nn.functional

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, EMBED)
            self.hidden = nn.Linear(BLOCK * EMBED, HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, context: Any) -> Any:
            emb = self.wte(context).view(context.shape[0], -1)
            return self.head(torch.tanh(self.hidden(emb)))

    class GRULanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, EMBED)
            self.gru = nn.GRU(EMBED, HIDDEN, batch_first=True)
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, tokens: Any) -> Any:
            out, _ = self.gru(self.wte(tokens))
            return self.head(F.gelu(out))

    return MLP() if kind == "mlp" else GRULanguageModel()


def mlp_examples(words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every (context of BLOCK previous characters, next character) pair of the words."""
    xs, ys = [], []
    for word in words:
        context = [0] * BLOCK
        for ix in encode(word) + [0]:
            xs.append(list(context))
            ys.append(ix)
            context = context[1:] + [ix]
    return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.int64)


def sequence_examples(words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Input "." + word, target word + "." padded with -1 (ignored by the loss)."""
    width = max(len(w) for w in words) + 1
    x = np.zeros((len(words), width), dtype=np.int64)
    y = np.full((len(words), width), -1, dtype=np.int64)
    for i, word in enumerate(words):
        ix = encode(word)
        x[i, 1 : len(ix) + 1] = ix
        y[i, : len(ix)] = ix
        y[i, len(ix)] = 0
    return x, y


def run(torch: Any, state: dict | None, compiled: bool, steps: int = 5, kind: str = "mlp") -> dict:
    torch.manual_seed(0)
    F = torch.nn.functional
    model = build(torch, kind).double()
    if state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    net = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99))
    words = names()
    x, y = mlp_examples(words) if kind == "mlp" else sequence_examples(words)
    batch = len(x) // steps
    losses = []
    for step in range(steps):
        xb = torch.tensor(x[step * batch : (step + 1) * batch])
        yb = torch.tensor(y[step * batch : (step + 1) * batch])
        logits = net(xb)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), yb.view(-1), ignore_index=-1)
        model.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    sample = generate(torch, model, kind)
    return {
        "losses": losses,
        "grads": {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()},
        "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
        "sample": sample,
    }


def generate(torch: Any, model: Any, kind: str, count: int = 3, length: int = 8) -> list[list]:
    """Sampled character indices (stopping at the boundary token), under no_grad."""
    g = torch.Generator().manual_seed(42)
    out = []
    with torch.no_grad():
        for _ in range(count):
            tokens = [0] * (BLOCK if kind == "mlp" else 1)
            word: list = []
            for _ in range(length):
                window = tokens[-BLOCK:] if kind == "mlp" else tokens
                logits = model(torch.tensor([window]))
                logits = logits if kind == "mlp" else logits[:, -1, :]
                probs = torch.softmax(logits, dim=-1)
                ix = torch.multinomial(probs, num_samples=1, generator=g).item()
                if ix == 0:
                    break
                word.append(ix)
                tokens.append(ix)
            out.append(word)
    return out
