"""A multi-head attention block that issues its GEMMs one head at a time."""
import math

import torch
import torch.nn as nn


class LoopedAttention(nn.Module):
    def __init__(self, d_model: int = 512, n_heads: int = 8):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_heads, self.d_head).transpose(1, 2)
        k = k.view(B, T, self.n_heads, self.d_head).transpose(1, 2)
        v = v.view(B, T, self.n_heads, self.d_head).transpose(1, 2)
        heads = []
        for h in range(self.n_heads):
            scores = torch.einsum("btd,bsd->bts", q[:, h], k[:, h]) / math.sqrt(self.d_head)
            heads.append(torch.einsum("bts,bsd->btd", scores.softmax(-1), v[:, h]))
        y = torch.stack(heads, dim=1).transpose(1, 2).reshape(B, T, C)
        return self.out(y)


def project_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Applies w to every row of x, one matmul per row."""
    out = torch.empty(x.size(0), x.size(1), w.size(1))
    for i in range(x.size(0)):
        out[i] = x[i] @ w
    return out
