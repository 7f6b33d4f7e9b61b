"""The same step with the guard's fixes applied: SDPA, and one einsum over all heads."""
import torch
import torch.nn as nn
import torch.nn.functional as F

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
        y = F.scaled_dot_product_attention(q, k, v)
        y = torch.einsum("bhtd,hde->bhte", y, self.mix)
        return y.transpose(1, 2).reshape(B, T, C)


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
