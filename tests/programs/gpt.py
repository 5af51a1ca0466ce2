"""A small GPT (causal self-attention blocks, weight tying) written against PyTorch's public API:
trained with AdamW, clip_grad_norm_, a cosine learning-rate schedule and a DataLoader, then
sampling with topk + multinomial.  ``run(torch, ...)`` works with ``torch`` being PyTorch or
fusegrad (``import fusegrad as torch``)."""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB, BLOCK, WIDTH, HEADS = 23, 8, 16, 2


def build(torch: Any, dropout: float) -> Any:
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(WIDTH)
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
            self.proj = nn.Linear(WIDTH, WIDTH)
            self.ln2 = nn.LayerNorm(WIDTH)
            self.mlp = nn.Sequential(
                nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
            )
            self.drop = nn.Dropout(dropout)

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
            q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(b, t, c)
            x = x + self.drop(self.proj(y))
            return x + self.drop(self.mlp(self.ln2(x)))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, WIDTH)
            self.pos = nn.Embedding(BLOCK, WIDTH)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.ln = nn.LayerNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            self.head.weight = self.tok.weight  # weight tying

        def forward(self, idx: Any, targets: Any = None) -> tuple:
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln(x))
            if targets is None:
                return logits, None
            return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

        @torch.no_grad()
        def generate(self, idx: Any, new: int, top_k: int) -> Any:
            for _ in range(new):
                logits, _ = self(idx[:, -BLOCK:])
                logits = logits[:, -1, :]
                v, _ = torch.topk(logits, top_k)
                logits[logits < v[:, [-1]]] = -float("inf")
                nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
                idx = torch.cat((idx, nxt), dim=1)
            return idx

    return GPT()


def data(torch: Any, n: int = 96) -> Any:
    rng = np.random.default_rng(0)
    text = rng.integers(0, VOCAB, n + BLOCK + 1)
    x = np.stack([text[i : i + BLOCK] for i in range(n)])
    y = np.stack([text[i + 1 : i + BLOCK + 1] for i in range(n)])
    return torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y))


def run(
    torch: Any, state: dict | None, compiled: bool, steps: int = 5, dropout: float = 0.0
) -> dict:
    torch.manual_seed(0)
    model = build(torch, dropout).double()
    if state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    net = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    loader = torch.utils.data.DataLoader(data(torch), batch_size=16, shuffle=False)
    losses = []
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        _, loss = net(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    torch.manual_seed(1)
    sample = model.generate(torch.zeros((2, 1), dtype=torch.long), new=6, top_k=5)
    return {
        "losses": losses,
        "grads": {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()},
        "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
        "sample_shape": tuple(sample.shape),
        "sample_in_range": bool((sample >= 0).all() and (sample < VOCAB).all()),
    }
