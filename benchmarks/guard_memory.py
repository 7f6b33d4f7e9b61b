"""Memory of the runtime guard over many observed steps: every step is observed (the window never
closes) and, from step `--start` on, the live Python allocations are sampled: with tracemalloc
(default) those made by matlint's runtime_guard files and all of them, with `--blocks` (much
faster: tracemalloc slows every allocation) the interpreter's allocated block count. Each model
also runs without the guard, for the growth torch itself shows. RSS is sampled too.

    python benchmarks/guard_memory.py [--steps 10000] [--start 1000] [--every 1000] [--models mlp transformer] [--blocks]

The guard-file figure includes objects that torch allocates while the dispatch handler calls the
op (the handler is the innermost Python frame then): compare the all-allocations growth with the
unguarded run's to see what the guard adds.

Models (CPU): `mlp` (two Linear layers, dropout, AdamW; three batch sizes in turn) and
`transformer` (embedding, one encoder layer, head, AdamW; four sequence lengths in turn, so new
shapes and call sites keep appearing as long as the cycle runs). Prints one line per sample and
exits 1 when the guard's allocations grew by more than `--limit-kib` between the first and last
sample.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc

import torch
import torch.nn as nn
import torch.nn.functional as F

from matlint.runtime_guard import guard
import matlint.runtime_guard.capture as capture

GUARD_FILES = tracemalloc.Filter(True, os.path.join(os.path.dirname(capture.__file__), "*"))


def rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def guard_bytes() -> int:
    gc.collect()
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([GUARD_FILES]).traces)


class TinyTransformer(nn.Module):
    def __init__(self, vocab=100, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.block(self.emb(x)))


def make_mlp():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 4))
    batches = [torch.randn(n, 16) for n in (4, 6, 8)]

    def step(i):
        return model(batches[i % 3]).square().mean()
    return model, step


def make_transformer():
    model = TinyTransformer()
    batches = [torch.randint(0, 100, (2, s)) for s in (8, 12, 16, 20)]

    def step(i):
        x = batches[i % 4]
        return F.cross_entropy(model(x).flatten(0, 1), x.flatten())
    return model, step


MODELS = {"mlp": make_mlp, "transformer": make_transformer}


def run(name: str, steps: int, start: int, every: int, guarded: bool, blocks: bool) -> dict:
    import contextlib

    torch.manual_seed(0)
    model, loss_of = MODELS[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = guard(window=steps + 1, warmup=0, json_path=None, report=False, estimate_savings=False)
    samples = []
    label = f"{name} {'guarded' if guarded else 'unguarded'}"
    t0 = time.perf_counter()
    try:
        with g if guarded else contextlib.nullcontext():
            for i in range(steps + 1):
                if i == max(start - 100, 0) and not blocks:  # allocations before tracing are not seen
                    tracemalloc.start()
                if i >= start and (i - start) % every == 0:
                    gc.collect()
                    sample = {"step": i, "rss_kib": rss_kib(), "keys": len(g.recorder.rec.ops),
                              "seq_sites": len(g.recorder._seq_sites), "elapsed_s": round(time.perf_counter() - t0, 1)}
                    if blocks:
                        sample["blocks"] = sys.getallocatedblocks()
                        shown = f"allocated blocks {sample['blocks']:10,}"
                    else:
                        sample["guard_bytes"] = guard_bytes()
                        sample["traced_bytes"] = tracemalloc.get_traced_memory()[0]
                        shown = f"guard files {sample['guard_bytes']:9,} B  all {sample['traced_bytes']:11,} B"
                    samples.append(sample)
                    print(f"{label:22} step {i:6}: {shown}  RSS {sample['rss_kib']:8,} KiB  keys {sample['keys']:4}  "
                          f"seq sites {sample['seq_sites']:5}  {sample['elapsed_s']:7.1f} s", flush=True)
                if i == steps:
                    break
                opt.zero_grad()
                loss_of(i).backward()
                opt.step()
    finally:
        tracemalloc.stop()
    first, last = samples[0], samples[-1]
    growth = {key: last[key] - first[key] for key in ("guard_bytes", "traced_bytes", "blocks", "rss_kib") if key in first}
    return {"model": name, "guarded": guarded, "steps": steps, "from_step": first["step"], "errors": g.errors,
            "growth": growth, "samples": samples}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--start", type=int, default=1_000)
    p.add_argument("--every", type=int, default=1_000)
    p.add_argument("--models", nargs="+", default=sorted(MODELS), choices=sorted(MODELS))
    p.add_argument("--blocks", action="store_true", help="count allocated blocks instead of tracing allocations")
    p.add_argument("--limit-kib", type=float, default=64.0,
                   help="most growth of the guard files' allocations accepted (tracemalloc mode)")
    p.add_argument("--json", help="write the results here")
    opts = p.parse_args(argv)
    results = []
    for name in opts.models:
        for guarded in (False, True):
            results.append(run(name, opts.steps, opts.start, opts.every, guarded, opts.blocks))
    ok = True
    for r in results:
        growth = r["growth"]
        if "guard_bytes" in growth and r["guarded"]:
            ok &= growth["guard_bytes"] <= opts.limit_kib * 1024
        ok &= not r["errors"]
        shown = ", ".join(f"{k} {v:+,}" for k, v in growth.items() if r["guarded"] or k != "guard_bytes")
        print(f"{r['model']} {'guarded' if r['guarded'] else 'unguarded'}: steps {r['from_step']}..{r['steps']}: "
              f"growth {shown}; guard errors {len(r['errors'])}")
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
