"""Where an observed step's extra time goes, per model of guard_overhead_six.py: the guard taken
apart into its mechanisms, each timed alone on the same model (median of steps, x plain).

    python benchmarks/guard_ablation.py [--quick] [--models WORDS] [--profile WORDS] [--out DIR]

Variants (each a context around the steps):
  hooks (no-op)    global forward pre/post hooks that do nothing
  guard hooks      the guard's module-path hooks (ModulePaths) alone
  mode, no record  the guard's dispatch mode recording nothing, the backward pass unobserved as
                   the guard runs it (the floor of a Python dispatch mode over forward + optimizer)
  mode + hooks     both, recording nothing
  guard observing  the whole guard, observing every step (window=50, warmup=0)
Also the step's CPU issue time (until step() returns) against its wall time (is it CPU-bound?),
dispatched ops and module calls per step, and, for models named in --profile, a cProfile of
observed steps (written to DIR/profile_<model>.txt).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guard_overhead_six as six  # noqa: E402

import matlint.runtime_guard as rg  # noqa: E402
from matlint.runtime_guard.capture import (CaptureMode, ModulePaths, Recorder,  # noqa: E402
                                           hold_backward_engine, release_backward_engine)


@contextlib.contextmanager
def guard_hooks():
    mp = ModulePaths()
    mp.install()
    try:
        yield
    finally:
        mp.remove()


@contextlib.contextmanager
def mode_no_record(hooks: bool):
    rec = Recorder(profile_cuda=False)
    rec.enabled = False
    if hooks:
        rec.modules.install()
    hold_backward_engine(rec)
    try:
        with CaptureMode(rec):
            yield
    finally:
        release_backward_engine(rec)
        rec.modules.remove()


def issue_wall(step, n, ctx=None):
    issue, wall = [], []
    with ctx if ctx is not None else contextlib.nullcontext():
        for _ in range(n):
            six.sync()
            t0 = time.perf_counter()
            step()
            issue.append((time.perf_counter() - t0) * 1e3)
            six.sync()
            wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(issue[2:]), statistics.median(wall[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--profile", default="", help="comma-separated words: cProfile these models' observed steps")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="/tmp")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    pwords = [w.strip().lower() for w in args.profile.split(",") if w.strip()]
    lines = ["| model, precision | plain ms (CPU issue ms) | hooks (no-op) | guard hooks | mode, no record | "
             "mode + hooks | guard observing (issue ms) | ops/step | modules/step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mname, make in six.MODELS.items():
        if words and not any(w in mname.lower() for w in words):
            continue
        for prec in args.precisions.split(","):
            name = f"{mname}, {prec}"
            torch.manual_seed(0)
            model, loss_fn = make(args.quick, prec == "bf16")
            step = six.trainer(model, loss_fn)
            six.timed(step, 3)
            n = args.steps
            gc.collect()
            p_issue, p_wall = issue_wall(step, n)
            cols = {}
            for vname, ctx in (("hooks", six.module_hooks), ("guard hooks", guard_hooks),
                               ("mode", lambda: mode_no_record(False)), ("mode+hooks", lambda: mode_no_record(True))):
                gc.collect()
                cols[vname] = issue_wall(step, n, ctx())
            gc.collect()
            g = rg.guard(window=50, warmup=0, json_path=None, report=False, estimate_savings=False)
            with g:
                gi, gw = issue_wall(step, n)
                rec = g.recorder.rec
                ops = sum(s.count for s in rec.ops.values()) / max(rec.steps, 1)
                if pwords and any(w in mname.lower() for w in pwords):
                    prof = cProfile.Profile()
                    prof.enable()
                    issue_wall(step, 3)
                    prof.disable()
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
                    fname = "profile_" + "".join(c if c.isalnum() else "_" for c in name)[:40] + ".txt"
                    with open(os.path.join(args.out, fname), "w") as fh:
                        fh.write(s.getvalue())
            counter = {"n": 0}
            from torch.nn.modules import module as nn_module

            h = nn_module.register_module_forward_pre_hook(lambda m, a: counter.__setitem__("n", counter["n"] + 1))
            step()
            h.remove()
            x = lambda v: f"{v[1] / p_wall:.2f}×"
            lines.append(f"| {name} | {p_wall:.2f} ({p_issue:.2f}) | {x(cols['hooks'])} | {x(cols['guard hooks'])} | "
                         f"{x(cols['mode'])} | {x(cols['mode+hooks'])} | {gw / p_wall:.2f}× ({gi:.2f}) | "
                         f"{ops:.0f} | {counter['n']} |")
            print(lines[-1], flush=True)
            del model, step, loss_fn, g
            gc.collect()
            if six.DEVICE == "cuda":
                torch.cuda.empty_cache()
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "guard_ablation.md"), "w") as fh:
        fh.write(table)
    print(table)


if __name__ == "__main__":
    main()
