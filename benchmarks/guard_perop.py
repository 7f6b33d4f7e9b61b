"""Per-op cost of the guard's dispatch mode and recording on a small MLP (fwd+bwd), with a cProfile."""
import torch, time, sys
from matlint.runtime_guard.capture import CaptureMode, Recorder
import torch.nn as nn
m = nn.Sequential(*[nn.Linear(32,32) for _ in range(8)])
x = torch.randn(4,32)
def run(n=200):
    t0=time.perf_counter()
    for i in range(n): m(x).sum().backward()
    return (time.perf_counter()-t0)/n*1e6
from collections import Counter
cnt = Counter()
class C(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(s, f, t, a=(), k=None):
        cnt[0]+=1; return f(*a, **(k or {}))
with C(): m(x).sum().backward()
nops = cnt[0]
for _ in range(3): base = run()
r = Recorder(); r.modules.install()
with CaptureMode(r): run(); g = run()
r.enabled=False
with CaptureMode(r): run(); e = run()
print(f"{nops} ops/iter; plain {base/nops:.2f}us/op; mode-only +{(e-base)/nops:.2f}; guard +{(g-base)/nops:.2f}us/op")
r.enabled=True
import cProfile, pstats
with CaptureMode(r):
    cProfile.run("run(100)", "/tmp/guard_perop.prof")
pstats.Stats("/tmp/guard_perop.prof").sort_stats("tottime").print_stats(14)
