"""The guard's savings estimates against the measured gain of each fix, applied for real, on CPU.

For each model: run it under the guard (estimates on), then time a training step of the original
and of the fixed model in alternating pairs (savings.time_pair). Repeated `--runs` times with the
estimate cache cleared, to show how much an estimate moves run to run.

    python benchmarks/guard_savings_cpu.py [--runs 3] [--out benchmarks/results/guard_savings_cpu.md]
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from matlint.runtime_guard import guard, savings


class SharedLinear(nn.Module):
    """MAT101, one weight: 32 calls of one Linear; fixed: one call on the stacked inputs."""

    def __init__(self, fixed=False):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.fixed = nn.Linear(256, 256), fixed

    def forward(self, xs):
        if self.fixed:
            return self.lin(xs.flatten(0, 1)).view(xs.shape[0], xs.shape[1], -1)
        return torch.stack([self.lin(x) for x in xs])


class PerItem(nn.Module):
    """MAT101, different weights: x[i] @ w[i] in a loop; fixed: one bmm."""

    def __init__(self, fixed=False):
        super().__init__()
        torch.manual_seed(0)
        self.w, self.fixed = nn.Parameter(torch.randn(32, 128, 128) / 12), fixed

    def forward(self, xs):
        if self.fixed:
            return torch.bmm(xs, self.w)
        return torch.stack([xs[i] @ self.w[i] for i in range(len(xs))])


class PaddedAttention(nn.Module):
    """MAT601 with a padding mask; fixed: the SDPA call the guard writes (attn_mask=~mask)."""

    def __init__(self, fixed=False, heads=8, d=256):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.heads, self.fixed = nn.Linear(d, 3 * d), heads, fixed

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        mask = torch.zeros(b, 1, 1, s, dtype=torch.bool)
        mask[0, ..., -s // 4:] = True  # padding in the first sequence
        if self.fixed:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            out = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
        return out.transpose(1, 2).reshape(b, s, d)


CASES = {
    "shared Linear x32 (MAT101)": (SharedLinear, lambda: torch.randn(32, 16, 256), "MAT101"),
    "per-item matmul x32 (MAT101)": (PerItem, lambda: torch.randn(32, 16, 128), "MAT101"),
    "padded attention (MAT601)": (PaddedAttention, lambda: torch.randn(4, 256, 256), "MAT601"),
}


def step_fn(model, x):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def run_case(name, runs):
    cls, make_input, code = CASES[name]
    x = make_input()
    rows = []
    for _ in range(runs):
        savings._cache.clear()
        model = cls()
        step = step_fn(model, x)
        g = guard(json_path=None, report=False)
        with g:
            for _ in range(12):
                step()
        [f] = [f for f in g.findings if f.code == code]
        gain = savings.time_pair(step, step_fn(cls(fixed=True), x), "cpu", max_s=2.0)
        rows.append((f.estimated_savings_ms, f.evidence["estimate_interval_ms"], f.evidence["estimate_reliable"],
                     g.step_ms[0], gain))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(4)
    lines = [f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; times in ms per step", "",
             "| model | run | estimate | interval | reliable | plain step | measured gain (interval) | estimate / gain |",
             "|---|---|---|---|---|---|---|---|"]
    for name in CASES:
        for i, (est, (lo, hi), reliable, step_ms, gain) in enumerate(run_case(name, args.runs), 1):
            lines.append(f"| {name} | {i} | {est:.3f} | {lo:.3f}–{hi:.3f} | {'yes' if reliable else 'no'} | "
                         f"{step_ms:.3f} | {gain.saved_ms:.3f} ({gain.lo_ms:.3f}–{gain.hi_ms:.3f}) | "
                         f"{est / gain.saved_ms if gain.saved_ms > 0 else float('nan'):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
