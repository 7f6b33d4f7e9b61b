"""On a CUDA GPU: a GQA decoder block whose SDPA call (fp32, enable_gqa=True) runs the math backend.
The guard's MAT601 finding at that call (what lets a fused kernel run) and its estimate, against
the measured gain of the whole training step with the K/V heads repeated before the call.

    python benchmarks/guard_sdpa_backend.py
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from matlint.runtime_guard import guard

B, S, H, KV, D, E = 8, 1024, 16, 4, 64, 1024


class GqaBlock(nn.Module):
    def __init__(self, expand=False):
        super().__init__()
        self.expand = expand
        self.q, self.kv, self.o = nn.Linear(E, H * D), nn.Linear(E, 2 * KV * D), nn.Linear(H * D, E)

    def forward(self, x):
        q = self.q(x).view(B, S, H, D).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, KV, D).permute(2, 0, 3, 1, 4)
        if self.expand:
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not self.expand)
        return self.o(y.transpose(1, 2).reshape(B, S, -1))


def step_ms(model, opt, x, n=20):
    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def main():
    torch.manual_seed(0)
    x = torch.randn(B, S, E, device="cuda")
    model = GqaBlock().cuda()
    opt = torch.optim.AdamW(model.parameters())
    g = guard(json_path=None, report=False, select=["MAT601"])
    with g:
        for _ in range(6):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for f in g.findings:
        print(f.message)
        print("estimate", f.estimated_savings_ms, f.evidence.get("estimate_interval_ms"), f.evidence.get("estimate_method"))
    fixed = GqaBlock(expand=True).cuda()
    fixed.load_state_dict(model.state_dict())
    gains = []
    for _ in range(3):  # alternating, as written then fixed
        a = step_ms(model, opt, x)
        b = step_ms(fixed, torch.optim.AdamW(fixed.parameters()), x)
        gains.append(a - b)
        print(f"step as written {a:.3f} ms, K/V repeated before the call {b:.3f} ms, gain {a - b:.3f} ms")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: median gain {sorted(gains)[1]:.3f} ms/step")


if __name__ == "__main__":
    main()
