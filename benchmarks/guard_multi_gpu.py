"""The guard on two GPUs under torchrun (NCCL), with DDP and with FSDP2 (`fully_shard`).

    torchrun --nproc_per_node 2 benchmarks/guard_multi_gpu.py --out DIR [--unfiltered] [--quick]

Per model (an MLP of Linear+BatchNorm blocks, whose buffers DDP broadcasts before every forward; a
6-layer transformer encoder under bf16 autocast) and wrapper (DDP, FSDP2):

1. Findings: rank 0's merged report of a guarded run in which rank 1 alone reads a value on the
   host twice a step (a MAT502 of rank 1 only), with the default options and with `kernels=True`
   (every op observed, backward included). `--unfiltered` runs the same with the guard's filter of
   torch.distributed's own ops switched off: what the wrappers' internals would report.
2. Overhead: the step time (forward, backward, AdamW) plain and under the guard, in rounds that
   alternate which runs first: an observed step's time over a plain step's (medians), the whole
   guarded run's time over the plain run's (default window, STEPS steps), and the time the guard's
   exit took (the report, the merge of the ranks' reports).
3. Safety: the parameters after 3 steps, plain and guarded from the same seeds (bitwise).

Rank 0 writes DIR/guard_multi_gpu[_unfiltered].json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import matlint
from matlint.runtime_guard import capture

STEPS = 40
ROUNDS = 3
CUDA = torch.cuda.is_available()  # else a CPU smoke test with gloo (--quick)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


class BNBlocks(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.BatchNorm1d(d), nn.ReLU()) for _ in range(n))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def models(quick):
    d, n, batch = (64, 4, 16) if quick else (1024, 24, 256)
    dm, layers, seq = (64, 2, 16) if quick else (512, 6, 256)

    def mlp():
        return BNBlocks(d, n), lambda dev: torch.randn(batch, d, device=dev)

    def transformer():
        layer = nn.TransformerEncoderLayer(dm, 8, 4 * dm, batch_first=True, dropout=0.0)
        return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), \
            lambda dev: torch.randn(16, seq, dm, device=dev)

    return {"bn_mlp": mlp, "transformer": transformer}


def shard_units(model):
    if isinstance(model, BNBlocks):
        return list(model.blocks)
    return list(model.layers)


def wrap(model, kind, device):
    model = model.to(device)
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if CUDA else None)
    from torch.distributed.fsdp import fully_shard

    for unit in shard_units(model):
        fully_shard(unit)
    return fully_shard(model)


def build(name, kind, device, rank, quick):
    torch.manual_seed(0)
    model, make_input = models(quick)[name]()
    model = wrap(model, kind, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device)
    gen.manual_seed(1 + rank)
    x0 = make_input(device)

    def step(extra_syncs=False):
        x = torch.randn(x0.shape, device=device, generator=gen)
        with torch.autocast(device.type, torch.bfloat16):
            out = model(x)
        loss = out.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if extra_syncs:
            [loss.item() for _ in range(2)]  # rank 1 only: MAT502 of rank 1
        return loss

    return model, step


def timed(step, n, guard=None):
    """Each step's time (ms), whether the guard observed it, and how long the guard's exit took."""
    times, observed = [], []
    if guard is not None:
        guard.__enter__()
    try:
        for _ in range(n):
            observed.append(guard is not None and guard.recording)
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        t0 = time.perf_counter()
        if guard is not None:
            guard.__exit__(None, None, None)
        exit_ms = (time.perf_counter() - t0) * 1e3
    return times, observed, exit_ms


def findings_run(name, kind, device, rank, quick, **options):
    _, step = build(name, kind, device, rank, quick)
    for _ in range(2):
        step()
    guard = matlint.guard(json_path=None, report=False, estimate_savings=False, **options)
    with guard:
        for _ in range(8):
            step(extra_syncs=rank == 1)
    dist.barrier()
    if rank != 0:
        return None
    return [f"{f.code}@{os.path.basename(f.filename)}:{f.row} ranks {','.join(map(str, f.extra.get('ranks', [])))}"
            f" ({(f.evidence or {}).get('module', '')}: {(f.evidence or {}).get('per_step')}/step)"
            for f in guard.findings]


def overhead_run(name, kind, device, rank, quick):
    _, step = build(name, kind, device, rank, quick)
    for _ in range(5):
        step()
    rows = []
    for r in range(ROUNDS):
        order = ("plain", "guard") if r % 2 == 0 else ("guard", "plain")
        got = {}
        for which in order:
            gc.collect()
            dist.barrier()
            if which == "plain":
                got["plain"] = timed(step, STEPS)[0]
            else:
                guard = matlint.guard(json_path=None, report=False, estimate_savings=False)
                got["guard"], got["observed"], got["exit_ms"] = timed(step, STEPS, guard)
        plain = med(got["plain"])
        obs = [t for t, o in zip(got["guard"], got["observed"]) if o]
        rows.append({"plain_ms": plain, "observed_steps": len(obs),
                     "observed_x": med(obs[1:]) / plain if len(obs) > 1 else None,
                     "whole_run_x": sum(got["guard"]) / sum(got["plain"]), "exit_ms": got["exit_ms"]})
    return rows


def bitwise(name, kind, device, rank, quick):
    def params(guarded):
        model, step = build(name, kind, device, rank, quick)
        with matlint.guard(json_path=None, report=False, estimate_savings=False) if guarded else contextlib.nullcontext():
            for _ in range(3):
                step()
        out = []
        for p in model.parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            out.append(t.detach().clone())
        return out

    a, b = params(False), params(True)
    return all(torch.equal(x, y) for x, y in zip(a, b))


def by_rank(out, name, rank, value):
    """Every rank's `value`, through files in `out` (one node)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f".{name}.rank{rank}.json"), "w") as fh:
        json.dump(value, fh)
    dist.barrier()
    values = []
    for r in range(dist.get_world_size()):
        with open(os.path.join(out, f".{name}.rank{r}.json")) as fh:
            values.append(json.load(fh))
    dist.barrier()
    os.remove(os.path.join(out, f".{name}.rank{rank}.json"))
    return values


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--unfiltered", action="store_true",
                    help="record torch.distributed's own ops as if they were the user's (the guard without its filter)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-overhead", action="store_true")
    ap.add_argument("--findings-only", action="store_true", help="only part 1 (findings)")
    args = ap.parse_args()
    if args.unfiltered:
        capture._DISTRIBUTED_DIRS = (os.sep + "no such dir" + os.sep,)
    dist.init_process_group("nccl" if CUDA else "gloo")
    rank = dist.get_rank()
    if CUDA:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    res = {"device": torch.cuda.get_device_name(device) if CUDA else "cpu", "torch": torch.__version__, "world_size": dist.get_world_size(),
           "unfiltered": args.unfiltered, "rows": {}}
    for name in models(args.quick):
        for kind in ("ddp", "fsdp2"):
            row = {"findings": findings_run(name, kind, device, rank, args.quick),
                   "findings_kernels": findings_run(name, kind, device, rank, args.quick, kernels=True)}
            if not (args.unfiltered or args.findings_only):
                row["bitwise_equal"] = bitwise(name, kind, device, rank, args.quick)
                if not args.no_overhead:
                    row["overhead"] = overhead_run(name, kind, device, rank, args.quick)
            row["overhead_by_rank"] = by_rank(args.out, f"{name}_{kind}", rank, row.get("overhead"))
            res["rows"][f"{name}/{kind}"] = row
            if rank == 0:
                print(name, kind, json.dumps(row, default=str)[:600], flush=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        suffix = "_unfiltered" if args.unfiltered else "_findings" if args.findings_only else ""
        with open(os.path.join(args.out, f"guard_multi_gpu{suffix}.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        print(markdown(res))
    dist.barrier()
    dist.destroy_process_group()


def markdown(res) -> str:
    lines = [f"{res['device']} ×{res['world_size']}, torch {res['torch']}"
             + (" — filter of torch.distributed's ops OFF" if res["unfiltered"] else ""), "",
             "| model/wrapper | findings (rank 0's merged report) | with kernels=True | observed step × | whole run × | exit ms | bitwise |",
             "|---|---|---|---|---|---|---|"]
    for key, row in res["rows"].items():
        ov = row.get("overhead_by_rank") or []
        obs = [r["observed_x"] for rank_rows in ov if rank_rows for r in rank_rows if r["observed_x"]]
        whole = [r["whole_run_x"] for rank_rows in ov if rank_rows for r in rank_rows]
        exit_ms = [r["exit_ms"] for rank_rows in ov if rank_rows for r in rank_rows]
        plain = [r["plain_ms"] for rank_rows in ov[:1] if rank_rows for r in rank_rows]
        def fmt(xs):
            return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" if xs else "-"

        lines.append(f"| {key} (plain {med(plain) if plain else float('nan'):.1f} ms) | {'; '.join(row['findings'] or []) or 'none'} | "
                     f"{'; '.join(row['findings_kernels'] or []) or 'none'} | {fmt(obs)} | {fmt(whole)} | "
                     f"{fmt(exit_ms)} | {row.get('bitwise_equal', '-')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
