"""Per-op cost of an empty dispatch mode and of the guard's recording, on an MLP's fwd+bwd,
followed by a cProfile of the recording: `python benchmarks/guard_perop.py`."""
import cProfile
import pstats
import sys
import time

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from matlint.runtime_guard.capture import CaptureMode, Recorder

model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])
x = torch.randn(4, 32)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10


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
    us_per_step()
# Interleaved rounds, best of each: this CPU is shared and noisy, the minimum is the stable number.
recorder = Recorder()
plain, guarded, mode_only = [], [], []
for _ in range(ROUNDS):
    plain.append(us_per_step(100))
    recorder.modules.install()
    recorder.enabled = True
    with CaptureMode(recorder):
        us_per_step(10)
        guarded.append(us_per_step(100))
    recorder.enabled = False  # the same mode, recording nothing: the dispatch mode's own cost
    with CaptureMode(recorder):
        us_per_step(10)
        mode_only.append(us_per_step(100))
    recorder.modules.remove()
plain, guarded, mode_only = min(plain), min(guarded), min(mode_only)
print(f"{ops} ops per step; plain {plain / ops:.2f} µs/op; empty mode +{(mode_only - plain) / ops:.2f} µs/op; "
      f"guard +{(guarded - plain) / ops:.2f} µs/op (recording alone +{(guarded - mode_only) / ops:.2f} µs/op); "
      f"best of {ROUNDS} rounds")
recorder.modules.install()
recorder.enabled = True
profiler = cProfile.Profile()
with CaptureMode(recorder):
    profiler.enable()
    us_per_step(100)
    profiler.disable()
recorder.modules.remove()
pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
