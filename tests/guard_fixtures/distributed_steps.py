"""Run by tests/test_guard_distributed.py under `torchrun --nproc_per_node 2` (gloo, CPU): guards
around DDP and FSDP2 training steps and around steps that differ between the ranks. Each scenario's
report (rank 0's merged one, or each rank's) is captured from stderr into OUT/<scenario>.rank<r>.txt,
its JSON is OUT/<scenario>.json, and what each rank saw (the ops recorded, the final parameters)
goes to OUT/<scenario>.seen.rank<r>.json.

usage: distributed_steps.py OUT_DIR
"""
import contextlib
import io
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import matlint

OUT = sys.argv[1]
STEPS = 5


def make_model():
    torch.manual_seed(0)
    # BatchNorm's buffers: DDP broadcasts them from rank 0 before each forward
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def wrapped(kind):
    model = make_model()
    if kind == "ddp":
        return DDP(model)
    if kind == "fsdp":
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        return fully_shard(model)
    return model


def train(model, rank, guard=None):
    """STEPS steps; every rank reads the loss twice a step (a finding on every rank), rank 1 also
    reads its first output twice (a finding of rank 1 alone)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    with guard if guard is not None else contextlib.nullcontext():
        for _ in range(STEPS):
            x = torch.randn(8, 16)
            out = model(x)
            loss = out.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            seen = [loss.item() for _ in range(2)]  # every rank
            if rank == 1:
                seen += [out[0, 0].item() for _ in range(2)]  # rank 1 only
    return model


def parameters(model):
    out = []
    for p in model.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2 shards are DTensors
        out.append(t.detach().flatten().tolist())
    return out


def report_of(name, rank, run, **options):
    """Runs `run(guard)` with stderr captured; returns what the guard recorded."""
    guard = matlint.guard(json_path=os.path.join(OUT, f"{name}.json"), estimate_savings=False, **options)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            run(guard)
        except RuntimeError as exc:
            if "planned failure" not in str(exc):
                raise
    with open(os.path.join(OUT, f"{name}.rank{rank}.txt"), "w") as fh:
        fh.write(err.getvalue())
    return guard


def ops_seen(guard):
    return sorted({k.qualname for k in guard.recorder.rec.ops})


def write_seen(name, rank, data):
    with open(os.path.join(OUT, f"{name}.seen.rank{rank}.json"), "w") as fh:
        json.dump(data, fh)


def uneven(rank, guard, fail_rank=None):
    """No collectives: rank 1 runs two steps more than rank 0; `fail_rank` raises in its fourth."""
    torch.manual_seed(rank)
    w = torch.randn(8, 8, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    with guard:
        for step in range(4 + 2 * rank):
            loss = (torch.randn(4, 8) @ w).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rank == 1:
                [loss.item() for _ in range(3)]
            if step == 3 and rank == fail_rank:
                raise RuntimeError("planned failure")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain_ops = ops_seen(report_of("plain", rank, lambda g: train(make_model(), rank, g), ranks="each"))
    for kind in ("ddp", "fsdp"):
        unguarded = parameters(train(wrapped(kind), rank))
        holder = {}
        guard = report_of(kind, rank, lambda g: holder.setdefault("model", train(wrapped(kind), rank, g)))
        write_seen(kind, rank, {"ops": ops_seen(guard), "plain_ops": plain_ops,
                                "parameters_equal": parameters(holder["model"]) == unguarded})
    report_of("each", rank, lambda g: train(wrapped("ddp"), rank, g), ranks="each")
    report_of("uneven", rank, lambda g: uneven(rank, g), window=8)
    report_of("rank1_raises", rank, lambda g: uneven(rank, g, fail_rank=1), window=8)
    report_of("rank0_raises", rank, lambda g: uneven(rank, g, fail_rank=0), window=8)
    # a guard that rank 1 never enters: rank 0 waits rank_timeout_s for it, then reports
    if rank == 0:
        report_of("rank0_only", rank, lambda g: uneven(rank, g), window=8, rank_timeout_s=1.0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
