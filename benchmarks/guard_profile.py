"""Where the guard's per-op time goes on one observed GPT-2 step (cProfile), and per-op costs."""
import cProfile
import pstats
import sys

import torch

sys.path.insert(0, "benchmarks")
from guard_overhead import gpt2_task, timed_steps, trainer  # noqa: E402

import matlint.runtime_guard as rg  # noqa: E402

model, loss_fn = gpt2_task("sdpa", quick=not torch.cuda.is_available(), bf16=torch.cuda.is_available())
step = trainer(model, loss_fn)
timed_steps(step, 3)
g = rg.guard(window=50, warmup=0, json_path=None, report=False, estimate_savings=False)
with g:
    timed_steps(step, 1)
    prof = cProfile.Profile()
    prof.enable()
    timed_steps(step, 2)
    prof.disable()
rec = g.recorder.rec
print("ops per step", sum(s.count for s in rec.ops.values()) / max(rec.steps, 1), "keys", len(rec.ops))
pstats.Stats(prof).sort_stats("tottime").print_stats(25)
