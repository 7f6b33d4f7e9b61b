"""MAT503 at run time on a GPU: the guard's estimate of making per-step tensors on the device
against the measured gain of that fix, applied for real.

A discriminator step of a GAN (two label fills made on the host and moved each step, as
`torch.ones(b, 1).to(device)`), and the same step with the labels made where they are used
(`torch.ones(b, 1, device=device)`), for a few batch sizes; and a step that uploads one
constant made from Python values each step (`torch.tensor([...]).to(device)`) against the
constant made once. Each: the guard's MAT503 findings and estimates, then both steps timed in
alternating pairs (savings.time_pair).

    python benchmarks/guard_upload_savings.py [--runs 3] [--out benchmarks/results/guard_upload_savings.md]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

from matlint.runtime_guard import guard, savings

DEVICE = "cuda"


def gan_step(batch, fixed):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1)).to(DEVICE)
    opt = torch.optim.Adam(net.parameters(), lr=2e-4)
    criterion = nn.BCEWithLogitsLoss()
    real = torch.randn(batch, 64, device=DEVICE)

    def step():
        if fixed:
            real_label = torch.ones(batch, 1, device=DEVICE)
            fake_label = torch.zeros(batch, 1, device=DEVICE)
        else:
            real_label = torch.ones(batch, 1).to(DEVICE)
            fake_label = torch.zeros(batch, 1).to(DEVICE)
        noise = torch.randn(batch, 64, device=DEVICE)
        loss = criterion(net(real), real_label) + criterion(net(noise), fake_label)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def constant_step(batch, fixed):
    torch.manual_seed(0)
    net = nn.Linear(64, 4).to(DEVICE)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(batch, 64, device=DEVICE)
    once = torch.tensor([0.1, 0.2, 0.3, 0.4]).to(DEVICE)

    def step():
        weights = once if fixed else torch.tensor([0.1, 0.2, 0.3, 0.4]).to(DEVICE)
        (net(x) * weights).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


CASES = {"GAN labels, batch 64": (gan_step, 64), "GAN labels, batch 4096": (gan_step, 4096),
         "constant from Python values": (constant_step, 256)}


def run_case(make, batch):
    savings._cache.clear()
    step = make(batch, False)
    g = guard(json_path=None, report=False)
    with g:
        for _ in range(12):
            step()
    found = [f for f in g.findings if f.code == "MAT503"]
    estimate = sum(f.estimated_savings_ms or 0.0 for f in found)
    gain = savings.time_pair(step, make(batch, True), DEVICE, max_s=3.0)
    return found, estimate, g.step_ms[0] or float("nan"), gain


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    lines = [f"torch {torch.__version__}, {torch.cuda.get_device_name()}; times in ms per step", "",
             "| case | run | MAT503 findings (lines) | estimate | plain step | measured gain (interval) | estimate / gain |",
             "|---|---|---|---|---|---|---|"]
    for name, (make, batch) in CASES.items():
        for run in range(1, args.runs + 1):
            found, estimate, step_ms, gain = run_case(make, batch)
            rows = ", ".join(str(f.row) for f in found) or "none"
            ratio = estimate / gain.saved_ms if gain.saved_ms > 0 else float("nan")
            lines.append(f"| {name} | {run} | {len(found)} ({rows}) | {estimate:.4f} | {step_ms:.3f} | "
                         f"{gain.saved_ms:.4f} ({gain.lo_ms:.4f}–{gain.hi_ms:.4f}) | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
