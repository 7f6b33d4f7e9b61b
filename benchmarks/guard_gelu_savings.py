"""MAT605 at run time: the guard's estimate of replacing a written-out tanh GELU with
`F.gelu(x, approximate="tanh")` against the measured gain of that fix, applied for real.

A stack of GPT-style MLP blocks (LayerNorm, Linear(d, 4d), the activation, Linear(4d, d),
residual) trained with AdamW, the activation written out as
`0.5 * h * (1 + tanh(sqrt(2 / pi) * (h + 0.044715 * h ** 3)))` or as `F.gelu(h, approximate="tanh")`,
in bf16 autocast and in fp32, at a GPT-2 size and at a small, launch-bound size. Each case: the
guard's MAT605 findings and the sum of their estimates, then the two steps timed in alternating
pairs (savings.time_pair).

    python benchmarks/guard_gelu_savings.py [--runs 2] [--out benchmarks/results/guard_gelu_savings.md]
"""
from __future__ import annotations

import argparse
import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from matlint.runtime_guard import guard, savings


class Block(nn.Module):
    def __init__(self, d, written_out):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.written_out = written_out

    def forward(self, x):
        h = self.fc(self.ln(x))
        if self.written_out:
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.proj(h)


def make_step(device, layers, d, batch, seq, bf16, written_out):
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(d, written_out) for _ in range(layers)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, d, device=device)

    def step():
        ctx = torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


CASES = {  # name: (layers, d, batch, seq, bf16)
    "GPT-2 MLP x4 (d768, B8 S512), bf16": (4, 768, 8, 512, True),
    "GPT-2 MLP x4 (d768, B8 S512), fp32": (4, 768, 8, 512, False),
    "small MLP x4 (d128, B4 S64), bf16": (4, 128, 4, 64, True),
}


def run_case(device, layers, d, batch, seq, bf16):
    savings._cache.clear()
    step = make_step(device, layers, d, batch, seq, bf16, True)
    g = guard(json_path=None, report=False)
    with g:
        for _ in range(12):
            step()
    found = [f for f in g.findings if f.code == "MAT605"]
    estimate = sum(f.estimated_savings_ms or 0.0 for f in found)
    gain = savings.time_pair(step, make_step(device, layers, d, batch, seq, bf16, False), device, max_s=5.0)
    return found, estimate, g.step_ms[0] or float("nan"), gain


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", default=None, help="comma-separated case names; default all")
    ap.add_argument("--out")
    args = ap.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    lines = [f"torch {torch.__version__}, {name}; times in ms per step", "",
             "| case | run | MAT605 findings | estimate | plain step | measured gain (interval) | estimate / gain |",
             "|---|---|---|---|---|---|---|"]
    wanted = set(args.cases.split(",")) if args.cases else None
    for case, spec in CASES.items():
        if wanted and case not in wanted:
            continue
        for run in range(1, args.runs + 1):
            found, estimate, step_ms, gain = run_case(args.device, *spec)
            ratio = estimate / gain.saved_ms if gain.saved_ms > 0 else float("nan")
            lines.append(f"| {case} | {run} | {len(found)} | {estimate:.4f} | {step_ms:.3f} | "
                         f"{gain.saved_ms:.4f} ({gain.lo_ms:.4f}–{gain.hi_ms:.4f}) | {ratio:.2f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
