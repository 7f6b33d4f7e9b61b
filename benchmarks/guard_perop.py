"""Per-op cost of the runtime guard on small CPU models, where Python dispatch dominates a step
(issue 26, item 6), followed by a cProfile of the observed steps:

    python benchmarks/guard_perop.py [--rounds 7] [--window 20] [--models mlp,gpt,cnn]
                                     [--profile gpt] [--baseline DIR]

Models (random weights, AdamW with foreach as on CUDA; one step = zero_grad + forward + loss +
backward + step, as in guard_overhead_six.py): an MLP of 8 Linear(32, 32) layers (batch 4), a 2-layer GPT built from plain
torch.nn with hand-written causal attention (d 32, 2 heads, batch 2 x 16 tokens), and a small CNN
(guard_overhead_six.SmallResNet on 2 x 3 x 8 x 8).

Per model, ROUNDS rounds (alternating which goes first), each of `guard_overhead_six.one_run`:
WINDOW + 6 plain steps, and as many under `matlint.guard(window=WINDOW)` (report, JSON and
savings estimates off): a warm-up step, WINDOW observed steps, plain steps after the window. observed x = median observed step after the warm-up step / median plain
step, in the same process, each step timed by the thread's CPU time; per-op µs = (median observed - median plain) / the ops the guard's
dispatch mode sees per step (backward passes run without it, see capture.py; all dispatched ops,
backward included, are shown too). Medians over the rounds, with their spread (min-max). Also per
round: the guard's dispatch mode and module hooks with nothing recorded (what torch's Python dispatch
costs before any of the guard's work).
With --baseline DIR (a copy of runtime_guard/, e.g. the code before a change) that copy is timed in
the same rounds, interleaved, for a before/after comparison on one machine state.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import os
import pstats
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import matlint.runtime_guard as rg
from matlint.runtime_guard.capture import (CaptureMode, Recorder, hold_backward_engine,
                                           release_backward_engine)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guard_overhead_six as six  # noqa: E402
import guard_overhead  # noqa: E402
from guard_overhead import med  # noqa: E402


def trainer(model, loss_fn):
    """AdamW's multi-tensor (foreach) step, as it runs on CUDA: on the CPU the default is a loop over
    the parameters, a dozen ops each, which would make the optimizer most of a step's ops."""
    return guard_overhead.trainer(model, loss_fn, foreach=True)


# -- models -----------------------------------------------------------------------------------------
def mlp():
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])
    x = torch.randn(4, 32)
    return model, lambda m: m(x).sum()


class Block(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        scores = scores.masked_fill(~self.causal[:s, :s], float("-inf"))
        att = self.drop(F.softmax(scores, dim=-1))
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=2, layers=2, seq=16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, seq) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpt():
    model = TinyGPT()
    ids = torch.randint(0, 64, (2, 17))
    return model, lambda m: F.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


def cnn():
    model = six.SmallResNet()
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 1000, (2,))
    return model, lambda m: F.cross_entropy(m(x), y)


MODELS = {"mlp": ("MLP 8x Linear(32) (B4)", mlp), "gpt": ("tiny GPT 2L/d32, hand-written attention (B2 S16)", gpt),
          "cnn": ("small CNN (SmallResNet, B2 8px)", cnn)}


# -- measurement -------------------------------------------------------------------------------------
class _Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


class _CountingCapture(CaptureMode):
    """The guard's dispatch mode, counting instead of recording: taken off for backward passes as it is."""
    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        _CountingCapture.ops += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(step) -> tuple:
    """(ops the guard's mode sees, all dispatched ops) in one step."""
    with _Counting() as counting:
        step()
    _CountingCapture.ops = 0
    recorder = Recorder(profile_cuda=False)
    hold_backward_engine(recorder)
    try:
        with _CountingCapture(recorder):
            step()
    finally:
        release_backward_engine(recorder)
    return _CountingCapture.ops, counting.ops


@contextlib.contextmanager
def unrecording():
    """The guard's dispatch mode and module hooks with its recorder off: what observing costs before
    any recording (the floor the recording adds to)."""
    recorder = Recorder(profile_cuda=False)
    recorder.enabled = False
    recorder.modules.install()
    hold_backward_engine(recorder)
    try:
        with CaptureMode(recorder):
            yield
    finally:
        release_backward_engine(recorder)
        recorder.modules.remove()


def windowed(guard_mod, window):
    """`guard_mod` with its guard observing `window` steps after the warm-up step (for one_run)."""
    return types.SimpleNamespace(guard=functools.partial(guard_mod.guard, window=window))


def measure(step, seen_ops, guard_mods, rounds, window) -> tuple:
    steps = window + 6  # the warm-up step, the window, and plain steps after it
    rows = {name: {"plain_ms": [], "observed_ms": [], "observed_x": [], "us_per_op": [], "findings": None}
            for name in guard_mods}
    floor = []
    for i in range(rounds):
        plain = med(six.timed(step, steps))
        floor.append((med(six.timed(step, steps, unrecording())[1:]) - plain) * 1e3 / seen_ops)
        for name, mod in guard_mods.items():
            r = six.one_run(step, steps, windowed(mod, window), guard_first=bool(i % 2))
            row = rows[name]
            observed = r["observed_x"] * r["plain_ms"]
            row["plain_ms"].append(r["plain_ms"])
            row["observed_ms"].append(observed)
            row["observed_x"].append(r["observed_x"])
            row["us_per_op"].append((observed - r["plain_ms"]) * 1e3 / seen_ops)
            if row["findings"] not in (None, r["findings"]):
                row["findings_vary"] = True
            row["findings"] = r["findings"]
    return rows, floor


def profile(step, window, top):
    g = rg.guard(window=window + 1, json_path=None, report=False, estimate_savings=False)
    profiler = cProfile.Profile()
    with g:
        step()  # the warm-up step
        profiler.enable()
        for _ in range(window):
            step()
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def fmt(xs, d=2):
    return f"{med(xs):.{d}f} ({min(xs):.{d}f}-{max(xs):.{d}f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--window", type=int, default=20, help="observed steps per round after the warm-up step")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--profile", default="gpt", help="models to cProfile (comma-separated; '' for none)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--baseline", default="", help="directory of another copy of runtime_guard to time too")
    args = ap.parse_args()
    # This host's cores are shared: one thread, timed by its own CPU time, is the steadier number
    # (wall time counts whatever else ran on the core meanwhile).
    torch.set_num_threads(1)
    six.STEP_CLOCK = time.thread_time
    guard_mods = {"guard": rg}
    if args.baseline:
        guard_mods = {"baseline": six.load_baseline(args.baseline), "guard": rg}
    print(f"cpu (one thread, its CPU time), torch {torch.__version__}, Python {sys.version.split()[0]}; "
          f"{args.rounds} rounds, {args.window} observed steps each; medians (min-max)\n")
    print("| model | ops seen / all | guard | plain ms | observed ms | observed x | guard µs/op |")
    print("|---|---|---|---|---|---|---|")
    findings, floors = {}, {}
    for key in args.models.split(","):
        label, make = MODELS[key]
        torch.manual_seed(0)
        model, loss_fn = make()
        step = trainer(model, loss_fn)
        six.timed(step, 5)  # warm-up
        seen, total = ops_per_step(step)
        rows, floor = measure(step, seen, guard_mods, args.rounds, args.window)
        floors[key] = floor
        for name, r in rows.items():
            print(f"| {label} | {seen} / {total} | {name} | {fmt(r['plain_ms'], 3)} | {fmt(r['observed_ms'], 3)} | "
                  f"{fmt(r['observed_x'])} | {fmt(r['us_per_op'], 1)} |", flush=True)
            if name == "guard":  # a baseline copy's findings are not made: the rules register with the installed guard
                findings[key] = r["findings"], r.get("findings_vary", False)
    print()
    for key, floor in floors.items():
        print(f"{key}: the mode and module hooks alone, recording nothing, cost {fmt(floor, 1)} µs/op")
    for key, (found, vary) in findings.items():
        print(f"findings {key}: {', '.join(found) or 'none'}{' (VARY between rounds)' if vary else ''}")
    for key in filter(None, args.profile.split(",")):
        torch.manual_seed(0)
        model, loss_fn = MODELS[key][1]()
        step = trainer(model, loss_fn)
        six.timed(step, 5)
        print(f"\n== cProfile of {args.window} observed steps: {MODELS[key][0]}")
        profile(step, args.window, args.top)


if __name__ == "__main__":
    main()
