"""A training step watched by the runtime guard: hand-written attention (MAT601) and a
per-head matmul loop (MAT101). Run it with `python examples/guard_attention.py` or
`matlint run examples/guard_attention.py`; the guard prints what it saw with the time each
fix would save on this machine, and writes .matlint/runtime.json."""
import math

import torch
import torch.nn as nn

import matlint


class Block(nn.Module):
    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.mix = nn.Parameter(torch.randn(n_heads, d_model // n_heads, d_model // n_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_heads, -1).transpose(1, 2)
        k = k.view(B, T, self.n_heads, -1).transpose(1, 2)
        v = v.view(B, T, self.n_heads, -1).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)), dim=-1)
        y = att @ v
        heads = [y[:, h] @ self.mix[h] for h in range(self.n_heads)]
        return torch.stack(heads, dim=1).transpose(1, 2).reshape(B, T, C)


def main() -> None:
    model = Block()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 32, 64)
    with matlint.guard(window=2):
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()


if __name__ == "__main__":
    main()
