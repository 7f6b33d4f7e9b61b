"""Per-op cost of an empty dispatch mode and of the guard's recording, on an MLP's fwd+bwd,
followed by a cProfile of the recording: `python benchmarks/guard_perop.py`."""
import cProfile
import pstats
import time

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from matlint.runtime_guard.capture import CaptureMode, Recorder

model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])
x = torch.randn(4, 32)


def step():
    model(x).sum().backward()


def us_per_step(n=200):
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n * 1e6


class Counting(TorchDispatchMode):
    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Counting.ops += 1
        return func(*args, **(kwargs or {}))


with Counting():
    step()
ops = Counting.ops
for _ in range(3):
    plain = us_per_step()
recorder = Recorder()
recorder.modules.install()
with CaptureMode(recorder):
    us_per_step()
    guarded = us_per_step()
recorder.enabled = False  # the same mode, recording nothing: the dispatch mode's own cost
with CaptureMode(recorder):
    us_per_step()
    mode_only = us_per_step()
print(f"{ops} ops per step; plain {plain / ops:.2f} µs/op; empty mode +{(mode_only - plain) / ops:.2f} µs/op; "
      f"guard +{(guarded - plain) / ops:.2f} µs/op")
recorder.enabled = True
profiler = cProfile.Profile()
with CaptureMode(recorder):
    profiler.enable()
    us_per_step(100)
    profiler.disable()
recorder.modules.remove()
pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
