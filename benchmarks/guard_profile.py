"""Where the guard's time goes on GPT-2 124M (SDPA): per-step CPU issue time against the GPU step
(is the step CPU-bound?), the cold warm-up step, op counts, and a cProfile of observed steps.

    python benchmarks/guard_profile.py [--no-profile]
"""
import cProfile
import gc
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from guard_overhead import EmptyMode, gpt2_task, sync, trainer  # noqa: E402

import matlint.runtime_guard as rg  # noqa: E402


def issue_and_wall(step, n, ctx=None, first=None):
    """(median ms until step() returns, median ms until the device is done) over n steps."""
    issue, wall = [], []
    if ctx is not None:
        ctx.__enter__()
    try:
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            step()
            issue.append((time.perf_counter() - t0) * 1e3)
            sync()
            wall.append((time.perf_counter() - t0) * 1e3)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    if first is not None:
        first.extend(wall[:1])
    return statistics.median(issue[1:] or issue), statistics.median(wall[1:] or wall)


def main():
    cuda = torch.cuda.is_available()
    model, loss_fn = gpt2_task("sdpa", quick=not cuda, bf16=cuda)
    step = trainer(model, loss_fn)
    issue_and_wall(step, 3)
    rows = {}
    rows["plain"] = issue_and_wall(step, 10)
    rows["empty mode"] = issue_and_wall(step, 6, EmptyMode())
    warm = []
    g = rg.guard(window=6, warmup=1, json_path=None, report=False, estimate_savings=False)
    rows["guard observed"] = issue_and_wall(step, 6, g, first=warm)
    plain_wall = rows["plain"][1]
    for name, (iss, wall) in rows.items():
        print(f"{name:16s} issue {iss:7.2f} ms  wall {wall:7.2f} ms  ({wall / plain_wall:.3f}x)")
    print(f"guard warm-up (cold) step wall {warm[0]:.2f} ms ({warm[0] / plain_wall:.3f}x)")
    rec = g.recorder.rec
    ops = sum(s.count for s in rec.ops.values()) / max(rec.steps, 1)
    bwd = sum(s.count for k, s in rec.ops.items() if k.backward) / max(rec.steps, 1)
    print(f"recorded (non-view) ops per step {ops:.0f} (backward {bwd:.0f}), keys {len(rec.ops)}, steps {rec.steps}")

    class Count(EmptyMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    print(f"dispatched ops per step (views included) {Count.n}")
    # the default guard, step by step: where its extra time goes over a run; full garbage
    # collections (gen 2) during each run are listed, plain and guarded, to see whether a slow
    # step after the window is one
    collections = []
    gc_start = {}

    def on_gc(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            gc_start["t"] = time.perf_counter()
        else:
            collections.append((time.perf_counter() - gc_start.pop("t", time.perf_counter())) * 1e3)

    gc.callbacks.append(on_gc)
    for attempt in range(2):
        del collections[:]
        plain = [issue_and_wall(step, 2)[1] for _ in range(5)]
        plain_gcs = list(collections)
        del collections[:]
        t0 = time.perf_counter()
        g = rg.guard(json_path=None, report=False, estimate_savings=False)
        g.__enter__()
        enter_ms = (time.perf_counter() - t0) * 1e3
        walls = []
        for _ in range(8):
            sync()
            t1 = time.perf_counter()
            step()
            sync()
            walls.append((time.perf_counter() - t1) * 1e3)
        t1 = time.perf_counter()
        g.__exit__(None, None, None)
        exit_ms = (time.perf_counter() - t1) * 1e3
        base = statistics.median(plain)
        print(f"default guard run {attempt}: enter {enter_ms:.2f} ms, steps (x plain {base:.2f} ms): "
              + " ".join(f"{w / base:.2f}" for w in walls) + f"; exit {exit_ms:.1f} ms; extra over 8 steps "
              f"{sum(walls) - 8 * base + enter_ms:.1f} ms; full collections (ms): plain 10 steps "
              f"{[round(c, 1) for c in plain_gcs]}, guarded 8 steps {[round(c, 1) for c in collections]}")
    gc.callbacks.remove(on_gc)
    if "--no-profile" in sys.argv:
        return
    g = rg.guard(window=50, warmup=0, json_path=None, report=False, estimate_savings=False)
    with g:
        issue_and_wall(step, 1)
        prof = cProfile.Profile()
        prof.enable()
        issue_and_wall(step, 2)
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
